"""Experiments tab: test a claim about a head by changing the model and measuring what changes.

Knock heads out (their output z set to 0 or to its mean) and read the loss per token and the next-token
prediction before and after; knock out each head in turn and set what it does beside what its scores say it
looks like; patch activations from a clean prompt into a corrupted one; test the induction circuit by knocking
out its two heads. Every number comes from ``explorer.interventions`` on the loaded model.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, NamedTuple

import gradio as gr
import numpy as np
import torch

from explorer import interventions as iv
from explorer import jobs, measure
from explorer.figures import experiments as figs
from explorer.figures.common import head_label, provenance_text
from explorer.measure.run import STILL_RUNNING
from explorer.state import session
from explorer.state.cache import results, weights_key
from explorer.state.openings import cached_opening
from explorer.web import links
from explorer.web.groups import MEASURE, VIEW, lane
from lens import heads as head_kinds
from lens.device import gpu, to_host

from . import outputs_of, user_errors
from . import vote
from .heads import HOWS, head_options, head_value, parse_heads  # noqa: F401 (the tab's names)

MAX_TOKENS = 64
# A list of words given twice: the second time through, a model with induction heads copies (the shipped
# decoder was trained on such spans); the patching pair differs in one word of the first copy.
DEFAULT_PROMPT = "apple river green chair moon seven bread lamp apple river green chair moon seven bread lamp"
CLEAN = "apple river green chair moon seven bread lamp apple river green"
CORRUPT = "apple river green table moon seven bread lamp apple river green"
GOOD, BAD = " chair", " table"
CIRCUIT_SPAN = 32
CIRCUIT_ROWS = 8
TOP_K = 5

INTRO = """### Experiments: switch a head off, or swap an activation, and measure what changes
A head's scores say what it *looks like*; knocking it out says what it *does*. Pick heads and press
**Knock out**: the chart shows how surprised the model is by each next token (its loss, in nats) with and
without them. **Each head in turn** sets every head's effect beside its scores. **Patch** runs a corrupted prompt
with one activation taken from a clean one and shows how much of the clean answer comes back."""


def check_how(how) -> str:
    if how not in HOWS:
        raise ValueError(f"knock-out must be one of {list(HOWS)}, got {str(how)[:40]!r}.")
    return HOWS[how]


def _scores(model, wk) -> dict:
    """Previous-token and induction scores (L, H) on repeated random tokens, shared by every session."""
    c = model.config
    n_prefix = 0 if c.bos_token_id is None else 1
    span = min(CIRCUIT_SPAN, (c.max_seq_len - n_prefix) // 2, c.vocab_size - n_prefix)
    return results.get_or_compute(("experiments.scores", wk, span),
                                  lambda: dict(head_kinds.head_scores(model, span_len=span), span=span))


def best_heads(model) -> dict:
    """The model's best induction head, and the best previous-token head in an earlier layer (its feeder)."""
    s = _scores(model, weights_key(model))
    ind = np.nan_to_num(np.asarray(s["induction"], dtype=float), nan=-1)
    li, hi = (int(x) for x in np.unravel_index(np.argmax(ind), ind.shape))
    prev = np.nan_to_num(np.asarray(s["previous_token"], dtype=float), nan=-1)[:max(li, 1)]
    lp, hp = (int(x) for x in np.unravel_index(np.argmax(prev), prev.shape))
    return {"induction": (li, hi), "previous": (lp, hp), "scores": s}


def default_heads(model) -> list[str]:
    li, hi = best_heads(model)["induction"]
    return [head_value(li, hi)]


class KnockoutView(NamedTuple):
    loss: Any  # plotly Figure: loss per token before and after
    top: list  # rows [rank, before, p, after, p]
    summary: str
    heads: Any  # gr.Dropdown update: this model's heads, the chosen ones selected


def _encode(tokenizer, model, text, what: str):
    ids, labels, notice = session.encode_with_notice(tokenizer, text, min(MAX_TOKENS, model.config.max_seq_len))
    if len(ids) < 2:
        raise ValueError(f"the {what} needs at least 2 tokens: type a longer text.")
    return ids, labels, notice


