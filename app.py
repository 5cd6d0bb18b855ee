"""Transformer Explorer: a Gradio app around a from-scratch Llama-style decoder and a classic encoder.

``python app.py`` serves it; ``build_demo()`` assembles the tabs from explorer/panels/ (tests launch it
in-process). Nothing else lives here.
"""
from __future__ import annotations

import gradio as gr

from explorer import session
from explorer.panels.attention import build_attention

TITLE = "Transformer Explorer"


def build_demo() -> gr.Blocks:
    session.load_default()  # the shipped model, loaded once at start-up (no network)
    with gr.Blocks(title=TITLE) as demo:
        gr.Markdown(f"# {TITLE}\nA Llama-style decoder written from scratch, and what happens inside it. "
                    "Every number on screen is computed now, by the code that is running.")
        state = gr.State(session.new_state())
        with gr.Tab("Attention", id="attention"):
            build_attention(demo, state)
    # One event at a time: 2 CPU cores, and hooked runs on the shared model are serialised anyway.
    demo.queue(default_concurrency_limit=1)
    return demo


if __name__ == "__main__":
    build_demo().launch(server_name="0.0.0.0", theme=gr.themes.Soft())
