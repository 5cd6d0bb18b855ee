"""Weight formats and the decoding roofline: one model at fp32, bf16 and weight-only int8, measured side by side,
and the speed limit memory bandwidth puts on one-token decoding.

Notation: B batch (1 here), T prompt length, S cached positions, V vocabulary, L layers, Hkv key/value heads,
D head dim.

Decoding one token multiplies one vector by every weight matrix: each weight byte is read once and used for one
multiply-add (arithmetic intensity about 2 flops per 4 bytes in fp32), so the step waits for memory, not for
arithmetic. Hence the limit ``tokens/s <= bandwidth / bytes read per token``, where bytes read per token are the
weights (every matrix once; the embedding table only as the tied LM head, a lookup reads one row) plus the KV
cache at the current length. Prefill reads the same weights once for T tokens (intensity about T times higher),
so it is bound by arithmetic instead.
"""
from __future__ import annotations

import copy
import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lens import device as dev
from models.speed import prepared_copy
from models.generate import generate, generate_steps
from models.layers import RMSNorm
from models.quant import Int8Linear, quantize_int8

from .profile import timed
from .units import MIB

FORMATS = ("fp32", "bf16", "int8")
FORMAT_NOTES = {
    "fp32": "every weight in float32 (4 bytes)",
    "bf16": "every weight and activation in bfloat16 (2 bytes); norms compute in fp32",
    "int8": "the 7 projections of every layer and the LM head int8 with one fp32 scale per output row (1 byte + "
            "4/in); the embedding (its own fp32 table where the LM head was tied to it: a lookup reads one row) and "
            "norms stay fp32; activations fp32 (never quantised)",
}
INT8_FAST = "narrow"  # int8_kernel's name for the fast step's own int8 product (models.speed.narrow)
# a measured speed this far above its memory limit is a measuring error (a timer, a cache), not a result
ABOVE_LIMIT = 1.05


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (/proc/cpuinfo); empty where they cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def native_bf16(device: str | torch.device | None = None) -> bool | None:
    """Whether ``device`` (default: the app's) multiplies bf16 natively: a GPU of compute capability 8 or more, a
    CPU with AVX512-BF16 or AMX-BF16. None where the CPU's flags cannot be read."""
    if dev.is_cuda(device):
        return dev.compute_capability(device)[0] >= 8
    flags = cpu_flags()
    return bool(flags & {"avx512_bf16", "amx_bf16"}) if flags else None


def above_limit(tokens_per_s: float, limit_tokens_per_s: float) -> bool:
    """Whether a measured decode speed lies above its memory roofline: impossible for a step that reads every
    weight once, so the measurement, not the decoder, is wrong."""
    return tokens_per_s > ABOVE_LIMIT * limit_tokens_per_s


# ---------------------------------------------------------------------------------------------------
# Converted copies
# ---------------------------------------------------------------------------------------------------
@torch.no_grad()
def convert(model: nn.Module, fmt: str) -> nn.Module:
    """``model`` in format ``fmt`` ("fp32", "bf16", "int8"): a new copy, the original untouched (fp32 of an fp32
    model is a copy too, so every format is timed on a model laid out the same way)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}.")
    if fmt == "int8":
        out = quantize_int8(copy.deepcopy(model).float())[0]
    else:
        out = prepared_copy(model, torch.float32 if fmt == "fp32" else torch.bfloat16)
    for p in out.parameters():
        p.requires_grad_(False)
    return out.eval()


def int8_kernel(model: nn.Module, step=None) -> str | None:
    """Which int8 matmul a model's ``Int8Linear`` layers run in a one-token step: ``INT8_FAST`` where ``step``
    (``models.speed.fast_step``) computes the model, else the modules' ("int8pack_mm" or "dequantize"); None
    without any."""
    if step is not None and any(isinstance(m, Int8Linear) for m in model.modules()) and step.why_not(model) is None:
        return INT8_FAST
    for m in model.modules():
        if isinstance(m, Int8Linear):
            return m.kernel_for(torch.empty(1, m.in_features, device=m.qweight.device, dtype=m.scale.dtype))
    return None


def weight_bytes(model: nn.Module) -> int:
    """Bytes the model's weights occupy: distinct parameters (a tied table once) plus int8 weights and scales."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return params + sum(m.nbytes for m in model.modules() if isinstance(m, Int8Linear))


def cache_bytes_per_position(model: nn.Module) -> int:
    """Bytes one cached position holds, all layers: L · 2 (k and v) · Hkv · D · element size of the model's cache."""
    c = model.config
    return c.n_layers * 2 * c.n_kv_heads * c.head_dim * model.embed_tokens.weight.element_size()


