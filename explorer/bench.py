"""``python -m explorer.bench --out DIR [--quick] [--device cpu|cuda] [--dtype float32|bfloat16]``

Writes DIR/bench.md and DIR/bench.json, everything measured in this run on this machine:
  (a) naive vs sdpa vs tiled attention: measured and predicted peak memory, time, agreement, over lengths;
  (b) greedy decoding of 128 tokens with and without the KV cache (tokens compared);
  (c) our decoder vs transformers' LlamaForCausalLM on the same random weights at the SmolLM2-135M shape:
      prefill time at T=128 and T=512, greedy decoding of 64 tokens (tokens/s), measured interleaved, and
      decoding against the memory-bandwidth bound (weight bytes read per token / measured copy bandwidth);
  (d) the machine.
The markdown opens with the project's targets (issues 3 and 7), each with its measured value and pass/fail.
``--quick`` runs smaller (fewer lengths and layers, fewer repeats) and says so in the report.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from explorer import measure
from models.config import ATTN_IMPLS, ModelConfig
from models.decoder import Decoder
from models.fast import optimize_for_decode
from models.generate import generate
from models.loading import load_pretrained, save_pretrained

TARGET_T = 4096  # the length at which the attention targets are stated
APP_PROMPT_TOKENS = 64
SHIPPED_NAME = "shipped default model"
SMOL_NAME = "SmolLM2-135M shape"
PROMPT_LEN = 16
CACHE_TOKENS = 128
HF_TOKENS = 64


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------------
def settings_for(quick: bool, tiny: bool, device: str) -> dict[str, Any]:
    """What each mode runs. ``tiny`` (hidden flag, for tests) shrinks everything to seconds."""
    if tiny:
        return {"mode": "tiny (test only)", "attn_runs": [([64, 128], ATTN_IMPLS)], "attn_repeats": 1,
                "n_layers": 2, "model": {"d_model": 64, "n_heads": 4, "n_kv_heads": 2, "d_ff": 128, "vocab_size": 256},
                "prefill_lens": [128, 512], "prefill_repeats": 1, "decode_repeats": 1, "cache_repeats": 1,
                "bandwidth_bytes": 16 * measure.MIB, "app_repeats": 1}
    if quick:
        # the tiled loop is the slow one on a CPU: it stops at 2048 here; naive and sdpa reach the target length
        return {"mode": "quick", "attn_runs": [([1024, 2048], ATTN_IMPLS), ([TARGET_T], ("naive", "sdpa"))],
                "attn_repeats": 1, "n_layers": 2, "model": {}, "prefill_lens": [128, 512], "prefill_repeats": 2,
                "decode_repeats": 2, "cache_repeats": 1, "bandwidth_bytes": 128 * measure.MIB,
                "app_repeats": 2}
    seq_lens = [256, 512, 1024, 2048, 4096, 8192]
    if device.startswith("cuda"):
        seq_lens += [16384, 32768]
    return {"mode": "full", "attn_runs": [(seq_lens, ATTN_IMPLS)], "attn_repeats": 3, "n_layers": None, "model": {},
            "prefill_lens": [128, 512], "prefill_repeats": 5, "decode_repeats": 3, "cache_repeats": 3,
            "bandwidth_bytes": 512 * measure.MIB, "app_repeats": 5}


def model_config(settings: dict[str, Any]) -> ModelConfig:
    """The SmolLM2-135M shape from explorer/data/real_configs.json (layers cut down in quick mode)."""
    base = measure.real_config("SmolLM2-135M").to_dict()
    base.update(settings["model"])
    if settings["n_layers"] is not None:
        base["n_layers"] = settings["n_layers"]
    base.update(max_seq_len=1024, bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_impl="sdpa")
    return ModelConfig.from_dict(base)


def default_budget(device: str) -> int:
    """The benchmark's own budget: it runs alone, so it may use more than one app request."""
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * 0.8)
    return max(measure.MEMORY_BUDGET_BYTES, 8 * measure.GIB)


