"""Transformer Explorer: a Gradio app around a from-scratch Llama-style decoder and a classic encoder.

``python app.py`` serves it; ``build_demo()`` assembles the tabs from explorer/panels/ (tests launch it
in-process). Nothing else lives here.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import time

if __name__ == "__main__" and os.name == "posix" and "PYTHONMALLOC" not in os.environ:
    # Python's own arenas stay pinned after many sessions; glibc's heaps the sweeper can trim (bench/notes/memory.md)
    os.environ["PYTHONMALLOC"] = "malloc"
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])

if importlib.util.find_spec("spaces"):  # Hugging Face ZeroGPU: its package must load before torch sets up CUDA
    import spaces  # noqa: F401

import gradio as gr

from explorer import glossary

from explorer.web import links

from explorer.state import session

from explorer.web import serving

from explorer.web import gradio_adapter
from explorer.web import middleware
from explorer.web import page
from explorer.web.clients import with_client
from explorer.web.groups import VIEW, lane
from explorer.panels.attention import build_attention
from explorer.panels.deck import build_deck
from explorer.panels.encoder_decoder import build_encoder_decoder
from explorer.panels.experiments import build_experiments
from explorer.panels.generation import build_generation
from explorer.panels.lora import build_lora
from explorer.panels.memory import build_memory
from explorer.panels.model import build_model, load_model, local_checkpoints
from explorer.panels.positions import build_positions
from explorer.panels.training import build_training, connect_header
from explorer.state.snapshots import snapshot_names
from explorer.panels.walkthrough import build_walkthrough

TITLE = "Transformer Explorer"
# Lecture order: one token through the model, then attention and experiments that test it, positions, generation with its cache, what
# attention costs, adapting and shrinking the model, the encoder for contrast; the model card last.
TABS = [
    ("Inside the model", "walkthrough", build_walkthrough),
    ("Attention", "attention", build_attention),
    ("Experiments", "experiments", build_experiments),
    ("Training", "training", build_training),
    ("Positions", "positions", build_positions),
    ("KV cache & generation", "generation", build_generation),
    ("Memory lab", "memory", build_memory),
    ("LoRA & int8", "lora", build_lora),
    ("Encoder vs decoder", "encoder_decoder", build_encoder_decoder),
    ("Model", "model", build_model),
]


def save_tab_js(tab_id: str, fmt: str) -> str:
    """A button's JS: every figure of the tab ``tab_id`` saved as ``fmt``, one file each, in page order."""
    return page.script("save_tab.js", TAB_ID=tab_id, FORMAT=fmt)


def mark_terms(block) -> None:
    """Our texts in a tab (each Markdown's value at build time, never a visitor's) with the glossary's terms
    marked where they first appear: hovering one shows its definition."""
    for child in getattr(block, "children", []):
        if isinstance(child, gr.Markdown) and isinstance(child.value, str) and child.value:
            # set after construction, through the adapter: the panels make these Markdowns, and the page is built later
            gradio_adapter.set_initial(child, glossary.mark(child.value))
        mark_terms(child)


# Concurrency per event, the queue's size and each session's share of it are set in explorer/web/serving.py.
QUEUE = serving.QUEUE
MAX_UPLOAD = "1mb"  # per file; no component takes files, so explorer/middleware.py refuses every upload request


def launch_kwargs() -> dict:
    """Theme, the page's CSS and head script (Gradio 6 takes them in launch()). System fonts only: nothing is
    fetched from a CDN."""
    theme = gr.themes.Soft(font=["ui-sans-serif", "system-ui", "sans-serif"],
                           font_mono=["ui-monospace", "SFMono-Regular", "monospace"])
    return {"theme": theme, "css_paths": page.css_paths(), "head": page.head(),
            "max_file_size": MAX_UPLOAD, "app_kwargs": middleware.app_kwargs()}


#: For each app built with ``openings_later``: (the tab a page opens on, the status line of the openings).
OPENING_PLACES: dict = {}


