"""The Weight formats section's measurement (a section of the LoRA & int8 tab): the loaded model at fp32, bf16 and
int8 decoded side by side, transformers on the same weights, the roofline's bandwidth, and the numbers behind the
tutorial's summary table. Below the panel, which lays it out, and the benchmark, which times it.

Copies of the model are kept in ``explorer.state.cache.results`` (keyed by the model's weights), never in
``gr.State``.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from explorer import measure
from explorer.state import session
from explorer.state.cache import results, weights_key
from explorer.state.locks import MEASURE_LOCK
from lens.hooks import model_lock
from models.lora import adapter_mode, folded_copy
from models.speed import decode_blas, fast_step

from . import formats as fm


def seconds_scale() -> float:
    """``EXPLORER_FORMATS_SECONDS_SCALE`` (default 1): the formats view's timing budgets multiplied by it, so a test
    suite or a slow machine can trade the numbers' steadiness for a shorter wait."""
    import os

    try:
        return min(10.0, max(0.05, float(os.environ.get("EXPLORER_FORMATS_SECONDS_SCALE", "") or 1.0)))
    except ValueError:  # a bad setting must not stop the app from starting
        return 1.0


ROOT = Path(__file__).resolve().parents[2]
HELD_OUT_PATH = ROOT / "assets" / "encoder-model" / "held_out_stories.txt"
# the fixed text's first tokens (fewer when the model's context is shorter): every format reads them once, and
# bf16's forward on a CPU without native bf16 is the view's slowest step (about 17 ms a token at the 135M shape)
HELD_OUT_TOKENS = 128
NEW_TOKENS = 64  # greedy agreement and decode speed are measured over at most this many new tokens
REPEATS = 3
# each format's decoding (and transformers') is timed for about this long, so that the whole view fits 30 s:
# fewer tokens and runs where a format decodes slowly (bf16 without native kernels), each row saying how many
DECODE_SECONDS = 2.0 * seconds_scale()
CACHE_TOKENS = 32  # the KV-caching row: decode with and without the cache, over at most this many tokens
# ... the cached decode timed for about this long (fewer tokens where it is slow), the uncached one then over as
# many tokens
CACHE_SECONDS = 2.0 * seconds_scale()
FLASH_LENGTHS = (1024, 2048)  # the FlashAttention row: peak memory at two lengths, to see how it grows
LORA_RANK, LORA_TARGETS = 8, ("q_proj", "v_proj")


def held_out_ids(tokenizer, max_len: int) -> list[int]:
    """The fixed held-out text's first tokens (at most ``max_len``)."""
    text = HELD_OUT_PATH.read_text()[:20_000]  # far more characters than HELD_OUT_TOKENS tokens need
    return list(tokenizer(text, add_special_tokens=True, truncation=True, max_length=max_len)["input_ids"])


def format_copies(model) -> dict[str, torch.nn.Module]:
    """fp32, bf16 and int8 versions of ``model`` (an fp32 model serves as its own fp32 version), the copies kept
    in the shared cache (bounded; the weights' key changes with every in-place write, so a trained LoRA model
    never meets a stale copy). Raises ValueError when the copies would not fit the memory budget.

    A fine-tuned model (LoRA adapters attached) is compared like with like: every format, and transformers built
    from the fp32 one, holds the weights the model computes with now (``models.lora.folded_copy``: each adapter
    that is on added into its base weight, one that is off left out)."""
    n = model.num_parameters()
    sizes = {"fp32": 4 * n, "bf16": 2 * n, "int8": measure.parameter_memory(model.config)["int8_models_quant"]}
    adapted = adapter_mode(model)
    fp32 = model.embed_tokens.weight.dtype == torch.float32 and adapted is None
    need = sum(v for k, v in sizes.items() if k != "fp32" or not fp32)
    if need > measure.MEMORY_BUDGET_BYTES:
        raise ValueError(f"Converting this model needs {measure.format_bytes(need)} for its copies, over the "
                         f"{measure.format_bytes(measure.MEMORY_BUDGET_BYTES)} one request may use: load a smaller "
                         "model (SmolLM2-135M fits) to compare formats.")
    key = (weights_key(model), adapted)  # switching adapters off or on writes no weight
    out = {}
    for fmt in fm.FORMATS:
        if fmt == "fp32" and fp32:
            out[fmt] = model
            continue

        def build(fmt=fmt):
            with model_lock(model):  # no LoRA write half-way through the copy
                return fm.convert(model if adapted is None else folded_copy(model), fmt)
        out[fmt] = results.get_or_compute(("format_copy", key, fmt), build, nbytes=sizes[fmt])
    return out


