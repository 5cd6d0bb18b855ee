"""One module per tab: build_<tab>(demo, state) lays out components and wires events.

``user_errors`` turns the ``ValueError``s that models/ and explorer/ raise for bad input into
``gr.Error`` with the same sentence, so the browser shows what to change instead of a traceback.
"""
from __future__ import annotations

import functools
import html
import inspect
import math
import re

import gradio as gr


def short(message: str, limit: int = 600) -> str:
    """A message that echoes what the user sent, cut to a readable length (a 20,000-character prompt stays out)."""
    return message if len(message) <= limit else message[:limit - 1] + "…"


_SERVER_PATH = re.compile(r"(?<![\w/.:~-])/(?:[\w.~+-]+/)+([\w.~+-]*)")


def no_paths(message: str) -> str:
    """``message`` with every absolute server path cut to its last part (``/srv/app/assets/m/config.json`` reads
    ``…/config.json``): a visitor has no use for the server's folders, and a stranger should not learn them."""
    return _SERVER_PATH.sub(lambda m: "…/" + m.group(1) if m.group(1) else "…/", message)


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
    return gr.Error(plain(short(no_paths(str(exc)))))


def user_errors(fn):
    """Wrap a handler (a plain function or a generator that streams updates) so that a ``ValueError``
    reaches the browser as ``gr.Error`` with the same sentence, and a ``MemoryError`` as a sentence too."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def stream(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except gr.Error:
                raise
            except (ValueError, MemoryError) as exc:
                raise _as_user_error(exc) from exc
        return stream

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except (ValueError, MemoryError) as exc:
            raise _as_user_error(exc) from exc
    return wrapper


def outputs_of(result: type, **components) -> list:
    """An event's output components in the order of its handler's named result (a NamedTuple), given by name:
    the one place a result's fields meet the components that show them. Raises TypeError when a field is
    missing or unknown, so a handler and its outputs cannot drift apart."""
    return list(result(**components))


def as_number(value, name: str, *, finite: bool = True) -> float:
    """A number typed in a box or sent through the API; ValueError naming the field otherwise.

    ``finite=False`` lets ±inf through for fields whose own range check says more than "finite" would.
    """
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be a number, got {shown(value)}.") from None
    if math.isnan(x):
        raise ValueError(f"{name} must be a number, got NaN.")
    if finite and math.isinf(x):
        raise ValueError(f"{name} must be a finite number, got {shown(value)}.")
    return x


def as_whole(value, name: str, lo: int, hi: int) -> int:
    """A whole number in [lo, hi] (3.0 counts, 3.5, inf and NaN do not); ValueError naming the range otherwise."""
    x = as_number(value, name, finite=False)
    if not x.is_integer() or not lo <= x <= hi:
        raise ValueError(f"{name} must be a whole number from {lo} to {hi}, got {shown(value)}.")
    return int(x)


def layer_choices(n_layers: int) -> list[tuple[str, int]]:
    return [(f"layer {i}", i) for i in range(n_layers)]


def head_choices(n_heads: int, n_kv_heads: int) -> list[tuple[str, int]]:
    from explorer.figures.common import head_label

    return [(head_label(h, n_heads, n_kv_heads), h) for h in range(n_heads)]


def as_index(value, n: int, what: str) -> int:
    """A layer/head index from a dropdown or an API call; ValueError naming the valid range."""
    try:
        i = int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: JSON Infinity
        raise ValueError(f"{what} must be a whole number between 0 and {n - 1}, got {shown(value)}.") from None
    if isinstance(value, float) and value != i:
        raise ValueError(f"{what} must be a whole number between 0 and {n - 1}, got {shown(value)}.")
    if not 0 <= i < n:  # 1e308 is a whole number with 309 digits: quoted as 1e+308
        raise ValueError(f"{what} must be between 0 and {n - 1} for this model, got {shown(value)}.")
    return i


def cached_opening(name: str, fn):
    """A page-load handler whose answer for the shared default model is computed once per input values and
    served to every session from ``explorer.state.cache.results`` (40 visitors arriving at once compute it once).

    A session looking at its own model (a dict argument whose "model" is set) gets ``fn`` computed for it.
    Plotly figures are kept as the JSON Gradio sends (``gr.Plot`` takes it as it is), so a figure is
    serialised once, not once per visitor; component updates are copied per call, since Gradio may consume
    them. ``explorer.web.serving`` wraps every page-load event this way; the mark ``cached_opening`` on the
    wrapper keeps it from being wrapped twice.
    """
    import copy

    from explorer.state import session
    from explorer.state.cache import results, weights_key

    if getattr(fn, "cached_opening", False):
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
        return _each(lambda v: copy.deepcopy(v) if isinstance(v, (dict, gr.components.Component)) else v, answer)
    load.cached_opening = True
    return load


def _each(f, answer):
    """``f`` applied to each output of a handler's ``answer`` (a tuple of outputs, or one)."""
    return tuple(f(v) for v in answer) if isinstance(answer, tuple) else f(answer)


def _as_sent(v):
    """``v`` as Gradio sends it when it is a Plotly figure (the JSON ``gr.Plot`` would make of it), else as it is."""
    from gradio.components.plot import PlotData

    if hasattr(v, "to_json") and hasattr(v, "layout") and hasattr(v, "data"):  # a plotly Figure
        return PlotData(type="plotly", plot=v.to_json())
    return v
