"""Weight formats: fp32 · bf16 · int8 (a section of the LoRA & int8 tab): the loaded model in three formats
side by side, the memory-bandwidth roofline of one-token decoding, and the tutorial's memory-and-compute
summary table measured on this machine.

Every number comes from ``explorer.measure`` on the loaded model when the button is pressed; a result is kept in
``explorer.state.cache.results`` (keyed by the model's weights and the prompt), never in ``gr.State``.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import gradio as gr
import torch

from explorer import measure

from explorer.state import session
from explorer.state.cache import results, weights_key
from explorer.figures import formats as figs
from explorer.figures.common import provenance_text
from explorer.state.locks import MEASURE_LOCK
from lens.hooks import model_lock
from explorer.measure import formats as fm
from models.speed import decode_blas, fast_step
from models.generate import generate

from explorer.panels.errors import user_errors
from explorer.state.openings import cached_opening
from explorer.web import links
from explorer.web.groups import MEASURE, lane

ROOT = Path(__file__).resolve().parents[2]
HELD_OUT_PATH = ROOT / "assets" / "encoder-model" / "held_out_stories.txt"
HELD_OUT_TOKENS = 256  # the fixed text's first tokens (fewer when the model's context is shorter)
MAX_PROMPT_TOKENS = 64
NEW_TOKENS = 64  # greedy agreement and decode speed are measured over at most this many new tokens
REPEATS = 3
# each format's decoding (and transformers') is timed for about this long, so that the whole view fits 30 s:
# fewer tokens and runs where a format decodes slowly (bf16 without native kernels), each row saying how many
DECODE_SECONDS = 3.0
CACHE_TOKENS = 32  # the KV-caching row: decode with and without the cache, over at most this many tokens
CACHE_SECONDS = 2.0  # ... the cached decode timed for about this long (fewer tokens where it is slow), the
# uncached one then over as many tokens
FLASH_LENGTHS = (1024, 2048)  # the FlashAttention row: peak memory at two lengths, to see how it grows
LORA_RANK, LORA_TARGETS = 8, ("q_proj", "v_proj")
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


def held_out_ids(tokenizer, max_len: int) -> list[int]:
    """The fixed held-out text's first tokens (at most ``max_len``)."""
    text = HELD_OUT_PATH.read_text()[:20_000]  # far more characters than HELD_OUT_TOKENS tokens need
    return list(tokenizer(text, add_special_tokens=True, truncation=True, max_length=max_len)["input_ids"])


def _copies(model) -> dict[str, torch.nn.Module]:
    """fp32, bf16 and int8 versions of ``model`` (an fp32 model serves as its own fp32 version), the copies kept
    in the shared cache (bounded; the weights' key changes with every in-place write, so a trained LoRA model
    never meets a stale copy). Raises ValueError when the copies would not fit the memory budget."""
    n = model.num_parameters()
    sizes = {"fp32": 4 * n, "bf16": 2 * n, "int8": measure.parameter_memory(model.config)["int8_models_quant"]}
    fp32 = model.embed_tokens.weight.dtype == torch.float32
    need = sum(v for k, v in sizes.items() if k != "fp32" or not fp32)
    if need > measure.MEMORY_BUDGET_BYTES:
        raise ValueError(f"Converting this model needs {measure.format_bytes(need)} for its copies, over the "
                         f"{measure.format_bytes(measure.MEMORY_BUDGET_BYTES)} one request may use: load a smaller "
                         "model (SmolLM2-135M fits) to compare formats.")
    key = weights_key(model)
    out = {}
    for fmt in fm.FORMATS:
        if fmt == "fp32" and fp32:
            out[fmt] = model
            continue

        def build(fmt=fmt):
            with model_lock(model):  # no LoRA write half-way through the copy
                return fm.convert(model, fmt)
        out[fmt] = results.get_or_compute(("format_copy", key, fmt), build, nbytes=sizes[fmt])
    return out


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
    rows.append(["INT8", CLAIMS["INT8"],
                 f"weights {q['size_reduction']:.0%} smaller than fp32; decoding x{q['speed_ratio']:.2f} the fp32 "
                 f"tokens/s ({q['kernel']}); held-out loss {q['loss_change']:+.4f} nats/token",
                 verdict, TABS["INT8"]])
    return rows


