"""How the queue serves many visitors: each listener in its lane, caps per session and per client.

Each listener declares its lane where it is registered (``explorer.web.groups``: view, generation, measure,
finetune, train, play, class), and ``apply`` refuses to serve an app with a listener that declares none. A lane's line
never waits behind another lane's: a generation starts as soon as the generation lane is free, whatever
fine-tunes and sweeps wait. Views take their limit from the queue's default too (``QUEUE``).

Caps, checked at each join (``explorer.web.gradio_adapter.cap_queue``), each refusal a sentence:
    a session (one browser tab or API client) holds at most ``EXPLORER_SESSION_QUEUE_CAP`` events in the queue
    at once (queued or running; a page load sends at most a link's three events), and at most one long job
    (generation, measurement or fine-tune);
    a client address (``explorer.web.clients``: the peer, or behind a Space's proxy the address the proxy
    forwarded) holds at most ``EXPLORER_CLIENT_QUEUE_CAP`` in all, ``EXPLORER_CLIENT_LONG_CAP`` in each long lane
    and ``EXPLORER_CLIENT_LANE_CAP`` in each other lane, so fresh session ids do not buy a script more;
    each event's values are checked before it is stored (``explorer.web.limits``: text length, sizes, ranges);
    within a lane, events wait round robin by client address, so a flood waits behind everyone's next request.
An event waiting ``EXPLORER_UNREAD_SECONDS`` with no reader of its answers open is dropped before it runs
(``gradio_adapter.drop_unread``): a page reads as it joins, a script that never reads only holds the line.
The queue's size stays well below Gradio's per-session message books (2,000 sessions in Gradio 6.31), which
keep every session with an event pending (``keep_sessions_with_events``).

Page loads cost little: every tab's opening example is computed once at start-up into the page itself
(``explorer.web.opening``), so a page opened without a link sends no event; a link runs its own tab's view, from the
shared result cache (``explorer.state.openings``). What Gradio offers no public API for is done by
``explorer.web.gradio_adapter``. The page cache and the upload limit are HTTP middleware (``explorer.web.middleware``);
idle sessions are swept by ``explorer.web.sweeper``.

    demo.queue(**QUEUE)    the queue's size and the views' limit
    apply(demo)            after demo.queue(): every listener's lane checked, the caps per session and client,
                           the opening examples, the upload switch and the sweeper
    start_openings(demo, tab, status)   after launch, with ``apply(demo, openings_later=True)``: the opening
                           examples computed in a thread, the first tab's first, the page refreshed after each stage
    close(demo)            stops serving and waits for the work already started (tests, benchmarks: before exit)
"""
from __future__ import annotations

import gc
import os
import threading
import time
import weakref

import gradio as gr

from explorer.web import gradio_adapter as adapter
from explorer.web import limits
from explorer.web import links
from explorer.web import middleware
from explorer.web import sweeper
from explorer.web.clients import address_of_request, trust_no_proxy_headers
from explorer.web.errors import no_paths, short
from explorer.web.groups import LONG_GROUPS, VIEW_CONCURRENCY, check_lanes, env_int, lane_name


#: Events per session in the queue at once (queued or running): a link's page load sends 3.
SESSION_QUEUE_CAP = env_int("EXPLORER_SESSION_QUEUE_CAP", 24)
#: Events per client address in the queue at once: a class behind one school address opening a link (3 events
#: each) and asking questions fits.
CLIENT_QUEUE_CAP = env_int("EXPLORER_CLIENT_QUEUE_CAP", 256)
#: Events per client address in each long lane (generation, measure, finetune) at once: each runs for seconds to
#: minutes one or two at a time, so a fifth waiting from one address only makes everyone else wait longer.
CLIENT_LONG_CAP = env_int("EXPLORER_CLIENT_LONG_CAP", 4)
#: Events per client address in each other lane (all views together, play, class) at once: a class of 64 behind
#: one school address opening a link (3 views each) fits.
CLIENT_LANE_CAP = env_int("EXPLORER_CLIENT_LANE_CAP", 192)
#: The whole queue: room for a class's page loads many times over, and at most half of Gradio's per-session
#: message books (``apply`` lowers it to that), so a session with an event pending always has its place there.
QUEUE_MAX_SIZE = env_int("EXPLORER_QUEUE_SIZE", 1024)
#: Seconds an event may wait with no reader of its answers open before it is dropped unrun: a page opens its
#: reader within a moment of joining, even on a loaded server.
UNREAD_SECONDS = env_int("EXPLORER_UNREAD_SECONDS", 10)
UNREAD_SENTENCE = ("This request was not run: no page was listening for its answer for "
                   f"{UNREAD_SECONDS} s after it was sent. Press the button again.")
