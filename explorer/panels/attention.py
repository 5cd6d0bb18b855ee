"""Attention tab: a prompt's tokens, one head's weights, every head at once, head scores, GQA groups,
the causal mask switched off, and naive vs fused attention compared live.

The first answer runs one forward (weights and prediction) and the induction probe; the naive-vs-fused
comparison (two more forwards) follows it as its own event (``attention_impls``), reusing that forward's
output, so the heatmap never waits for it."""
from __future__ import annotations

import time
import urllib.parse
from typing import Any, NamedTuple

import gradio as gr
import numpy as np

from explorer.web import links
from explorer.web.groups import VIEW, lane
from lens.device import gpu
from explorer import jobs, measure, probes
from lens import heads
from explorer.state import session
from explorer.state.cache import results, weights_key
from explorer.figures import attention as figs
from explorer.figures.common import head_label, kv_head_of
from explorer.probes.families import local_layers_sentence

from explorer.panels.controls import as_index, head_choices, layer_choices, outputs_of
from explorer.panels.errors import user_errors
from explorer.panels import vote

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


SPANS = (8, 16, 32, 64, 120)
PROMPT_SPAN = "your prompt (it repeats)"
TOP_K = 5


def span_choices(config) -> list[str]:
    """The induction spans that fit the model: ``[BOS] + r + r`` within its context, ``r`` distinct tokens."""
    n_prefix = 0 if config.bos_token_id is None else 1
    fit = [n for n in SPANS if n_prefix + 2 * n <= config.max_seq_len and n <= config.vocab_size - n_prefix]
    return [str(n) for n in fit] + [PROMPT_SPAN]


def _forward(model, ids, causal, wk=None) -> probes.PromptForward:
    """The prompt's one forward (every head's weights and the next-token prediction), shared by every session
    and every layer/head/span/display switch that asks the same question of the same weights."""
    wk = weights_key(model) if wk is None else wk  # reading every parameter's version costs ~ms on 30 layers
    return results.get_or_compute(("attention.forward", wk, tuple(ids), causal),
                                  lambda: probes.prompt_forward(model, ids, causal=causal, top_k=TOP_K))


def _induction(model, ids, span: str, wk) -> tuple[np.ndarray, str]:
    """(L, H) induction scores at the chosen span and the sentence saying what they were measured on."""
    if span == PROMPT_SPAN:
        n = heads.repeated_suffix_len(ids)
        if n == 0:
            raise ValueError("Your prompt does not end with a repeated stretch of tokens (… A B C A B C), so it "
                             "cannot be scored for induction: repeat part of it, or choose a span.")
        causal = _forward(model, ids, True, wk)["patterns"]  # (L, H, T, T)
        scores = results.get_or_compute(("attention.prompt_induction", wk, tuple(ids)),
                                        lambda: heads.induction_score(causal[:, None], n).numpy())  # (L, H)
        return scores, f"induction on your prompt's repeated last {n} tokens"
    if span not in span_choices(model.config):
        raise ValueError(f"Induction span must be one of {span_choices(model.config)}, got {str(span)[:40]!r}.")
    n = int(span)
    scores = jobs.experiments.within_cap(  # a long span on a large model: capped, like the experiments
        lambda: results.get_or_compute(("attention.induction", wk, n),
                                       lambda: heads.induction_scores(model, n)),
        f"the induction scores at span {n}", "choose a shorter span")
    return scores, f"induction on 4 rows of random tokens repeated at span {n}"


def _head_scores(model, ids, span: str, wk) -> tuple[dict, str]:
    """Previous-token and sink scores on the prompt (causal), induction at the chosen span."""
    causal = _forward(model, ids, True, wk)["patterns"]
    on_prompt = results.get_or_compute(("attention.prompt_scores", wk, tuple(ids)),
                                       lambda: probes.pattern_scores(causal[:, None], ids))  # (L, 1, H, T, T)
    induction, how = _induction(model, ids, span, wk)
    return {**on_prompt, "induction": induction}, how


