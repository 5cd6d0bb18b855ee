"""Weight formats: fp32 · bf16 · int8 (a section of the LoRA & int8 tab): the loaded model in three formats
side by side, the memory-bandwidth roofline of one-token decoding, and the tutorial's memory-and-compute
summary table measured on this machine.

Every number comes from ``explorer.measure`` on the loaded model when the button is pressed; a result is kept in
``explorer.state.cache.results`` (keyed by the model's weights and the prompt), never in ``gr.State``.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import gradio as gr

from explorer import measure

from explorer.state import session
from models.lora import adapter_mode
from explorer.state.cache import results, weights_key
from explorer.figures import formats as figs
from explorer.figures.common import provenance_text
from explorer.measure import formats as fm
from explorer.measure.weight_formats import (  # noqa: F401 (STAGES: what the progress bar says, read by tests)
    DECODE_SECONDS, FLASH_LENGTHS, LORA_RANK, LORA_TARGETS, NEW_TOKENS, REPEATS, STAGES, measure_formats)

from explorer.panels.errors import user_errors
from explorer.state.openings import cached_opening
from explorer.web import links
from explorer.web.groups import MEASURE, lane

MAX_PROMPT_TOKENS = 64
DEFAULT_PROMPT = "Once upon a time, there was a happy girl named Lily. She had a"
TRANSFORMERS = "transformers fp32"
CACHE_SIZED = 64 * 2**20  # weights under this may stay in the CPU's caches between steps

INTRO = """### Weight formats: fp32 · bf16 · int8
Decoding one token reads **every weight once** to do one multiply-add with it, so its speed is set by how fast
memory delivers bytes, not by arithmetic: *tokens/s ≤ memory bandwidth ÷ bytes read per token*. Smaller weights
should mean faster decoding — if the machine has fast kernels for them. Press **Measure** to convert the loaded
model to bf16 and weight-only int8 and measure all three here, now, beside transformers on the same weights."""

FORMAT_HEADERS = ["format", "weight bytes", "decode tokens/s", "MB read / token", "limit tokens/s",
                  "% of limit", "greedy agreement with fp32 (new tokens both decoded)", "max |Δlogit| vs fp32",
                  "held-out loss (nats/token)", "matmul kernel", "decode timed over"]
SUMMARY_HEADERS = ["technique", "the tutorial's claim", "measured here, on the loaded model", "held?",
                   "where it is measured live"]
CLAIMS = {
    "KV caching": "the cache grows linearly with length; per-step compute O(S²) → O(S)",
    "GQA": "KV cache ÷ (query heads / KV heads)",
    "FlashAttention": "peak attention memory O(S²) → O(S)",
    "LoRA": "~1 % of the parameters trained",
    "INT8": "~50 % model size reduction, minor throughput gain, small accuracy drop",
}
TABS = {"KV caching": "KV cache & generation tab", "GQA": "KV cache & generation tab (MHA / GQA / MQA sizes)",
        "FlashAttention": "Memory lab tab", "LoRA": "LoRA & int8 tab (top: trainable vs frozen)",
        "INT8": "this section (table above)"}


class FormatsView(NamedTuple):
    table: list[list[Any]]  # one row per format (and transformers), FORMAT_HEADERS
    top: list[list[Any]]  # next-token top-10 per format
    roofline: Any  # plotly figure
    notes: str  # markdown: bandwidth and how it was measured, prefill for contrast, kernels
    summary: list[list[Any]]  # the tutorial's five rows, SUMMARY_HEADERS
    numbers: dict  # the measured values behind both tables (small: numbers and short lists)


def _summary(model, numbers: dict) -> list[list[Any]]:
    """The five rows, each cell computed from ``numbers`` (filled here from the calculators and measurements)."""
    c = model.config
    rows = []
    # KV caching: bytes per cached position counted on an allocated cache, and time per step with and without it
    kv = numbers["kv"]
    per_pos = kv["allocated_bytes_per_position"]
    held = kv["speedup"] > 1 and per_pos == kv["formula_bytes_per_token"]
    rows.append(["KV caching", CLAIMS["KV caching"],
                 f"{per_pos:,} bytes per cached position ({measure.format_bytes(per_pos * kv['seq_len'])} at "
                 f"{kv['seq_len']} positions); {kv['cached_ms']:.1f} ms per token with the cache (the "
                 f"fast step), {kv['uncached_ms']:.1f} ms without (the modules) ({kv['speedup']:.1f}x) over "
                 f"{kv['new_tokens']} tokens",
                 "yes" if held else "no", TABS["KV caching"]])
    g = numbers["gqa"]
    held = g["ratio"] == c.n_heads / c.n_kv_heads and g["allocated_bytes"] == g["gqa_bytes"]
    rows.append(["GQA", CLAIMS["GQA"],
                 f"{c.n_heads} query / {c.n_kv_heads} KV heads: cache {measure.format_bytes(g['gqa_bytes'])} against "
                 f"{measure.format_bytes(g['mha_bytes'])} as MHA at {g['seq_len']} positions "
                 f"(÷{g['ratio']:g}; the model's own allocated cache: {measure.format_bytes(g['allocated_bytes'])})",
                 "yes" if held else "no", TABS["GQA"]])
    f = numbers["flash"]
    (t1, t2) = FLASH_LENGTHS
    held = f["naive_growth"] > 3 and f["sdpa_growth"] < 2.5
    rows.append(["FlashAttention", CLAIMS["FlashAttention"],
                 f"peak above the inputs, T={t1} → {t2}: naive {measure.format_bytes(f['naive'][0])} → "
                 f"{measure.format_bytes(f['naive'][1])} (x{f['naive_growth']:.2f}), fused SDPA "
                 f"{measure.format_bytes(f['sdpa'][0])} → {measure.format_bytes(f['sdpa'][1])} "
                 f"(x{f['sdpa_growth']:.2f}); {f['naive'][1] / max(f['sdpa'][1], 1):.0f}x less at T={t2}",
                 "yes" if held else "no", TABS["FlashAttention"]])
    lo = numbers["lora"]
    held = 0.001 <= lo["trainable_fraction"] <= 0.02
    rows.append(["LoRA", CLAIMS["LoRA"],
                 f"rank {LORA_RANK} on {' and '.join(LORA_TARGETS)}: {lo['trainable']:,} of {lo['frozen']:,} "
                 f"parameters trained ({lo['trainable_fraction']:.2%})", "yes" if held else "no", TABS["LoRA"]])
    q = numbers["int8"]
    parts = [q["size_reduction"] >= 0.4, q["speed_ratio"] >= 1.0, q["loss_change"] <= 0.05]
    verdict = "yes" if all(parts) else "no" if not any(parts) else "partly: " + ", ".join(
        name for name, ok in zip(("size", "speed", "accuracy"), parts) if ok) + " held"
    kernel = {fm.INT8_FAST: "the fast step's int8 kernel"}.get(q["kernel"], q["kernel"])
    rows.append(["INT8", CLAIMS["INT8"],
                 f"weights {q['size_reduction']:.0%} smaller than fp32; decoding x{q['speed_ratio']:.2f} the fp32 "
                 f"tokens/s ({kernel}); held-out loss {q['loss_change']:+.4f} nats/token",
                 verdict, TABS["INT8"]])
    return rows


def _kernel_words(kernel: str | None, name: str, numbers: dict) -> str:
    """The last-but-one column: which product computed a format's one-token steps."""
    if kernel == fm.INT8_FAST:
        return ("the fast step's int8 kernel (models/speed/kernels/gemv.c: int8 rows widened to fp32 in registers, "
                "activations fp32); prompts dequantised")
    if kernel == "int8pack_mm":
        return "torch _weight_int8pack_mm for one-token steps (int8 read directly); prompts dequantised"
    if kernel == "dequantize":
        return "dequantised on the fly (int8 → fp32, then matmul)"
    return f"dense fp32, the fast step's one-token products by {numbers['decode_blas']}" if name == "fp32" else \
        "dense " + name