#: Gradio's timing summary (its monitoring page) is recomputed after this many events, not after each one: after
#: each, it costs a class's page loads dearly. Gradio reads its variable when ``demo.queue()`` makes the queue.
ANALYTICS_EVERY = 1000
os.environ.setdefault("GRADIO_ANALYTICS_CACHE_FREQUENCY", str(ANALYTICS_EVERY))

#: ``demo.queue(**QUEUE)``: room for the events of 64 sessions' page loads at once, views a few at a time.
QUEUE = {"max_size": QUEUE_MAX_SIZE, "default_concurrency_limit": VIEW_CONCURRENCY}


def refused_sentence(cap: int) -> str:
    return (f"This page already has {cap} requests waiting or running: wait for them to finish (or reload the "
            "page) before sending more.")


def client_refused_sentence(cap: int) -> str:
    return (f"Your network address already has {cap} requests waiting or running on this server: wait for them "
            "to finish before sending more.")


def lane_refused_sentence(lane: str, cap: int) -> str:
    when = "in a minute or two, when one of them has finished" if lane in LONG_GROUPS else "in a few seconds"
    return (f"Your network address already has {cap} {lane} requests waiting or running on this server: try "
            f"again {when}.")


def lane_cap(lane: str) -> int:
    return CLIENT_LONG_CAP if lane in LONG_GROUPS else CLIENT_LANE_CAP


LONG_REFUSED = ("This page already has a generation, measurement or fine-tune waiting or running: wait for it to "
                "finish (or press Stop) before starting another.")
UNKNOWN_EVENT = "That event does not exist in this app: reload the page."


def bad_value_sentence(api_name: str | None, exc: Exception) -> str:
    """A value Gradio refused before any handler ran, as one sentence quoting a short, escaped prefix of why."""
    reason = short(no_paths(str(exc) or type(exc).__name__), 120)
    return short(f"A value sent to {api_name or 'this control'} is not one its controls accept ({reason}): use the "
                 "page's own choices and ranges, or reload the page.")


def queue_rules(on_join=None) -> adapter.QueueRules:
    """What every join is held to (``gradio_adapter.cap_queue``): the caps per session, per client address in all
    and per lane, one long job per session, each event's values checked, with a sentence for each refusal."""
    return adapter.QueueRules(
        SESSION_QUEUE_CAP, CLIENT_QUEUE_CAP, LONG_GROUPS, address_of_request, refused_sentence(SESSION_QUEUE_CAP),
        client_refused_sentence(CLIENT_QUEUE_CAP), LONG_REFUSED, UNKNOWN_EVENT, on_join=on_join, lane_of=lane_name,
        lane_cap=lane_cap, lane_refusal=lane_refused_sentence, check_values=limits.join_problem,
        established=middleware.BrowserSessions.established)


def apply(demo: gr.Blocks, *, openings_later: bool = False) -> gr.Blocks:
    """After ``demo.queue(**QUEUE)``: every listener's lane checked (ValueError naming those without one), each
    session's and client's share of the queue capped (in all and per lane), each event's values checked at join,
    events nobody reads dropped before they run,
    uvicorn told to trust no forwarded header (``clients.trust_no_proxy_headers``), the opening examples computed
    into the page, uploads switched off when nothing takes files, the sweeper started.

    With ``openings_later`` the opening examples are not computed here: ``start_openings`` computes them once the
    server answers (``python app.py``), and the page says so meanwhile."""
    check_lanes(demo)
    trust_no_proxy_headers()  # before launch, which makes uvicorn's Config
    adapter.keep_sessions_with_events(demo)
    adapter.configs_on_demand(demo)  # a class arriving at once no longer waits for 40 copies of the page's config

    def on_join(session_hash: str) -> None:
        adapter.configs_on_demand(demo)  # launch made a new session holder: the same for it
        sweeper.tell_returning_visitor(demo, session_hash)

    adapter.cap_queue(demo, queue_rules(on_join))
    adapter.drop_unread(demo, middleware.BrowserSessions.reading, UNREAD_SECONDS, UNREAD_SENTENCE)
    adapter.sentence_for_bad_values(demo, bad_value_sentence)
    if openings_later:
        _LATER[demo] = _detach_openings(demo)
    else:
        open_in_page(demo)
    middleware.ACCEPTS_FILES = middleware.takes_files(demo)
    middleware.ACCEPTS_RECORDINGS = middleware.records_audio(demo)
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


