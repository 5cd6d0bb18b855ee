"""The generation trace: every step of ``models.generate.generate_steps`` recorded, with and without the KV cache.

Notation: ``T`` prompt tokens, ``V`` vocabulary.
"""
from __future__ import annotations

import time
from typing import Any, TypedDict

import torch

from lens.device import synchronize
from torch import nn

from explorer.measure import runtime_info
from models.generate import NewToken, generate_steps, sampling_probs
from models.speed import fast_step

from lens.hooks import as_tokens, effective_impl

# The two ways the generation tab computes each token after the prompt: the model's own modules (the code every other
# tab shows), or the fast step (models.speed: the same math as flat array operations, which steps aside for anything
# it does not compute exactly). The prompt always runs through the modules.
MODULES, FAST = "the modules", "the fast step"
# The tab decodes with the modules unless told otherwise (explorer/panels/generation.py says why).
DEFAULT_DECODE = MODULES
DECODE_PATHS = {MODULES: None, FAST: fast_step}


class GenerationStep(TypedDict):
    """One new token of a trace (units: ids, probabilities, positions, bytes, seconds)."""
    step: int
    position: int
    token: int
    top_ids: list[int]
    top_probs: list[float]
    model_probs: list[float]
    chosen_prob: float
    chosen_rank: int
    positions_computed: int
    cache_length: int
    cache_bytes_allocated_per_layer: int
    cache_bytes_used_per_layer: int
    seconds: float


class GenerationTotals(TypedDict):
    new_tokens: int
    seconds: float
    prefill_seconds: float
    decode_seconds: float
    tokens_per_second: float
    cache_bytes_allocated: int
    cache_bytes_used: int


class GenerationTrace(TypedDict):
    """What ``generation_trace`` returns (the fields are described there)."""
    prompt: list[int]
    tokens: list[int]
    new_tokens: list[int]
    steps: list[GenerationStep]
    totals: GenerationTotals
    settings: dict[str, Any]
    provenance: dict[str, str]


class CacheComparison(TypedDict):
    """What ``compare_cache`` returns."""
    with_cache: GenerationTrace
    without_cache: GenerationTrace
    identical: bool
    first_difference: int | None
    speedup: float


def provenance(model: nn.Module) -> dict[str, str]:
    """``measure.runtime_info`` (device, dtype, torch) plus the attention implementation and thread count."""
    return {**runtime_info(model), "attn_impl": effective_impl(model, None), "threads": str(torch.get_num_threads())}


@torch.inference_mode()
def generation_trace(model: nn.Module, tokens, max_new_tokens: int, *, temperature: float = 0.0,
                     top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                     use_cache: bool = True, top: int = 10, step=None) -> GenerationTrace:
    """Generate from one prompt and record every step of ``models.generate.generate_steps``.

    Returns a ``GenerationTrace``:
        prompt, tokens (prompt + new), new_tokens: lists of ids.
        steps: one dict per new token with
            step, position (where the chosen token goes), token (chosen id),
            top_ids: the ``top`` ids with the largest logits (the sampler's distribution is monotone in the
                logits, so these are its most likely ids too), top_probs: their probabilities under the
                distribution actually sampled from (``sampling_probs``: temperature, top-k, top-p; one-hot
                for greedy), model_probs: their plain softmax probabilities (temperature 1, no cut-off),
            chosen_prob, chosen_rank (rank of the chosen id by logit, 0 = most likely),
            positions_computed: positions the model ran this step (the prompt on step 0; 1 with the cache,
                the whole sequence without it),
            cache_length: positions held in the KV cache when this step's logits were computed (0 without
                cache), cache_bytes_allocated_per_layer, cache_bytes_used_per_layer (keys + values, bytes),
            seconds: wall time from the previous step's end to this token being chosen (step 0 includes
                cache allocation and the prompt's prefill); the trace's own bookkeeping is excluded.
        totals: new_tokens, seconds, prefill_seconds (step 0), decode_seconds (the rest),
            tokens_per_second (decode steps only, NaN with fewer than 2 steps), cache_bytes_allocated,
            cache_bytes_used (all layers, bytes).
        settings: the sampling settings; provenance: device, dtype, torch version, attention implementation.

    step: the one-token path for the cached steps (``DECODE_PATHS``' values; None: the modules).
    """
    if not isinstance(top, int) or top < 1:
        raise ValueError(f"top must be a positive integer, got {top!r}.")
    tokens = _one_prompt(model, tokens, "generation_trace")
    T = tokens.shape[1]
    run = generate_steps(model, tokens, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                         generator=_generator(seed, tokens), use_cache=use_cache, step=step)
    steps: list[GenerationStep] = []
    cache = None
    synchronize(tokens.device)
    last = time.perf_counter()
    for new in run:
        synchronize(tokens.device)  # on a GPU the step's work is queued: the clock waits for it
        seconds = time.perf_counter() - last
        steps.append(_record(model, new, T, seconds, top, temperature, top_k, top_p))
        cache = new.cache
        last = time.perf_counter()
    seconds = [s["seconds"] for s in steps]
    decode = seconds[1:]
    totals = GenerationTotals(**{
        "new_tokens": len(steps),
        "seconds": float(sum(seconds)),
        "prefill_seconds": float(seconds[0]) if seconds else 0.0,
        "decode_seconds": float(sum(decode)),
        "tokens_per_second": len(decode) / sum(decode) if decode and sum(decode) > 0 else float("nan"),
        "cache_bytes_allocated": cache.nbytes if cache is not None else 0,
        "cache_bytes_used": cache.bytes_used if cache is not None else 0,
    })
    out_list = tokens[0].tolist() + [s["token"] for s in steps]
    return GenerationTrace(**{
        "prompt": out_list[:T],
        "tokens": out_list,
        "new_tokens": out_list[T:],
        "steps": steps,
        "totals": totals,
        "settings": {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed,
                     "use_cache": use_cache, "max_new_tokens": max_new_tokens},
        "provenance": provenance(model),
    })