def bytes_per_token(model: nn.Module, kv_len: int) -> dict[str, int]:
    """Bytes one decoding step reads, counted on the model: every linear weight once (int8 with its scales),
    the norms, one embedding row when the table is not also the LM head, and the KV cache of ``kv_len`` positions.

    Returns {"weights", "kv_cache", "total"} in bytes.
    """
    if not isinstance(kv_len, int) or kv_len < 0:
        raise ValueError(f"kv_len must be a non-negative whole number of positions, got {kv_len!r}.")
    seen: set[int] = set()
    weights = 0
    for m in model.modules():
        if isinstance(m, (nn.Linear, RMSNorm)) and id(m.weight) not in seen:
            seen.add(id(m.weight))
            weights += m.weight.numel() * m.weight.element_size()
        elif isinstance(m, Int8Linear):
            weights += m.nbytes
    emb = model.embed_tokens.weight
    if id(emb) not in seen:  # untied: the lookup reads one row; tied: already read in full as the LM head
        weights += emb.shape[1] * emb.element_size()
    kv = kv_len * cache_bytes_per_position(model)
    return {"weights": weights, "kv_cache": kv, "total": weights + kv}


def roofline_tokens_per_s(bytes_per_step: float, bandwidth_bytes_per_s: float) -> float:
    """The memory-bound speed limit: each step must read ``bytes_per_step`` at ``bandwidth_bytes_per_s``."""
    if bytes_per_step <= 0 or bandwidth_bytes_per_s <= 0:
        raise ValueError("bytes per step and bandwidth must both be positive.")
    return bandwidth_bytes_per_s / bytes_per_step


# ---------------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------------
READ_METHOD = ("a {size} fp32 tensor (far larger than any cache) summed with torch.sum, which reads every byte "
               "once; bytes read / median wall time of {repeats} calls after one warm-up")


def read_bandwidth(nbytes: int = 256 * MIB, *, repeats: int = 7, device: str | torch.device | None = None
                   ) -> dict[str, Any]:
    """Memory read bandwidth: a large tensor summed (read once, nothing written but one number).

    Returns {"bytes_per_s", "nbytes", "repeats", "seconds" (median), "runs", "method"}.
    """
    if nbytes < MIB or repeats < 1:
        raise ValueError("read at least 1 MiB, at least once.")
    device = dev.resolve(device)
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    x.sum()
    runs = [timed(x.sum, device)[1] for _ in range(repeats)]
    seconds = statistics.median(runs)
    size = f"{nbytes / MIB:.0f} MiB"
    return {"bytes_per_s": x.numel() * 4 / seconds, "nbytes": x.numel() * 4, "repeats": repeats,
            "seconds": seconds, "runs": runs, "method": READ_METHOD.format(size=size, repeats=repeats)}


def decode_speed(generate_fn, n_tokens: int, *, repeats: int = 3, device=None, budget_s: float | None = None,
                 min_tokens: int = 8) -> dict[str, Any]:
    """Decode tokens/s of ``generate_fn(k)`` (greedy, k new tokens): (n - 1) / (time(n) - time(1)), medians of
    ``repeats``, so the prompt's prefill and the first token cancel out and only one-token steps are counted.

    With ``budget_s``, fewer tokens and runs where a decoder is slow, so that the measurement takes about
    ``budget_s`` seconds after its warm-up: the step time is estimated from a 1- and a 5-token run, n is cut so
    that ``repeats`` runs fit (never under ``min_tokens``), and no run starts that would end past the budget (one
    run at least).

    Returns {"tokens_per_s", "step_seconds", "tokens" (an n-token output), "new_tokens" (n), "repeats" (runs)}.
    """
    if n_tokens < 2:
        raise ValueError("measure at least 2 new tokens.")
    generate_fn(2)  # warm-up
    long_runs, short_runs, tokens = [], [], None
    started = time.perf_counter()
    run_seconds = 0.0
    if budget_s is not None:
        short_runs.append(timed(lambda: generate_fn(1), device)[1])
        probe = timed(lambda: generate_fn(5), device)[1]
        step = max((probe - short_runs[0]) / 4, 1e-6)
        per_run = (budget_s - (time.perf_counter() - started)) / repeats  # an n-token run and a 1-token run
        fits = 1 + int((per_run - 2 * short_runs[0]) / step)
        n_tokens = max(min(n_tokens, min_tokens), min(n_tokens, fits))
        run_seconds = short_runs[0] + step * (n_tokens - 1)  # one n-token run, predicted
    for r in range(repeats):
        if budget_s is not None and r > 0 and (time.perf_counter() - started) + run_seconds + short_runs[0] > budget_s:
            break
        tokens, t = timed(lambda: generate_fn(n_tokens), device)
        long_runs.append(t)
        if len(short_runs) < len(long_runs):
            short_runs.append(timed(lambda: generate_fn(1), device)[1])
    step = max(statistics.median(long_runs) - statistics.median(short_runs), 1e-9) / (n_tokens - 1)
    return {"tokens_per_s": 1.0 / step, "step_seconds": step, "tokens": tokens, "new_tokens": n_tokens,
            "repeats": len(long_runs)}