def describe_head(weights: np.ndarray, layer: int, head: int, n_heads: int, n_kv_heads: int,
                  scores: dict) -> str:
    """One sentence on what the selected head measurably does on this prompt (causal weights, (T, T))."""
    name = f"Layer {layer} · {head_label(head, n_heads, n_kv_heads)}"
    if len(weights) < 2:
        return f"{name}: one token, so every query can only look at itself."
    profile = heads.offset_profile(weights).numpy()  # (T,) share of the rows' weight d tokens back, key 0 apart
    d = int(np.argmax(profile[1:]) + 1)
    sink = float(np.mean(weights[1:, 0]))
    where = "the previous token" if d == 1 else f"the token {d} back"
    parts = [f"On this prompt, {name} puts **{profile[d]:.2f}** of its weight on {where} (its most attended "
             f"distance), {profile[0]:.2f} on the token itself and {sink:.2f} on token 0 (the sink)"]
    score = ", ".join(f"{figs.SCORE_TITLES[k]} {float(scores[k][layer, head]):.2f}" for k in SCORES_SHOWN)
    parts.append(f"its scores: {score}")
    return "; ".join(parts) + ". Shares are mean weights over queries 1 … T−1 (query 0 sees only itself)."


def test_link(prompt: str, layer: int, head: int) -> str:
    """The Experiments tab's link that knocks this head out on this prompt (percent-encoded: never markup). The page
    opens it in the same tab with its model and projector mode added (explorer/web/page/link.js)."""
    query = urllib.parse.urlencode({"tab": "experiments", "heads": f"{layer}.{head}",
                                    "prompt": session.clean_text(prompt)[:links.MAX_TEXT], "focus": "loss"},
                                   quote_via=urllib.parse.quote)
    return f"?{query}"


class AttentionView(NamedTuple):
    """What the Attention tab shows for one prompt, layer, head and mask (the event's outputs, in order)."""
    heatmap: Any  # plotly Figure: the chosen head's weights
    tokens: list  # rows [position, token, id]
    info: str
    grid: Any  # plotly Figure: every layer and head
    scores: Any  # plotly Figure: head scores
    gqa: Any  # plotly Figure: which query heads share a KV head
    gqa_md: str
    layer: Any  # gr.Dropdown update
    head: Any  # gr.Dropdown update
    pick: Any  # gr.Dropdown update: heads to jump to by score
    prediction: list  # rows [rank, token, id, probability]: the next token after the prompt
    head_md: str  # what the selected head measurably does


SINK_CHOICE = "hide the sink (drop key 0, renormalise rows)"


def default_span(config) -> str:
    """32 where it fits (the span the scores panel opens on), else the longest that does."""
    fit = span_choices(config)[:-1]
    return "32" if "32" in fit else (fit[-1] if fit else PROMPT_SPAN)