def _one_prompt(model: nn.Module, tokens, caller: str) -> torch.Tensor:
    tokens = as_tokens(model, tokens)
    if tokens.shape[0] != 1:
        raise ValueError(f"{caller} follows one prompt; got a batch of {tokens.shape[0]}: pass one row.")
    return tokens


def _generator(seed: int | None, tokens: torch.Tensor) -> torch.Generator | None:
    return None if seed is None else torch.Generator(device=tokens.device).manual_seed(seed)


def _record(model: nn.Module, new: NewToken, T: int, seconds: float, top: int, temperature: float,
            top_k: int | None, top_p: float | None) -> GenerationStep:
    """One step of a one-prompt generation as a ``GenerationStep`` (the fields are described in
    ``generation_trace``)."""
    row = new.logits[0].float()  # (V,)
    probs = sampling_probs(new.logits[:1], temperature=temperature, top_k=top_k, top_p=top_p)[0]  # (V,)
    plain = torch.softmax(row, dim=-1)
    top_ids = torch.topk(row, min(top, row.shape[-1])).indices
    chosen = int(new.token[0])
    cache = new.cache
    return GenerationStep(**{
        "step": new.index,
        "position": new.position,
        "token": chosen,
        "top_ids": top_ids.tolist(),
        "top_probs": probs[top_ids].tolist(),
        "model_probs": plain[top_ids].tolist(),
        "chosen_prob": float(probs[chosen]),
        "chosen_rank": int((row > row[chosen]).sum()),
        "positions_computed": T if new.index == 0 else (1 if cache is not None else new.position),
        "cache_length": cache.length if cache is not None else 0,
        "cache_bytes_allocated_per_layer": cache.bytes_per_layer() if cache is not None else 0,
        "cache_bytes_used_per_layer": cache.bytes_used // cache.n_layers if cache is not None else 0,
        "seconds": seconds,
    })


def compare_cache(model: nn.Module, tokens, max_new_tokens: int, seed: int | None = 0,
                  **sampling) -> CacheComparison:
    """The same prompt, seed and sampling settings with the KV cache on and off.

    Returns ``{"with_cache": trace, "without_cache": trace, "identical": bool, "first_difference": index of
    the first differing new token or None, "speedup": without-cache seconds / with-cache seconds}``.
    Greedy decoding gives identical tokens unless two logits tie to within rounding; sampling with a seed
    draws the same random numbers, so it too matches unless rounding moves a token across a boundary.
    """
    on = generation_trace(model, tokens, max_new_tokens, seed=seed, use_cache=True, **sampling)
    off = generation_trace(model, tokens, max_new_tokens, seed=seed, use_cache=False, **sampling)
    diff = [i for i, (a, b) in enumerate(zip(on["new_tokens"], off["new_tokens"])) if a != b]
    t_on, t_off = on["totals"]["seconds"], off["totals"]["seconds"]
    return CacheComparison(**{
        "with_cache": on,
        "without_cache": off,
        "identical": not diff,
        "first_difference": diff[0] if diff else None,
        "speedup": t_off / t_on if t_on > 0 else float("nan"),
    })


def uncached_schedule(max_new_tokens: int, points: int = 8) -> set[int]:
    """The steps at which ``stream_generation`` also times the uncached forward: ``points`` evenly spaced
    steps from the first to the last, so the comparison costs a bounded share of the run."""
    if max_new_tokens <= points:
        return set(range(max_new_tokens))
    return {round(i * (max_new_tokens - 1) / (points - 1)) for i in range(points)}


