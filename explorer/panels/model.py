"""Model tab: pick the model this browser session looks at (the shipped default, a Hub id, or a local
folder under EXPLORER_MODEL_ROOT) and read its card: parameters by component, dtype, memory, config."""
from __future__ import annotations

import html
import re
from pathlib import Path

import gradio as gr

from explorer.web import link_model, links
from explorer.web.page import script
from explorer.web.clients import with_client
from explorer.web.groups import VIEW, lane
from explorer import measure
from explorer.state import session
from explorer.state import checkpoints
from explorer.figures.common import parameter_bars
from explorer.probes.families import differences_sentence, differences_table

from explorer.panels.errors import user_errors
from explorer.state.openings import cached_opening

INTRO = """### Model: what you are looking at
Every tab runs the model chosen here, for your browser session only (other visitors keep theirs). The shipped
default is a small Llama-style decoder trained on simple stories. You can also type a Hugging Face repo id such as
`HuggingFaceTB/SmolLM2-135M` (fetched only when this machine is online) or a checkpoint folder under
`{root}` (safetensors only: pickled weights are never loaded). Llama loads, and the families that change it in
a few named ways: Qwen2 / Qwen2.5, Qwen3, Gemma 3 (text) and Mistral, such as `Qwen/Qwen2.5-0.5B-Instruct`,
`Qwen/Qwen3-0.6B` or `google/gemma-3-270m`. The table under the chart says how the loaded model differs from
Llama, switch by switch, and which line of `models/` applies each switch."""
DIFFERS_HEADERS = ["switch", "this model", "Llama", "what it does", "applied at"]

def local_checkpoints() -> list[str]:
    """Folders under the allowed root that hold a config.json (what "a local folder" can name)."""
    root = checkpoints.model_root()
    try:
        found = sorted(str(p.parent.relative_to(root)) for p in root.glob("*/config.json"))
        found += sorted(str(p.parent.relative_to(root)) for p in root.glob("*/*/config.json"))
    except OSError:
        return []
    return found[:20]


def _card_text(folder: Path | None) -> str:
    if folder is None or not (folder / "README.md").is_file():
        return ""
    card = (folder / "README.md").resolve()
    shipped = folder == checkpoints.default_model_dir()
    if not shipped and not card.is_relative_to(checkpoints.model_root()):
        return "(This folder's README.md links outside the allowed model folder, so it is not shown.)"
    if not shipped and card.stat().st_nlink > 1:  # a hard link: the same file may also lie outside the root
        return ("(This folder's README.md is a hard link, the same file as one elsewhere on the server, so it is "
                "not shown: copy the card into the folder instead.)")
    text = card.read_text(errors="replace")
    text = re.sub(r"\A---\n.*?\n---\n", "", text, flags=re.S)  # drop YAML front matter
    # a card a visitor chose (any Hub repo) is their text: its HTML shows as text, its Markdown still formats
    return text[:20000] if shipped else html.escape(text[:20000], quote=False)


def _folder(state: dict) -> Path | None:
    src = (state or {}).get("source", "default")
    if src == "default":
        return checkpoints.default_model_dir()
    path = Path(src)
    return path if path.is_dir() else None


def _whose(model) -> str:
    if not session.is_shared(model):
        return "your own copy"
    if model is session.load_default()[0]:
        return "shared default (read-only)"
    return "one copy shared by every session that loaded it (read-only: a fine-tune makes your own)"


def model_card(state):
    """(summary markdown, parameter figure, config rows, model card markdown, rows of how the model differs from
    Llama) for the user's model."""
    model, _, name = session.get_model(state)
    c = model.config
    parts = measure.parameters_by_component(model)
    total = sum(parts.values())
    info = measure.runtime_info(model)
    held = measure.module_bytes(model)
    tied = "<br><sup>the LM head is tied to the embedding: counted once</sup>" if c.tie_embeddings else ""
    fig = parameter_bars(parts, total=total, title=f"{name} · {total:,} parameters by component{tied}")
    summary = (f"**{name}** · {total:,} parameters · dtype **{info['dtype']}** · device {info['device']} · "
               f"weights **{measure.format_bytes(held['parameters'])}** in memory "
               f"(+ {measure.format_bytes(held['buffers'])} of RoPE "
               f"tables) · torch {info['torch']} · {_whose(model)}"
               f"\n\n{differences_sentence(c)}")
    rows = [[k, str(v)] for k, v in c.to_dict().items()]
    rows += [["head_dim (derived)", str(c.head_dim)], ["n_kv_groups (derived)", str(c.n_kv_groups)]]
    card = _card_text(_folder(state))
    return summary, fig, rows, card, differences_table(c)


@user_errors
def load_model(source, state, progress=gr.Progress()):
    """Load ``source`` for this user; on any failure the model they had stays loaded."""
    state = state if state is not None else session.new_state()
    progress(0.1, desc="checking the source")
    model, tokenizer, name, cleaned = checkpoints.load_checkpoint(source)
    progress(0.9, desc="reading the card")
    if model is None:
        session.reset_to_default(state)
        status = "✅ Back to the shipped default model."
    else:
        session.set_model(state, model, tokenizer, name, cleaned)
        link_model.remember(state, source)  # the id the page's links carry from now on
        status = f"✅ Loaded **{name}** for your session: every tab now recomputes its view on it."
    summary, fig, rows, card, differs = model_card(state)
    return f"{status}\n\n{summary}", fig, rows, card, differs, state


def show_card(state):
    return model_card(state)


def build_model(demo: gr.Blocks, state: gr.State) -> None:
    gr.Markdown(INTRO.format(root=checkpoints.shown_root()))
    found = local_checkpoints()
    # the chart beside the source and its status, so it starts in the first screen (and fits a projector)
    with gr.Row():
        with gr.Column(scale=2, min_width=320):
            source = gr.Textbox(label="Model", value="default",
                                placeholder="default · HuggingFaceTB/SmolLM2-135M · default-model",
                                info="'default', a Hub repo id (owner/name), or a folder under the allowed root")
            with gr.Row():
                load = gr.Button("Load", variant="primary")
                reset = gr.Button("Back to default")
            if found:
                gr.Markdown("Local checkpoints under the allowed root: " + ", ".join(f"`{checkpoints.shown_name(f)}`" for f in found))
            status = gr.Markdown()
        with gr.Column(scale=3):
            bars = gr.Plot(label="Parameters by component", elem_id="model-params")
    differs = gr.Dataframe(headers=DIFFERS_HEADERS, label="How this model differs from Llama", interactive=False,
                           wrap=True)
    config = gr.Dataframe(headers=["setting", "value"], label="Config", interactive=False)
    with gr.Accordion("Model card (README.md of the checkpoint)", open=False):
        card = gr.Markdown()
    outputs = [status, bars, config, card, differs, state]
    loads = [load.click(with_client(load_model), [source, state], outputs, api_name="load_model", **lane(VIEW)),
             source.submit(with_client(load_model), [source, state], outputs, api_name="load_model_submit", api_visibility="private", **lane(VIEW)),
             reset.click(lambda: "default", None, [source], api_name="model_reset_text", api_visibility="private", **lane(VIEW)).then(
                 with_client(load_model), [source, state], outputs, api_name="model_reset", api_visibility="private", **lane(VIEW))]
    load.click(None, [source], None, js=script("model_load_start.js"), api_name="model_tab_loading", api_visibility="private")
    links.register(demo, "model", cached_opening("model_card", show_card), [state], [status, bars, config, card, differs],
                   api_name="model_card",
                   follow_model=False)
    links.register_model_loads(demo, *loads)