def _format_sentences(numbers: dict, points: list[dict], flagged: list[str]) -> str:
    """What the hardware and the measurement say about int8 and bf16 here, and which speeds were discarded."""
    rows = numbers["formats"]
    f32, i8, b16 = rows["fp32"], rows["int8"], rows["bf16"]
    out = []
    if "int8" not in flagged:
        x = i8["tokens_per_s"] / f32["tokens_per_s"]
        read = i8["bytes_per_token"]["total"] / f32["bytes_per_token"]["total"]
        if x > 1:
            out.append(f"**int8 decodes {x:.2f}× as fast as fp32** here: it reads {read:.0%} of fp32's bytes per "
                       "token (every matrix, the LM head included, in int8; the norms, the KV cache and the one "
                       "embedding row a token looks up stay fp32).")
        else:
            why = numbers.get("int8_aside")
            out.append(f"**int8 decodes only {x:.2f}× fp32's speed here**, though it reads {read:.0%} of the bytes: "
                       + (f"the fast step stands aside for it ({why}), and torch's own one-row int8 product is slower "
                          "than the dense fp32 one on this CPU." if why else "this CPU streams the int8 rows no faster "
                          "than fp32's (a busy machine, or a memory system that is not the limit here)."))
    native = numbers.get("native_bf16")
    if native is False:
        out.append("**This CPU has no native bf16 arithmetic** (no AVX512-BF16, no AMX): torch widens every bf16 "
                   "weight to fp32 in software, so bf16 reads half of fp32's bytes (its point on the roofline) yet "
                   f"decodes at {b16['tokens_per_s'] / f32['tokens_per_s']:.2f}× fp32's speed.")
    elif native:
        out.append("This machine multiplies bf16 natively (AVX512-BF16 or AMX on a CPU, a GPU of compute capability "
                   "8 or more).")
    if flagged:
        out.append(f"**Measuring error:** {', '.join(flagged)} measured faster than its memory limit allows, which a "
                   "step that reads every weight once cannot do (a timer or the caches misled the measurement); "
                   "its speed is left out of the table and the figure. Press **Measure** again.")
    if numbers.get("adapters"):
        out.append(f"The loaded model carries LoRA adapters ({numbers['adapters']}): every row, transformers' too, "
                   "holds the weights it computes with now (adapters that are on added into their base weights).")
    return "\n\n".join(out)


