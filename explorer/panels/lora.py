"""LoRA tab: what an adapter of a given rank costs (counted and by formula), a bounded fine-tune of the
user's own copy of the model on text they paste (live loss curve, Stop button), and the adapter switched
off, on and merged, with one head's attention and a greedy continuation before and after, side by side."""
from __future__ import annotations

import functools
import math
import time
from typing import Any, NamedTuple

import gradio as gr
import torch

from explorer.web import links
from explorer.web.clients import with_client
from explorer.web.groups import FINETUNE, VIEW, lane
from lens.device import gpu
from explorer import finetune, glossary, jobs, measure, probes
from explorer.state import session
from explorer.figures import lora as figs
from explorer.figures.common import head_label
from models.lora import adapter_mode, check_lora, set_adapter_mode
from lens.hooks import model_lock
from models.generate import generate as generate_tokens
from models.block import PROJECTIONS

from explorer.panels.controls import as_index, as_number, as_whole, head_choices, layer_choices, outputs_of
from explorer.panels.errors import user_errors
from explorer.state.openings import cached_opening
from . import lora_text as prose
from .formats import build_formats

MAX_RANK = 64
MAX_TEXT_TOKENS = 2048
FT_SEQ_LEN = 512  # tokens per training row (the text is cut into overlapping rows of this length)
MAX_PROMPT_TOKENS = 64
MAX_CONTINUATION = 48
MODES = ("off", "on", "merged")
DEFAULT_TARGETS = ["q_proj", "v_proj"]
DEFAULT_TEXT = ("Once upon a time, there was a happy girl named Mia. She had a purple whale. She loved the purple "
                "whale very much. Once upon a time, there was a happy boy named Tom. He had a purple whale. He loved "
                "the purple whale very much. Once upon a time, there was a happy girl named Anna. She had a purple "
                "whale. She loved the purple whale very much.")
DEFAULT_PROMPT = "Once upon a time, there was a happy girl named Lily. She had a"

INTRO = """### LoRA: a small trainable update beside frozen weights
A LoRA adapter leaves each chosen weight matrix W₀ frozen and learns a low-rank update:
y = W₀x + (alpha / r)·B·A·x, with A (r × in) and B (out × r). Only A and B train, so a rank-8 adapter on two
projections trains a few percent of the parameters. Choose rank, alpha and projections to see the counts;
then fine-tune **your own copy** of the model on your text (nobody else's model changes) and compare."""

FT_INTRO = """#### Fine-tune your copy on your text
Each run starts a fresh adapter with the settings above and trains only A and B (AdamW, next-token loss)
for at most {steps} steps and {seconds:.0f} seconds. The curve updates while it trains; Stop ends it. On a large
model fewer steps may fit the time limit: the run then ends before a step that would pass it, and says how many fit.
The example text gives three children a purple whale: after training, a child the text never named
(Lily, in the prompt below) tends to get one too, while the base model on the left still says what it said."""

CMP_INTRO = """#### Before and after
Switch the adapter off, on, or merge it into the weights (W₀ + (alpha / r)·B·A, same outputs, no extra
work per token). The left side is always the base model (adapter off), the right side the adapter on."""


def check_adapter(rank, alpha, targets, config) -> tuple[int, float, tuple[str, ...]]:
    rank = as_whole(rank, "rank", 1, MAX_RANK)
    alpha = as_number(alpha, "alpha")
    if not 0 < alpha <= 1024:
        raise ValueError(f"alpha must be a positive number up to 1024, got {alpha:g}.")
    if isinstance(targets, str):
        targets = [targets]
    if targets is not None and not isinstance(targets, (list, tuple)):
        raise ValueError(f"Tick at least one projection to adapt, among {list(PROJECTIONS)}.")
    unknown = [t for t in (targets or []) if t not in PROJECTIONS]
    targets = tuple(t for t in PROJECTIONS if t in (targets or []))
    if not targets or unknown:
        raise ValueError(f"Tick at least one projection to adapt, among {list(PROJECTIONS)}.")
    shapes = measure.projection_shapes(config)  # (in, out) by name
    check_lora(rank, alpha, shapes=[(shapes[t][1], shapes[t][0]) for t in targets])
    return rank, alpha, targets


