"""Decoding in three weight formats against the memory roofline: ours at fp32 / bf16 / int8 and transformers
at fp32 on the same weights, each as a fraction of bandwidth ÷ bytes read per token."""
from __future__ import annotations

from typing import Any

import torch

from explorer.measure import formats as fm
from models.decoder import Decoder
from models.speed import fast_step
from models.generate import generate

from .targets import HF_TOKENS

# the flags that decide which narrow formats a CPU multiplies fast
CPU_FLAGS_SHOWN = frozenset({"avx2", "fma", "avx512f", "avx512_vnni", "avxvnni", "avx512_bf16", "amx_bf16",
                             "amx_int8"})


def bench_formats(model: Decoder, hf, prompt: torch.Tensor, settings: dict[str, Any], log) -> dict[str, Any]:
    """Read bandwidth, then decode tokens/s (prefill left out: ``stepped_speed``, transformers' ``decode_speed``) of
    each format (decoded with ``models.speed.fast_step``, which computes fp32 and int8 and steps aside for bf16: the
    modules decode it) and of transformers, bytes read per token counted on each model at the continuation's middle
    length, the limit and the fraction of it reached. ``prompt`` (1, T); ``hf`` may be None (then its row is
    absent)."""
    bw = fm.read_bandwidth(settings["bandwidth_bytes"], repeats=7, device=prompt.device)
    log(f"formats: read bandwidth {bw['bytes_per_s'] / 1e9:.1f} GB/s ({bw['method']})")
    kv_len = prompt.shape[1] + HF_TOKENS // 2
    rows: dict[str, dict[str, Any]] = {}
    speeds = {}
    for fmt in fm.FORMATS:
        m = model if fmt == "fp32" else fm.convert(model, fmt)
        speeds[f"ours {fmt}"] = (fm.stepped_speed(m, prompt, HF_TOKENS, step=fast_step,
                                                  repeats=settings["decode_repeats"]),
                                 fm.bytes_per_token(m, kv_len), fm.int8_kernel(m, fast_step))
        del m
    if hf is not None:
        speeds["transformers fp32"] = (fm.decode_speed(fm.transformers_generate_fn(hf, prompt), HF_TOKENS,
                                                       repeats=settings["decode_repeats"], device=prompt.device),
                                       fm.bytes_per_token(model, kv_len), None)
    for name, (speed, nbytes, kernel) in speeds.items():
        limit = fm.roofline_tokens_per_s(nbytes["total"], bw["bytes_per_s"])
        rows[name] = {"tokens_per_s": speed["tokens_per_s"], "bytes_per_token": nbytes["total"],
                      "weight_bytes_per_token": nbytes["weights"], "kv_bytes_per_token": nbytes["kv_cache"],
                      "limit_tokens_per_s": limit, "fraction_of_limit": speed["tokens_per_s"] / limit,
                      "int8_kernel": kernel}
        log(f"formats: {name} {speed['tokens_per_s']:.1f} tok/s, limit {limit:.1f} "
            f"({speed['tokens_per_s'] / limit:.0%})")
    out = {"bandwidth": {k: bw[k] for k in ("bytes_per_s", "nbytes", "repeats", "seconds", "method")},
           "new_tokens": HF_TOKENS, "kv_len": kv_len, "rows": rows,
           "cpu_flags": sorted(fm.cpu_flags() & CPU_FLAGS_SHOWN), "native_bf16": fm.native_bf16(prompt.device),
           **{f"{fmt}_over_fp32": rows[f"ours {fmt}"]["tokens_per_s"] / rows["ours fp32"]["tokens_per_s"]
              for fmt in ("int8", "bf16")}}
    if "transformers fp32" in rows:
        out["ours_fp32_over_transformers"] = rows["ours fp32"]["tokens_per_s"] / rows["transformers fp32"][
            "tokens_per_s"]
    return out