def _knockout(prompt, chosen, how, state) -> KnockoutView:
    model, tokenizer, name = session.get_model(state)
    iv.check_decoder(model)
    pairs, mode = parse_heads(chosen, model), check_how(how)
    ids, labels, notice = _encode(tokenizer, model, prompt, "prompt")
    wk = weights_key(model)

    def compute():
        r = iv.knockout_before_after(model, torch.tensor([ids]), pairs, how=mode)
        return {"before": to_host(r["before"].float()), "after": to_host(r["after"].float()),
                "p_before": to_host(r["p_before"]), "p_after": to_host(r["p_after"])}

    r = results.get_or_compute(("experiments.knockout", wk, tuple(ids), tuple(pairs), mode), compute)
    n_rep = head_kinds.repeated_suffix_len(ids)
    repeated_from = len(ids) - n_rep - 1 if n_rep else None  # index into the predicted tokens (ids[1:])
    c = model.config
    named = ", ".join(f"layer {lay} · {head_label(h, c.n_heads, c.n_kv_heads)}" for lay, h in pairs)
    run = measure.runtime_info(model)
    fig = figs.loss_per_token_figure(
        labels[1:], r["before"], r["after"], repeated_from=repeated_from,
        title=f"Loss per token · before and after knocking out {named}",
        provenance=provenance_text(run["device"], run["dtype"], run["torch"], "computed"))
    order_b, order_a = np.argsort(-r["p_before"])[:TOP_K], np.argsort(-r["p_after"])[:TOP_K]
    tb = session.token_strings(tokenizer, [int(i) for i in order_b])
    ta = session.token_strings(tokenizer, [int(i) for i in order_a])
    top = [[k + 1, tb[k], round(float(r["p_before"][order_b[k]]), 4), ta[k], round(float(r["p_after"][order_a[k]]), 4)]
           for k in range(len(order_b))]
    mean_b, mean_a = float(np.mean(r["before"])), float(np.mean(r["after"]))
    parts = [f"**Knocking out {named}** ({'zeroed' if mode == 'zero' else 'set to its mean'}) changes the mean loss "
             f"over this prompt's {len(ids) - 1} predictions from **{mean_b:.3f}** to **{mean_a:.3f}** nats per token "
             f"({mean_a - mean_b:+.3f})."]
    if repeated_from is not None:
        rb, ra = float(np.mean(r["before"][repeated_from:])), float(np.mean(r["after"][repeated_from:]))
        parts.append(f"On the repeated part (the last {n_rep} tokens, shaded) it goes from **{rb:.3f}** to "
                     f"**{ra:.3f}** ({ra - rb:+.3f}): copying from the first time round is what an induction head "
                     "does.")
    parts.append(f"Model: {name}. Computed now, on {run['device']}, by `explorer/interventions.py`.")
    if notice:
        parts.append(f"⚠️ {notice}")
    return KnockoutView(loss=fig, top=top, summary=" ".join(parts),
                        heads=gr.Dropdown(choices=head_options(model), value=[head_value(*p) for p in pairs],
                                                      multiselect=True))


@user_errors
@gpu(60)
def knockout_view(prompt, chosen, how, state) -> KnockoutView:
    model, _, _ = session.get_model(state)
    with session.threads_for(model):
        return _knockout(prompt, chosen, how, state)