@torch.inference_mode()
def stream_generation(model: nn.Module, tokens, max_new_tokens: int, *, temperature: float = 0.0,
                      top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                      stop_tokens=(), uncached_at: set[int] = frozenset(), top: int = 10,
                      step_lock=None, measure_lock=None, step=None):
    """``models.generate.generate_steps`` with the KV cache, one step per ``next()``: yields a ``GenerationStep``
    as each token is chosen, plus ``uncached_seconds``, ``uncached_max_abs_dlogit`` and ``uncached_same_top``
    (the whole sequence recomputed without the cache: its time, its next-token logits vs the cached ones, and
    whether both rank the same token first) at the steps in ``uncached_at``
    (None elsewhere), and ``shared_cores`` (True when ``measure_lock`` was busy: another measurement may have
    run on the same cores during this step), and ``fast_step`` (True when ``step``, the caller's one-token path,
    computed this token's logits; False for the prefill and wherever the modules did). Stops after
    ``max_new_tokens`` or at a token of ``stop_tokens``.

    step_lock (the model's lock) and measure_lock are held around each step's computation only, never while
    the caller holds the step, so a stopped or slow consumer blocks nobody; measure_lock is only tried,
    never waited for.
    """
    tokens = _one_prompt(model, tokens, "stream_generation")
    T = tokens.shape[1]
    run = generate_steps(model, tokens, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                         generator=_generator(seed, tokens), stop_tokens=stop_tokens, step=step)
    seq = tokens.new_empty((1, T + max_new_tokens))  # the sequence so far, for the uncached forward
    seq[:, :T] = tokens
    step_lock = step_lock or _NoLock()
    while True:
        with step_lock:
            shared = measure_lock is not None and not measure_lock.acquire(blocking=False)
            try:
                synchronize(tokens.device)
                start = time.perf_counter()
                new = next(run, None)
                if new is None:
                    return
                synchronize(tokens.device)
                seconds = time.perf_counter() - start
                seq[:, new.position] = new.token
                uncached_seconds = dlogit = same_top = None
                if new.index in uncached_at:
                    start = time.perf_counter()
                    full = model(seq[:, :new.position], last_only=True)[:, -1]  # the same logits, recomputed
                    synchronize(tokens.device)
                    uncached_seconds = time.perf_counter() - start
                    dlogit = float((full.float() - new.logits.float()).abs().max())
                    same_top = bool(full.argmax(-1) == new.logits.argmax(-1))
            finally:
                if measure_lock is not None and not shared:
                    measure_lock.release()
            item = {**_record(model, new, T, seconds, top, temperature, top_k, top_p),
                    "uncached_seconds": uncached_seconds, "uncached_max_abs_dlogit": dlogit,
                    "uncached_same_top": same_top, "shared_cores": shared, "fast_step": new.fast}
        yield item


@torch.inference_mode()
def modules_check(model: nn.Module, prompt: list[int], steps: list[dict]) -> dict[str, Any]:
    """Whether the modules agree with a finished stream, one token at a time: one teacher-forced forward of the
    modules over prompt + new tokens (the prompt, then every new token but the last in one call with a fresh cache,
    so memory stays at (new tokens, V) logits) gives their next-token logits at every step.

    Returns same_top (per step: the modules rank first the token the stream's logits ranked first, ``top_ids[0]``),
    same_greedy (per step: the modules' first choice is the token chosen; the same thing under greedy decoding),
    max_abs_dprob (largest difference between the modules' softmax and the stream's ``model_probs`` over the
    candidates shown) and seconds (the forward's wall time)."""
    tokens = as_tokens(model, prompt)  # (1, T)
    new = [st["token"] for st in steps]
    start = time.perf_counter()
    cache = model.new_cache(1, tokens.shape[1] + len(new))
    logits = [model(tokens, start_pos=0, cache=cache, last_only=True)[0, -1:]]  # (1, V): step 0
    if len(new) > 1:
        rest = torch.tensor([new[:-1]], dtype=torch.long, device=tokens.device)  # (1, n - 1)
        logits.append(model(rest, start_pos=tokens.shape[1], cache=cache)[0])  # (n - 1, V): steps 1 .. n - 1
    logits = torch.cat(logits).float()  # (n, V)
    synchronize(tokens.device)
    seconds = time.perf_counter() - start
    top = logits.argmax(-1).tolist()
    probs = torch.softmax(logits, -1)
    dprob = max(float((probs[i, st["top_ids"]] - torch.tensor(st["model_probs"], device=probs.device)).abs().max())
                for i, st in enumerate(steps))
    return {"same_top": [t == st["top_ids"][0] for t, st in zip(top, steps)],
            "same_greedy": [t == st["token"] for t, st in zip(top, steps)], "max_abs_dprob": dprob,
            "seconds": seconds}


class _NoLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
