"""Inside the model: one token of the prompt followed through the decoder, step by step, and the logit lens.

One hooked forward per (model, prompt, token) is kept in the shared result cache (the chosen token's values
only, ``explorer.probes.walkthrough.Walkthrough``), so the stepper, the previous/next buttons and the layer menu
redraw one step without running the model again. Nothing of it goes into ``gr.State``.
"""
from __future__ import annotations

import html
import time

import gradio as gr

from explorer.web import links
from explorer.web.groups import VIEW, lane
from lens.device import gpu
from explorer import measure
from explorer.state import session
from explorer.probes import walkthrough as wt
from explorer.figures import walkthrough as figs
from explorer.figures.common import head_label
from explorer.state.cache import results, weights_key

from explorer.panels.controls import as_index, as_whole, layer_choices
from explorer.panels.errors import short, user_errors
from explorer.state.openings import cached_opening
from explorer.panels import vote

MAX_TOKENS = 64
DEFAULT_PROMPT = "Once upon a time, there was a little"

INTRO = """### Inside the model: one token, step by step
Pick a token of your prompt and step through what the decoder does to it, from its row of the embedding table
to the probabilities of the next token. Every number is your prompt's real value, captured from the running
model by its hooks, and each step names the function in `models/` that computes it. Below, the **logit lens**
shows what the model would predict if it stopped after each layer: watch where the right answer appears."""


def walk_cached(model, ids: list[int], position: int) -> tuple[wt.Walkthrough, bool]:
    """(the walkthrough, whether it was already computed): one hooked forward per model, prompt, token and
    weights, kept in the shared result cache so the stepper's buttons redraw a step without running the model."""
    computed = []

    def walk() -> wt.Walkthrough:
        computed.append(True)
        return wt.walk(model, ids, position)

    # a user's own model may change between two clicks: its weights key changes with it
    result = results.get_or_compute(("walkthrough", weights_key(model), tuple(ids), position), walk)
    return result, not computed


def _position(token, n_tokens: int) -> int:
    if token is None or token == "":
        return n_tokens - 1
    return as_whole(token, "token position", 0, n_tokens - 1)


def _inputs(prompt, token, layer, step, state):
    """Validated (model, tokenizer, name, ids, labels, notice, position, layer, step)."""
    model, tokenizer, name = session.get_model(state)
    c = model.config
    ids, labels, notice = session.encode_with_notice(tokenizer, prompt, min(MAX_TOKENS, c.max_seq_len))
    position = _position(token, len(ids))
    layer = as_index(layer, c.n_layers, "layer")
    step = as_whole(step, "step", 0, len(wt.STEP_KEYS) - 1)
    return model, tokenizer, name, ids, labels, notice, position, layer, step


def _path(index: int) -> str:
    names = [wt.STEP_NAMES[k] for k in wt.STEP_KEYS]
    return " → ".join(f"**{n}**" if i == index else n for i, n in enumerate(names))


def _step_outputs(w: wt.Walkthrough, tokenizer, labels, layer: int, index: int):
    c = w.config
    step = w.step(index, layer, labels[w.position])
    heads = [head_label(h, c.n_heads, c.n_kv_heads) for h in range(c.n_heads)]
    kv_heads = [f"KV {j}" for j in range(c.n_kv_heads)]
    next_tokens = session.token_strings(tokenizer, [int(i) for i in step.arrays["ids"]]) if "ids" in step.arrays else ()
    note = ""
    if step.key == "logits":
        s = step.scalars
        note = f"all {c.vocab_size} logits: max {s['max']:.3f}, mean {s['mean']:.3f}, min {s['min']:.3f}"
    fig = figs.step_figure(step.key, step.arrays, title=step.title, keys=labels, heads=heads, kv_heads=kv_heads,
                           stream_rows=w.lens.rows, next_tokens=next_tokens, expanded=layer, note=note)
    code = " · ".join(f"`{ref}`" for ref in step.code)
    hooks = ", ".join(f"`{h}`" for h in step.hooks[:4]) + (f" and {len(step.hooks) - 4} more" if len(step.hooks) > 4
                                                           else "")
    md = (f"#### Step {index} of {len(wt.STEP_KEYS) - 1} · {step.title}\n{step.sentence}\n\n"
          f"Formula: `{step.formula}`\n\nComputed by {code} · values from the hooks {hooks}.\n\n"
          f"<small>{_path(index)}</small>")
    return fig, md, gr.Slider(value=index)


def _lens_figure(w: wt.Walkthrough, tokenizer, label: str):
    tokens = [session.token_strings(tokenizer, [int(i) for i in row]) for row in w.lens.ids]
    final = session.token_strings(tokenizer, [w.lens.final_id])[0]
    return figs.lens_figure(w.lens.rows, tokens, w.lens.ids, w.lens.probs, final, w.lens.final_probs,
                            title=f"Logit lens · {label} · each layer's stream through the final norm and LM head")


def _after(row: str) -> str:
    return "already at the embedding" if row == "embedding" else f"after {row}"


