"""What one event may carry, checked when it joins the queue, before Gradio stores it (``serving.apply`` hands
``join_problem`` to ``gradio_adapter.cap_queue``): a queued event holds its values for as long as it waits, so a
script's oversized values are refused at the door, not when a worker finally reaches them.

    a text box          at most its own ``max_length``, else ``MAX_TEXT_CHARS`` characters (the handlers' limit)
    any other control   at most ``MAX_OTHER_CHARS`` characters of text and ``MAX_ITEMS`` list or table items in all
    a slider or number  a number within its range, when no event can change that range (a layer slider's maximum
                        follows the loaded model, so those are left to the handler)
"""
from __future__ import annotations

import math
from typing import Any

import gradio as gr

from explorer.state.text import MAX_TEXT_CHARS

#: Characters of text in one value of a control that is not a text box (a model name, a table's cells).
MAX_OTHER_CHARS = 10_000
#: List items, table cells and dict entries in one value (the largest table a view shows has a few hundred).
MAX_ITEMS = 10_000


def _size(value: Any, budget: int) -> tuple[int, int]:
    """(characters of text, items) in ``value``, counted until either passes ``budget``."""
    chars = items = 0
    stack = [value]
    while stack and chars <= budget and items <= budget:
        v = stack.pop()
        if isinstance(v, str):
            chars += len(v)
        elif isinstance(v, dict):
            items += len(v)
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            items += len(v)
            stack.extend(v)
    return chars, items


def _label(block, i: int) -> str:
    label = getattr(block, "label", None)
    return f'"{label}"' if isinstance(label, str) and label else f"input {i + 1}"


def join_problem(api_name: str | None, controls: list, data: Any) -> tuple[int | None, str] | None:
    """Why an event's ``data`` for the inputs ``controls`` ((component, whether an event can change its
    properties) pairs) of ``api_name`` is refused: (the input's index, or None for the whole, and a sentence);
    None when every value is within its control's limits."""
    where = f" to {api_name}" if api_name else ""
    if not isinstance(data, list):
        return None, f"The values sent{where} are not a list: reload the page."
    if len(data) > len(controls) + 1:  # Gradio may add one value past the inputs (a request or progress slot)
        return None, f"{len(data)} values were sent{where}, which takes {len(controls)}: reload the page."
    for i, ((block, changeable), value) in enumerate(zip(controls, data)):
        if isinstance(block, gr.Textbox):
            limit = getattr(block, "max_length", None) or MAX_TEXT_CHARS
            chars, items = _size(value, max(limit, MAX_ITEMS))
            if chars > limit:
                return i, (f"The text sent to {_label(block, i)} is longer than {limit:,} characters: paste a "
                           "shorter text (every view uses far fewer tokens than that).")
            if items:
                return i, f"{_label(block, i)} takes text, not a list: type or paste text."
            continue
        chars, items = _size(value, max(MAX_OTHER_CHARS, MAX_ITEMS))
        if chars > MAX_OTHER_CHARS or items > MAX_ITEMS:
            return i, _not_accepted(api_name, f"{_label(block, i)} got more than {MAX_OTHER_CHARS:,} characters or "
                                           f"{MAX_ITEMS:,} items")
        if isinstance(block, (gr.Slider, gr.Number)) and not changeable and isinstance(value, (int, float)) \
                and not isinstance(value, bool):
            lo, hi = getattr(block, "minimum", None), getattr(block, "maximum", None)
            if not math.isfinite(value) or (lo is not None and value < lo) or (hi is not None and value > hi):
                span = f"from {lo:g} to {hi:g}" if lo is not None and hi is not None else "within its range"
                return i, _not_accepted(api_name, f"{_label(block, i)} takes a number {span}")
    return None


def _not_accepted(api_name: str | None, reason: str) -> str:
    """The same sentence as Gradio's own refusals of a value (``serving.bad_value_sentence``)."""
    return (f"A value sent to {api_name or 'this control'} is not one its controls accept ({reason}): use the "
            "page's own choices and ranges, or reload the page.")
