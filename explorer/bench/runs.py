"""The measurements the benchmark makes: attention, the KV cache, ours vs transformers, the app's Attention tab."""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from lens import device as dev
from explorer import measure
from models.config import ATTN_IMPLS, ModelConfig
from models.decoder import Decoder
from models.generate import generate
from models.loading import save_pretrained
from models.speed import fast_step

from .targets import APP_PROMPT_TOKENS, CACHE_TOKENS, HF_TOKENS, PROMPT_LEN, TARGET_T

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
    if dev.is_cuda(device):
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


def default_budget(device) -> int:
    """The benchmark's own budget: it runs alone, so it may use more than one app request."""
    free = dev.free_bytes(device)
    if free is not None:
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
def bench_cache(model: Decoder, prompt: torch.Tensor, settings, device: str) -> dict[str, Any]:
    """Cached decoding with the fast step (``models.speed.fast_step``, what the benchmark times as ours) against the
    whole sequence recomputed by the modules at every step."""
    generate(model, prompt, 4, step=fast_step)  # warm-up
    cached_times, uncached_times = [], []
    cached = uncached = None
    for r in range(settings["cache_repeats"]):
        cached, t = measure.timed(lambda: generate(model, prompt, CACHE_TOKENS, use_cache=True, step=fast_step),
                                  device)
        cached_times.append(t)
        log(f"cache: cached {CACHE_TOKENS} tokens in {t:.2f} s")
        if r == 0:  # the uncached run is the slow one: once is enough to see a ratio this large
            uncached, t = measure.timed(lambda: generate(model, prompt, CACHE_TOKENS, use_cache=False), device)
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
                    times.append(measure.timed(fn, device)[1])
            o, t = statistics.median(ours), statistics.median(theirs)
            result["prefill"][str(T)] = {"ours_seconds": o, "transformers_seconds": t, "ours_over_transformers": o / t,
                                         "ours_runs": ours, "transformers_runs": theirs}
            log(f"prefill T={T}: ours {o * 1e3:.1f} ms, transformers {t * 1e3:.1f} ms, ratio {o / t:.2f}")
    prompt = torch.randint(0, cfg.vocab_size, (1, PROMPT_LEN), generator=g).to(device)
    attention_mask = torch.ones_like(prompt)

    def ours_fn():
        return generate(model, prompt, HF_TOKENS, step=fast_step)  # the speed path, passed explicitly

    def theirs_fn():
        with torch.inference_mode():
            return hf.generate(prompt, attention_mask=attention_mask, do_sample=False, max_new_tokens=HF_TOKENS,
                               min_new_tokens=HF_TOKENS, pad_token_id=0)

    ours_tokens, theirs_tokens = ours_fn(), theirs_fn()  # warm-up, and the tokens to compare
    ours, theirs = [], []
    for r in range(settings["decode_repeats"]):
        pair = [(ours_fn, ours), (theirs_fn, theirs)]
        for fn, times in (pair if r % 2 == 0 else pair[::-1]):
            times.append(measure.timed(fn, device)[1])
    o, t = statistics.median(ours), statistics.median(theirs)
    bound = bandwidth / weight_bytes_per_token
    result["decode"] = {
        "new_tokens": HF_TOKENS, "prompt_len": PROMPT_LEN, "ours_seconds": o, "transformers_seconds": t,
        "ours_tokens_per_s": HF_TOKENS / o, "transformers_tokens_per_s": HF_TOKENS / t, "ours_over_transformers": t / o,
        "ours_runs": ours, "transformers_runs": theirs,
        "tokens_identical": bool(torch.equal(ours_tokens, theirs_tokens.to(ours_tokens.device))),
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


def payload_bytes(outputs) -> int:
    """Bytes of JSON the browser receives for one update: plotly figures as JSON, the rest as Gradio sends it."""
    import gradio as gr

    from explorer.web import gradio_adapter

    total = 0
    for out in outputs:
        if hasattr(out, "to_json"):
            total += len(out.to_json().encode())
        elif isinstance(out, gr.components.Component):  # a gr.update-style component (dropdown choices)
            total += len(json.dumps(gradio_adapter.update_props(out), default=str).encode())
        else:
            total += len(json.dumps(out, default=str).encode())
    return total


def app_handler(demo, api_name: str) -> Callable:
    """The function the app runs for its public endpoint ``api_name`` (e.g. "attention" for ``/attention``)."""
    from explorer.web import gradio_adapter

    return gradio_adapter.event_function(demo, api_name)


def bench_app(models: dict[str, Decoder | Callable[[], Decoder]], settings) -> dict[str, Any]:
    """Server time and payload of the Attention tab for a 64-token prompt (issues 7 and 12), per model (or per
    function that builds one: built when its turn comes and freed after, so large shapes need not coexist).

    The app is built as ``python app.py`` builds it and its public ``/attention`` handler is called as the
    server calls it, with the model as the user's own. First answer: the result cache emptied before each
    repeat, so the forward, the induction probe, head scores and figures are all computed. Naive vs fused: the
    ``/attention_impls`` follow-up the app chains after every answer, right after that first answer (two more
    forwards; the answer's own is reused). Head switch: the same prompt at another layer and head right after,
    as a click on the Layer or Head menu sends it (the forward reused from the cache, the figures built).
    Breakdown: the parts of a first answer timed alone (medians), to show where its time goes. The Memory
    lab's opening example, which the app measures in the background at start-up, is waited for first so it
    does not share the cores.
    """
    from explorer import probes
    from explorer.state import session
    from explorer.state import checkpoints
    from explorer.state.cache import results as result_cache
    from explorer.figures import attention as figs
    from explorer.panels import attention as panel

    folder = checkpoints.default_model_dir()
    if not (folder / "config.json").is_file():
        return {"skipped": f"{folder} is missing: the Attention tab needs the shipped tokenizer"}
    import app

    demo = app.build_demo()
    app_handler(demo, "memory_example")()  # waits for the start-up measurement
    attention_view = app_handler(demo, "attention")
    attention_impls = app_handler(demo, "attention_impls")
    _, tokenizer = session.load_default()
    words = "Tom gave the red ball to Anna and Anna gave the red ball back to Tom".split()
    text = " ".join(words * 8)
    ids = tokenizer(text)["input_ids"]
    cut = tokenizer.decode(ids[:APP_PROMPT_TOKENS], skip_special_tokens=True)
    causal = "causal (as trained)"  # the Mask radio's first choice
    results = {}
    for name, model in models.items():
        if not isinstance(model, torch.nn.Module):
            model = model()
        if model.config.vocab_size < len(tokenizer):
            continue  # the tiny test model cannot read the shipped tokenizer's ids
        c = model.config
        state = {"source": name, "name": name, "model": model, "tokenizer": tokenizer}
        times, follow, switches, payload, n_tokens = [], [], [], 0, 0
        layer, head = c.n_layers - 1, c.n_heads - 1  # another grid page on a deep model
        for _ in range(settings["app_repeats"] + 1):  # the first call is the warm-up
            result_cache.clear()
            outputs, seconds = measure.timed(lambda: attention_view(cut, 0, 0, causal, state))
            times.append(seconds)
            follow.append(measure.timed(lambda: attention_impls(cut, causal, state))[1])
            switched, seconds = measure.timed(lambda: attention_view(cut, layer, head, causal, state))
            switches.append(seconds)
            payload = max(payload_bytes(outputs), payload_bytes(switched))
            n_tokens = len(outputs.tokens)
        prompt_ids = [row[2] for row in outputs.tokens]
        labels = [f"{i}·{tok}" for i, tok, _ in outputs.tokens]
        span = int(panel.default_span(c))
        parts: dict[str, list[float]] = {}
        for _ in range(settings["app_repeats"]):
            fwd, t = measure.timed(lambda: probes.prompt_forward(model, prompt_ids, causal=True, top_k=panel.TOP_K))
            parts.setdefault("forward with every head's weights", []).append(t)
            scores, t = measure.timed(lambda: probes.head_scores(model, span_len=span))
            parts.setdefault(f"induction probe (4 rows, span {span})", []).append(t)
            p = fwd["patterns"]

            def figures():
                on_prompt = probes.pattern_scores(p[:, None], prompt_ids)
                figs.attention_heatmap(p[0, 0], labels, layer=0, head=0, n_heads=c.n_heads, n_kv_heads=c.n_kv_heads)
                page = figs.grid_page(0, c.n_layers)
                figs.attention_grid(p[page.start:page.stop], labels, n_kv_heads=c.n_kv_heads, layers=range(len(page)),
                                    layer_names=page, n_layers=c.n_layers)
                figs.head_scores_figure({**{k: on_prompt[k] for k in ("previous_token", "first_token")},
                                         "induction": scores["induction"]}, n_kv_heads=c.n_kv_heads, selected=(0, 0))

            parts.setdefault("head scores on the prompt and figures (heatmap, grid page, scores)", []).append(
                measure.timed(figures)[1])
        results[name] = {"tokens": n_tokens, "seconds": statistics.median(times[1:]), "fastest_seconds": min(times[1:]),
                         "switch_seconds": statistics.median(switches[1:]),
                         "impls_seconds": statistics.median(follow[1:]), "payload_bytes": payload,
                         "parameters": model.num_parameters(),
                         "breakdown_seconds": {k: statistics.median(v) for k, v in parts.items()}}
        log(f"app {name}: first answer {results[name]['seconds'] * 1e3:.0f} ms, naive vs fused follow-up "
            f"{results[name]['impls_seconds'] * 1e3:.0f} ms, head switch {results[name]['switch_seconds'] * 1e3:.0f} "
            f"ms, payload {measure.format_bytes(payload)}")
    return results


def bench_induction(model: Decoder, bos_id: int | None, spans=(8, 16, 32, 64, 120), batch: int = 8,
                    seed: int = 123) -> dict[str, Any]:
    """The best induction head score of ``model`` at each span: ``batch`` rows of ``[BOS] + r + r`` (r random
    distinct tokens, fixed seed), scored by ``lens.heads.induction_score``; spans that do not fit are left out."""
    from lens.heads import induction_score, repeated_random_tokens
    from explorer.probes import run_with_cache

    out: dict[str, Any] = {"batch": batch, "seed": seed, "bos_first": bos_id is not None, "spans": {}}
    for span in spans:
        if (bos_id is not None) + 2 * span > model.config.max_seq_len:
            continue
        x = repeated_random_tokens(model.config.vocab_size, span, batch, seed, bos_id=bos_id)
        _, cache = run_with_cache(model, x, lambda n: n.endswith("attn.hook_pattern"))
        score = induction_score(cache.stack("attn.hook_pattern"), span)  # (L, H)
        layer, head = divmod(int(score.argmax()), score.shape[1])
        out["spans"][str(span)] = {"best": float(score.max()), "layer": layer, "head": head}
        log(f"induction span {span}: best head layer {layer} head {head} score {float(score.max()):.3f}")
    return out

