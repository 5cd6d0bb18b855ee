"""Attention tab: a prompt's tokens, one head's weights, every head at once, head scores, GQA groups,
the causal mask switched off, and naive vs fused attention compared live."""
from __future__ import annotations

import time
import weakref
from collections import OrderedDict
from typing import Any, NamedTuple

import gradio as gr
import numpy as np

from explorer import links
from explorer.device import gpu
from explorer import measure, probes, session
from explorer.figures import attention as figs
from explorer.figures.common import head_label, kv_head_of
from explorer.locks import MEMO_LOCK

from . import as_index, head_choices, layer_choices, outputs_of, user_errors

MAX_TOKENS = 64
DEFAULT_PROMPT = "Tom gave the red ball to Anna. Anna gave the red ball to Tom."
VIEWS = ["causal (as trained)", "bidirectional (mask removed)"]
SCORES_SHOWN = ("previous_token", "induction", "first_token")

INTRO = """### Attention: which earlier tokens each token reads
Each row of the heatmap is one token (the query) looking back at the tokens before it (the keys); a row's
weights sum to 1. Pick a layer and head, or jump to the head that scores highest as a *previous-token*,
*induction* or *sink* head. Heads labelled "(KV 1)" share key/value head 1 with the other heads of their group.
Clicking a cell of a chart does not select anything (Gradio's plot sends no click events): use the menus."""


def _score_choices(scores: dict, H: int, Hkv: int) -> list[tuple[str, str]]:
    out = []
    for name in SCORES_SHOWN:
        z = np.nan_to_num(np.asarray(scores[name], dtype=float), nan=-1.0)
        order = np.argsort(z, axis=None)[::-1][:3]
        for flat in order:
            layer, head = divmod(int(flat), H)
            label = (f"{figs.SCORE_TITLES[name]} · layer {layer} · {head_label(head, H, Hkv)} · "
                     f"{z[layer, head]:.2f}")
            out.append((label, f"{layer},{head}"))
    return out


_MEMO: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_MEMO_SIZE = 8


def _memo(model, key, compute):
    """Per-model results for the last few prompts, so switching layer or head does not rerun the model.

    Only for the shared default model, which never changes: a user's own model may be changed in place
    (LoRA attached or trained), so its results are always computed afresh.
    """
    if not session.is_shared(model):
        return compute()
    with MEMO_LOCK:
        entries = _MEMO.setdefault(model, OrderedDict())
        if key in entries:
            entries.move_to_end(key)
            return entries[key]
    value = compute()
    with MEMO_LOCK:
        entries[key] = value
        while len(entries) > _MEMO_SIZE:
            entries.popitem(last=False)
    return value


def _patterns(model, ids, causal):
    """(L, H, T, T) weights of every head and the sentence saying how they were obtained."""
    return _memo(model, ("patterns", tuple(ids), causal),
                 lambda: probes.patterns_with_source(model, ids, causal=causal))


def _head_scores(model, ids):
    """Previous-token and sink scores on the prompt (causal), induction on repeated random tokens.

    The induction probe does not depend on the prompt, so it runs once per model.
    """
    induction = _memo(model, ("induction",), lambda: probes.head_scores(model)["induction"])
    causal, _ = _patterns(model, ids, True)
    return {**probes.pattern_scores(causal[:, None], ids), "induction": induction}  # (L, 1, H, T, T) patterns


class AttentionView(NamedTuple):
    """What the Attention tab shows for one prompt, layer, head and mask (the event's outputs, in order)."""
    heatmap: Any  # plotly Figure: the chosen head's weights
    tokens: list  # rows [position, token, id]
    info: str
    grid: Any  # plotly Figure: every layer and head
    scores: Any  # plotly Figure: head scores
    gqa: Any  # plotly Figure: which query heads share a KV head
    gqa_md: str
    impl_md: str
    layer: Any  # gr.Dropdown update
    head: Any  # gr.Dropdown update
    pick: Any  # gr.Dropdown update: heads to jump to by score