def _sweep_updates(prompt, how, state):
    """The sweep as it computes (``jobs.experiments.capped``): (figure, text) updates, ``None`` while a layer
    computes; the last is the answer, the layers it completed when the time cap ended it."""
    model, tokenizer, name = session.get_model(state)
    iv.check_decoder(model)
    mode = check_how(how)
    ids, labels, _ = _encode(tokenizer, model, prompt, "prompt")
    wk = weights_key(model)
    key = ("experiments.sweep", wk, tuple(ids), mode)
    r = results.get(key)
    if r is not None:
        yield _sweep_answer(model, ids, mode, name, r, wk)
        return
    cap = jobs.experiments.EXPERIMENT_SECONDS
    for u in jobs.experiments.capped(model, lambda: iv.iter_knockout_sweep(model, [ids], how=mode), cap_s=cap):
        if u is STILL_RUNNING:
            yield None
        elif u.finished:
            results.put(key, u.result)
            yield _sweep_answer(model, ids, mode, name, u.result, wk)
        elif u.capped:
            if not u.done:
                raise ValueError(f"no layer of the sweep finished within its {cap:g} s limit: use a shorter prompt "
                                 "or a smaller model.")
            knocked = u.result["knocked"].clone()
            knocked[u.done:] = float("nan")  # a layer cut short by the cap is not shown half done
            yield _sweep_answer(model, ids, mode, name, {**u.result, "knocked": knocked}, wk, note=(
                f"⏱️ Stopped at the {cap:g} s limit after {u.done} of {u.total} layers: the figure shows those "
                "layers. Use a shorter prompt to see them all."))
        else:
            yield gr.skip(), jobs.experiments.progress_text("Knocking out each head in turn", u, len(model.blocks))


def _sweep_answer(model, ids, mode, name, r, wk, note: str = ""):
    n_rep = head_kinds.repeated_suffix_len(ids)
    where = slice(len(ids) - n_rep - 1, None) if n_rep else slice(None)
    delta = to_host((r["knocked"][..., where] - r["base"][where]).mean(-1))  # (L, H); NaN for layers not done
    with session.threads_for(model):
        s = _scores(model, wk)
    c = model.config
    shown = {"previous-token score": s["previous_token"], f"induction score (span {s['span']})": s["induction"]}
    L, H = delta.shape
    flat = int(np.nanargmax(delta))
    bl, bh = divmod(flat, H)
    on = f"the repeated last {n_rep} tokens" if n_rep else f"all {len(ids) - 1} predictions"
    fig = figs.knockout_sweep_figure(delta, shown, n_kv_heads=c.n_kv_heads, selected=(bl, bh),
                                     subtitle=f"loss change on {on} of your prompt; scores on repeated random tokens")
    big = [(lay, h) for lay in range(L) for h in range(H) if delta[lay, h] > 1.0]
    done = int(np.isfinite(delta).any(-1).sum())
    text = (f"**{done * H} knock-outs, one head at a time** ({mode}), loss measured on {on}. The largest change: "
            f"layer {bl} · {head_label(bh, H, c.n_kv_heads)}, **{delta[bl, bh]:+.3f}** nats per token "
            f"(its previous-token score {float(s['previous_token'][bl, bh]):.2f}, induction "
            f"{float(s['induction'][bl, bh]):.2f}).")
    if big:
        text += (f" {len(big)} head(s) cost more than 1 nat per token: " + ", ".join(
            f"{lay}.{h} ({delta[lay, h]:+.2f})" for lay, h in big[:12]) + ". A head can matter without scoring high "
                 "on any pattern: compare the panels.")
    return fig, text + f" Model: {name}." + (f"\n\n{note}" if note else "")


def _last(updates):
    """The answer of a job's updates, for a caller that cannot stream (an opening example: the time cap bounds it)."""
    answer = None
    for update in updates:
        if update is not None:
            answer = update
    return answer


@user_errors
@gpu(120)
def sweep_view(prompt, how, state):
    return _last(_sweep_updates(prompt, how, state))


@user_errors
@gpu(120)
def sweep_stream(prompt, how, state):
    """The button's sweep: progress while it computes; Stop (Gradio's cancel) ends it within a torch operation."""
    with contextlib.closing(_sweep_updates(prompt, how, state)) as updates:  # closed at once when Stop cancels
        for update in updates:
            yield (gr.skip(), gr.skip()) if update is None else update


def answer_id(tokenizer, text, what: str) -> int:
    text = session.clean_text(text)
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        shown = session.token_strings(tokenizer, ids)
        raise ValueError(f"the {what} answer {text[:40]!r} is {len(ids)} tokens ({', '.join(map(repr, shown[:6]))}): "
                         "patching compares two single tokens; choose a word that is one token (often with a "
                         "leading space, like ' Tom').")
    return int(ids[0])


class PatchView(NamedTuple):
    resid: Any
    head: Any
    summary: str


