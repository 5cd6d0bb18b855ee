"""Transformer Explorer: a Gradio app around a from-scratch Llama-style decoder and a classic encoder.

``python app.py`` serves it; ``build_demo()`` assembles the tabs from explorer/panels/ (tests launch it
in-process). Nothing else lives here.
"""
from __future__ import annotations

import importlib.util

if importlib.util.find_spec("spaces"):  # Hugging Face ZeroGPU: its package must load before torch sets up CUDA
    import spaces  # noqa: F401

import gradio as gr

from explorer import serving, session
from explorer.panels.attention import build_attention
from explorer.panels.encoder_decoder import build_encoder_decoder
from explorer.panels.generation import build_generation
from explorer.panels.lora import build_lora
from explorer.panels.memory import build_memory
from explorer.panels.model import build_model
from explorer.panels.positions import build_positions
from explorer.panels.walkthrough import build_walkthrough

TITLE = "Transformer Explorer"
CSS = ".gradio-container {max-width: 1400px !important}"
TABS = [
    ("Inside the model", "walkthrough", build_walkthrough),
    ("Attention", "attention", build_attention),
    ("Positions", "positions", build_positions),
    ("Memory lab", "memory", build_memory),
    ("KV cache & generation", "generation", build_generation),
    ("LoRA", "lora", build_lora),
    ("Encoder vs decoder", "encoder_decoder", build_encoder_decoder),
    ("Model", "model", build_model),
]

# Concurrency per event, the queue's size and each session's share of it are set in explorer/serving.py.
QUEUE = {"default_concurrency_limit": 1, "max_size": serving.QUEUE_MAX_SIZE}
MAX_UPLOAD = "1mb"  # no component takes files, but Gradio's /upload route exists: keep it small


def launch_kwargs() -> dict:
    """Theme and CSS (Gradio 6 takes them in launch()). System fonts only: nothing is fetched from a CDN."""
    theme = gr.themes.Soft(font=["ui-sans-serif", "system-ui", "sans-serif"],
                           font_mono=["ui-monospace", "SFMono-Regular", "monospace"])
    return {"theme": theme, "css": CSS, "max_file_size": MAX_UPLOAD}


def build_demo() -> gr.Blocks:
    session.load_default()  # the shipped model, loaded once at start-up from assets/ (no network)
    with gr.Blocks(title=TITLE, analytics_enabled=False) as demo:  # no calls home from a classroom machine
        gr.Markdown(f"# {TITLE}\nA Llama-style decoder written from scratch, and what happens inside it. "
                    "Every number on screen is computed now, on this machine, by the code that is running.")
        state = gr.State(session.new_state())  # per browser session: the model this user looks at
        with gr.Tabs():
            for label, tab_id, build in TABS:
                with gr.Tab(label, id=tab_id, elem_id=f"tab-{tab_id}"):
                    build(demo, state)
    demo.queue(**QUEUE)
    return serving.apply(demo)


if __name__ == "__main__":
    build_demo().launch(server_name="0.0.0.0", **launch_kwargs())
