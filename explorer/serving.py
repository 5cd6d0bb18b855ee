"""How the queue serves many visitors: concurrency per event, by what the event holds, and a per-session cap.

Gradio runs each handler function one request at a time unless told otherwise, so a class of 40 waits in
series on an idle second core. Here each event gets a concurrency group by what it holds:

    measure   timings and training (memory sweeps, generation, fine-tuning): one at a time, since two on the
              same cores would time each other
    play      the memory lab's Play: sleeps between frames, so many run side by side
    view      everything else (cached opening examples, hooked forward passes on small models, predictions):
              a few side by side; runs on one model still serialise on its model lock (explorer.locks)

A session (one browser tab or API client) may hold at most ``EXPLORER_SESSION_QUEUE_CAP`` events in the
queue at once (queued or running); one more is refused with a sentence, so one client cannot fill the queue
that everyone shares; a page load sends at most a link's three events.

Page loads cost little: every tab's opening example is computed once at start-up into the page itself
(``explorer.opening``), so a page opened without a link sends no event; a link runs its own tab's view, from the
shared result cache (its figures kept as the JSON Gradio sends). The page and its configuration are built once
(``PageCache``), and Gradio's timing summary is not recomputed after every event.

Sessions that left are forgotten: a daemon sweeps every quarter of ``EXPLORER_SESSION_IDLE_MINUTES``, freeing
idle visitors' own models, Gradio's state of sessions idle that long and the results nobody used meanwhile. No component takes files, so Gradio's upload route refuses every request
(``UploadLimit``).

    apply(demo)     after demo.queue(): sets each event's group and limit, the per-session cap, the cached page
                    loads and the sweeper
    app_kwargs()    for launch(app_kwargs=...): the page cache and the upload limit
"""
from __future__ import annotations

import contextlib
import gzip
import inspect
from collections import OrderedDict
import os
import threading
import time
import weakref

import gradio as gr


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
        if body.session_hash in _RETURNING:
            tell_returning_visitor(demo, body.session_hash)
        held = queue.pending_event_ids_session.get(body.session_hash) if body.session_hash else None
        if held is not None and len(held) >= SESSION_QUEUE_CAP:
            return False, refused_sentence(SESSION_QUEUE_CAP), "queue_full"
        return await push(body, request, username)

    queue.push = push_within_cap
    _sentence_for_bad_values(demo)
    serve_page_loads_from_cache(demo)
    open_in_page(demo)
    global ACCEPTS_FILES
    ACCEPTS_FILES = takes_files(demo)
    limit_heap_arenas()
    start_sweeper(demo)
    return demo


def page_load_fns(demo: gr.Blocks) -> list:
    """Every event the page's load or a link runs on the server: the panels' ``demo.load`` events, the link
    triggers (``explorer.links``) and every event chained after one of them."""
    from explorer import links, opening

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
    """Every opening example computed now, once, into the page (``explorer.opening``); the panels' page-load
    events then no longer run per visitor. Returns the seconds each took, by event name."""
    from explorer import links, opening

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


class PageCache:
    """ASGI middleware: the page itself (``GET /``, with Gradio's configuration inside) and ``GET /config`` are
    built once per (path, page, host and proxy headers) and served from memory.

    Gradio builds both afresh for every visitor (a deep copy and a render of a ~300 KB configuration, and the
    API description for the page): under 40 page loads at once that was two fifths of the server's time. They
    are the same for every visitor of this app (no login, no per-user layout), so a copy is served; responses
    that set a cookie or are not a plain 200 are never kept. A kept copy is also gzipped once, and sent gzipped
    to a browser that accepts it: the page carries every opening figure (about 1.4 MB; 0.2 MB gzipped).
    """
    PATHS = ("/", "/config", "/gradio_api/config")
    KEY_HEADERS = (b"host", b"x-forwarded-host", b"x-forwarded-proto", b"x-forwarded-port", b"x-forwarded-prefix",
                   b"x-forwarded-for-root", b"forwarded")
    MAX_ENTRIES = 32

    def __init__(self, app) -> None:
        self.app = app
        self._kept: dict[tuple, tuple[dict, list[bytes]]] = {}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET" or scope["path"] not in self.PATHS:
            return await self.app(scope, receive, send)
        from urllib.parse import parse_qsl

        headers = dict(scope.get("headers") or [])
        if b"authorization" in headers:
            return await self.app(scope, receive, send)
        query = tuple(sorted((k, v) for k, v in parse_qsl(scope.get("query_string", b"").decode("latin-1"))
                             if k in ("page", "deep_link")))
        key = (scope["path"], scope.get("root_path", ""), query, tuple(headers.get(h) for h in self.KEY_HEADERS))
        kept = self._kept.get(key)
        if kept is not None:
            start, body, zipped = kept
            if zipped is not None and b"gzip" in headers.get(b"accept-encoding", b"").lower():
                start, body = _gzipped_start(start, len(zipped)), zipped
            await send(start)
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return None
        captured: dict = {}
        chunks: list[bytes] = []

        async def capture(message):
            if message["type"] == "http.response.start":
                captured.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    names = {k.lower() for k, _ in captured.get("headers", [])}
                    if captured.get("status") == 200 and b"set-cookie" not in names and \
                            len(self._kept) < self.MAX_ENTRIES:
                        body = b"".join(chunks)
                        zipped = None if b"content-encoding" in names else gzip.compress(body, 6)
                        self._kept[key] = (dict(captured), body, zipped)
            await send(message)

        return await self.app(scope, receive, capture)