def _attention_view(prompt, layer, head, view, state, span=None, sink=False):
    """Everything the tab shows for one prompt, layer, head, mask view, induction span and sink display."""
    t0 = time.perf_counter()
    model, tokenizer, name = session.get_model(state)
    c = model.config
    L, H, Hkv = c.n_layers, c.n_heads, c.n_kv_heads
    layer = as_index(layer, L, "layer")
    head = as_index(head, H, "head")
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}, got {view!r}.")
    if not isinstance(sink, bool):
        raise ValueError(f"the sink option is on or off (true/false), got {str(sink)[:40]!r}.")
    span = default_span(c) if span is None else str(span)
    causal = view == VIEWS[0]
    ids, labels, notice = session.encode_with_notice(tokenizer, prompt, min(MAX_TOKENS, c.max_seq_len))

    wk = weights_key(model)
    fwd = _forward(model, ids, causal, wk)
    patterns, source = fwd["patterns"], fwd["source"]  # (L, H, T, T)
    shown_heat = heads.without_sink(patterns[layer, head]).numpy() if sink else patterns[layer, head]
    heat = figs.attention_heatmap(shown_heat, labels, layer=layer, head=head, n_heads=H,
                                  n_kv_heads=Hkv, causal=causal, sink_hidden=sink, window=c.layer_window(layer))
    page = figs.grid_page(layer, L)

    def grid_figure():
        p = heads.without_sink(patterns[page.start:page.stop]).numpy() if sink else patterns[page.start:page.stop]
        return figs.attention_grid(p, labels, n_kv_heads=Hkv, causal=causal, layers=range(len(page)),
                                   layer_names=page, n_layers=L, sink_hidden=sink)

    grid = results.get_or_compute(("attention.grid", wk, tuple(ids), causal, page.start, sink), grid_figure)

    scores, how = _head_scores(model, ids, span, wk)
    scores_fig = figs.head_scores_figure(
        {k: scores[k] for k in SCORES_SHOWN}, n_kv_heads=Hkv, selected=(layer, head),
        subtitle=f"previous-token and sink on your prompt (causal); {how}",
    )
    gqa = results.get_or_compute(("attention.gqa", H, Hkv), lambda: figs.gqa_figure(H, Hkv))

    shown = session.token_strings(tokenizer, ids)
    table = [[i, tok, int(t)] for i, (tok, t) in enumerate(zip(shown, ids))]
    top = session.token_strings(tokenizer, [int(i) for i in fwd["top_ids"]])
    prediction = [[rank + 1, tok, int(i), round(float(p), 4)]
                  for rank, (tok, i, p) in enumerate(zip(top, fwd["top_ids"], fwd["top_probs"]))]
    causal_patterns = _forward(model, ids, True, wk)["patterns"]
    head_md = describe_head(causal_patterns[layer, head], layer, head, H, Hkv, scores)
    head_md += f" [Test this head: knock it out and measure →]({test_link(prompt, layer, head)})"
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
    local = local_layers_sentence(c, layer)
    if local:
        info.append(local)
    info.append(f"Weights shown: {source}." + (" Sink hidden: key 0 is dropped and each row renormalised over the "
                                               "keys left (row 0, which sees only key 0, is blank)." if sink else ""))
    info.append(f"The grid shows layers {page.start}–{page.stop - 1} of {L}: the block of "
                f"{figs.GRID_PAGE} holding the selected layer (pick another layer to page).")
    elapsed = time.perf_counter() - t0
    run = measure.runtime_info(model)
    info.append(f"Computed in {elapsed * 1000:.0f} ms on {run['device']} (one forward per prompt and mask, "
                f"reused for every layer, head and display switch).")
    picks = _score_choices(scores, H, Hkv)
    return AttentionView(heatmap=heat, tokens=table, info="\n\n".join(info), grid=grid, scores=scores_fig, gqa=gqa,
                         gqa_md=gqa_md, layer=gr.Dropdown(choices=layer_choices(L), value=layer),
                         head=gr.Dropdown(choices=head_choices(H, Hkv), value=head),
                         pick=gr.Dropdown(choices=picks, value=None), prediction=prediction, head_md=head_md)


@user_errors
@gpu(30)
def attention_view(prompt, layer, head, view, state, span=None, sink=False) -> AttentionView:
    model, _, _ = session.get_model(state)
    with session.threads_for(model):
        return _attention_view(prompt, layer, head, view, state, span, sink)


def _compare(model, tokenizer, prompt, view) -> str:
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}, got {view!r}.")
    causal = view == VIEWS[0]
    ids, _, _ = session.encode_with_notice(tokenizer, prompt, min(MAX_TOKENS, model.config.max_seq_len))
    wk = weights_key(model)

    def compare():
        fwd = _forward(model, ids, causal, wk)  # the first answer's forward, from the cache
        return probes.compare_impls(model, ids, causal=causal, known={fwd["attn_impl"]: fwd["logits"]})

    diffs = results.get_or_compute(("attention.impls", wk, tuple(ids), causal), compare)
    return (f"**Naive vs fused attention, computed on this prompt** "
            f"({'causal' if causal else 'bidirectional'}): max |Δlogit| SDPA − naive = "
            f"**{diffs['sdpa']:.3g}**, tiled (flash) − naive = **{diffs['tiled']:.3g}** "
            f"({measure.runtime_info(model)['dtype']}; differences at rounding level mean the three paths "
            f"compute the same function).")