def build_demo(openings_later: bool = False) -> gr.Blocks:
    """The whole app. With ``openings_later`` (``python app.py``) the opening examples are computed after the
    server answers (``serving.start_openings``, the page saying so meanwhile); otherwise here, before it returns."""
    started = time.time()
    session.load_default()  # the shipped model, loaded once at start-up from assets/ (no network)
    with gr.Blocks(title=TITLE, analytics_enabled=False, fill_width=True) as demo:  # no calls home
        state = gr.State(session.new_state())  # per browser session: the model this user looks at
        with gr.Row(elem_id="header-row", equal_height=True):
            gr.Markdown(f"## {TITLE}", scale=2, min_width=220, elem_id="header-title")
            picker = gr.Dropdown(["default", *local_checkpoints(), *snapshot_names()], value="default",
                                 allow_custom_value=True, show_label=False, container=False, scale=2, min_width=180, elem_id="header-model")
            load = gr.Button("Load model", variant="primary", scale=0, min_width=110, elem_id="header-load")
            projector = gr.Checkbox(label="Projector mode", value=False, scale=0, min_width=150, container=False,
                                    elem_id="projector")
            copy = gr.Button("🔗 Copy link to this view", scale=0, min_width=200, elem_id="copy-link")
            link = gr.Textbox(show_label=False, interactive=False, buttons=["copy"], container=False, scale=2,
                              min_width=180, elem_id="view-link", lines=1, max_lines=1,
                              placeholder="the view's link appears here")
        notice = gr.Textbox(label="About this link", visible=False, interactive=False, elem_id="link-notice")
        status = gr.Markdown(serving.COMPUTING_ALL, visible=openings_later, elem_id="opening-status")
        page_model = build_deck(demo, state, notice)  # ?lesson=<name>: the deck's bar; the model id links carry
        with gr.Accordion(about_label(started), open=False, elem_id="glossary"):
            gr.Markdown("A Llama-style decoder written from scratch, and what happens inside it. Every number on "
                        "screen is computed now, on this machine, by the code that is running. The model picker "
                        "above loads a model for every tab (a Hub id or a folder under the model root; the Model "
                        "tab shows its card).\n\n" + glossary.markdown())
        first_tab = None
        with gr.Tabs(overflow_behavior="wrap") as tabs:  # every tab in sight, on a phone too
            for label, tab_id, build in TABS:
                with gr.Tab(label, id=tab_id, elem_id=f"tab-{tab_id}") as tab:
                    first_tab = first_tab or tab  # the tab a page opens on
                    build(demo, state)
                    with gr.Row(elem_classes="save-figures"):
                        gr.Markdown("Save every figure of this tab, sized for a 1920×1080 slide:")
                        for fmt in ("png", "svg"):
                            gr.Button(f"⬇ {fmt.upper()}", size="sm", scale=0, min_width=90,
                                      elem_id=f"save-{tab_id}-{fmt}").click(
                                None, js=save_tab_js(tab_id, fmt), api_name=f"save_{tab_id}_{fmt}",
                                api_visibility="private")
                mark_terms(tab)
        card = links.views(demo)["model"].outputs
        links.register_model_loads(demo, load.click(with_client(load_model), [picker, state], [*card, state],
                                                    api_name="header_load_model", api_visibility="private", **lane(VIEW)))
        connect_header(demo, tabs, picker, card)  # "knock out at this step" loads a snapshot, opens Experiments
        load.click(None, [picker], None, js=page.script("model_load_start.js"), api_name="model_loading", api_visibility="private")
        links.wire(demo, tabs, notice, state, page_model)
        # the header names the model a link or a deck step loaded, not the "default" the page was built with
        page_model.change(None, [page_model], [picker], js="(m) => m", api_name="picker_shows_model",
                          api_visibility="private")
        inputs, js = links.copy_link_js(demo, page_model)
        copy.click(None, inputs, [link], js=js, api_name="copy_link", api_visibility="private")
        demo.load(None, None, [projector], js=page.script("page_load.js"), api_name="projector_from_link",
                  api_visibility="private")
        demo.load(None, js=page.script("model_loading.js"), api_name="model_loading_line", api_visibility="private")
        projector.change(None, [projector], None, js=page.script("projector.js"), api_name="projector",
                         api_visibility="private")
    demo.queue(**QUEUE)
    serving.apply(demo, openings_later=openings_later)  # computes every tab's opening example into the page
    if openings_later:
        OPENING_PLACES[demo] = (first_tab, status)
    return demo


def about_label(started: float) -> str:
    """The About line, always in sight: it says that the opening examples were computed at start-up, and when."""
    import datetime

    when = datetime.datetime.fromtimestamp(started, datetime.timezone.utc).strftime("%H:%M UTC")
    return f"About · glossary · each tab opens on an example computed at start-up ({when}); what you change is computed now"


def server_name(env=None) -> str:
    """Where ``python app.py`` listens: this machine only (127.0.0.1), unless on a Space (``SPACE_ID`` set: its
    proxy must reach the app) or the operator sets ``GRADIO_SERVER_NAME`` (0.0.0.0 opens it to a classroom's
    network on purpose: docs/operating.md)."""
    import os

    env = os.environ if env is None else env
    if env.get("GRADIO_SERVER_NAME"):
        return env["GRADIO_SERVER_NAME"]
    return "0.0.0.0" if env.get("SPACE_ID") else "127.0.0.1"


def main() -> None:
    """``python app.py``: the server answers first, then computes the opening examples (about as long again on
    2 cores), the page saying so and filling in."""
    demo = build_demo(openings_later=True)
    demo.launch(server_name=server_name(), prevent_thread_lock=True, **launch_kwargs())
    serving.start_openings(demo, *OPENING_PLACES[demo])
    demo.block_thread()


if __name__ == "__main__":
    main()