def _walkthrough(prompt, token, layer, step, state):
    t0 = time.perf_counter()
    model, tokenizer, name, ids, labels, notice, position, layer, step = _inputs(prompt, token, layer, step, state)
    w, cached = walk_cached(model, ids, position)
    fig, md, slider = _step_outputs(w, tokenizer, labels, layer, step)
    lens = _lens_figure(w, tokenizer, labels[position])
    top = session.token_strings(tokenizer, [int(w.top_ids[0])])[0]
    lens_hit = next((row for row, ids_ in zip(w.lens.rows, w.lens.ids[:, 0]) if int(ids_) == int(w.top_ids[0])), None)
    elapsed = time.perf_counter() - t0
    info = [f"**Model:** {name} · **{len(ids)} tokens** · following {labels[position]} (id {w.token_id}) · "
            f"{'reused the forward already run' if cached else 'one forward with every hook'}"
            f" · {elapsed * 1000:.0f} ms on {measure.runtime_info(model)['device']}.",
            f"Next token predicted: **{short(figs.display_token(top), 40)}** with "
            f"{100 * float(w.top_probs[0]):.1f}%"
            + (f"; the logit lens first ranks it on top {_after(lens_hit)}." if lens_hit else ".")]
    info.append("In the logit lens, the *embedding* row is the token's own vector sent straight to the LM head"
                + (" (tied to the embedding table, so it mostly predicts the token itself)" if model.config.tie_embeddings
                   else "") + "; the last row is the model's real prediction.")
    if notice:
        info.append(f"⚠️ {notice}")
    # A dropdown shows its labels as plain text: the entities that keep "<s>" literal in a plot would show.
    choices = [(html.unescape(lab), i) for i, lab in enumerate(labels)]
    return (fig, md, lens, "\n\n".join(info), gr.Dropdown(choices=choices, value=position),
            gr.Dropdown(choices=layer_choices(model.config.n_layers), value=layer), slider)


@user_errors
@gpu(30)
def walkthrough(prompt, token, layer, step, state):
    """The whole tab for one prompt, token, expanded layer and step."""
    model, _, _ = session.get_model(state)
    with session.threads_for(model):
        return _walkthrough(prompt, token, layer, step, state)


def _show_step(prompt, token, layer, step, state, delta: int = 0):
    model, tokenizer, _, ids, labels, _, position, layer, step = _inputs(prompt, token, layer, step, state)
    index = min(max(step + delta, 0), len(wt.STEP_KEYS) - 1)
    with session.threads_for(model):
        w, _ = walk_cached(model, ids, position)
        return _step_outputs(w, tokenizer, labels, layer, index)


@user_errors
@gpu(30)
def walkthrough_step(prompt, token, layer, step, state):
    """One step's figure and text (the forward reused when this prompt and token were just computed)."""
    return _show_step(prompt, token, layer, step, state)


@user_errors
@gpu(30)
def walkthrough_prev(prompt, token, layer, step, state):
    return _show_step(prompt, token, layer, step, state, -1)


@user_errors
@gpu(30)
def walkthrough_next(prompt, token, layer, step, state):
    return _show_step(prompt, token, layer, step, state, +1)


def forget_token(prompt):
    """A new prompt has other tokens: follow its last one until the user picks another."""
    return gr.Dropdown(choices=[], value=None)


def build_walkthrough(demo: gr.Blocks, state: gr.State) -> None:
    model, _, _ = session.get_model(None)
    n = len(wt.STEP_KEYS)
    gr.Markdown(INTRO)
    with gr.Row():
        with gr.Column(scale=2):
            prompt = gr.Textbox(label="Prompt", value=DEFAULT_PROMPT, lines=2, max_lines=6,
                                info=f"Up to {MAX_TOKENS} tokens; longer prompts are cut with a notice.")
            with gr.Row():
                token = gr.Dropdown(label="Token to follow", choices=[], value=None, allow_custom_value=True,
                                    info="Empty: the last token (whose next token the model predicts).")
                layer = gr.Dropdown(label="Layer to expand", choices=layer_choices(model.config.n_layers), value=0,
                                    allow_custom_value=True)
            run = gr.Button("Walk through", variant="primary")
            step = gr.Slider(0, n - 1, value=0, step=1, label=f"Step (0 = embedding … {n - 1} = next token)")
            with gr.Row():
                prev = gr.Button("◀ Previous step")
                nxt = gr.Button("Next step ▶")
            step_md = gr.Markdown()
        with gr.Column(scale=3):
            step_fig = gr.Plot(label="This step's values", elem_id="walkthrough-step")
    info = gr.Markdown()
    lens = gr.Plot(label="Logit lens", elem_id="walkthrough-lens")
    vote.ask_section(demo, "walkthrough", vote.next_token_question, [prompt, state], what="which token comes next?")

    inputs = [prompt, token, layer, step, state]
    outputs = [step_fig, step_md, lens, info, token, layer, step]
    step_outputs = [step_fig, step_md, step]
    run.click(walkthrough, inputs, outputs, api_name="walkthrough", **lane(VIEW))
    prompt.submit(walkthrough, inputs, outputs, api_name="walkthrough_submit", api_visibility="undocumented", **lane(VIEW))
    prompt.input(forget_token, [prompt], [token], api_name="walkthrough_prompt_edit", api_visibility="private", **lane(VIEW))
    token.input(walkthrough, inputs, outputs, api_name="walkthrough_token", api_visibility="private", **lane(VIEW))
    step.release(walkthrough_step, inputs, step_outputs, api_name="walkthrough_step", **lane(VIEW))
    layer.input(walkthrough_step, inputs, step_outputs, api_name="walkthrough_layer", api_visibility="private", **lane(VIEW))
    prev.click(walkthrough_prev, inputs, step_outputs, api_name="walkthrough_prev", **lane(VIEW))
    nxt.click(walkthrough_next, inputs, step_outputs, api_name="walkthrough_next", **lane(VIEW))
    links.register(demo, "walkthrough", cached_opening("walkthrough", walkthrough), inputs, outputs, api_name="walkthrough_example",
                   params=dict(prompt=prompt, layer=layer, step=step),
                   names=dict(step={key: i for i, key in enumerate(wt.STEP_KEYS)}),
                   resets={token: None},  # another tokenizer may cut the prompt into fewer tokens
                   focus=dict(step=step_fig, lens=lens))