@user_errors
@gpu(30)
def attention_impls(prompt, view, state) -> str:
    """Max |Δlogit| of SDPA and tiled attention against naive on the prompt: the follow-up of every Attention
    answer (the forward the answer ran is one of the three; the other two run here, once per prompt and mask)."""
    model, tokenizer, _ = session.get_model(state)
    with session.threads_for(model):
        return _compare(model, tokenizer, prompt, view)


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
            with gr.Row():
                sink = gr.Checkbox(label=SINK_CHOICE, value=False,
                                   info="Many heads park most weight on token 0; this shows where the rest goes.")
                span = gr.Dropdown(label="Induction span (tokens repeated)", choices=span_choices(c), value=default_span(c),
                                   allow_custom_value=True)
            run = gr.Button("Show attention", variant="primary")
            tokens = gr.Dataframe(headers=["position", "token", "id"], label="Tokens and their ids",
                                  interactive=False, max_height=360)
        with gr.Column(scale=3):
            heat = gr.Plot(label="Attention weights of the chosen head", elem_id="attention-heatmap")
            # the sentence that measures what the figure shows, right under it (a link's focus=heatmap shows both)
            head_md = gr.Markdown(elem_id="attention-head-sentence")
    prediction = gr.Dataframe(headers=["rank", "next token", "id", "probability"],
                              label=f"What the model predicts next (top {TOP_K}, same forward)",
                              interactive=False)
    info = gr.Markdown()
    impl_md = gr.Markdown()
    grid = gr.Plot(label="All layers × all heads", elem_id="attention-grid")
    with gr.Row():
        with gr.Column(scale=3):
            pick = gr.Dropdown(label="Jump to a head by its score", choices=[], value=None)
            scores = gr.Plot(label="Head scores", elem_id="attention-scores")
        with gr.Column(scale=2):
            gqa = gr.Plot(label="Grouped-query attention: which query heads share a KV head", elem_id="attention-gqa")
            gqa_md = gr.Markdown()

    vote.ask_section(demo, "attention", vote.attention_question, [prompt, layer, head, state],
                     what="which token does this head look at?")

    inputs = [prompt, layer, head, view, state, span, sink]
    outputs = outputs_of(AttentionView, heatmap=heat, tokens=tokens, info=info, grid=grid, scores=scores, gqa=gqa,
                         gqa_md=gqa_md, layer=layer, head=head, pick=pick, prediction=prediction, head_md=head_md)
    # Every answer is followed by the naive-vs-fused comparison for its prompt and mask: computed once, then
    # served from the cache (a layer or head switch on the same prompt gets it in milliseconds).
    impl_inputs = [prompt, view, state]

    def then_compare(event, api: str, visibility: str = "private"):
        event.then(attention_impls, impl_inputs, impl_md, api_name=api, api_visibility=visibility, **lane(VIEW))

    then_compare(run.click(attention_view, inputs, outputs, api_name="attention", **lane(VIEW)), "attention_impls", "public")
    then_compare(prompt.submit(attention_view, inputs, outputs, api_name="attention_submit",
                               api_visibility="undocumented", **lane(VIEW)), "attention_impls_submit", "undocumented")
    for control, api in ((layer, "layer"), (head, "head"), (view, "mask"), (span, "span"), (sink, "sink")):
        then_compare(control.input(attention_view, inputs, outputs, api_name=f"attention_{api}",
                                   api_visibility="private", **lane(VIEW)), f"attention_impls_{api}")
    then_compare(pick.input(jump_to_head, [pick], [layer, head], api_name="attention_jump",
                            api_visibility="private", **lane(VIEW)).success(
        attention_view, inputs, outputs, api_name="attention_after_jump", api_visibility="private", **lane(VIEW)),
        "attention_impls_after_jump")
    links.register(demo, "attention", attention_view, inputs, outputs, api_name="attention_example",
                   params=dict(prompt=prompt, layer=layer, head=head, mask=view, span=span, sink=sink),
                   then=[(attention_impls, impl_inputs, [impl_md], "attention_impls_example")],
                   focus=dict(heatmap=[heat, head_md], grid=grid, scores=scores))
