"""What one event may carry, checked when it joins the queue, before Gradio stores it (``serving.apply`` hands
``join_problem`` to ``gradio_adapter.cap_queue``): a queued event holds its values for as long as it waits, so a
script's oversized values are refused at the door, not when a worker finally reaches them.

    a text box          at most its own ``max_length``, else ``MAX_TEXT_CHARS`` characters (the handlers' limit)
    any other control   at most ``MAX_OTHER_CHARS`` characters of text and ``MAX_ITEMS`` list or table items in all

A number holds no memory while it waits: a slider's range (steps, sizes) is refused by Gradio's own check before
the handler runs, and by the handler where the range follows the loaded model, with the sentences the page and
its API clients already show.
"""
from __future__ import annotations

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
    """Why an event's ``data`` for the input components ``controls`` of ``api_name`` is refused: (the input's
    index, or None for the whole, and a sentence); None when every value is within its control's limits. A value
    of the wrong kind but a small size is left to Gradio and the handler, which answer it with a sentence."""
    where = f" to {api_name}" if api_name else ""
    if not isinstance(data, list):
        return None, f"The values sent{where} are not a list: reload the page."
    if len(data) > len(controls) + 1:  # Gradio may add one value past the inputs (a request or progress slot)
        return None, f"{len(data)} values were sent{where}, which takes {len(controls)}: reload the page."
    for i, (block, value) in enumerate(zip(controls, data)):
        limit = (getattr(block, "max_length", None) or MAX_TEXT_CHARS) if isinstance(block, gr.Textbox) else None
        chars, items = _size(value, max(limit or MAX_OTHER_CHARS, MAX_ITEMS))
        if limit is not None and chars > limit:
            return i, (f"The text sent to {_label(block, i)} is longer than {limit:,} characters: paste a shorter "
                       "text (every view uses far fewer tokens than that).")
        if (limit is None and chars > MAX_OTHER_CHARS) or items > MAX_ITEMS:
            return i, _not_accepted(api_name, f"{_label(block, i)} got more than {MAX_OTHER_CHARS:,} characters or "
                                           f"{MAX_ITEMS:,} items")
    return None


def _not_accepted(api_name: str | None, reason: str) -> str:
    """The same sentence as Gradio's own refusals of a value (``serving.bad_value_sentence``)."""
    return (f"A value sent to {api_name or 'this control'} is not one its controls accept ({reason}): use the "
            "page's own choices and ranges, or reload the page.")
