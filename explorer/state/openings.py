"""Opening examples shared by every session: a page-load handler's answer kept in the result cache (``cache.py``).

40 visitors following one link at once then compute its answer, and serialise each of its figures, once.

    load = cached_opening("attention_example", attention_view)   # the same handler, answers shared
    with pinning(): ...                   # answers computed here (the openings at start-up) are kept for good

A link's view answers through the same wrapper for any input a link carries, so only the answers computed at
start-up on the page's own inputs are pinned (``is_pinned``: the sweeper keeps them); a link's answer is evicted
like any other result once nobody has asked for it.
"""
from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import inspect
import threading

import gradio as gr

from explorer.state import session
from explorer.state.cache import results, weights_key

_PINNING: "contextvars.ContextVar[bool]" = contextvars.ContextVar("explorer_pinning", default=False)
_PINNED: set = set()  # result keys of the opening examples computed at start-up
_PINNED_GUARD = threading.Lock()


@contextlib.contextmanager
def pinning():
    """Within the block (and the worker threads its event loop hands calls to, which copy its context), every
    answer ``cached_opening`` serves is pinned."""
    token = _PINNING.set(True)
    try:
        yield
    finally:
        _PINNING.reset(token)


def pin(key) -> None:
    """Keep the result ``key`` when the sweeper drops what nobody used (an opening example's own key)."""
    with _PINNED_GUARD:
        _PINNED.add(key)


def is_pinned(key) -> bool:
    with _PINNED_GUARD:
        return key in _PINNED


def pinned() -> frozenset:
    """The keys pinned so far (kept in the result cache while its bounds allow)."""
    with _PINNED_GUARD:
        return frozenset(_PINNED)


#: Makes a Plotly figure into what Gradio sends for a ``gr.Plot`` (its public ``postprocess``).
_PLOT = gr.Plot(render=False)


def cached_opening(name: str, fn):
    """A page-load handler whose answer for the shared default model is computed once per input values and
    served to every session from ``explorer.state.cache.results``; ``fn`` itself when it streams (a generator)
    or reads the request or a progress bar, whose answers are a session's own.

    A session looking at its own model (a dict argument whose "model" is set) gets ``fn`` computed for it.
    Plotly figures are kept as the JSON Gradio sends (``gr.Plot`` takes it as it is), so a figure is
    serialised once, not once per visitor; component updates are copied per call, since Gradio may consume
    them. The mark ``cached_opening`` on the wrapper keeps it from being wrapped twice.
    """
    if getattr(fn, "cached_opening", False) or inspect.isgeneratorfunction(fn) or _takes_request_or_progress(fn):
        return fn

    @functools.wraps(fn)
    def load(*args):
        if any(isinstance(a, dict) and a.get("model") is not None for a in args):
            return fn(*args)
        values = tuple(repr(a) for a in args if not isinstance(a, dict))
        if sum(map(len, values)) > 4096:  # an API client's long input: not an opening example, nothing kept
            return fn(*args)
        key = ("opening", name, weights_key(session.load_default()[0]), values)
        answer = results.get_or_compute(key, lambda: _each(_as_sent, fn(*args)))
        if _PINNING.get():
            pin(key)
        return _each(lambda v: copy.deepcopy(v) if isinstance(v, (dict, gr.components.Component)) else v, answer)
    load.cached_opening = True
    return load


def _takes_request_or_progress(fn) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any("Request" in str(p.annotation) or isinstance(p.default, gr.Progress) for p in params)


def _each(f, answer):
    """``f`` applied to each output of a handler's ``answer`` (a tuple of outputs, or one)."""
    return tuple(f(v) for v in answer) if isinstance(answer, tuple) else f(answer)


def _as_sent(v):
    """``v`` as Gradio sends it when it is a Plotly figure (the JSON ``gr.Plot`` would make of it), else as it is."""
    if hasattr(v, "to_json") and hasattr(v, "layout") and hasattr(v, "data"):  # a plotly Figure
        return _PLOT.postprocess(v)
    return v