def _gzipped_start(start: dict, length: int) -> dict:
    """A response start message for the gzipped body of ``length`` bytes."""
    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() not in (b"content-length", b"vary")]
    headers += [(b"content-encoding", b"gzip"), (b"content-length", str(length).encode()),
                (b"vary", b"Accept-Encoding")]
    return {**start, "headers": headers}


#: Set by ``apply``: whether any component of the app takes files (none does: then no upload is accepted).
ACCEPTS_FILES = False
#: With a component that takes files: the most one upload request may carry (all its files together).
UPLOAD_REQUEST_BYTES = 2 * 2**20

UPLOAD_REFUSED = ("This app takes no files: nothing can be uploaded here. Type or paste your text into the page "
                  "instead.")


def takes_files(demo: gr.Blocks) -> bool:
    """Whether a component of ``demo`` accepts files from a visitor (it has an upload event)."""
    return any("upload" in {str(getattr(e, "event_name", e)) for e in getattr(block, "EVENTS", [])}
               for block in demo.blocks.values())


class UploadLimit:
    """ASGI middleware on Gradio's upload route, which exists whether or not a component takes files, and whose
    own limit (``max_file_size``) is per file, so one request could carry 1,000 files. With no component that
    takes files (this app), every upload is refused before a byte is written; otherwise a request larger than
    ``UPLOAD_REQUEST_BYTES`` in all is refused, by its declared length or as it streams."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].rstrip("/").endswith("/upload"):
            return await self.app(scope, receive, send)
        if not ACCEPTS_FILES:
            return await _plain(send, 403, UPLOAD_REFUSED)
        limit = UPLOAD_REQUEST_BYTES
        sentence = (f"One upload may carry at most {limit // 2**20} MB in all: send fewer or smaller files.")
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is None or not declared.isdigit() or int(declared) > limit:
            return await _plain(send, 413, sentence)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:  # longer than it said: stop reading it
                raise RuntimeError("upload longer than its declared length")
            return message

        return await self.app(scope, counted, send)


async def _plain(send, status: int, text: str) -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def app_kwargs() -> dict:
    """What ``launch(app_kwargs=...)`` needs from this module: the page cache and the upload limit."""
    from starlette.middleware import Middleware

    return {"middleware": [Middleware(UploadLimit), Middleware(PageCache)]}


# --- sessions that left -------------------------------------------------------------------------------------

def _state_dicts(session_state):
    """(state component id, value) for each dict a Gradio session's state holds (our session states are dicts)."""
    for key, value in list(getattr(session_state, "state_data", {}).items()):
        if isinstance(value, dict):
            yield key, value


def _holds_own_model(session_state) -> bool:
    """Whether a Gradio session's state holds a visitor's own model, or a notice that it was freed."""
    from explorer.private_models import EVICTED_KEY

    return any(value.get("model") is not None or value.get(EVICTED_KEY) for _, value in _state_dicts(session_state))


#: session hash -> (state component id, the sentence): sessions dropped while their owner had not yet been told
#: that their own model was freed. Bounded; a visitor returning after more sessions than this is not told.
_RETURNING: "OrderedDict[str, tuple[int, str]]" = OrderedDict()
MAX_RETURNING = 10_000


def _notice_of(session_state) -> tuple[int, str] | None:
    from explorer.private_models import EVICTED_KEY

    return next(((key, value[EVICTED_KEY]) for key, value in _state_dicts(session_state) if value.get(EVICTED_KEY)),
                None)


