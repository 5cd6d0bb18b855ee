"""Values between the page and the handlers: a refused value answered with a sentence, what an update carries,
and a Plotly figure sent as the JSON text a handler made itself.

    sentence_for_bad_values(demo, say)     Gradio's check of a sent value against its component, as a sentence
    update_props(component)                what a component returned as an update carries
    plotly_payload(figure_json)            what ``gr.Plot`` sends for a figure given as its JSON text
"""
from __future__ import annotations

from typing import Callable

import gradio as gr

from explorer.web.gradio_adapter.checks import PlotData


def sentence_for_bad_values(demo: gr.Blocks, say: Callable[[str | None, Exception], str]) -> None:
    """Gradio checks each sent value against its component before any handler runs, and answers a bad one with a
    bare "Error" or a message that echoes the whole value: answer ``say(api_name, exception)`` instead."""
    preprocess = demo.preprocess_data

    async def preprocess_with_sentence(block_fn, inputs, state, explicit_call=False):
        try:
            _text_boxes_get_text(block_fn, inputs)
            return await preprocess(block_fn, inputs, state, explicit_call)
        except Exception as exc:  # noqa: BLE001 - every failure here is a value the page would never send
            raise gr.Error(say(block_fn.api_name, exc), print_exception=False) from None

    demo.preprocess_data = preprocess_with_sentence


def _text_boxes_get_text(block_fn, inputs) -> None:
    """A Textbox passes whatever was sent through ``str()``: a script's ``Infinity`` or ``{}`` would reach the
    handler as the prompt "inf" or "{}". Only text (or nothing) is a Textbox's value."""
    for block, value in zip(block_fn.inputs or [], inputs or []):
        if isinstance(block, gr.Textbox) and value is not None and not isinstance(value, str):
            raise ValueError(f"{block.label or 'a text box'} must be text, not a {type(value).__name__}")


def update_props(component) -> dict:
    """The properties a component returned as an update carries (what Gradio sends for it, before its value)."""
    return dict(component.constructor_args)


def plotly_payload(figure_json: str) -> PlotData:
    """What ``gr.Plot`` sends for a Plotly figure given as its JSON text (``gr.Plot`` passes this on as it is), so a
    handler can send a figure it serialised itself without building a plotly ``Figure`` again."""
    return PlotData(type="plotly", plot=figure_json)