def check_finetune(rank, alpha, targets, steps, lr, max_seconds, config) -> tuple:
    """A fine-tune's settings as clean values: (rank, alpha, targets, steps, lr, max_seconds, seq_len); ValueError
    with what to change otherwise."""
    rank, alpha, targets = check_adapter(rank, alpha, targets, config)
    steps = as_whole(steps, "steps", 1, finetune.MAX_STEPS)
    # a blank box: the rate for this model's width (the box's default only fits the default model)
    lr = None if lr is None or lr == "" else as_number(lr, "learning rate")
    if not lr:  # blank, or 0 (what a browser sends for a cleared box): chosen from the model's width
        lr = finetune.default_lr(config.d_model)
    max_seconds = as_number(max_seconds, "time limit")
    finetune.check_settings(steps, lr, max_seconds, 2, 1)
    return rank, alpha, targets, steps, lr, max_seconds, min(config.max_seq_len - 1, FT_SEQ_LEN)


def _total_sentence(model, counted: dict) -> str:
    """Why the total here is not the Model tab's: it counts the adapter too (said only when the counts say so)."""
    own = model.num_parameters()
    if counted["frozen"] == own and counted["total"] == own + counted["trainable"]:
        return (f"The total, {counted['total']:,}, is the model's own {own:,} parameters (the Model tab's count) "
                f"plus the adapter's {counted['trainable']:,}.")
    return f"The total counted here is {counted['total']:,}; the model itself has {own:,} parameters."


@user_errors
def lora(rank, alpha, targets, state):
    """Trainable vs frozen parameters and training memory for an adapter, counted and by formula."""
    model, _, name = session.get_model(state)
    c = model.config
    rank, alpha, targets = check_adapter(rank, alpha, targets, c)
    counted = finetune.count_adapted(c, targets, rank=rank, alpha=alpha)
    formula = measure.lora_parameters(c, rank, targets)
    dtype = measure.runtime_info(model)["dtype"]
    nbytes = measure.element_size(dtype) if dtype in measure.DTYPES else 4
    memory = finetune.training_memory(counted["trainable"], counted["frozen"], bytes_per_value=nbytes)
    fig = figs.parameter_figure(counted, formula["trainable"], memory, rank=rank, alpha=alpha, targets=targets,
                                dtype=dtype)
    shapes = measure.projection_shapes(c)
    rows = []
    for t in targets:
        i, o = shapes[t]
        rows.append([t, f"{i} × {o}", i * o, rank * (i + o), c.n_layers, c.n_layers * rank * (i + o)])
    agree = "equal" if counted["trainable"] == formula["trainable"] else "**differ**"
    lora_mem = sum(memory["LoRA"].values())
    full_mem = sum(memory["full fine-tune"].values())
    md = (f"**{name}**, rank {rank}, alpha {alpha:g} (scale alpha/r = {alpha / rank:g}) on {', '.join(targets)}.\n\n"
          f"Counted on a copy of the model's structure: **{counted['trainable']:,} trainable**, "
          f"{counted['frozen']:,} frozen ({counted['trainable'] / counted['total']:.2%} trainable). "
          f"Formula r·(in + out) per projection × {c.n_layers} layers: **{formula['trainable']:,}** ({agree}). "
          f"Each adapted weight is {formula['ratio']:.1f}× larger than its adapter. {_total_sentence(model, counted)}\n\n"
          f"Training memory without activations ({dtype}): LoRA {measure.format_bytes(lora_mem)} vs full "
          f"fine-tuning {measure.format_bytes(full_mem)}.")
    return fig, rows, md


LORA_HEADERS = ["projection", "shape (in × out)", "weight parameters", "adapter r·(in + out)", "layers",
                "adapter parameters, all layers"]


# --- fine-tuning ------------------------------------------------------------------------------------------

