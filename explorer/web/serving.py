"""How the queue serves many visitors: concurrency per event, by what the event holds, and a per-session cap.

Gradio runs each handler function one request at a time unless told otherwise, so a class of 40 waits in
series on an idle second core. Here each event gets a concurrency group by what it holds:

    measure   timings and training (memory sweeps, generation, fine-tuning): one at a time, since two on the
              same cores would time each other
    play      the memory lab's Play: sleeps between frames, so many run side by side
    view      everything else (cached opening examples, hooked forward passes on small models, predictions):
              a few side by side; runs on one model still serialise on its model lock (explorer.state.locks)

A session (one browser tab or API client) may hold at most ``EXPLORER_SESSION_QUEUE_CAP`` events in the
queue at once (queued or running); one more is refused with a sentence, so one client cannot fill the queue
that everyone shares; a page load sends at most a link's three events.

Page loads cost little: every tab's opening example is computed once at start-up into the page itself
(``explorer.web.opening``), so a page opened without a link sends no event; a link runs its own tab's view, from the
shared result cache (its figures kept as the JSON Gradio sends). Gradio's timing summary is not recomputed after
every event. The page cache and the upload limit are HTTP middleware (``explorer.web.middleware``); idle sessions are
swept by ``explorer.web.sweeper``.

    apply(demo)     after demo.queue(): sets each event's group and limit, the per-session cap, the cached page
                    loads and the opening examples, the upload switch and the sweeper
    close(demo)     stops serving and waits for the work already started (tests, benchmarks: before exit)
"""
from __future__ import annotations

import inspect
import os
import threading
import time
import weakref

import gradio as gr

from explorer.web import sweeper

from explorer.web import middleware


def _env_int(name: str, default: int, lo: int = 1) -> int:
    try:
        return max(lo, int(os.environ.get(name, "") or default))
    except ValueError:  # a bad setting must not stop the app from starting
        return default


#: Events per session in the queue at once (queued or running): a link's page load sends 3.
SESSION_QUEUE_CAP = _env_int("EXPLORER_SESSION_QUEUE_CAP", 24)
#: The whole queue: room for 64 sessions' page loads at once, and more.
QUEUE_MAX_SIZE = _env_int("EXPLORER_QUEUE_SIZE", 2048)
#: Cheap views run this many at a time per group.
VIEW_CONCURRENCY = _env_int("EXPLORER_VIEW_CONCURRENCY", 4)

#: Gradio's timing summary (its monitoring page) is recomputed after this many events, not after each one.
ANALYTICS_EVERY = 1000

# (api_name prefix, group, limit); first match wins, anything unmatched is a view.
GROUPS: list[tuple[str, str, int | None]] = [
    ("memory_compare", "measure", 1),
    ("generate", "measure", 1),
    ("lora_finetune", "measure", 1),
    ("memory_trace_play", "play", 16),
]


def group_of(api_name: str | None) -> tuple[str | None, int | None]:
    """(concurrency group, limit) for an event; (None, VIEW_CONCURRENCY) keeps the event its own group."""
    for prefix, group, limit in GROUPS:
        if (api_name or "").startswith(prefix):
            return group, limit
    return None, VIEW_CONCURRENCY


def refused_sentence(cap: int) -> str:
    return (f"This page already has {cap} requests waiting or running: wait for them to finish (or reload the "
            "page) before sending more.")


def apply(demo: gr.Blocks) -> gr.Blocks:
    """Set each event's concurrency group and limit, size the queue, and cap each session's share of it."""
    queue = getattr(demo, "_queue", None)
    if queue is None:
        raise RuntimeError("serving.apply(demo) needs demo.queue() to have been called first.")
    for fn in demo.fns.values():
        if fn.fn is None:  # front-end only (Stop buttons): nothing runs on the server
            fn.concurrency_limit = None
            continue
        group, limit = group_of(fn.api_name)
        fn.concurrency_limit = limit
        if group is not None:
            fn.concurrency_id = group
    queue.max_size = QUEUE_MAX_SIZE
    if not os.environ.get("GRADIO_ANALYTICS_CACHE_FREQUENCY"):
        # Gradio recomputes its per-function timing summary (a pandas group-by over the last 10,000 events) after
        # every event by default: under a class's page loads that alone took a fifth of the server's time.
        queue.ANAYLTICS_CACHE_FREQUENCY = ANALYTICS_EVERY
    push = queue.push

    async def push_within_cap(body, request, username):
        if body.session_hash in sweeper.RETURNING:
            sweeper.tell_returning_visitor(demo, body.session_hash)
        held = queue.pending_event_ids_session.get(body.session_hash) if body.session_hash else None
        if held is not None and len(held) >= SESSION_QUEUE_CAP:
            return False, refused_sentence(SESSION_QUEUE_CAP), "queue_full"
        return await push(body, request, username)

    queue.push = push_within_cap
    _sentence_for_bad_values(demo)
    serve_page_loads_from_cache(demo)
    open_in_page(demo)
    middleware.ACCEPTS_FILES = middleware.takes_files(demo)
    sweeper.limit_heap_arenas()
    sweeper.start_sweeper(demo)
    return demo