def _patch_updates(clean, corrupt, good, bad, state):
    """Patching as it computes (``jobs.experiments.capped``): ``PatchView`` updates, ``None`` while a layer
    computes; the last is the answer, the layers it completed when the time cap ended it."""
    model, tokenizer, name = session.get_model(state)
    iv.check_decoder(model)
    c_ids, c_labels, _ = _encode(tokenizer, model, clean, "clean prompt")
    x_ids, x_labels, _ = _encode(tokenizer, model, corrupt, "corrupted prompt")
    if len(c_ids) != len(x_ids):
        raise ValueError(f"the clean prompt is {len(c_ids)} tokens and the corrupted one {len(x_ids)}: patching swaps "
                         "activations position by position, so make them the same length (swap words of one "
                         "token each).")
    answer = (answer_id(tokenizer, good, "first"), answer_id(tokenizer, bad, "second"))
    key = ("experiments.patch", weights_key(model), tuple(c_ids), tuple(x_ids), answer)
    shown = [f"{a} / {b.split('·', 1)[1]}" if a != b else a for a, b in zip(c_labels, x_labels)]
    r = results.get(key)
    if r is not None:
        yield _patch_answer(model, tokenizer, name, r, answer, shown)
        return
    cap = jobs.experiments.EXPERIMENT_SECONDS
    steps = lambda: iv.iter_patching_experiment(model, [c_ids], [x_ids], answer)  # noqa: E731
    for u in jobs.experiments.capped(model, steps, cap_s=cap):
        if u is STILL_RUNNING:
            yield None
            continue
        if not (u.finished or u.capped):
            yield PatchView(gr.skip(), gr.skip(), jobs.experiments.progress_text(
                "Patching (the residual stream's layers, then the heads')", u, len(model.blocks)))
            continue
        if u.capped and not u.done:
            raise ValueError(f"no layer of the patching finished within its {cap:g} s limit: use shorter prompts "
                             "or a smaller model.")
        L = len(model.blocks)
        resid, head = to_host(u.result["resid_pre"]).copy(), to_host(u.result["head"]).copy()
        resid[u.done:] = np.nan  # a layer cut short by the cap is not shown half done
        head[max(0, u.done - L):] = np.nan
        r = {**u.result, "resid_pre": resid, "head": head}
        if u.finished:
            results.put(key, r)
            yield _patch_answer(model, tokenizer, name, r, answer, shown)
        else:
            yield _patch_answer(model, tokenizer, name, r, answer, shown, note=(
                f"⏱️ Stopped at the {cap:g} s limit after {u.done} of {u.total} layers (the residual stream's "
                "layers first, then the heads'): the figures show those. Use shorter prompts to see them all."))


def _patch_answer(model, tokenizer, name, r, answer, shown, note: str = "") -> PatchView:
    c = model.config
    resid = figs.patching_figure(r["resid_pre"], shown, x_title="position (clean / corrupted token)",
                                 title="Residual stream patched in, one layer and position at a time")
    head = figs.patching_figure(r["head"], [head_label(h, c.n_heads, c.n_kv_heads) for h in range(c.n_heads)],
                                x_title="head", title="One head's output patched in, every position")
    g, b = session.token_strings(tokenizer, [answer[0]])[0], session.token_strings(tokenizer, [answer[1]])[0]
    text = (f"**logit({g}) − logit({b})** at the last position: **{r['clean']:.2f}** on the clean prompt, "
            f"**{r['corrupt']:.2f}** on the corrupted one. Each cell is the fraction of that gap one patch brings "
            "back: 1 = all of it, 0 = none.")
    if np.isfinite(r["head"]).any():
        hl, hh = np.unravel_index(np.nanargmax(r["head"]), r["head"].shape)
        text += (f" The head that brings back most: layer {hl} · {head_label(int(hh), c.n_heads, c.n_kv_heads)} "
                 f"({r['head'][hl, hh]:.2f}).")
    return PatchView(resid=resid, head=head, summary=text + f" Model: {name}." + (f"\n\n{note}" if note else ""))