#: What the progress bar says, stage by stage (the stages, not a time estimate: decoding takes most of it).
STAGES = ("converting the model to bf16 and int8", "measuring memory read bandwidth",
          f"decoding in fp32, bf16 and int8, about {DECODE_SECONDS:.0f} s each (up to {NEW_TOKENS} tokens, up to "
          f"{REPEATS} runs; the longest stage)",
          "fp32 prefill speed", "transformers on the same weights", "decoding with and without the cache",
          "attention memory at two lengths")


def _measure(model, tokenizer, ids: list[int], progress=None) -> dict:
    c = model.config
    device = model.embed_tokens.weight.device
    prompt = torch.tensor([ids], device=device)
    held = torch.tensor([held_out_ids(tokenizer, min(HELD_OUT_TOKENS, c.max_seq_len))], device=device)

    def stage(i: int) -> None:
        if progress is not None:
            progress((i, len(STAGES)), desc=STAGES[i], unit="stages")

    stage(0)
    copies = _copies(model)
    with session.default_threads(), MEASURE_LOCK:  # one measurement on the cores at a time
        stage(1)
        bandwidth = fm.read_bandwidth(repeats=7, device=device)
        # decoded as the benchmark decodes: the fast step where it computes the model exactly, else the modules
        stage(2)
        reference = fm.held_out_logits(copies["fp32"], held)  # (1, T', V): fp32's row, its |Δlogit| and transformers'
        measured = fm.compare_formats(copies, prompt, held, new_tokens=NEW_TOKENS, repeats=REPEATS, step=fast_step,
                                      budget_s=DECODE_SECONDS, reference_logits=reference)
        stage(3)
        # fp32's only: the screen contrasts it with decoding; bf16 and int8 took 30 s more on SmolLM2-135M
        prefill = {"fp32": fm.prefill_speed(copies["fp32"], held, repeats=REPEATS)}
        hf_speed = None
        stage(4)
        with tempfile.TemporaryDirectory() as tmp:
            hf = fm.transformers_copy(copies["fp32"], Path(tmp))
            if hf is not None:
                hf_speed = fm.decode_speed(fm.transformers_generate_fn(hf, prompt), NEW_TOKENS, repeats=REPEATS,
                                           budget_s=DECODE_SECONDS)
                hf_speed.update(fm.transformers_against(copies["fp32"], hf, held, ours_logits=reference))
                del hf
        del reference
        fp32 = copies["fp32"]
        stage(5)
        kv_on = fm.decode_speed(lambda n: generate(fp32, prompt, n, step=fast_step), CACHE_TOKENS, repeats=1,
                                budget_s=CACHE_SECONDS)
        kv_off = fm.decode_speed(lambda n: generate(fp32, prompt, n, use_cache=False), kv_on["new_tokens"],
                                 repeats=1)
        flash = {impl: [] for impl in ("naive", "sdpa")}
        stage(6)
        for T in FLASH_LENGTHS:
            r = measure.attention_memory(T, c.n_heads, c.head_dim, n_kv_heads=c.n_kv_heads, impls=("naive", "sdpa"),
                                         repeats=1, device=device)
            for impl in flash:
                flash[impl].append(r[impl]["peak_bytes"])
    formula = measure.kv_cache_bytes(c, seq_len=c.max_seq_len, dtype=torch.float32)
    variants = measure.attention_variants(c, seq_len=c.max_seq_len, dtype=torch.float32)
    lora = measure.lora_parameters(c, LORA_RANK, LORA_TARGETS)
    numbers = {
        "bandwidth": {k: bandwidth[k] for k in ("bytes_per_s", "nbytes", "repeats", "seconds", "method")},
        "formats": {name: {"weight_bytes": r["weight_bytes"], "tokens_per_s": r["tokens_per_s"],
                           "bytes_per_token": r["bytes_per_token"], "agreement": r["agreement"],
                           "max_abs_logit_diff": r["max_abs_logit_diff"], "held_out_loss": r["held_out_loss"],
                           "int8_kernel": r["int8_kernel"], "prefill_tokens_per_s": prefill.get(name),
                           "new_tokens": r["new_tokens"], "repeats": r["repeats"],
                           "top": r["top"]} for name, r in measured.items()},
        "transformers": None if hf_speed is None else {"tokens_per_s": hf_speed["tokens_per_s"],
                                                       "tokens": hf_speed["tokens"][0].tolist(),
                                                       "new_tokens": hf_speed["new_tokens"],
                                                       "repeats": hf_speed["repeats"],
                                                       "max_abs_logit_diff": hf_speed["max_abs_logit_diff"],
                                                       "held_out_loss": hf_speed["held_out_loss"]},
        "kv": {"allocated_bytes_per_position": fm.cache_bytes_per_position(fp32),
               "formula_bytes_per_token": formula["per_token"], "seq_len": c.max_seq_len,
               "cached_ms": kv_on["step_seconds"] * 1e3, "uncached_ms": kv_off["step_seconds"] * 1e3,
               "speedup": kv_off["step_seconds"] / kv_on["step_seconds"], "new_tokens": kv_on["new_tokens"]},
        "gqa": {"mha_bytes": variants["MHA"]["per_sequence"], "gqa_bytes": variants["GQA"]["per_sequence"],
                "ratio": variants["MHA"]["per_sequence"] / variants["GQA"]["per_sequence"],
                "allocated_bytes": fp32.new_cache(1).nbytes, "seq_len": c.max_seq_len},
        "flash": {**flash, "lengths": list(FLASH_LENGTHS), "naive_growth": flash["naive"][1] / flash["naive"][0],
                  "sdpa_growth": flash["sdpa"][1] / max(flash["sdpa"][0], 1)},
        "lora": {k: lora[k] for k in ("trainable", "frozen", "trainable_fraction")},
        "fp32_tokens": measured["fp32"]["tokens"], "held_out_tokens": held.shape[1], "prompt_tokens": len(ids), "new_tokens": NEW_TOKENS,
        "runtime": measure.runtime_info(fp32), "decode_blas": decode_blas(fp32),
    }
    f32, i8 = numbers["formats"]["fp32"], numbers["formats"]["int8"]
    numbers["int8"] = {"size_reduction": 1 - i8["weight_bytes"] / f32["weight_bytes"],
                       "speed_ratio": i8["tokens_per_s"] / f32["tokens_per_s"],
                       "loss_change": i8["held_out_loss"] - f32["held_out_loss"], "kernel": i8["int8_kernel"]}
    return numbers


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
    numbers = results.get_or_compute(("formats", weights_key(model), tuple(ids)),
                                     lambda: _measure(model, tokenizer, ids, progress))
    return _view(model, tokenizer, ids, notice, numbers)