def _attention_view(prompt, layer, head, view, state):
    """Everything the tab shows for one prompt, layer, head and mask view."""
    t0 = time.perf_counter()
    model, tokenizer, name = session.get_model(state)
    c = model.config
    L, H, Hkv = c.n_layers, c.n_heads, c.n_kv_heads
    layer = as_index(layer, L, "layer")
    head = as_index(head, H, "head")
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}, got {view!r}.")
    causal = view == VIEWS[0]
    ids, labels, notice = session.encode_with_notice(tokenizer, prompt, min(MAX_TOKENS, c.max_seq_len))

    patterns, source = _patterns(model, ids, causal)  # (L, H, T, T)
    heat = figs.attention_heatmap(patterns[layer, head], labels, layer=layer, head=head, n_heads=H,
                                  n_kv_heads=Hkv, causal=causal)
    grid = figs.attention_grid(patterns, labels, n_kv_heads=Hkv, causal=causal)

    scores = _head_scores(model, ids)
    scores_fig = figs.head_scores_figure(
        {k: scores[k] for k in SCORES_SHOWN}, n_kv_heads=Hkv, selected=(layer, head),
        subtitle="previous-token and sink on your prompt (causal); induction on repeated random tokens",
    )
    gqa = figs.gqa_figure(H, Hkv)
    diffs = _memo(model, ("impls", tuple(ids), causal), lambda: probes.compare_impls(model, ids, causal=causal))

    shown = session.token_strings(tokenizer, ids)
    table = [[i, tok, int(t)] for i, (tok, t) in enumerate(zip(shown, ids))]
    group = c.n_kv_groups
    gqa_rows = "\n".join(
        f"| KV {j} | {', '.join(str(h) for h in range(j * group, (j + 1) * group))} |" for j in range(Hkv))
    gqa_md = (f"**{H} query heads, {Hkv} key/value heads**: each KV head is read by {group} query head(s); "
              f"the KV cache stores {Hkv} heads per layer instead of {H}.\n\n| KV head | query heads |\n|---|---|\n"
              f"{gqa_rows}\n\nSelected: {head_label(head, H, Hkv)} reads KV head {kv_head_of(head, H, Hkv)}.")
    info = [f"**Model:** {name} · **{len(ids)} tokens** · layer {layer} · {head_label(head, H, Hkv)} · "
            f"{'causal' if causal else 'bidirectional view (the model was trained causal)'}"]
    if notice:
        info.append(f"⚠️ {notice}")
    info.append(f"Weights shown: {source}.")
    elapsed = time.perf_counter() - t0
    run = measure.runtime_info(model)
    info.append(f"Computed in {elapsed * 1000:.0f} ms on {run['device']}.")
    impl_md = (f"**Naive vs fused attention, computed now on this prompt** "
               f"({'causal' if causal else 'bidirectional'}): max |Δlogit| SDPA − naive = "
               f"**{diffs['sdpa']:.3g}**, tiled (flash) − naive = **{diffs['tiled']:.3g}** "
               f"({run['dtype']}; differences at rounding level mean the three paths "
               f"compute the same function).")
    picks = _score_choices(scores, H, Hkv)
    return AttentionView(heatmap=heat, tokens=table, info="\n\n".join(info), grid=grid, scores=scores_fig, gqa=gqa,
                         gqa_md=gqa_md, impl_md=impl_md, layer=gr.Dropdown(choices=layer_choices(L), value=layer),
                         head=gr.Dropdown(choices=head_choices(H, Hkv), value=head),
                         pick=gr.Dropdown(choices=picks, value=None))


@user_errors
@gpu(30)
def attention_view(prompt, layer, head, view, state) -> AttentionView:
    model, _, _ = session.get_model(state)
    with session.threads_for(model):
        return _attention_view(prompt, layer, head, view, state)


@user_errors
def jump_to_head(pick):
    if not pick:
        raise ValueError("Choose a head from the list.")
    try:
        layer, head = (int(x) for x in str(pick).split(","))
    except ValueError:  # not "layer,head": not from the list
        raise ValueError(f"Choose a head from the list (got {str(pick)[:40]!r}).") from None
    return layer, head


def build_attention(demo: gr.Blocks, state: gr.State) -> None:
    model, _, _ = session.get_model(None)
    c = model.config
    gr.Markdown(INTRO)
    with gr.Row():
        with gr.Column(scale=2):
            prompt = gr.Textbox(label="Prompt", value=DEFAULT_PROMPT, lines=2, max_lines=6,
                                info=f"Up to {MAX_TOKENS} tokens are shown; longer prompts are cut with a notice.")
            with gr.Row():
                layer = gr.Dropdown(label="Layer", choices=layer_choices(c.n_layers), value=0,
                                    allow_custom_value=True)
                head = gr.Dropdown(label="Head (its KV head)", choices=head_choices(c.n_heads, c.n_kv_heads),
                                   value=0, allow_custom_value=True)
            view = gr.Radio(VIEWS, value=VIEWS[0], label="Mask")
            run = gr.Button("Show attention", variant="primary")
            tokens = gr.Dataframe(headers=["position", "token", "id"], label="Tokens and their ids",
                                  interactive=False, max_height=360)
        with gr.Column(scale=3):
            heat = gr.Plot(label="Attention weights of the chosen head")
    info = gr.Markdown()
    impl_md = gr.Markdown()
    grid = gr.Plot(label="All layers × all heads")
    with gr.Row():
        with gr.Column(scale=3):
            pick = gr.Dropdown(label="Jump to a head by its score", choices=[], value=None)
            scores = gr.Plot(label="Head scores")
        with gr.Column(scale=2):
            gqa = gr.Plot(label="Grouped-query attention: which query heads share a KV head")
            gqa_md = gr.Markdown()

    inputs = [prompt, layer, head, view, state]
    outputs = outputs_of(AttentionView, heatmap=heat, tokens=tokens, info=info, grid=grid, scores=scores, gqa=gqa,
                         gqa_md=gqa_md, impl_md=impl_md, layer=layer, head=head, pick=pick)
    run.click(attention_view, inputs, outputs, api_name="attention")
    prompt.submit(attention_view, inputs, outputs, api_name="attention_submit", api_visibility="undocumented")
    for control in (layer, head, view):
        control.input(attention_view, inputs, outputs, api_name=f"attention_{control.label.split()[0].lower()}",
                      api_visibility="private")
    pick.input(jump_to_head, [pick], [layer, head], api_name="attention_jump", api_visibility="private").success(
        attention_view, inputs, outputs, api_name="attention_after_jump", api_visibility="private")
    links.register(demo, "attention", attention_view, inputs, outputs, api_name="attention_example",
                   params=dict(prompt=prompt, layer=layer, head=head, mask=view))
