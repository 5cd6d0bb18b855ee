"""What a visitor is told when something they sent is wrong: one sentence, never a traceback.

``user_errors`` turns the ``ValueError``s that models/ and explorer/ raise for bad input into ``gr.Error`` with
the same sentence (and a ``MemoryError`` into a sentence too); the message helpers keep what reaches the browser
short, free of server paths and shown as text.
"""
from __future__ import annotations

import functools
import html
import inspect
import logging
import threading
import time
from collections import deque

import gradio as gr

from explorer.web.errors import no_paths, short, short_numbers

log = logging.getLogger("explorer.user")
TRACEBACKS_PER_MINUTE = 5
UNEXPECTED = ("Something went wrong on the server with this request (the server has logged it): try again, or "
              "change the settings.")
_tracebacks: deque = deque()  # when each of the last minute's tracebacks was logged (monotonic s)
_tracebacks_guard = threading.Lock()


def shown(value) -> str:
    """A number (or anything) as a message quotes it: short, never a 309-digit integer."""
    if isinstance(value, float):
        return repr(value)  # 1e+308, inf
    text = repr(value)
    if isinstance(value, int) and not isinstance(value, bool) and len(text) > 15:
        return f"a {len(text.lstrip('-'))}-digit number"
    return short(text, 40)


def plain(message: str) -> str:
    """A message safe to show in Gradio's error popup, which renders HTML: markup from the input shows as text,
    and lone surrogates (which no page can display) become U+FFFD."""
    return html.escape(message.encode("utf-8", "replace").decode("utf-8"), quote=False)


def _as_user_error(exc: Exception) -> gr.Error:
    if isinstance(exc, MemoryError):  # a prediction fell short: answer this request, keep the server up
        import gc

        gc.collect()
        return gr.Error("The machine ran out of memory for this request: choose smaller sizes or a shorter "
                        "text and try again.")
    if isinstance(exc, OverflowError):  # int(inf) or a number past a C type, where no check named the control
        return gr.Error("A number sent is infinite or too large for this view: use the page's own ranges.")
    return gr.Error(plain(short(short_numbers(no_paths(str(exc))))), print_exception=False)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _log_user_error(name: str, error: gr.Error) -> None:
    """One line for an error a visitor caused: Gradio's own traceback for it is switched off."""
    error.print_exception = False
    log.warning("user error in %s: %s", name, short(_one_line(error.message), 300))


def _log_unexpected(name: str, exc: BaseException) -> None:
    """The traceback of an unexpected error, or one line once ``TRACEBACKS_PER_MINUTE`` were logged this minute."""
    now = time.monotonic()
    with _tracebacks_guard:
        while _tracebacks and _tracebacks[0] <= now - 60:
            _tracebacks.popleft()
        full = len(_tracebacks) < TRACEBACKS_PER_MINUTE
        if full:
            _tracebacks.append(now)
    if full:
        log.error("unexpected error in %s", name, exc_info=exc)
    else:
        log.error("unexpected error in %s: %s: %s (traceback left out: %d logged this minute)", name,
                  type(exc).__name__, short(_one_line(exc), 300), TRACEBACKS_PER_MINUTE)


def _as_sentence(name: str, exc: Exception) -> gr.Error:
    """What the browser is shown for ``exc``, logged as the module docstring says."""
    if isinstance(exc, gr.Error):
        error = exc
    elif isinstance(exc, (ValueError, MemoryError, OverflowError)):
        error = _as_user_error(exc)
    else:
        _log_unexpected(name, exc)
        return gr.Error(UNEXPECTED, print_exception=False)
    _log_user_error(name, error)
    return error


def user_errors(fn):
    """Wrap a handler (a plain function or a generator that streams updates) so that a ``ValueError``
    reaches the browser as ``gr.Error`` with the same sentence, a ``MemoryError`` or ``OverflowError`` (an infinite
    number where no check named the control) as a sentence too, and any other error as ``UNEXPECTED``; each is
    logged as the module docstring says."""
    name = getattr(fn, "__qualname__", None) or repr(fn)
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def stream(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - every error reaches the browser as a sentence
                error = _as_sentence(name, exc)
                if error is exc:
                    raise
                raise error from exc
        return stream

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - every error reaches the browser as a sentence
            error = _as_sentence(name, exc)
            if error is exc:
                raise
            raise error from exc
    return wrapper