@user_errors
@gpu(120)
def patch_view(clean, corrupt, good, bad, state) -> PatchView:
    return _last(_patch_updates(clean, corrupt, good, bad, state))


@user_errors
@gpu(120)
def patch_stream(clean, corrupt, good, bad, state):
    """The button's patching: progress while it computes; Stop (Gradio's cancel) ends it within a torch operation."""
    with contextlib.closing(_patch_updates(clean, corrupt, good, bad, state)) as updates:
        for update in updates:
            yield (gr.skip(), gr.skip(), gr.skip()) if update is None else update


def _circuit(state):
    model, _, name = session.get_model(state)
    iv.check_decoder(model)
    chosen = best_heads(model)
    c = model.config
    if chosen["induction"][0] == 0:
        raise ValueError("this model's best induction head is in layer 0, so no earlier head can feed it: the "
                         "two-head circuit needs at least two layers.")
    span = chosen["scores"]["span"]
    wk = weights_key(model)
    x = head_kinds.repeated_random_tokens(c.vocab_size, span, CIRCUIT_ROWS, 0, bos_id=c.bos_token_id)
    r = jobs.experiments.within_cap(
        lambda: results.get_or_compute(("experiments.circuit", wk, span, chosen["previous"], chosen["induction"]),
                                       lambda: {k: to_host(v) for k, v in iv.induction_circuit(
                                           model, x, chosen["previous"], chosen["induction"], span).items()}),
        "the circuit's four runs", "use a smaller model")
    (lp, hp), (li, hi) = chosen["previous"], chosen["induction"]
    s = chosen["scores"]
    pname = f"previous-token head {lp}.{hp}"
    iname = f"induction head {li}.{hi}"
    labels = {"neither": "neither", "previous": pname, "induction": iname, "both": "both"}
    fig = figs.circuit_figure(r, labels, title=f"The induction circuit, tested · loss on the repeated half of "
                                               f"{CIRCUIT_ROWS} rows of random tokens (span {span})")
    m = {k: float(np.mean(v)) for k, v in r.items()}
    text = (f"The {pname} (previous-token score {float(s['previous_token'][lp, hp]):.2f}) writes which token came "
            f"before; the {iname} (induction score {float(s['induction'][li, hi]):.2f}) finds the earlier "
            f"occurrence and copies what followed. Loss on the second copy: **{m['neither']:.2f}** with both heads, "
            f"**{m['previous']:.2f}** without the previous-token head, **{m['induction']:.2f}** without the induction "
            f"head, **{m['both']:.2f}** without either (nats per token; a uniform guess would be "
            f"{math.log(c.vocab_size):.2f}). Model: {name}.")
    return fig, text


@user_errors
@gpu(60)
def circuit_view(state):
    model, _, _ = session.get_model(state)
    with session.threads_for(model):
        return _circuit(state)


def _model_defaults(state) -> dict:
    model, _, _ = session.get_model(state)
    return {"heads": gr.Dropdown(choices=head_options(model), value=default_heads(model), multiselect=True)}