def open_in_page(demo: gr.Blocks) -> dict[str, float]:
    """Every opening example computed now, once, into the page (``explorer.web.opening``); the panels' page-load
    events then no longer run per visitor. Returns the seconds each took, by event name."""
    from explorer.web import opening

    roots = adapter.page_load_events(demo)
    taken = opening.open_in_page(demo, links.opening_events(demo) + roots)
    adapter.detach_page_loads(demo, roots)
    return taken


#: Per app built with ``apply(demo, openings_later=True)``: the opening events still to compute.
_LATER: "weakref.WeakKeyDictionary[gr.Blocks, list[int]]" = weakref.WeakKeyDictionary()


def _detach_openings(demo: gr.Blocks) -> list[int]:
    """The page-load events no longer run per visitor (``start_openings`` computes them once); the opening events."""
    roots = adapter.page_load_events(demo)
    adapter.detach_page_loads(demo, roots)
    return links.opening_events(demo) + roots


#: Status texts while ``start_openings`` runs (the page's ``opening-status`` Markdown; hidden once all are in).
COMPUTING_ALL = ("⏳ Every tab's opening example is being computed now, on this machine, by the code shown: the "
                 "figures are empty until then, and this page fills in by itself when they are ready.")
COMPUTING_REST = ("⏳ This first tab's example is computed; the other tabs' are still being computed now, on this "
                  "machine: their figures are empty until then, and this page fills in by itself when they are "
                  "ready.")


def refresh_page(demo: gr.Blocks) -> None:
    """The page sent to visitors from now on carries the components' current values and properties."""
    adapter.rebuild_page_config(demo)
    middleware.PageCache.page_changed()


def freeze_start_up() -> None:
    """What start-up made (the libraries, the model, the page with its opening figures: about 1.3 million objects)
    lives as long as the process, yet each of Python's full collections walked all of it: a pause of 0.45 s for
    every request then, on 2 cores. Frozen after one last collection, they are left out of the walk."""
    gc.collect()
    gc.freeze()


def start_openings(demo: gr.Blocks, first_tab, status: gr.Markdown) -> threading.Thread:
    """After ``demo.launch``: compute the opening examples held back by ``apply(demo, openings_later=True)`` in a
    thread, those of ``first_tab`` (the tab a page opens on) first, refreshing the page after them and after the
    rest; ``status`` says what is still being computed and is hidden at the end. A failure is the app's own bug:
    logged with its traceback, the others still computed, and the status line then names what failed."""
    from explorer.web import opening

    events = _LATER.pop(demo)

    def run() -> None:
        import traceback

        failed: dict[str, BaseException] = {}
        try:
            first = opening.in_tab(demo, events, first_tab)
            done = set(adapter.events_after(demo, first))
            taken = opening.open_in_page(demo, first, failed=failed)
            adapter.set_initial(status, {"__type__": "update", "value": COMPUTING_REST})
            refresh_page(demo)
            taken |= opening.open_in_page(demo, [i for i in events if i not in first], frozenset(done), failed)
        except Exception as exc:  # noqa: BLE001 - the server keeps serving; the page says what failed
            failed["opening examples"] = exc
        for name, exc in failed.items():
            print(f"Opening example {name} failed:", flush=True)
            traceback.print_exception(exc)
        if failed:
            adapter.set_initial(status, {"__type__": "update", "value": (
                f"⚠ {len(failed)} opening example(s) could not be computed ({', '.join(sorted(failed))}; the "
                "server's log says why): those figures stay empty until you use their tab's own controls.")})
        else:
            adapter.set_initial(status, {"__type__": "update", "visible": False})
            print(f"Opening examples computed in {sum(taken.values()):.1f} s", flush=True)
        refresh_page(demo)
        freeze_start_up()

    thread = threading.Thread(target=run, name="opening-examples-later", daemon=True)
    thread.start()
    return thread