# ---------------------------------------------------------------------------------------------------
# (a) attention
# ---------------------------------------------------------------------------------------------------
def bench_attention(settings, device: str, dtype: torch.dtype, budget: int) -> list[dict[str, Any]]:
    def on_result(row):
        if row["refused"]:
            log(f"attention T={row['seq_len']} {row['impl']}: refused (over budget)")
        else:
            log(f"attention T={row['seq_len']} {row['impl']}: peak {measure.format_bytes(row['peak_bytes'])} "
                f"(predicted {measure.format_bytes(row['predicted_bytes'])}), {row['seconds']:.3f} s")

    rows = []
    for seq_lens, impls in settings["attn_runs"]:
        rows += measure.attention_sweep(seq_lens, 8, 64, impls=impls, dtype=dtype, device=device, causal=True,
                                        repeats=settings["attn_repeats"], budget_bytes=budget, over_budget="skip",
                                        on_result=on_result)
    by_t: dict[int, dict[str, dict]] = {}
    for row in rows:
        by_t.setdefault(row["seq_len"], {})[row["impl"]] = row
    for row in rows:  # ratios against naive at the same length
        naive = by_t[row["seq_len"]].get("naive")
        ok = naive and not naive["refused"] and not row["refused"]
        row["naive_over_impl_memory"] = naive["peak_bytes"] / max(row["peak_bytes"], 1) if ok else None
        row["naive_over_impl_time"] = naive["seconds"] / row["seconds"] if ok else None
        row["measured_over_predicted"] = (row["peak_bytes"] / row["predicted_bytes"]
                                          if row["peak_bytes"] is not None else None)
    return rows


# ---------------------------------------------------------------------------------------------------
# (b) KV cache
# ---------------------------------------------------------------------------------------------------
def _timed(fn: Callable[[], Any], device: str) -> tuple[Any, float]:
    measure._sync(device)
    t0 = time.perf_counter()
    out = fn()
    measure._sync(device)
    return out, time.perf_counter() - t0


def bench_cache(model: Decoder, prompt: torch.Tensor, settings, device: str) -> dict[str, Any]:
    generate(model, prompt, 4)  # warm-up
    cached_times, uncached_times = [], []
    cached = uncached = None
    for r in range(settings["cache_repeats"]):
        cached, t = _timed(lambda: generate(model, prompt, CACHE_TOKENS, use_cache=True), device)
        cached_times.append(t)
        log(f"cache: cached {CACHE_TOKENS} tokens in {t:.2f} s")
        if r == 0:  # the uncached run is the slow one: once is enough to see a ratio this large
            uncached, t = _timed(lambda: generate(model, prompt, CACHE_TOKENS, use_cache=False), device)
            uncached_times.append(t)
            log(f"cache: uncached {CACHE_TOKENS} tokens in {t:.2f} s")
    c, u = statistics.median(cached_times), statistics.median(uncached_times)
    return {"new_tokens": CACHE_TOKENS, "prompt_len": prompt.shape[1], "cached_seconds": c, "uncached_seconds": u,
            "cached_runs": cached_times, "uncached_runs": uncached_times, "speedup": u / c,
            "tokens_identical": bool(torch.equal(cached, uncached)),
            "cached_tokens_per_s": CACHE_TOKENS / c, "uncached_tokens_per_s": CACHE_TOKENS / u}


# ---------------------------------------------------------------------------------------------------
# (c) ours vs transformers
# ---------------------------------------------------------------------------------------------------
def load_transformers_copy(model: Decoder, folder: Path, dtype: torch.dtype, device: str):
    import transformers
    from transformers import LlamaForCausalLM

    transformers.logging.set_verbosity_error()
    save_pretrained(model, folder)
    hf = LlamaForCausalLM.from_pretrained(str(folder), dtype=dtype, attn_implementation="sdpa")
    return hf.to(device).eval()