def stepped_speed(model: nn.Module, prompt: torch.Tensor, n_tokens: int, *, step=None, use_cache: bool = True,
                  repeats: int = 3, budget_s: float | None = None, min_tokens: int = 8) -> dict[str, Any]:
    """Decode tokens/s of our own generation loop (greedy; ``step`` and ``use_cache`` as ``generate`` takes them),
    timed inside each run: (k - 1) / (time of the k-th new token - time of the first), the median over ``repeats``
    runs of up to ``n_tokens``. The prefill and the first token fall outside the span, as ``decode_speed``'s
    differencing cancels them, but without its 1-token runs, so a format whose prefill is slow (int8 widens every
    weight of a prompt) spends its budget on one-token steps.

    With ``budget_s``: a run stops at its first token past the budget (never under ``min_tokens``), and no run
    starts past it (one at least). Returns ``decode_speed``'s keys; "tokens" (1, T + k) and "new_tokens" (k) are
    the first run's, the longest.
    """
    if n_tokens < 2 or min_tokens < 2:
        raise ValueError("measure at least 2 new tokens.")
    device = prompt.device
    generate(model, prompt, 2, step=step, use_cache=use_cache)  # warm-up

    def run(limit: int, started: float) -> tuple[list[float], torch.Tensor]:
        new, times = [], []
        for s in generate_steps(model, prompt, limit, step=step, use_cache=use_cache):
            dev.synchronize(device)
            times.append(time.perf_counter())
            new.append(s.token)
            if budget_s is not None and len(new) >= min_tokens and times[-1] - started > budget_s:
                break
        return times, torch.cat([prompt, torch.stack(new, dim=1)], dim=1)  # (1, T + k)
    return _timed_runs(run, prompt.shape[1], n_tokens, repeats, budget_s)


def _timed_runs(run, prompt_len: int, n_tokens: int, repeats: int, budget_s: float | None) -> dict[str, Any]:
    """The runs of ``stepped_speed`` and ``transformers_stepped_speed``: ``run(limit, started)`` decodes up to
    ``limit`` new tokens (stopping itself past ``budget_s`` from ``started``) and returns each new token's time and
    its output (1, T + k); a later run decodes as many as the first, and none starts past the budget."""
    started = time.perf_counter()
    spans, tokens = [], None
    for r in range(repeats):
        if budget_s is not None and r > 0 and time.perf_counter() - started > budget_s:
            break
        times, out = run(n_tokens if tokens is None else tokens.shape[1] - prompt_len, started)
        spans.append((times[-1] - times[0]) / (len(times) - 1))
        if tokens is None:
            tokens = out
    step_s = max(statistics.median(spans), 1e-9)
    return {"tokens_per_s": 1.0 / step_s, "step_seconds": step_s, "tokens": tokens,
            "new_tokens": tokens.shape[1] - prompt_len, "repeats": len(spans)}


@torch.inference_mode()
def prefill_speed(model: nn.Module, ids: torch.Tensor, *, repeats: int = 3) -> float:
    """Prompt tokens/s of one forward pass over ``ids`` (1, T) filling a cache (median of ``repeats``)."""
    def run():
        return model(ids, cache=model.new_cache(ids.shape[0], ids.shape[1]), last_only=True)
    run()
    device = ids.device
    return ids.shape[1] / statistics.median(timed(run, device)[1] for _ in range(repeats))