def _encode_text(tokenizer, text: str) -> tuple[list[int], str]:
    text = session.clean_text(text)
    ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
    notice = ""
    if len(ids) > MAX_TEXT_TOKENS:
        notice = f"Your text is {len(ids)} tokens long; the first {MAX_TEXT_TOKENS} are used."
        ids = ids[:MAX_TEXT_TOKENS]
    if len(ids) < finetune.MIN_TOKENS:
        raise ValueError("The text is too short to learn from: paste at least a sentence.")
    return ids, notice


class FinetuneUpdate(NamedTuple):
    """What each step of a fine-tune shows (the event's outputs, in order)."""
    curve: Any  # plotly Figure: the loss so far
    status: str
    state: dict  # the user's session state (their own model, the adapter's settings)


@user_errors
@gpu(120)
def lora_finetune(rank, alpha, targets, text, steps, lr, max_seconds, state, progress=gr.Progress()):
    """Fine-tune a fresh adapter on the user's own copy; yields the loss curve as it falls.

    The training runs on a worker thread (``jobs.finetune``): this generator yields often, so Gradio's cancel (Stop)
    closes it within a fraction of a second, and the worker then ends inside the step it is in, the adapter left
    as after the last completed step. The Stop button's own request (``lora_stop``) says which step that was.
    """
    model, tokenizer, _ = session.get_model(state)
    rank, alpha, targets, steps, lr, max_seconds, seq_len = check_finetune(rank, alpha, targets, steps, lr,
                                                                           max_seconds, model.config)
    ids, notice = _encode_text(tokenizer, text)
    rows = finetune.make_rows(ids, seq_len)
    finetune.check_step_memory(model.config, rows)  # before any copy or allocation
    model, tokenizer, name = session.private_model(state)  # the user's own copy; the shared model is never touched
    prov = measure.runtime_info(model)
    run, items = jobs.finetune.start(
        state, model, rows=rows, ids=ids, targets=targets, rank=rank, alpha=alpha,
        settings=dict(steps=steps, lr=lr, max_seconds=max_seconds, seq_len=seq_len, batch=finetune.DEFAULT_BATCH))
    xs, ys = [0], []
    head = f"{notice} " if notice else ""
    last_yield = time.perf_counter()
    record, end_loss = None, None
    try:
        for item in items:
            if item is jobs.STILL_RUNNING:
                yield FinetuneUpdate(gr.skip(), gr.skip(), gr.skip())
                continue
            kind, value = item
            if kind == "start":
                ys.append(value)
                curve = figs.loss_curve_figure(xs, ys, max_steps=steps, status="starting", provenance=prov)
                yield FinetuneUpdate(curve, f"{head}Training a rank-{rank} adapter on {len(ids)} tokens…", state)
            elif kind == "end":
                end_loss = value
            else:
                record = value
                if not math.isfinite(record["loss"]):  # the worker has removed the adapter already
                    raise ValueError(f"The loss became {record['loss']} at step {record['step']}: lower the learning "
                                     "rate. The adapter was removed, so your model is the base model again.")
                xs.append(record["step"])
                ys.append(record["loss"])
                # the bar ends where the run will: at the last step that fits the time limit
                progress((record["step"], min(steps, record["fit_steps"])),
                         desc=f"step {record['step']}/{steps} · loss {record['loss']:.3f}")
                now = time.perf_counter()
                if now - last_yield > 0.3 or record["step"] == steps or record["stopped"]:
                    last_yield = now
                    curve = figs.loss_curve_figure(xs, ys, max_steps=steps, status=f"step {record['step']}",
                                                   provenance=prov)
                    yield FinetuneUpdate(curve, f"{head}Step {record['step']}/{steps}: loss {record['loss']:.3f} "
                                                f"({record['seconds']:.1f} s)."
                                                f"{prose.fit_sentence(record, steps, max_seconds)}", state)
    finally:
        items.close()  # closed by Gradio's cancel: the worker is told at once, not when this is collected
    curve = functools.partial(figs.loss_curve_figure, xs, ys, max_steps=steps, provenance=prov)
    if run.outcome == "diverged":
        status = prose.diverged_status(head, record, ys[1], lr, name, model.config.d_model)
        yield FinetuneUpdate(curve(status="diverged"), status, state)
    elif end_loss is None:  # the Stop button's request ended the worker while this stream was still open
        yield FinetuneUpdate(curve(status=f"stopped after step {run.steps}"),
                             prose.stopped_status(head, run.steps, name), state)
    else:
        why, status = prose.finished_status(head, record, len(xs) - 1, steps, max_seconds, lr, ys[0], end_loss,
                                            name)
        yield FinetuneUpdate(curve(status=why), status, state)