def bench_formats_view(model: Decoder, log) -> dict[str, Any]:
    """The "Weight formats" view's whole measurement (``explorer.measure.weight_formats.measure_formats``: three
    formats, transformers, the summary rows) on ``model``, once, with the shipped tokenizer's ids for its prompt:
    what a visitor waits for after "Measure"."""
    import time

    from explorer.measure.weight_formats import measure_formats
    from explorer.panels import formats as panel
    from explorer.state import session

    _, tokenizer = session.load_default()
    if model.config.vocab_size < len(tokenizer):
        return {"skipped": "the model cannot read the shipped tokenizer's ids (the tiny test model)"}
    ids = tokenizer(panel.DEFAULT_PROMPT)["input_ids"][:panel.MAX_PROMPT_TOKENS]
    t0 = time.perf_counter()
    numbers = measure_formats(model, tokenizer, ids)
    seconds = time.perf_counter() - t0
    rows = dict(numbers["formats"], **({"transformers": numbers["transformers"]} if numbers["transformers"] else {}))
    log(f"formats view: {seconds:.1f} s (" + ", ".join(
        f"{k} {v['tokens_per_s']:.1f} tok/s over {v['new_tokens']} tokens x {v['repeats']}" for k, v in rows.items())
        + ")")
    return {"seconds": seconds, "new_tokens": {k: v["new_tokens"] for k, v in rows.items()},
            "repeats": {k: v["repeats"] for k, v in rows.items()},
            "tokens_per_s": {k: v["tokens_per_s"] for k, v in numbers["formats"].items()}}


#: The held-out text's first tokens int8's next-token choices are compared at (the Weight formats view reads fewer).
AGREEMENT_TOKENS = 256


@torch.inference_mode()
def bench_int8_agreement(model: Decoder, tokenizer) -> dict[str, Any]:
    """int8 against fp32 on a trained model (``model``, the shipped one: random weights make greedy choices
    fragile): the next-token choice (argmax) at every position of the held-out text, each model reading the same
    text, and a 64-token greedy continuation of its first 16 tokens decoded one token at a time by the fast step."""
    from explorer.measure.weight_formats import held_out_ids

    ids = torch.tensor([held_out_ids(tokenizer, min(AGREEMENT_TOKENS, model.config.max_seq_len))])
    int8 = fm.convert(model, "int8")
    same = (model(ids).argmax(-1) == int8(ids).argmax(-1)).float()  # (1, T)
    prompt = ids[:, :16]
    greedy = fm.greedy_agreement(generate(model, prompt, 64, step=fast_step),
                                 generate(int8, prompt, 64, step=fast_step), prompt.shape[1])
    return {"positions": same.numel(), "fraction": float(same.mean()), "greedy": greedy,
            "int8_kernel": fm.int8_kernel(int8, fast_step)}


def render_formats(f: dict[str, Any]) -> list[str]:
    """The report's section for ``bench_formats``'s result (markdown lines)."""
    bw = f["bandwidth"]
    lines = ["## (c2) Decoding in three weight formats against the memory roofline", "",
             f"Read bandwidth {bw['bytes_per_s'] / 1e9:.1f} GB/s: {bw['method']}. Decode tokens/s = "
             f"({f['new_tokens']} - 1) / (time of {f['new_tokens']} new tokens - time of 1), medians; bytes per token "
             f"counted on each model (every matrix once, norms, KV cache at {f['kv_len']} positions); "
             "limit = bandwidth / bytes per token.", "",
             "| decoder | MB read / token | decode tokens/s | limit tokens/s | fraction of limit | int8 kernel |",
             "|---|---|---|---|---|---|"]
    for name, r in f["rows"].items():
        lines.append(f"| {name} | {r['bytes_per_token'] / 1e6:.1f} | {r['tokens_per_s']:.1f} | "
                     f"{r['limit_tokens_per_s']:.1f} | {r['fraction_of_limit']:.0%} | {r['int8_kernel'] or '—'} |")
    if "ours_fp32_over_transformers" in f:
        lines += ["", f"Ours fp32 / transformers fp32 decode speed: {f['ours_fp32_over_transformers']:.3f}x."]
    if "int8_over_fp32" in f:
        native = {True: "native bf16", False: "no native bf16", None: "bf16 support unknown"}[f["native_bf16"]]
        lines += ["", f"int8 / fp32 {f['int8_over_fp32']:.2f}x, bf16 / fp32 {f['bf16_over_fp32']:.2f}x; CPU flags: "
                      f"{', '.join(f['cpu_flags']) or 'unread'} ({native})."]
    return lines + [""]