def bench_vs_transformers(model: Decoder, hf, settings, device: str, cfg: ModelConfig, bandwidth: float,
                          weight_bytes_per_token: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    result: dict[str, Any] = {"prefill": {}, "decode": {}}
    with torch.inference_mode():
        probe = torch.randint(0, cfg.vocab_size, (1, 32), generator=g).to(device)
        result["max_abs_logit_diff"] = float((model(probe).float() - hf(input_ids=probe).logits.float()).abs().max())
        for T in settings["prefill_lens"]:
            tokens = torch.randint(0, cfg.vocab_size, (1, T), generator=g).to(device)
            ours_fn = lambda: model(tokens)  # noqa: E731  full logits (1, T, V)
            theirs_fn = lambda: hf(input_ids=tokens, use_cache=False).logits  # noqa: E731  full logits (1, T, V)
            ours_fn(), theirs_fn()  # warm-up
            ours, theirs = [], []
            for r in range(settings["prefill_repeats"]):
                pair = [("ours", ours_fn, ours), ("theirs", theirs_fn, theirs)]
                for _, fn, times in (pair if r % 2 == 0 else pair[::-1]):  # alternate who goes first
                    times.append(_timed(fn, device)[1])
            o, t = statistics.median(ours), statistics.median(theirs)
            result["prefill"][str(T)] = {"ours_seconds": o, "transformers_seconds": t, "ours_over_transformers": o / t,
                                         "ours_runs": ours, "transformers_runs": theirs}
            log(f"prefill T={T}: ours {o * 1e3:.1f} ms, transformers {t * 1e3:.1f} ms, ratio {o / t:.2f}")
    prompt = torch.randint(0, cfg.vocab_size, (1, PROMPT_LEN), generator=g).to(device)
    attention_mask = torch.ones_like(prompt)

    def ours_fn():
        return generate(model, prompt, HF_TOKENS)

    def theirs_fn():
        with torch.inference_mode():
            return hf.generate(prompt, attention_mask=attention_mask, do_sample=False, max_new_tokens=HF_TOKENS,
                               min_new_tokens=HF_TOKENS, pad_token_id=0)

    ours_tokens, theirs_tokens = ours_fn(), theirs_fn()  # warm-up, and the tokens to compare
    ours, theirs = [], []
    for r in range(settings["decode_repeats"]):
        pair = [(ours_fn, ours), (theirs_fn, theirs)]
        for fn, times in (pair if r % 2 == 0 else pair[::-1]):
            times.append(_timed(fn, device)[1])
    o, t = statistics.median(ours), statistics.median(theirs)
    bound = bandwidth / weight_bytes_per_token
    result["decode"] = {
        "new_tokens": HF_TOKENS, "prompt_len": PROMPT_LEN, "ours_seconds": o, "transformers_seconds": t,
        "ours_tokens_per_s": HF_TOKENS / o, "transformers_tokens_per_s": HF_TOKENS / t, "ours_over_transformers": t / o,
        "ours_runs": ours, "transformers_runs": theirs,
        "tokens_identical": bool(torch.equal(ours_tokens.cpu(), theirs_tokens.cpu())),
        "bandwidth_bytes_per_s": bandwidth, "weight_bytes_per_token": weight_bytes_per_token,
        "bound_tokens_per_s": bound, "ours_fraction_of_bound": HF_TOKENS / o / bound,
        "transformers_fraction_of_bound": HF_TOKENS / t / bound,
    }
    log(f"decode {HF_TOKENS}: ours {HF_TOKENS / o:.1f} tok/s, transformers {HF_TOKENS / t:.1f} tok/s, "
        f"bound {bound:.1f} tok/s")
    return result


def weight_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of weights one decoding step reads: every matrix once; the embedding table only through the LM
    head (a lookup reads one row), so a tied table counts once and an untied one not at all."""
    n = measure.parameter_count(cfg)
    read = n["total"] - (0 if cfg.tie_embeddings else n["embedding"])
    return read * measure.element_size(dtype)


# ---------------------------------------------------------------------------------------------------
# Targets
# ---------------------------------------------------------------------------------------------------
def _target(name: str, value: str, passed: bool | None, source: str) -> dict[str, Any]:
    return {"target": name, "measured": value, "pass": passed, "source": source}


def evaluate_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of issues 3 and 7 with the measured value; pass None when it was not measured."""
    out = []
    vs = report.get("vs_transformers") or {}
    for T in ("128", "512"):
        p = (vs.get("prefill") or {}).get(T)
        out.append(_target(f"Prefill T={T}: ours / transformers time <= 1.0",
                           f"{p['ours_over_transformers']:.2f}" if p else "not measured",
                           p["ours_over_transformers"] <= 1.0 if p else None, "issue 7"))
    d = vs.get("decode")
    out.append(_target(f"Decode {HF_TOKENS} tokens: ours tokens/s >= 1.5x transformers",
                       f"{d['ours_over_transformers']:.2f}x ({d['ours_tokens_per_s']:.1f} vs "
                       f"{d['transformers_tokens_per_s']:.1f} tok/s)" if d else "not measured",
                       d["ours_over_transformers"] >= 1.5 if d else None, "issue 7"))
    c = report.get("cache")
    out.append(_target(f"Cached vs uncached greedy decoding of {CACHE_TOKENS} tokens: >= 5x faster, identical tokens",
                       f"{c['speedup']:.1f}x, tokens {'identical' if c['tokens_identical'] else 'DIFFERENT'}"
                       if c else "not measured",
                       (c["speedup"] >= 5 and c["tokens_identical"]) if c else None, "issue 7"))
    rows = {(r["seq_len"], r["impl"]): r for r in report.get("attention") or []}
    naive, sdpa, tiled = (rows.get((TARGET_T, i)) for i in ("naive", "sdpa", "tiled"))

    def ok(r):
        return r is not None and not r["refused"]

    at = f"T={TARGET_T} (8 heads, D 64, causal)"
    if ok(naive) and ok(sdpa):
        mem, speed = naive["peak_bytes"] / max(sdpa["peak_bytes"], 1), naive["seconds"] / sdpa["seconds"]
        out.append(_target(f"naive vs sdpa at {at}: >= 50x less peak memory", f"{mem:.0f}x", mem >= 50, "issue 7"))
        out.append(_target(f"naive vs sdpa at {at}: >= 5x faster", f"{speed:.1f}x", speed >= 5, "issue 7"))
    else:
        out += [_target(f"naive vs sdpa at {at}: >= 50x less peak memory", "not measured", None, "issue 7"),
                _target(f"naive vs sdpa at {at}: >= 5x faster", "not measured", None, "issue 7")]
    if ok(naive):
        rel = naive["peak_bytes"] / naive["predicted_bytes"] - 1
        out.append(_target(f"naive measured peak within 25% of its prediction at T={TARGET_T}",
                           f"{rel:+.1%} ({measure.format_bytes(naive['peak_bytes'])} vs "
                           f"{measure.format_bytes(naive['predicted_bytes'])})", abs(rel) <= 0.25, "issue 3"))
    else:
        out.append(_target(f"naive measured peak within 25% of its prediction at T={TARGET_T}", "not measured",
                           None, "issue 3"))
    if ok(naive) and ok(tiled):
        r = naive["peak_bytes"] / max(tiled["peak_bytes"], 1)
        out.append(_target(f"tiled peak at least 10x under naive at T={TARGET_T}", f"{r:.1f}x", r >= 10, "issue 3"))
    else:
        out.append(_target(f"tiled peak at least 10x under naive at T={TARGET_T}", "not measured", None, "issue 3"))
    diffs = [r["max_abs_diff"] for r in (naive, sdpa, tiled) if ok(r) and r["max_abs_diff"] is not None]
    if ok(naive) and len(diffs) == 3:
        out.append(_target(f"naive, sdpa and tiled agree to 1e-4 at T={TARGET_T}", f"max abs diff {max(diffs):.1e}",
                           max(diffs) <= 1e-4, "issue 3"))
    else:
        out.append(_target(f"naive, sdpa and tiled agree to 1e-4 at T={TARGET_T}", "not measured", None, "issue 3"))
    app = report.get("app", {})
    for key, limit in ((SHIPPED_NAME, 0.3), (SMOL_NAME, 1.5)):
        name = f"Attention tab, {APP_PROMPT_TOKENS}-token prompt, {key}: server time <= {limit * 1e3:.0f} ms"
        a = app.get(key)
        out.append(_target(name, f"{a['seconds'] * 1e3:.0f} ms" if a else "not measured",
                           a["seconds"] <= limit if a else None, "issue 7"))
        out.append(_target(f"Attention tab update, {key}: payload <= 2 MB",
                           measure.format_bytes(a["payload_bytes"]) if a else "not measured",
                           a["payload_bytes"] <= 2_000_000 if a else None, "issue 7"))
    return out


# ---------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------
def _mark(p: bool | None) -> str:
    return "—" if p is None else ("pass" if p else "**FAIL**")


def _f(x: float | None, fmt: str = "{:.3f}") -> str:
    return "—" if x is None else fmt.format(x)




def _payload_bytes(outputs) -> int:
    """Bytes of JSON the browser receives for one update: plotly figures as JSON, the rest as Gradio sends it."""
    total = 0
    for out in outputs:
        if hasattr(out, "to_json"):
            total += len(out.to_json().encode())
        elif hasattr(out, "constructor_args"):  # a gr.update-style component (dropdown choices)
            total += len(json.dumps(out.constructor_args, default=str).encode())
        else:
            total += len(json.dumps(out, default=str).encode())
    return total


def bench_app(models: dict[str, Decoder], settings) -> dict[str, Any]:
    """Server time and payload of the Attention tab for a 64-token prompt (issue 7), per model.

    The handler is called as the app calls it, with the model as the user's own (so nothing is memoised):
    every repeat computes the patterns, head scores and the naive-vs-SDPA comparison from scratch.
    """
    from explorer import session
    from explorer.panels.attention import VIEWS, attention_view

    folder = session.default_model_dir()
    if not (folder / "config.json").is_file():
        return {"skipped": f"{folder} is missing: the Attention tab needs the shipped tokenizer"}
    _, tokenizer = session.load_default()
    words = "Tom gave the red ball to Anna and Anna gave the red ball back to Tom".split()
    text = " ".join(words * 8)
    ids = tokenizer(text)["input_ids"]
    cut = tokenizer.decode(ids[:APP_PROMPT_TOKENS], skip_special_tokens=True)
    results = {}
    for name, model in models.items():
        if model.config.vocab_size < len(tokenizer):
            continue  # the tiny test model cannot read the shipped tokenizer's ids
        state = {"source": name, "name": name, "model": model, "tokenizer": tokenizer}
        times, payload, n_tokens = [], 0, 0
        for _ in range(settings["app_repeats"] + 1):  # the first call is the warm-up
            t0 = time.perf_counter()
            outputs = attention_view(cut, 0, 0, VIEWS[0], state)
            times.append(time.perf_counter() - t0)
            payload = _payload_bytes(outputs)
            n_tokens = len(outputs[1])
        results[name] = {"tokens": n_tokens, "seconds": statistics.median(times[1:]), "payload_bytes": payload,
                         "parameters": model.num_parameters()}
    return results


def render_markdown(report: dict[str, Any]) -> str:
    m, s = report["machine"], report["settings"]
    lines = [f"# Transformer Explorer benchmark ({s['mode']})", "",
             f"{m['date']} · {m['cpu']} · {m['cores']} cores ({m['torch_threads']} torch threads) · "
             f"torch {m['torch']} · transformers {m.get('transformers', '—')} · device {m['device']}"
             f"{' (' + m['gpu'] + ')' if m.get('gpu') else ''} · dtype {m['dtype']}", ""]
    for note in report["notes"]:
        lines.append(f"- {note}")
    lines += ["", "## Targets", "", "| target | measured | result | from |", "|---|---|---|---|"]
    for t in report["targets"]:
        lines.append(f"| {t['target']} | {t['measured']} | {_mark(t['pass'])} | {t['source']} |")
    lines += ["", "## (a) Attention: naive vs sdpa vs tiled",
              "", "8 heads, head_dim 64, batch 1, causal, one call measured for memory (peak above the inputs; "
              f"{report['attention_memory_source']}), median of {s['attn_repeats']} timed call(s) after a warm-up. "
              "Predicted = the analytic count in explorer/measure.py.", "",
              "| T | impl | measured peak | predicted | measured/predicted | seconds | naive/impl memory | "
              "naive/impl time | max abs diff vs naive |", "|---|---|---|---|---|---|---|---|---|"]
    for r in report["attention"]:
        if r["refused"]:
            lines.append(f"| {r['seq_len']} | {r['impl']} | refused | {measure.format_bytes(r['predicted_bytes'])} "
                         f"| — | — | — | — | over the budget of {measure.format_bytes(report['budget_bytes'])} |")
            continue
        lines.append(
            f"| {r['seq_len']} | {r['impl']} | {measure.format_bytes(r['peak_bytes'])} | "
            f"{measure.format_bytes(r['predicted_bytes'])} | {_f(r['measured_over_predicted'])} | "
            f"{_f(r['seconds'], '{:.4f}')} | {_f(r['naive_over_impl_memory'], '{:.1f}x')} | "
            f"{_f(r['naive_over_impl_time'], '{:.1f}x')} | {_f(r['max_abs_diff'], '{:.1e}')} |")
    c, cfg = report["cache"], report["model"]
    lines += ["", f"## (b) KV cache: greedy decoding of {c['new_tokens']} tokens", "",
              f"Model: {cfg['description']}. Prompt {c['prompt_len']} tokens; cached = models.generate with the "
              "preallocated cache, uncached = the whole sequence recomputed every step.", "",
              "| | seconds | tokens/s |", "|---|---|---|",
              f"| cached | {c['cached_seconds']:.2f} | {c['cached_tokens_per_s']:.1f} |",
              f"| uncached | {c['uncached_seconds']:.2f} | {c['uncached_tokens_per_s']:.1f} |", "",
              f"Speed-up {c['speedup']:.1f}x. The tokens are "
              f"{'identical' if c['tokens_identical'] else 'NOT identical'} with and without the cache.", ""]
    v = report["vs_transformers"]
    d = v["decode"]
    lines += ["## (c) Our decoder vs transformers' LlamaForCausalLM (same random weights)", "",
              f"Model: {cfg['description']}; transformers loads our save_pretrained folder with "
              f"attn_implementation=\"sdpa\". Max |logit difference| on a 32-token probe: "
              f"{v['max_abs_logit_diff']:.1e}. Runs interleaved, ours and theirs alternating who goes first; "
              "medians.", "",
              "| measurement | ours | transformers | ratio |", "|---|---|---|---|"]
    for T, p in v["prefill"].items():
        lines.append(f"| prefill T={T}, full logits (ms) | {p['ours_seconds'] * 1e3:.1f} | "
                     f"{p['transformers_seconds'] * 1e3:.1f} | ours/theirs time {p['ours_over_transformers']:.2f} |")
    lines += [f"| greedy decode {d['new_tokens']} tokens after {d['prompt_len']} (tokens/s) | "
              f"{d['ours_tokens_per_s']:.1f} | {d['transformers_tokens_per_s']:.1f} | "
              f"ours/theirs speed {d['ours_over_transformers']:.2f}x |",
              f"| fraction of the bandwidth bound | {d['ours_fraction_of_bound']:.0%} | "
              f"{d['transformers_fraction_of_bound']:.0%} | |", "",
              f"Decoded tokens ours vs transformers: {'identical' if d['tokens_identical'] else 'different'}. "
              f"Bandwidth bound: {measure.format_bytes(d['weight_bytes_per_token'])} of weights read per token / "
              f"{d['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s measured copy bandwidth (read + write of a "
              f"{measure.format_bytes(report['settings']['bandwidth_bytes'])} tensor) = "
              f"{d['bound_tokens_per_s']:.1f} tokens/s.", "",
              ]
    app = report.get("app", {})
    lines += ["## (d) The app: Attention tab, one update", ""]
    if "skipped" in app:
        lines += [f"Skipped: {app['skipped']}.", ""]
    else:
        lines += ["The Attention tab's handler called as the app calls it (every heatmap, the all-heads grid, head "
                  "scores, naive vs SDPA vs tiled logits), nothing memoised; median of "
                  f"{report['settings']['app_repeats']} after a warm-up. Payload = the JSON of its outputs.", "",
                  "| model | parameters | prompt tokens | server time (ms) | payload |", "|---|---|---|---|---|"]
        for name, a in app.items():
            lines.append(f"| {name} | {a['parameters'] / 1e6:.1f}M | {a['tokens']} | {a['seconds'] * 1e3:.0f} | "
                         f"{measure.format_bytes(a['payload_bytes'])} |")
        lines.append("")
    lines += ["## (e) Machine", "", "| | |", "|---|---|"]
    for k, val in m.items():
        lines.append(f"| {k} | {val} |")
    lines += ["", f"Total benchmark time {report['wall_seconds']:.0f} s.", ""]
    return "\n".join(lines)


def run_bench(out: Path, *, quick: bool = False, tiny: bool = False, device: str = "cpu",
              dtype: str = "float32", budget_bytes: int | None = None) -> dict[str, Any]:
    t_start = time.perf_counter()
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but this machine has no CUDA GPU: use --device cpu.")
    torch_dtype = measure.as_dtype(dtype)
    settings = settings_for(quick, tiny, device)
    budget = default_budget(device) if budget_bytes is None else budget_bytes
    cfg = model_config(settings)
    notes = []
    if settings["mode"] != "full":
        runs = "; ".join(f"{', '.join(i)} at T = {lens}" for lens, i in settings["attn_runs"])
        notes.append(f"{settings['mode']} mode: attention for {runs} only, {cfg.n_layers} layers instead of 30, "
                     "fewer repeats; run without --quick for the real numbers.")
    notes.append("Other processes may share this machine's cores; times are wall-clock medians and move with load.")
    report: dict[str, Any] = {"settings": settings, "budget_bytes": budget, "notes": notes,
                              "machine": measure.machine_info(device, torch_dtype),
                              "attention_memory_source": ("torch.cuda.max_memory_allocated" if device.startswith("cuda")
                                                          else "torch.profiler allocation events")}
    log(f"settings: {settings['mode']}, device {device}, dtype {dtype}, {torch.get_num_threads()} threads")
    report["attention"] = bench_attention(settings, device, torch_dtype, budget)

    torch.manual_seed(0)
    model = Decoder(cfg).to(device=device, dtype=torch_dtype).eval()  # N(0, 0.02) weights from the initializer
    optimize_for_decode(model)  # the (in, out) weight layout the app serves
    n_params = model.num_parameters()
    report["model"] = {"config": cfg.to_dict(), "parameters": n_params,
                       "description": f"SmolLM2-135M shape, random N(0, 0.02) weights: {cfg.n_layers} layers, "
                                      f"d {cfg.d_model}, {cfg.n_heads}/{cfg.n_kv_heads} heads, d_ff {cfg.d_ff}, "
                                      f"vocab {cfg.vocab_size}, tied embeddings, {n_params / 1e6:.1f}M parameters, "
                                      f"{dtype}"}
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, cfg.vocab_size, (1, PROMPT_LEN), generator=g).to(device)
    report["cache"] = bench_cache(model, prompt, settings, device)

    bandwidth = measure.copy_bandwidth(settings["bandwidth_bytes"], device=device)
    with tempfile.TemporaryDirectory() as tmp:
        hf = load_transformers_copy(model, Path(tmp), torch_dtype, device)
        report["vs_transformers"] = bench_vs_transformers(model, hf, settings, device, cfg, bandwidth,
                                                          weight_bytes_per_token(cfg, torch_dtype))
        del hf
    app_models = {SMOL_NAME: model}
    from explorer import session

    if (session.default_model_dir() / "config.json").is_file():
        app_models = {SHIPPED_NAME: optimize_for_decode(load_pretrained(session.default_model_dir())), **app_models}
    report["app"] = bench_app(app_models, settings) if device == "cpu" and torch_dtype == torch.float32 else {
        "skipped": "the app serves float32 on the CPU; run the CPU float32 benchmark for these numbers"}
    report["targets"] = evaluate_targets(report)
    if hasattr(os, "getloadavg"):
        m = report["machine"]
        m["load_average_1min_end"] = round(os.getloadavg()[0], 2)
        busy = max(m.get("load_average_1min", 0), m["load_average_1min_end"]) > 0.5 * m["cores"] + 0.5
        notes.append(f"1-minute load average {m.get('load_average_1min')} at the start and "
                     f"{m['load_average_1min_end']} at the end, on {m['cores']} cores"
                     + (": other processes were competing for the cores during this run, so the times (not the "
                        "memory figures) are slower and noisier than on an idle machine." if busy else "."))
    report["wall_seconds"] = time.perf_counter() - t_start
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "bench.md").write_text(render_markdown(report))
    log(f"wrote {out / 'bench.md'} and {out / 'bench.json'} in {report['wall_seconds']:.0f} s")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m explorer.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for bench.md and bench.json")
    parser.add_argument("--quick", action="store_true", help="smaller and faster (about a minute on 2 cores)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--budget", default=None, help="memory budget for one attention size, e.g. 8GiB")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the cores available)")
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # tests: a toy model, seconds
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads or measure.cpu_cores())
    try:
        budget = None if args.budget is None else measure.parse_bytes(args.budget)
        run_bench(args.out, quick=args.quick, tiny=args.tiny, device=args.device, dtype=args.dtype,
                  budget_bytes=budget)
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