def _prompt_ids(tokenizer, prompt, model) -> tuple[list[int], str]:
    ids, _, notice = session.encode_with_notice(tokenizer, prompt, min(MAX_PROMPT_TOKENS,
                                                                      model.config.max_seq_len - NEW_TOKENS))
    return ids, notice


@user_errors
def formats_example(prompt, state):
    """The section's opening example: the shipped default model measured by ``_measure`` once, when the app
    starts (after the first tab's example), kept apart from Measure's results so that Measure measures anew."""
    import datetime

    model, tokenizer = session.load_default()
    ids, notice = _prompt_ids(tokenizer, prompt, model)
    numbers = _measure(model, tokenizer, ids)
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
    """The tables, roofline and notes from ``_measure``'s numbers for ``model`` and the prompt's ``ids``."""
    bw = numbers["bandwidth"]["bytes_per_s"]
    table, points = [], []
    for name, r in numbers["formats"].items():
        b = r["bytes_per_token"]["total"]
        limit = fm.roofline_tokens_per_s(b, bw)
        a = r["agreement"]
        table.append([name, measure.format_bytes(r["weight_bytes"]), round(r["tokens_per_s"], 1), round(b / 1e6, 3),
                      round(limit, 1), _pct(r["tokens_per_s"] / limit), f"{a['matching']} / {a['new_tokens']}",
                      f"{r['max_abs_logit_diff']:.2e}", round(r["held_out_loss"], 4),
                      {"int8pack_mm": "torch _weight_int8pack_mm for one-token steps (int8 read directly); "
                                      "prompts dequantised",
                       "dequantize": "dequantised on the fly (int8 → fp32, then matmul)"}.get(
                          r["int8_kernel"],
                          f"dense fp32, the fast step's one-token products by {numbers['decode_blas']}"
                          if name == "fp32" else "dense " + name), _timed_over(r)])
        points.append({"name": f"ours {name}", "bytes_per_token": b, "tokens_per_s": r["tokens_per_s"]})
    hf = numbers["transformers"]
    f32 = numbers["formats"]["fp32"]
    if hf is not None:
        b = f32["bytes_per_token"]["total"]
        limit = fm.roofline_tokens_per_s(b, bw)
        both = min(hf["new_tokens"], f32["new_tokens"])  # the new tokens both decoded
        same = sum(x == y for x, y in zip(hf["tokens"][len(ids):len(ids) + both],
                                          numbers["fp32_tokens"][len(ids):len(ids) + both]))
        table.append([TRANSFORMERS, measure.format_bytes(f32["weight_bytes"]), round(hf["tokens_per_s"], 1),
                      round(b / 1e6, 3), round(limit, 1), _pct(hf["tokens_per_s"] / limit),
                      f"{same} / {both}", f"{hf['max_abs_logit_diff']:.2e}", round(hf["held_out_loss"], 4),
                      "dense fp32 (LlamaForCausalLM, SDPA)", _timed_over(hf)])
        points.append({"name": TRANSFORMERS, "bytes_per_token": b, "tokens_per_s": hf["tokens_per_s"]})
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
    fig = figs.roofline_figure(points, bw, provenance=prov)
    pre = f32["prefill_tokens_per_s"]
    notes = (
        f"**Memory read bandwidth: {bw / 1e9:.1f} GB/s**, measured now: {numbers['bandwidth']['method']}. "
        f"Bytes read per token are counted on each model (every weight matrix once, the norms, and the KV cache at "
        f"the continuation's middle length, {numbers['prompt_tokens'] + NEW_TOKENS // 2} positions); the limit is "
        f"bandwidth ÷ those bytes. Each decoder's speed is timed for about {DECODE_SECONDS:.0f} s: up to "
        f"{NEW_TOKENS} new tokens, up to {REPEATS} runs, fewer where it decodes slowly (the last column says how "
        f"many; greedy agreement compares the new tokens both decoded).\n\n"
        f"**Why decoding is memory-bound and prefill is not:** a decode step uses each weight for one multiply-add "
        f"(about 2 flops per 4 bytes read in fp32), so the cores wait for memory; prefill uses each weight once per "
        f"prompt token ({numbers['held_out_tokens']} here), so arithmetic sets its pace: fp32 prefill ran at "
        f"**{pre:,.0f} tokens/s** against **{f32['tokens_per_s']:.1f} tokens/s** decoding, on the same weights.\n\n"
        f"Held-out loss: the first {numbers['held_out_tokens']} tokens of "
        f"`assets/encoder-model/held_out_stories.txt`; max |Δlogit| over the same positions. "
        f"int8: {fm.FORMAT_NOTES['int8']}. bf16: {fm.FORMAT_NOTES['bf16']}. "
        f"A format is faster only where the CPU has a fast kernel for it: measured, not assumed."
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
            roofline = gr.Plot(label="Decoding speed against bytes per token")
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