#: What the progress bar says, stage by stage (the stages, not a time estimate: decoding takes most of it).
STAGES = ("converting the model to bf16 and int8", "measuring memory read bandwidth",
          f"decoding in fp32, bf16 and int8, about {DECODE_SECONDS:.2g} s each (up to {NEW_TOKENS} tokens, up to "
          f"{REPEATS} runs; the longest stage)",
          "fp32 prefill speed", "transformers on the same weights", "decoding with and without the cache",
          "attention memory at two lengths")


def measure_formats(model, tokenizer, ids: list[int], progress=None) -> dict:
    """The Weight formats section's whole measurement of ``model`` (fp32) on the prompt ``ids``: read bandwidth,
    fp32 / bf16 / int8 decoding against fp32 (and transformers), fp32 prefill, decoding with and without the KV
    cache, attention memory at two lengths, and the calculators' numbers for the summary table. ``progress`` is
    told each of ``STAGES`` in turn. A dict of numbers and short lists (seconds, bytes, tokens/s)."""
    c = model.config
    device = model.embed_tokens.weight.device
    prompt = torch.tensor([ids], device=device)
    held = torch.tensor([held_out_ids(tokenizer, min(HELD_OUT_TOKENS, c.max_seq_len))], device=device)

    def stage(i: int) -> None:
        if progress is not None:
            progress((i, len(STAGES)), desc=STAGES[i], unit="stages")

    stage(0)
    copies = format_copies(model)
    with session.default_threads(), MEASURE_LOCK:  # one measurement on the cores at a time
        stage(1)
        bandwidth = fm.read_bandwidth(repeats=7, device=device)
        # decoded as the benchmark decodes: the fast step where it computes the model exactly, else the modules
        stage(2)
        reference = fm.held_out_logits(copies["fp32"], held)  # (1, T', V): fp32's row, its |Δlogit| and transformers'
        measured = fm.compare_formats(copies, prompt, held, new_tokens=NEW_TOKENS, repeats=REPEATS, step=fast_step,
                                      budget_s=DECODE_SECONDS, reference_logits=reference)
        stage(3)
        # fp32's only: the screen contrasts prefill with decoding, and the other formats' would double the wait
        prefill = {"fp32": fm.prefill_speed(copies["fp32"], held, repeats=REPEATS)}
        hf_speed = None
        stage(4)
        with tempfile.TemporaryDirectory() as tmp:
            hf = fm.transformers_copy(copies["fp32"], Path(tmp))
            if hf is not None:
                hf_speed = fm.transformers_stepped_speed(hf, prompt, NEW_TOKENS, repeats=REPEATS,
                                                         budget_s=DECODE_SECONDS)
                hf_speed.update(fm.transformers_against(copies["fp32"], hf, held, ours_logits=reference))
                del hf
        del reference
        fp32 = copies["fp32"]
        stage(5)
        kv_on = fm.stepped_speed(fp32, prompt, CACHE_TOKENS, step=fast_step, repeats=1, budget_s=CACHE_SECONDS)
        kv_off = fm.stepped_speed(fp32, prompt, kv_on["new_tokens"], use_cache=False, repeats=1)
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
        "native_bf16": fm.native_bf16(device), "int8_aside": fast_step.why_not(copies["int8"]),
        "adapters": adapter_mode(model),
    }
    f32, i8 = numbers["formats"]["fp32"], numbers["formats"]["int8"]
    numbers["int8"] = {"size_reduction": 1 - i8["weight_bytes"] / f32["weight_bytes"],
                       "speed_ratio": i8["tokens_per_s"] / f32["tokens_per_s"],
                       "loss_change": i8["held_out_loss"] - f32["held_out_loss"], "kernel": i8["int8_kernel"]}
    return numbers