def build_experiments(demo: gr.Blocks, state: gr.State) -> None:
    model, _, _ = session.get_model(None)
    gr.Markdown(INTRO)
    with gr.Row():
        with gr.Column(scale=2):
            prompt = gr.Textbox(label="Prompt", value=DEFAULT_PROMPT, lines=2, max_lines=6,
                                info="A prompt that repeats itself shows induction at work: the second time through, the model can copy.")
            chosen = gr.Dropdown(label="Heads to knock out (layer.head)", choices=head_options(model),
                                 value=default_heads(model), multiselect=True, allow_custom_value=True,
                                 info="Opens on the model's best induction head.")
            how = gr.Radio(list(HOWS), value=list(HOWS)[0], label="Knock-out")
            run = gr.Button("Knock out", variant="primary")
            top = gr.Dataframe(headers=["rank", "next token before", "p", "after", "p "],
                               label=f"Next token after the prompt, top {TOP_K}", interactive=False)
        with gr.Column(scale=3):
            loss = gr.Plot(label="Loss per token, before and after", elem_id="experiments-loss")
            summary = gr.Markdown(elem_id="experiments-loss-summary")
    vote.ask_section(demo, "experiments", vote.knockout_question, [prompt, chosen, how, state],
                     what="what does the knock-out do to the loss?")
    gr.Markdown("#### Each head in turn: what it does beside what it looks like")
    with gr.Row():
        sweep_btn = gr.Button("Knock out each head in turn", scale=0, min_width=260)
        sweep_stop = gr.Button("Stop", variant="stop", scale=0, min_width=80)
        sweep_md = gr.Markdown()
    sweep_fig = gr.Plot(label="Loss change per head, with its scores", elem_id="experiments-sweep")
    gr.Markdown("#### Patch: which activation carries the answer from one prompt to the other?")
    with gr.Row():
        with gr.Column(scale=2):
            clean = gr.Textbox(label="Clean prompt", value=CLEAN, lines=1)
            corrupt = gr.Textbox(label="Corrupted prompt (same number of tokens)", value=CORRUPT, lines=1)
            with gr.Row():
                good = gr.Textbox(label="Answer on the clean prompt", value=GOOD, max_lines=1)
                bad = gr.Textbox(label="Answer on the corrupted prompt", value=BAD, max_lines=1)
            with gr.Row():
                patch_btn = gr.Button("Patch", variant="primary")
                patch_stop = gr.Button("Stop", variant="stop", min_width=80)
            patch_md = gr.Markdown()
        with gr.Column(scale=3):
            resid = gr.Plot(label="Residual stream patched in", elem_id="experiments-resid")
    head_fig = gr.Plot(label="One head's output patched in", elem_id="experiments-head")
    gr.Markdown("#### The induction circuit, tested")
    with gr.Row():
        circuit_btn = gr.Button("Knock out its two heads", scale=0, min_width=260)
        circuit_md = gr.Markdown()
    circuit_fig = gr.Plot(label="Loss on the repeated half", elem_id="experiments-circuit")

    inputs = [prompt, chosen, how, state]
    outputs = outputs_of(KnockoutView, loss=loss, top=top, summary=summary, heads=chosen)
    run.click(knockout_view, inputs, outputs, api_name="knockout", **lane(VIEW))
    prompt.submit(knockout_view, inputs, outputs, api_name="knockout_submit", api_visibility="undocumented", **lane(VIEW))
    sweeping = sweep_btn.click(sweep_stream, [prompt, how, state], [sweep_fig, sweep_md], api_name="experiment_sweep",
                               **lane(MEASURE))
    sweep_stop.click(None, None, None, cancels=[sweeping], api_name="experiment_sweep_stop", api_visibility="private")
    patching = patch_btn.click(patch_stream, [clean, corrupt, good, bad, state], [resid, head_fig, patch_md],
                               api_name="experiment_patch", **lane(VIEW))
    patch_stop.click(None, None, None, cancels=[patching], api_name="experiment_patch_stop", api_visibility="private")
    circuit_btn.click(circuit_view, [state], [circuit_fig, circuit_md], api_name="experiment_circuit", **lane(VIEW))
    # The sections below the first open on examples computed by the same handlers on the shipped model, with the
    # other tabs' opening examples (explorer/web/opening.py), not while the tab is built
    demo.load(cached_opening("knockout_sweep_example", sweep_view), [prompt, how, state], [sweep_fig, sweep_md],
              api_name="knockout_sweep_example", api_visibility="undocumented", **lane(VIEW))
    demo.load(cached_opening("patch_example", patch_view), [clean, corrupt, good, bad, state],
              [resid, head_fig, patch_md], api_name="patch_example", api_visibility="undocumented", **lane(VIEW))
    demo.load(cached_opening("circuit_example", circuit_view), [state], [circuit_fig, circuit_md],
              api_name="circuit_example", api_visibility="undocumented", **lane(VIEW))
    links.register(demo, "experiments", knockout_view, inputs, outputs, api_name="knockout_example",
                   params=dict(prompt=prompt, heads=chosen, how=how), model_defaults=_model_defaults,
                   focus=dict(loss=[loss, summary], sweep=sweep_fig, circuit=circuit_fig))