def _timed_over(r: dict) -> str:
    """How a row's decode speed was measured: "64 tokens × 3 runs"."""
    runs = r["repeats"]
    return f"{r['new_tokens']} tokens × {runs} run{'s' if runs != 1 else ''}"


def _pct(x: float) -> str:
    return f"{x:.0%}"


@user_errors
def formats_view(prompt, state, progress=gr.Progress()):
    """The loaded model at fp32, bf16 and int8: table, top-10, roofline, notes and the measured summary table.
    progress: Gradio's progress bar, told each stage of a measurement (an answer from the cache has none)."""
    model, tokenizer, _ = session.get_model(state)
    ids, notice = _prompt_ids(tokenizer, prompt, model)
    numbers = results.get_or_compute(("formats", weights_key(model), adapter_mode(model), tuple(ids)),
                                     lambda: measure_formats(model, tokenizer, ids, progress))
    return _view(model, tokenizer, ids, notice, numbers)


def _prompt_ids(tokenizer, prompt, model) -> tuple[list[int], str]:
    ids, _, notice = session.encode_with_notice(tokenizer, prompt, min(MAX_PROMPT_TOKENS,
                                                                      model.config.max_seq_len - NEW_TOKENS))
    return ids, notice


@user_errors
def formats_example(prompt, state):
    """The section's opening example: the shipped default model measured by ``measure_formats`` once, when the app
    starts (after the first tab's example), kept apart from Measure's results so that Measure measures anew."""
    import datetime

    model, tokenizer = session.load_default()
    ids, notice = _prompt_ids(tokenizer, prompt, model)
    numbers = measure_formats(model, tokenizer, ids)
    view = _view(model, tokenizer, ids, notice, numbers)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M UTC")
    opening = (f"**Opening example: the shipped default model ({session.default_model_name()}), measured when the "
               f"app started ({when})** by the same code as the button. Press **Measure** to measure the loaded "
               "model now.\n\n")
    return view._replace(notes=opening + view.notes)


