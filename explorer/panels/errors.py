"""What a visitor is told when something they sent is wrong: one sentence, never a traceback.

``user_errors`` turns the ``ValueError``s that models/ and explorer/ raise for bad input into ``gr.Error`` with
the same sentence (and a ``MemoryError`` into a sentence too); the message helpers keep what reaches the browser
short, free of server paths and shown as text.
"""
from __future__ import annotations

import functools
import html
import inspect

import gradio as gr

from explorer.web.errors import no_paths, short


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
    return gr.Error(plain(short(no_paths(str(exc)))))


def user_errors(fn):
    """Wrap a handler (a plain function or a generator that streams updates) so that a ``ValueError``
    reaches the browser as ``gr.Error`` with the same sentence, and a ``MemoryError`` or ``OverflowError`` (an infinite
    number where no check named the control) as a sentence too."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def stream(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except gr.Error:
                raise
            except (ValueError, MemoryError, OverflowError) as exc:
                raise _as_user_error(exc) from exc
        return stream

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except (ValueError, MemoryError, OverflowError) as exc:
            raise _as_user_error(exc) from exc
    return wrapper