def greedy_agreement(reference: torch.Tensor, other: torch.Tensor, prompt_len: int) -> dict[str, Any]:
    """How far two greedy continuations (B, T + n) of the same prompt agree.

    Returns {"matching": positions equal, "new_tokens": n, "fraction", "first_divergence": index of the first new
    token that differs (None when all match)}.
    """
    if reference.shape != other.shape:
        raise ValueError("compare continuations of the same length.")
    same = (reference[0, prompt_len:] == other[0, prompt_len:].to(reference.device)).tolist()
    n = len(same)
    first = next((i for i, s in enumerate(same) if not s), None)
    return {"matching": sum(same), "new_tokens": n, "fraction": sum(same) / n if n else 1.0,
            "first_divergence": first}


@torch.inference_mode()
def max_abs_logit_diff(reference: nn.Module, other: nn.Module, ids: torch.Tensor) -> float:
    """max |logits_reference - logits_other| over every position of ``ids`` (1, T), in fp32."""
    return float((reference(ids).float() - other(ids).float()).abs().max())


@torch.inference_mode()
def held_out_logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The model's fp32 logits (B, T, V) at every position of ``ids`` (B, T): one forward serves both a format's
    held-out loss and its |Δlogit| (a slow format's prompt-sized forward took ~10 s on a 2-core CPU)."""
    return model(ids).float()


def loss_from_logits(logits: torch.Tensor, ids: torch.Tensor) -> float:
    """Mean next-token cross-entropy (nats/token) of ``ids`` (B, T) from ``held_out_logits`` (B, T, V)."""
    if ids.shape[1] < 2:
        raise ValueError("the held-out text needs at least two tokens.")
    x = logits[:, :-1]  # (B, T-1, V): each position predicts the next token
    return float(F.cross_entropy(x.reshape(-1, x.shape[-1]), ids[:, 1:].reshape(-1)))


@torch.inference_mode()
def transformers_against(ours: nn.Module, hf, ids: torch.Tensor,
                         ours_logits: torch.Tensor | None = None) -> dict[str, float]:
    """transformers' fp32 copy beside ours on ``ids`` (1, T): {"max_abs_logit_diff" over every position,
    "held_out_loss" (nats/token) of the copy}, so its row carries the same columns as our formats.
    ours_logits: ``held_out_logits(ours, ids)`` when already computed."""
    theirs = hf(ids).logits.float()  # (1, T, V)
    ours_logits = held_out_logits(ours, ids) if ours_logits is None else ours_logits
    return {"max_abs_logit_diff": float((ours_logits - theirs).abs().max()),
            "held_out_loss": loss_from_logits(theirs, ids)}


@torch.inference_mode()
def held_out_loss(model: nn.Module, ids: torch.Tensor) -> float:
    """Mean next-token cross-entropy of ``ids`` (B, T), nats per token, computed in fp32."""
    if ids.shape[1] < 2:
        raise ValueError("the held-out text needs at least two tokens.")
    return loss_from_logits(held_out_logits(model, ids), ids)


@torch.inference_mode()
def next_token_top(model: nn.Module, ids: torch.Tensor, k: int = 10) -> list[tuple[int, float]]:
    """The ``k`` most likely next tokens after ``ids`` (1, T): [(id, probability)], most likely first."""
    probs = torch.softmax(model(ids, last_only=True)[0, -1].float(), -1)  # (V,)
    top = torch.topk(probs, min(k, probs.numel()))
    return list(zip(top.indices.tolist(), top.values.tolist()))


def compare_formats(models: dict[str, nn.Module], prompt: torch.Tensor, held_out: torch.Tensor, *,
                    new_tokens: int = 64, repeats: int = 3, top_k: int = 10, step=None,
                    budget_s: float | None = None,
                    reference_logits: torch.Tensor | None = None) -> dict[str, dict[str, Any]]:
    """Each converted model beside the first (the fp32 reference): weight bytes, decode tokens/s, bytes per
    decoded token at the continuation's mean cache length, greedy agreement over ``new_tokens``, max |Δlogit| on
    ``held_out``, held-out loss (nats/token), the prompt's next-token top-k and which int8 kernel ran.

    prompt (1, T) and held_out (1, T') token ids; ``prompt`` + ``new_tokens`` must fit the context. step: the
    one-token path decoding uses (``models.speed.fast_step``; None: the modules), for every format alike (the fast
    step computes fp32 and, where its kernel is built, int8; it steps aside for bf16).
    budget_s: each format's decoding timed for
    about this long (``stepped_speed``: fewer tokens and runs for a slow format, each row saying how many); greedy
    agreement then compares the tokens both decoded. reference_logits: ``held_out_logits`` of the first model on
    ``held_out``, when the caller already has them.
    """
    names = list(models)
    T = prompt.shape[1]
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        model = models[name]
        speed = stepped_speed(model, prompt, new_tokens, step=step, repeats=repeats, budget_s=budget_s)
        if name == names[0]:
            logits = held_out_logits(model, held_out) if reference_logits is None else reference_logits
            reference_logits = logits
        else:
            logits = held_out_logits(model, held_out)
        out[name] = {"weight_bytes": weight_bytes(model), "tokens_per_s": speed["tokens_per_s"],
                     "new_tokens": speed["new_tokens"], "repeats": speed["repeats"],
                     "bytes_per_token": bytes_per_token(model, T + new_tokens // 2),
                     "tokens": speed["tokens"][0].tolist(), "held_out_loss": loss_from_logits(logits, held_out),
                     "max_abs_logit_diff": float((reference_logits - logits).abs().max()),
                     "top": next_token_top(model, prompt, top_k), "int8_kernel": int8_kernel(model, step)}
        del logits  # (1, T', V) fp32: 50 MB at a 49k vocabulary and 256 tokens
    for name in names:
        both = T + min(out[names[0]]["new_tokens"], out[name]["new_tokens"])  # the tokens both decoded
        out[name]["agreement"] = greedy_agreement(torch.tensor([out[names[0]]["tokens"][:both]]),
                                                  torch.tensor([out[name]["tokens"][:both]]), T)
    return out


def transformers_copy(model: nn.Module, folder) -> nn.Module | None:
    """transformers' ``LlamaForCausalLM`` on the same weights (fp32, SDPA), or None when transformers is absent
    or cannot build this configuration. ``folder`` receives the safetensors it is loaded from."""
    try:
        import transformers
        from transformers import LlamaForCausalLM
    except ImportError:
        return None
    from models.loading import save_pretrained

    transformers.logging.set_verbosity_error()
    try:
        save_pretrained(model, folder)
        hf = LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32, attn_implementation="sdpa")
    except (ValueError, OSError, KeyError):  # a configuration transformers' Llama cannot express
        return None
    return hf.to(model.embed_tokens.weight.device).eval()


def transformers_stepped_speed(hf, prompt: torch.Tensor, n_tokens: int, *, repeats: int = 3,
                               budget_s: float | None = None, min_tokens: int = 8) -> dict[str, Any]:
    """``stepped_speed`` for transformers' greedy ``generate``: each new token's time taken where ``generate``
    hands it to its streamer, so both decoders are timed the same way, inside one run, without 1-token runs to
    cancel the prefill; the budget ends a run through a stopping criterion. Returns ``stepped_speed``'s keys."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    if n_tokens < 2 or min_tokens < 2:
        raise ValueError("measure at least 2 new tokens.")
    device = prompt.device
    generate_n = transformers_generate_fn(hf, prompt)
    generate_n(2)  # warm-up

    def run(limit: int, started: float) -> tuple[list[float], torch.Tensor]:
        times: list[float] = []

        class Clock:  # generate's streamer: put() gets the prompt, then each new token once it is chosen
            def put(self, value) -> None:
                dev.synchronize(device)
                times.append(time.perf_counter())

            def end(self) -> None:
                pass

        class Budget(StoppingCriteria):  # asked once a token is chosen, before the streamer is handed it
            def __call__(self, input_ids, scores, **kwargs):
                done = budget_s is not None and input_ids.shape[1] - prompt.shape[1] >= min_tokens and \
                    time.perf_counter() - started > budget_s
                return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)

        out = generate_n(limit, streamer=Clock(), stopping_criteria=StoppingCriteriaList([Budget()]))
        return times[1:], out  # times[0]: the prompt's put, before any step
    return _timed_runs(run, prompt.shape[1], n_tokens, repeats, budget_s)


def transformers_generate_fn(hf, prompt: torch.Tensor):
    """``fn(n, **kwargs)``: transformers' greedy generate of exactly n new tokens after ``prompt`` (1, T) (fewer
    where a ``stopping_criteria`` in ``kwargs`` ends it; ``kwargs`` go to ``generate``)."""
    mask = torch.ones_like(prompt)
    # No end-of-text token: ours decodes straight through it, and min_new_tokens would instead forbid it
    # (its logit set to -inf), so an answer whose greedy token is </s> diverged at once ("agreement 0 / 64").
    hf.generation_config.eos_token_id = None

    def fn(n: int, **kwargs):
        with torch.inference_mode():
            return hf.generate(prompt, attention_mask=mask, do_sample=False, max_new_tokens=n, pad_token_id=0,
                               **kwargs)
    return fn
