"""Sessions that left are forgotten: a daemon (``start_sweeper``, started by ``explorer.web.serving.apply``) runs
``sweep_once`` every quarter of the shorter idle time below, freeing idle visitors' own models, what Gradio
keeps for sessions idle that long and the results nobody used meanwhile (the opening examples stay). A visitor
whose model was freed is told so on their next action, even when their Gradio session was dropped meanwhile.

    EXPLORER_SESSION_IDLE_MINUTES      (default 30) a session that opened Gradio's heartbeat (a browser tab, or
                                       Gradio's own client: ``middleware.BrowserSessions``) and its own model
    EXPLORER_API_SESSION_IDLE_MINUTES  (default 1) a session that never did: a script posting to the queue, whose
                                       per-session copy of the page's configuration and unread answers would
                                       otherwise stay for the longer time
"""
from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections import OrderedDict

import gradio as gr

from explorer.web import gradio_adapter as adapter


def _state_dicts(values: dict):
    """(state component id, value) for each dict among a session's state values (our session states are dicts)."""
    for key, value in values.items():
        if isinstance(value, dict):
            yield key, value


def _holds_own_model(values: dict) -> bool:
    """Whether a session's state values hold a visitor's own model, or a notice that it was freed."""
    from explorer.state.private_models import EVICTED_KEY

    return any(value.get("model") is not None or value.get(EVICTED_KEY) for _, value in _state_dicts(values))


#: session hash -> (state component id, the sentence): sessions dropped while their owner had not yet been told
#: that their own model was freed. Bounded; a visitor returning after more sessions than this is not told.
RETURNING: "OrderedDict[str, tuple[int, str]]" = OrderedDict()
MAX_RETURNING = 10_000


def _notice_of(values: dict) -> tuple[int, str] | None:
    from explorer.state.private_models import EVICTED_KEY

    return next(((key, value[EVICTED_KEY]) for key, value in _state_dicts(values) if value.get(EVICTED_KEY)), None)


def tell_returning_visitor(demo: gr.Blocks, session_hash: str) -> None:
    """A session dropped while its owner had a notice waiting comes back: its fresh state carries the notice,
    so the next action answers with it (``session.get_model``), as it would have before the drop."""
    from explorer.state.private_models import EVICTED_KEY

    entry = RETURNING.pop(session_hash, None)
    if entry is None:
        return
    key, sentence = entry
    value = adapter.fresh_state_value(demo, session_hash, key)  # a fresh copy of the state's default value
    if isinstance(value, dict):
        value[EVICTED_KEY] = sentence


def _api_idle_seconds() -> float:
    try:
        return max(0.0, float(os.environ.get("EXPLORER_API_SESSION_IDLE_MINUTES", "") or 1)) * 60
    except ValueError:  # a bad setting must not stop the app from starting
        return 60.0


#: How long a session that never opened the heartbeat (a script) is kept idle.
API_IDLE_SECONDS = _api_idle_seconds()


def forget_idle_sessions(demo: gr.Blocks, idle_seconds: float, now: float | None = None,
                         api_idle_seconds: float | None = None) -> int:
    """Drop what Gradio keeps for each session idle longer than ``idle_seconds`` (its per-session copy of every
    component's configuration and its ``gr.State`` values): Gradio keeps an API client's session until 10,000
    sessions exist and a closed tab's for an hour. A session still holding its own model, or the notice that it
    was freed, is kept four times as long; dropped with a notice waiting, the notice is kept (a sentence) and
    given to the session's fresh state when it comes back. A session that never opened Gradio's heartbeat (a
    script) is dropped after ``api_idle_seconds`` (``API_IDLE_SECONDS``) when that is shorter. How many were
    dropped."""
    import datetime

    from explorer.web.middleware import BrowserSessions

    api_idle = min(idle_seconds, API_IDLE_SECONDS if api_idle_seconds is None else api_idle_seconds)

    now_dt = datetime.datetime.now() if now is None else datetime.datetime.fromtimestamp(now)
    dropped = 0
    for session_hash, last in adapter.sessions_last_used(demo).items():
        idle = (now_dt - last).total_seconds()
        limit = idle_seconds if BrowserSessions.has_browser(session_hash) else api_idle
        if idle <= limit or adapter.events_held(demo, session_hash):
            continue
        values = adapter.session_values(demo, session_hash)
        if idle <= 4 * idle_seconds and _holds_own_model(values):
            continue
        notice = _notice_of(values)
        if notice is not None:  # told on its next action all the same
            RETURNING[session_hash] = notice
            while len(RETURNING) > MAX_RETURNING:
                RETURNING.popitem(last=False)
        adapter.forget_session(demo, session_hash)
        BrowserSessions.forget(session_hash)
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
    from explorer.state import private_models

    freed = private_models.expire_idle()
    dropped = forget_idle_sessions(demo, private_models.IDLE_SECONDS)
    unused = drop_unused_results(private_models.IDLE_SECONDS)
    if freed or dropped or unused:
        _give_back_memory()
    return freed, dropped


def drop_unused_results(seconds: float) -> int:
    """Drop the results nobody asked for in ``seconds``, a link's answers included; the opening examples computed at
    start-up stay for the next class (``explorer.state.openings.is_pinned``). How many were dropped."""
    from explorer.state.cache import results
    from explorer.state.openings import is_pinned

    return results.drop_unused(seconds, keep=is_pinned)


#: demo -> (its sweeper thread, the event that stops it)
_SWEEPERS: "weakref.WeakKeyDictionary[gr.Blocks, tuple[threading.Thread, threading.Event]]" = \
    weakref.WeakKeyDictionary()


def start_sweeper(demo: gr.Blocks) -> threading.Thread:
    """A daemon thread that runs ``sweep_once`` every quarter of the shorter idle time (1 s to 60 s), until the demo is
    gone or ``stop_sweeper`` is called."""
    from explorer.state import private_models

    period = min(60.0, max(1.0, min(private_models.IDLE_SECONDS, API_IDLE_SECONDS) / 4))
    ref = weakref.ref(demo)
    stop = threading.Event()

    def loop():
        while not stop.is_set() and (alive := ref()) is not None:
            with contextlib.suppress(Exception):  # a sweep that fails is retried at the next period
                sweep_once(alive)
            del alive
            stop.wait(period)

    thread = threading.Thread(target=loop, name="explorer-session-sweeper", daemon=True)
    _SWEEPERS[demo] = (thread, stop)
    thread.start()
    return thread


def stop_sweeper(demo: gr.Blocks, timeout: float = 30.0) -> bool:
    """Stop ``demo``'s sweeper and wait for a sweep in progress to end; whether it has ended."""
    thread, stop = _SWEEPERS.pop(demo, (None, None))
    if thread is None:
        return True
    stop.set()
    thread.join(timeout)
    return not thread.is_alive()