#: Threads that run handlers' work: Gradio's (AnyIO's) workers, which end once the server has stopped and their
#: current call returns, and the memory lab's measurements (explorer.measure.run, explorer.panels.memory).
WORK_THREADS = ("AnyIO worker thread", "abandonable-measurement", "memory-lab-opening")


def close(demo: gr.Blocks, timeout: float = 120.0) -> list[str]:
    """Stop serving ``demo``, stop its sweeper and wait, at most ``timeout`` seconds in all, for the threads
    still running handlers' work; the names of those still running then (none when all ended).

    Python ends the daemon threads still alive at exit wherever they are: one inside a torch kernel is unwound
    through C++ that cannot be unwound, and the process aborts ("terminate called without an active exception",
    exit 134) after its work is done. A process that served the app in-process calls this before it exits."""
    deadline = time.monotonic() + timeout
    server = getattr(demo, "server", None)
    if server is not None:  # clients' open streams (heartbeats, queue updates) would hold the shutdown for minutes
        server.config.timeout_graceful_shutdown = min(2.0, timeout)
    demo.close(verbose=False)
    sweeper.stop_sweeper(demo, timeout)
    me = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not me and thread.name in WORK_THREADS:
            thread.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in threading.enumerate() if t is not me and t.name in WORK_THREADS and t.is_alive()]


def page_load_fns(demo: gr.Blocks) -> list:
    """Every event the page's load or a link runs on the server: the panels' ``demo.load`` events, the link
    triggers (``explorer.web.links``) and every event chained after one of them."""
    from explorer.web import links
    from explorer.web import opening

    return [demo.fns[i] for i in opening.chain_of(demo, opening.page_load_roots(demo) + links.link_events(demo))]


def _takes_request_or_progress(fn) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any("Request" in str(p.annotation) or isinstance(p.default, gr.Progress) for p in params)


def serve_page_loads_from_cache(demo: gr.Blocks) -> None:
    """Every page-load event answers from the shared result cache (``explorer.panels.cached_opening``): a class
    opening the page at once computes each opening example, and serialises each of its figures, once. Events
    that read the request (the link's query) or stream are left as they are."""
    from explorer.panels import cached_opening

    for fn in page_load_fns(demo):
        if inspect.isgeneratorfunction(fn.fn) or _takes_request_or_progress(fn.fn):
            continue
        fn.fn = cached_opening(fn.api_name or fn.name, fn.fn)


_OPENED: "weakref.WeakKeyDictionary[gr.Blocks, tuple[float, float]]" = weakref.WeakKeyDictionary()


def open_in_page(demo: gr.Blocks) -> dict[str, float]:
    """Every opening example computed now, once, into the page (``explorer.web.opening``); the panels' page-load
    events then no longer run per visitor. Returns the seconds each took, by event name."""
    from explorer.web import links
    from explorer.web import opening

    at, t0 = time.time(), time.perf_counter()
    roots = opening.page_load_roots(demo)
    taken = opening.open_in_page(demo, links.opening_events(demo) + roots)
    opening.detach_page_loads(demo, roots)
    _OPENED[demo] = (at, time.perf_counter() - t0)
    return taken


def opened(demo: gr.Blocks) -> tuple[float, float]:
    """(when, as a Unix time, and in how many seconds) ``demo``'s opening examples were computed."""
    return _OPENED[demo]


def _sentence_for_bad_values(demo: gr.Blocks) -> None:
    """Gradio checks each value against its component (a dropdown's choices, a slider's number) before any
    handler runs, and answers a bad one with a bare "Error" or a message that echoes the whole value. Turn
    that into one sentence with a short, escaped prefix of the reason."""
    from explorer.panels import no_paths, short

    preprocess = demo.preprocess_data

    async def preprocess_with_sentence(block_fn, inputs, state, explicit_call=False):
        try:
            return await preprocess(block_fn, inputs, state, explicit_call)
        except Exception as exc:  # noqa: BLE001 - every failure here is a value the page would never send
            reason = short(no_paths(str(exc) or type(exc).__name__), 120)
            raise gr.Error(short(f"A value sent to {block_fn.api_name or 'this control'} is not one its controls "
                                 f"accept ({reason}): use the page's own choices and ranges, or reload the page."),
                           print_exception=False) from None

    demo.preprocess_data = preprocess_with_sentence