def lora_stop(state):
    """The Stop button's request (beside Gradio's cancel of the fine-tune's stream): stop this session's running
    fine-tune, wait for its worker to end (within an operation) and say which step its adapter is the one after.
    Nothing running, or a run that ended on its own: nothing changes on screen."""
    run = jobs.finetune.stop(state)
    if run is None:
        return gr.skip()
    if not run.finished.is_set():
        return f"Stopping: the adapter so far is the one after step {run.steps}."
    if run.outcome != "stopped":  # it ended on its own just before the Stop arrived
        return gr.skip()
    return prose.stopped_status("", run.steps, state.get("name") or "the model")


# --- adapter switch and comparison -------------------------------------------------------------------

def _adapted(state) -> torch.nn.Module:
    model, _, _ = session.get_model(state)
    if session.is_shared(model) or adapter_mode(model) is None:
        raise ValueError("Fine-tune first: there is no adapter on your model yet.")
    return model


@user_errors
def lora_adapter(mode, state):
    """Switch the user's adapter off, on, or merge it into the weights."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}.")
    model = _adapted(state)
    with model_lock(model):
        set_adapter_mode(model, mode)
    state.setdefault("lora", {})["mode"] = mode
    words = {"off": "Adapter **off**: your copy computes exactly the base model.",
             "on": "Adapter **on**: y = W₀x + (alpha/r)·B·A·x, computed beside the frozen weight.",
             "merged": "Adapter **merged** into W₀: the same outputs (up to rounding) at the base model's cost."}
    return words[mode], state


def _continue(model, ids: list[int], n: int) -> list[int]:
    tokens = session.as_tensor(ids, model)
    out = generate_tokens(model, tokens, n, temperature=0.0)
    return out[0, len(ids):].tolist()


@user_errors
@gpu(60)
def lora_compare(prompt, layer, head, new_tokens, state):
    """Base model (adapter off) vs adapter on or merged: one head's attention and a greedy continuation.

    Before any fine-tune there is no adapter: both sides show the base model (a fresh adapter, B = 0, would
    compute exactly the same numbers), so the first visit still shows the attention and a continuation.
    """
    model, tokenizer, _ = session.get_model(state)
    c = model.config
    layer = as_index(layer, c.n_layers, "layer")
    head = as_index(head, c.n_heads, "head")
    n = as_whole(new_tokens, "new tokens", 1, MAX_CONTINUATION)
    ids, labels, notice = session.encode_with_notice(tokenizer, prompt, min(MAX_PROMPT_TOKENS, c.max_seq_len - n))
    tokens = session.as_tensor(ids, model)
    has_adapter = adapter_mode(model) is not None
    with session.threads_for(model), model_lock(model):  # a defined thread count, whatever ran here before
        mode = adapter_mode(model)
        after_mode = "merged" if mode == "merged" else "on"
        try:
            if has_adapter:
                set_adapter_mode(model, "off")
            before_pat = probes.attention_pattern(model, ids, layer, head)
            with torch.inference_mode():
                before_logits = model(tokens).float()
            before_new = _continue(model, ids, n)
            merge_note = ""
            if has_adapter:
                set_adapter_mode(model, after_mode)
                after_pat = probes.attention_pattern(model, ids, layer, head)
                with torch.inference_mode():
                    after_logits = model(tokens).float()
                after_new = _continue(model, ids, n)
                if after_mode == "merged":
                    set_adapter_mode(model, "on")
                    with torch.inference_mode():
                        unmerged = model(tokens).float()
                    merge_note = (" Merged vs unmerged adapter: max |Δlogit| = "
                                  f"{float((unmerged - after_logits).abs().max()):.2e} (float rounding).")
            else:
                after_pat, after_logits, after_new = before_pat, before_logits, before_new
        finally:
            if has_adapter:
                set_adapter_mode(model, mode)
    after_title = f"adapter {after_mode}" if has_adapter else "no adapter yet (B = 0 would give exactly this)"
    fig = figs.attention_before_after_figure(
        before_pat, after_pat, labels, layer=layer, head_name=head_label(head, c.n_heads, c.n_kv_heads),
        before_title="adapter off (base model)", after_title=after_title)
    prompt_text = tokenizer.decode(ids, skip_special_tokens=True)
    after_label = f"adapter {after_mode}" if has_adapter else "no adapter yet"
    before_text = [(prompt_text, None), (tokenizer.decode(before_new, skip_special_tokens=True), "adapter off")]
    after_text = [(prompt_text, None), (tokenizer.decode(after_new, skip_special_tokens=True), after_label)]
    head_md = f"{notice} " if notice else ""
    if not has_adapter:
        md = (f"{head_md}No adapter yet: both sides are the base model. A fresh adapter starts with B = 0, so it "
              "changes nothing, to the bit, until it is trained. Fine-tune above and this view compares again.")
        return fig, before_text, after_text, md
    changed = sum(a != b for a, b in zip(before_new, after_new))
    md = (f"{head_md}{glossary.term('max |Δlogit|', 'Max |Δlogit|')} over the prompt, adapter {after_mode} vs off: "
          f"**{float((after_logits - before_logits).abs().max()):.3g}**; {changed} of {n} greedy tokens differ; "
          f"largest change in this head's weights: **{float(abs(after_pat - before_pat).max()):.3g}**.{merge_note} "
          f"The adapter is back to **{mode}**.")
    return fig, before_text, after_text, md


def _model_defaults(state) -> dict:
    """After a model load: the layer and head menus of the loaded model (the first of each)."""
    c = session.get_model(state)[0].config
    return {"layer": gr.Dropdown(choices=layer_choices(c.n_layers), value=0),
            "head": gr.Dropdown(choices=head_choices(c.n_heads, c.n_kv_heads), value=0)}


def build_lora(demo: gr.Blocks, state: gr.State) -> None:
    model, _, _ = session.get_model(None)
    c = model.config
    gr.Markdown(INTRO)
    with gr.Row():
        with gr.Column(scale=1, min_width=260):
            rank = gr.Slider(1, MAX_RANK, value=8, step=1, label="rank r")
            alpha = gr.Number(value=16, label="alpha", info="the update is scaled by alpha / r")
            targets = gr.CheckboxGroup(list(PROJECTIONS), value=DEFAULT_TARGETS, label="projections to adapt")
        with gr.Column(scale=3):
            params_plot = gr.Plot(label="Trainable vs frozen parameters and training memory", elem_id="lora-params")
            params_md = gr.Markdown()
    params_table = gr.Dataframe(headers=LORA_HEADERS, label="Adapter size per projection", interactive=False)

    gr.Markdown(FT_INTRO.format(steps=finetune.MAX_STEPS, seconds=finetune.MAX_SECONDS))
    with gr.Row():
        with gr.Column(scale=2):
            text = gr.Textbox(label="Your text to fine-tune on", value=DEFAULT_TEXT, lines=5, max_lines=12,
                              info=f"up to {MAX_TEXT_TOKENS} tokens are used")
            with gr.Row():
                steps = gr.Slider(1, finetune.MAX_STEPS, value=40, step=1, label="steps")
                max_seconds = gr.Slider(1, finetune.MAX_SECONDS, value=30, step=1, label="time limit (s)")
            # the rate on a row of its own: beside the buttons its hint was cut to "...(128/width)^"
            lr = gr.Number(value=None, label="learning rate",
                           info=f"1e-5 to 0.1; blank or 0: from the model's width, 1e-2 × (128 / width) to the power "
                                f"{finetune.LR_EXPONENT:g} ({finetune.default_lr(c.d_model):g} for width {c.d_model})")
            with gr.Row():
                train = gr.Button("Fine-tune", variant="primary", min_width=100)
                stop = gr.Button("Stop", variant="stop", min_width=80)
            ft_md = gr.Markdown()
        with gr.Column(scale=3):
            loss_plot = gr.Plot(label="Training loss", elem_id="lora-loss")

    gr.Markdown(CMP_INTRO)
    with gr.Row():
        with gr.Column(scale=1, min_width=260):
            mode = gr.Radio(list(MODES), value="on", label="adapter")
            mode_md = gr.Markdown()
            prompt = gr.Textbox(label="Prompt to continue", value=DEFAULT_PROMPT, lines=2)
            with gr.Row():
                layer = gr.Dropdown(label="Layer", choices=layer_choices(c.n_layers), value=0)
                head = gr.Dropdown(label="Head", choices=head_choices(c.n_heads, c.n_kv_heads), value=0)
            new_tokens = gr.Slider(1, MAX_CONTINUATION, value=12, step=1, label="tokens to continue (greedy)")
            compare = gr.Button("Compare", variant="primary")
        with gr.Column(scale=3):
            with gr.Row():
                before_text = gr.HighlightedText(label="base model (adapter off)", combine_adjacent=False,
                                                 color_map={"adapter off": "#c7d7f0"})
                after_text = gr.HighlightedText(label="with your adapter", combine_adjacent=False,
                                                color_map={"adapter on": "#ffd37a", "adapter merged": "#ffb17a",
                                                           "no adapter yet": "#dddddd"})
            cmp_md = gr.Markdown()
            cmp_plot = gr.Plot(label="Attention before and after", elem_id="lora-compare")

    p_inputs = [rank, alpha, targets, state]
    p_outputs = [params_plot, params_table, params_md]
    for control in (rank, alpha, targets):
        control.change(lora, p_inputs, p_outputs, api_name=f"lora_{control.label.split()[0]}",
                       api_visibility="private", show_progress="hidden", **lane(VIEW))

    cmp_inputs = [prompt, layer, head, new_tokens, state]
    cmp_outputs = [cmp_plot, before_text, after_text, cmp_md]
    ft_event = train.click(with_client(lora_finetune), [rank, alpha, targets, text, steps, lr, max_seconds, state],
                           outputs_of(FinetuneUpdate, curve=loss_plot, status=ft_md, state=state),
                           api_name="lora_finetune", **lane(FINETUNE))
    ft_event.success(lambda: "on", None, [mode], api_name="lora_mode_after_finetune", api_visibility="private", **lane(VIEW)).then(
        lora_compare, cmp_inputs, cmp_outputs, api_name="lora_compare_after_finetune", api_visibility="private", **lane(VIEW))
    # Gradio's cancel closes the stream at once (the worker ends inside its step); this request says where it ended
    stop.click(lora_stop, [state], [ft_md], cancels=[ft_event], api_name="lora_stop", api_visibility="private", **lane(VIEW))
    mode.input(lora_adapter, [mode, state], [mode_md, state], api_name="lora_adapter", **lane(VIEW)).success(
        lora_compare, cmp_inputs, cmp_outputs, api_name="lora_compare_after_switch", api_visibility="private", **lane(VIEW))
    compare.click(lora_compare, cmp_inputs, cmp_outputs, api_name="lora_compare", **lane(VIEW))
    # the adapter's size (the tab's first chart) follows the loaded model too: run after the comparison's view
    links.register(demo, "lora", cached_opening("lora_compare", lora_compare), cmp_inputs, cmp_outputs, api_name="lora_compare_example",
                   params=dict(prompt=prompt, layer=layer, head=head, tokens=new_tokens),
                   model_defaults=_model_defaults,
                   then=[(cached_opening("lora", lora), p_inputs, p_outputs, "lora", "public")],
                   focus=dict(params=params_plot, compare=cmp_plot))
    demo.load(cached_opening("lora_empty_curve", lambda: figs.loss_curve_figure([], [], max_steps=40)), None,
              [loss_plot], api_name="lora_empty_curve", api_visibility="private", **lane(VIEW))
    build_formats(demo, state)  # Weight formats: fp32 · bf16 · int8, and the measured summary table