def tell_returning_visitor(demo: gr.Blocks, session_hash: str) -> None:
    """A session dropped while its owner had a notice waiting comes back: its fresh state carries the notice,
    so the next action answers with it (``session.get_model``), as it would have before the drop."""
    from explorer.private_models import EVICTED_KEY

    entry = _RETURNING.pop(session_hash, None)
    holder = getattr(demo, "state_holder", None)
    if entry is None or holder is None:
        return
    key, sentence = entry
    with contextlib.suppress(KeyError, TypeError):
        value = holder[session_hash][key]  # a fresh copy of the state's default value
        if isinstance(value, dict):
            value[EVICTED_KEY] = sentence


def forget_idle_sessions(demo: gr.Blocks, idle_seconds: float, now: float | None = None) -> int:
    """Drop what Gradio keeps for each session idle longer than ``idle_seconds`` (its per-session copy of every
    component's configuration and its ``gr.State`` values): Gradio keeps an API client's session until 10,000
    sessions exist and a closed tab's for an hour. A session still holding its own model, or the notice that it
    was freed, is kept four times as long; dropped with a notice waiting, the notice is kept (a sentence) and
    given to the session's fresh state when it comes back. How many were dropped."""
    import datetime

    holder = getattr(demo, "state_holder", None)
    queue = getattr(demo, "_queue", None)
    if holder is None or queue is None:
        return 0
    now_dt = datetime.datetime.now() if now is None else datetime.datetime.fromtimestamp(now)
    dropped = 0
    for session_hash, last in list(holder.time_last_used.items()):
        idle = (now_dt - last).total_seconds()
        if idle <= idle_seconds or queue.pending_event_ids_session.get(session_hash):
            continue
        session_state = holder.session_data.get(session_hash)
        if session_state is not None and idle <= 4 * idle_seconds and _holds_own_model(session_state):
            continue
        notice = _notice_of(session_state) if session_state is not None else None
        if notice is not None:  # told on its next action all the same
            _RETURNING[session_hash] = notice
            while len(_RETURNING) > MAX_RETURNING:
                _RETURNING.popitem(last=False)
        holder.delete_state(session_hash)  # Gradio's own clean-up of the State values (their delete callbacks)
        with holder.lock:
            holder.session_data.pop(session_hash, None)
            holder.time_last_used.pop(session_hash, None)
        queue.pending_event_ids_session.pop(session_hash, None)
        with contextlib.suppress(KeyError):
            del queue.pending_messages_per_session[session_hash]
        dropped += 1
    return dropped


def limit_heap_arenas(arenas: int = 2) -> None:
    """Have the threads that serve requests share ``arenas`` glibc heaps instead of one each (glibc's default
    allows 8 per core): memory a finished request freed is then reused by the next one on another thread and
    goes back to the system when idle, instead of lingering in dozens of half-empty heaps. Set before the server
    starts its threads; ``MALLOC_ARENA_MAX`` in the environment wins."""
    import ctypes

    if os.environ.get("MALLOC_ARENA_MAX"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(-8, arenas)  # M_ARENA_MAX


def _give_back_memory() -> None:
    """Collect, and hand freed heap pages back to the system (glibc keeps them otherwise)."""
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def sweep_once(demo: gr.Blocks) -> tuple[int, int]:
    """Free idle visitors' own models, drop idle sessions and the results nobody used meanwhile (opening
    examples excepted); (models freed, sessions dropped)."""
    from explorer import private_models

    from explorer.cache import results

    freed = private_models.expire_idle()
    dropped = forget_idle_sessions(demo, private_models.IDLE_SECONDS)
    # results nobody asked for during the idle time go too; the opening examples stay for the next class
    unused = results.drop_unused(private_models.IDLE_SECONDS, keep=_is_opening)
    if freed or dropped or unused:
        _give_back_memory()
    return freed, dropped


def _is_opening(key) -> bool:
    return isinstance(key, tuple) and bool(key) and key[0] == "opening"


def start_sweeper(demo: gr.Blocks) -> threading.Thread:
    """A daemon thread that runs ``sweep_once`` every quarter of the idle time (1 s to 60 s)."""
    from explorer import private_models

    period = min(60.0, max(1.0, private_models.IDLE_SECONDS / 4))
    ref = weakref.ref(demo)

    def loop():
        while (alive := ref()) is not None:
            with contextlib.suppress(Exception):  # a sweep that fails is retried at the next period
                sweep_once(alive)
            del alive
            time.sleep(period)

    thread = threading.Thread(target=loop, name="explorer-session-sweeper", daemon=True)
    thread.start()
    return thread