@user_errors
def formats_after_load(state):
    """After a model load: the section's figures belonged to the previous model, so they are cleared and the
    notes say how to measure the new one (a measurement takes up to ~30 s, too long to start unasked)."""
    _, _, name = session.get_model(state)
    notes = (f"The figures here were measured on the previous model. Press **Measure fp32 · bf16 · int8** to "
             f"measure **{name}** now.")
    return FormatsView([], [], None, notes, [], None)


def _view(model, tokenizer, ids: list[int], notice: str, numbers: dict) -> FormatsView:
    """The tables, roofline and notes from ``measure_formats``'s numbers for ``model`` and the prompt's ``ids``."""
    bw = numbers["bandwidth"]["bytes_per_s"]
    table, points, flagged = [], [], []
    for name, r in numbers["formats"].items():
        b = r["bytes_per_token"]["total"]
        limit = fm.roofline_tokens_per_s(b, bw)
        a = r["agreement"]
        speed, pct = round(r["tokens_per_s"], 1), _pct(r["tokens_per_s"] / limit)
        if fm.above_limit(r["tokens_per_s"], limit):
            flagged.append(name)
            speed, pct = f"measuring error ({r['tokens_per_s']:.1f} is above the limit)", "—"
        else:
            points.append({"name": f"ours {name}", "bytes_per_token": b, "tokens_per_s": r["tokens_per_s"]})
        table.append([name, measure.format_bytes(r["weight_bytes"]), speed, round(b / 1e6, 3),
                      round(limit, 1), pct, f"{a['matching']} / {a['new_tokens']}",
                      f"{r['max_abs_logit_diff']:.2e}", round(r["held_out_loss"], 4),
                      _kernel_words(r["int8_kernel"], name, numbers), _timed_over(r)])
    hf = numbers["transformers"]
    f32 = numbers["formats"]["fp32"]
    if hf is not None:
        b = f32["bytes_per_token"]["total"]
        limit = fm.roofline_tokens_per_s(b, bw)
        both = min(hf["new_tokens"], f32["new_tokens"])  # the new tokens both decoded
        same = sum(x == y for x, y in zip(hf["tokens"][len(ids):len(ids) + both],
                                          numbers["fp32_tokens"][len(ids):len(ids) + both]))
        speed, pct = round(hf["tokens_per_s"], 1), _pct(hf["tokens_per_s"] / limit)
        if fm.above_limit(hf["tokens_per_s"], limit):
            flagged.append(TRANSFORMERS)
            speed, pct = f"measuring error ({hf['tokens_per_s']:.1f} is above the limit)", "—"
        else:
            points.append({"name": TRANSFORMERS, "bytes_per_token": b, "tokens_per_s": hf["tokens_per_s"]})
        table.append([TRANSFORMERS, measure.format_bytes(f32["weight_bytes"]), speed,
                      round(b / 1e6, 3), round(limit, 1), pct,
                      f"{same} / {both}", f"{hf['max_abs_logit_diff']:.2e}", round(hf["held_out_loss"], 4),
                      "dense fp32 (LlamaForCausalLM, SDPA)", _timed_over(hf)])
    words = {}
    top = []
    for rank in range(len(f32["top"])):
        row = [rank + 1]
        for r in numbers["formats"].values():
            i, p = r["top"][rank]
            words.setdefault(i, session.token_strings(tokenizer, [i])[0])
            row.append(f"{words[i]!r} {p:.3f}")
        top.append(row)
    rt = numbers["runtime"]
    prov = provenance_text(rt["device"], "fp32 / bf16 / int8 weights", rt["torch"])
    fig = figs.roofline_figure(points, bw, provenance=prov) if points else None
    pre = f32["prefill_tokens_per_s"]
    notes = (
        f"**Memory read bandwidth: {bw / 1e9:.1f} GB/s**, measured now: {numbers['bandwidth']['method']}. "
        f"Bytes read per token are counted on each model (every weight matrix once, the norms, and the KV cache at "
        f"the continuation's middle length, {numbers['prompt_tokens'] + NEW_TOKENS // 2} positions); the limit is "
        f"bandwidth ÷ those bytes. Each decoder's speed is timed for about {DECODE_SECONDS:.2g} s: up to "
        f"{NEW_TOKENS} new tokens, up to {REPEATS} runs, fewer where it decodes slowly (the last column says how "
        f"many; greedy agreement compares the new tokens both decoded).\n\n"
        f"**Why decoding is memory-bound and prefill is not:** a decode step uses each weight for one multiply-add "
        f"(about 2 flops per 4 bytes read in fp32), so the cores wait for memory; prefill uses each weight once per "
        f"prompt token ({numbers['held_out_tokens']} here), so arithmetic sets its pace: fp32 prefill ran at "
        f"**{pre:,.0f} tokens/s** against **{f32['tokens_per_s']:.1f} tokens/s** decoding, on the same weights.\n\n"
        f"Held-out loss: the first {numbers['held_out_tokens']} tokens of "
        f"`assets/encoder-model/held_out_stories.txt`; max |Δlogit| over the same positions. "
        f"int8: {fm.FORMAT_NOTES['int8']}. bf16: {fm.FORMAT_NOTES['bf16']}. "
        f"A format is faster only where the CPU has a fast kernel for it: measured, not assumed.\n\n"
        + _format_sentences(numbers, points, flagged)
        + (f"\n\nThis model's weights ({measure.format_bytes(f32['weight_bytes'])}) fit in the CPU's caches, so "
           f"per-step overhead (Python, small kernels), not memory, sets its decoding pace and the limit is far "
           f"away; load SmolLM2-135M (about 540 MB in fp32) to see the roofline bite."
           if f32["weight_bytes"] < CACHE_SIZED else "")
        + (f"\n\n{notice}" if notice else "")
        + ("" if hf is not None else "\n\ntransformers could not build this model: its row is left out."))
    summary = _summary(model, numbers)
    return FormatsView(table, top, fig, notes, summary, numbers)


def build_formats(demo: gr.Blocks, state: gr.State) -> None:
    gr.Markdown(INTRO)
    with gr.Row():
        prompt = gr.Textbox(label="Prompt (its next-token top-10 under each format)", value=DEFAULT_PROMPT, lines=2,
                            scale=4)
        run = gr.Button("Measure fp32 · bf16 · int8", variant="primary", scale=1)
    table = gr.Dataframe(headers=FORMAT_HEADERS, label="The loaded model in three formats, measured now",
                         interactive=False)
    with gr.Row():
        with gr.Column(scale=3):
            roofline = gr.Plot(label="Decoding speed against bytes per token", elem_id="formats-roofline")
        with gr.Column(scale=2):
            top = gr.Dataframe(headers=["rank", *fm.FORMATS], label="Next token: top-10 under each format",
                               interactive=False)
    notes = gr.Markdown()
    gr.Markdown("#### The tutorial's memory and compute summary, measured on the loaded model")
    summary = gr.Dataframe(headers=SUMMARY_HEADERS, label="Claim, measurement, verdict", interactive=False,
                           wrap=True)
    with gr.Accordion("The numbers behind both tables", open=False):
        numbers = gr.JSON()
    outputs = [table, top, roofline, notes, summary, numbers]
    run.click(formats_view, [prompt, state], outputs, api_name="formats", **lane(MEASURE))
    # computed with the other openings (python app.py: after the first tab's), once, on the shipped model
    demo.load(cached_opening("formats_example", formats_example), [prompt, state], outputs,
              api_name="formats_example", api_visibility="private", **lane(MEASURE))
    links.follow_model_loads(demo, formats_after_load, [state], outputs, api_name="clear_formats_after_load")
