"""Instruments every panel reads: hook names, ``run_with_cache``, attention patterns, head scores, the
generation trace and the positional (RoPE / sinusoidal) probes.

Notation: ``B`` batch, ``T`` queries, ``S`` keys, ``L`` layers, ``H`` query heads, ``Hkv`` key/value heads,
``D`` head dim, ``C`` model dim, ``V`` vocabulary.

Everything here observes the model through its hook points (``models.hooks.HookPoint``) and never changes
what it computes. Hooks are registered on the model's modules, which the app shares between users, so each
hooked run holds a per-model lock and each hook records only calls made on the thread that registered it:
two users' captures can never mix, and a plain forward on another thread is never captured.
"""
from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from models.attention import Attention
from models.config import ATTN_IMPLS, ModelConfig, check_attn_impl
from models.generate import check_sampling, generate, sampling_probs
from explorer.heads import (
    duplicate_token_score,
    first_token_score,
    induction_score,
    previous_token_score,
    repeated_random_tokens,
)
from models.hooks import HookPoint
from models.rope import apply_rope, sinusoidal_table

__all__ = [
    "ActivationCache",
    "hook_names",
    "run_with_cache",
    "model_lock",
    "attention_pattern",
    "all_patterns",
    "compare_impls",
    "head_scores",
    "generation_trace",
    "compare_cache",
    "rope_probe",
    "sinusoidal_probe",
]

# --------------------------------------------------------------------------------------------------
# Hook names and the per-model lock
# --------------------------------------------------------------------------------------------------

_LOCKS: "weakref.WeakKeyDictionary[nn.Module, threading.RLock]" = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def model_lock(model: nn.Module) -> threading.RLock:
    """The lock every hooked run on ``model`` holds (one per model object, freed with the model).

    Re-entrant, so a probe that calls another probe on the same thread does not deadlock.
    """
    with _LOCKS_GUARD:
        lock = _LOCKS.get(model)
        if lock is None:
            lock = _LOCKS[model] = threading.RLock()
        return lock


def _hook_points(model: nn.Module) -> list[tuple[str, HookPoint]]:
    """(name, hook point) for every hook point a forward can reach (an attention without RoPE, as in
    the encoder, never calls its hook_rot_q / hook_rot_k, so they are left out)."""
    modules = list(model.named_modules())
    silent = {f"{name}.hook_rot_{x}" if name else f"hook_rot_{x}"
              for name, m in modules if isinstance(m, Attention) and not m.use_rope for x in ("q", "k")}
    return [(name, m) for name, m in modules if isinstance(m, HookPoint) and name not in silent]


# Where each part of a pre-norm block runs, so names list in the order the forward reaches them
# (named_modules would list a block's own hooks after its submodules').
_BLOCK_ORDER = {"hook_resid_pre": 0, "input_layernorm": 1, "attn": 2, "hook_attn_out": 3, "hook_resid_mid": 4,
                "post_attention_layernorm": 5, "mlp": 6, "hook_mlp_out": 7, "hook_resid_post": 8}


def _forward_rank(name: str) -> tuple[int, int, int]:
    parts = name.split(".")
    if parts[0] == "blocks" and len(parts) > 2 and parts[1].isdigit():
        return (1, int(parts[1]), _BLOCK_ORDER.get(parts[2], len(_BLOCK_ORDER)))
    if name == "hook_embed":
        return (0, 0, 0)
    return (3, 0, 0) if name == "hook_logits" else (2, 0, 0)


def hook_names(model: nn.Module) -> list[str]:
    """Every hook point of ``model`` by module path, in the order a forward reaches them.

    Decoder: ``hook_embed``, then per block ``blocks.{i}.hook_resid_pre``,
    ``blocks.{i}.input_layernorm.hook_scale`` / ``hook_normalized``, ``blocks.{i}.attn.hook_q`` ... ``hook_pattern``,
    ``hook_z``, ``blocks.{i}.hook_attn_out``, ``hook_resid_mid``, ``post_attention_layernorm.*``,
    ``blocks.{i}.mlp.hook_gate`` / ``hook_up`` / ``hook_post``, ``hook_mlp_out``, ``hook_resid_post``; then
    ``norm.hook_scale``, ``norm.hook_normalized``, ``hook_logits``. The encoder has no ``hook_logits`` and its
    MLP hooks are ``mlp.hook_pre`` / ``mlp.hook_post``.
    """
    return sorted((name for name, _ in _hook_points(model)), key=_forward_rank)


def _effective_impl(model: nn.Module, attn_impl: str | None) -> str:
    if attn_impl is not None:
        return check_attn_impl(attn_impl)
    impls = {b.attn.impl for b in getattr(model, "blocks", [])}
    if len(impls) == 1:
        return impls.pop()
    return "mixed" if impls else model.config.attn_impl


_IMPL_WORDS = {
    "sdpa": "PyTorch's fused scaled_dot_product_attention",
    "tiled": "the tiled online-softmax (flash) loop",
}


def _pattern_source(impl: str, rotary: bool) -> str:
    qk = "rotated q and k" if rotary else "q and k"
    if impl == "naive":
        return ("naive softmax(q·kᵀ/√D + mask) computed by the model: these are the very weights that "
                "produced the output")
    if impl == "mixed":
        return (f"layers run different implementations; where a layer runs naive attention these are the "
                f"weights it used, elsewhere they are recomputed with the naive formula from the captured {qk}")
    return (f"recomputed with the naive formula from the captured {qk}; the output came from {impl} "
            f"({_IMPL_WORDS.get(impl, impl)}), which never forms the weights")


class ActivationCache(dict):
    """``name -> tensor`` (detached clones), plus where the attention weights came from.

    attn_impl: the attention implementation that produced the output ("naive", "sdpa", "tiled" or
        "mixed" when layers differ).
    pattern_source: one sentence for the UI saying how ``*.attn.hook_pattern`` was obtained.
    n_layers: layers of the model, so ``stack`` knows what to expect.
    """

    def __init__(self, *args, attn_impl: str = "", pattern_source: str = "", n_layers: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.attn_impl = attn_impl
        self.pattern_source = pattern_source
        self.n_layers = n_layers

    def stack(self, suffix: str) -> torch.Tensor:
        """``blocks.{i}.<suffix>`` for every layer, stacked: e.g. ``stack("attn.hook_pattern")`` -> (L, B, H, T, S)."""
        names = [f"blocks.{i}.{suffix}" for i in range(self.n_layers)]
        missing = [n for n in names if n not in self]
        if missing:
            raise ValueError(f"the cache lacks {missing[0]}: run run_with_cache with names that include it.")
        return torch.stack([self[n] for n in names])


def _select(model: nn.Module, names) -> list[tuple[str, HookPoint]]:
    points = _hook_points(model)
    if names is None:
        return points
    if callable(names):
        return [(n, m) for n, m in points if names(n)]
    if isinstance(names, str):
        names = [names]
    wanted = list(names)
    known = dict(points)
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not a hook point of this model; hook_names(model) lists the "
                         f"{len(known)} there are (e.g. {next(iter(known), '')!r}).")
    return [(n, known[n]) for n in dict.fromkeys(wanted)]


def _device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _as_tokens(model: nn.Module, tokens) -> torch.Tensor:
    """Token ids as a (B, T) int64 tensor on the model's device; a flat list or (T,) becomes one row."""
    if isinstance(tokens, torch.Tensor):
        t = tokens
    else:
        try:
            t = torch.as_tensor(np.asarray(tokens))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"tokens must be a list of integer ids or an integer tensor ({exc}).") from exc
    if t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex():
        raise ValueError(f"tokens must be integer ids, got {t.dtype}.")
    if t.dim() == 1:
        t = t[None]
    if t.dim() != 2:
        raise ValueError(f"tokens must have shape (length,) or (batch, length), got {tuple(t.shape)}.")
    return t.to(device=_device(model), dtype=torch.long)


def run_with_cache(model: nn.Module, tokens, names=None, *, attn_impl: str | None = None,
                   **forward_kwargs) -> tuple[torch.Tensor, ActivationCache]:
    """Run ``model(tokens, ...)`` once, recording hook points. Returns (output, cache).

    output: the model's return value (decoder logits (B, T, V), encoder hidden states (B, T, C)).
    names: None (every hook point), a list of hook names, one name, or a predicate ``name -> bool``.
    attn_impl: this call's attention implementation (default: the model's own).
    forward_kwargs: passed to the model (``causal``, ``key_padding``, ``start_pos``, ``cache``...).
    The cached tensors are detached clones made under inference mode: read them (``.numpy()``, slicing,
    arithmetic), don't modify them in place.

    Hooks are removed afterwards, also when selecting names or the forward raises. Runs under
    ``torch.inference_mode`` holding ``model_lock(model)``; each hook records only the calling thread's
    forward, so a concurrent plain forward on the shared model is never captured.
    """
    tokens = _as_tokens(model, tokens)
    impl = _effective_impl(model, attn_impl)
    cache = ActivationCache(attn_impl=impl, pattern_source=_pattern_source(impl, hasattr(model, "rope_cos")),
                            n_layers=len(getattr(model, "blocks", [])))
    owner = threading.get_ident()

    def make_hook(name: str):
        def hook(module, inputs, output):
            if threading.get_ident() == owner:
                cache[name] = output.detach().clone()
        return hook

    kwargs = dict(forward_kwargs)
    if attn_impl is not None:
        kwargs["attn_impl"] = attn_impl
    handles = []
    with model_lock(model):
        try:
            for name, point in _select(model, names):
                handles.append(point.register_forward_hook(make_hook(name)))
            with torch.inference_mode():
                out = model(tokens, **kwargs)
        finally:
            for h in handles:
                h.remove()
    return out, cache


# --------------------------------------------------------------------------------------------------
# Attention patterns
# --------------------------------------------------------------------------------------------------

def _check_layer(model: nn.Module, layer: int) -> None:
    L = len(model.blocks)
    if not isinstance(layer, int) or not 0 <= layer < L:
        raise ValueError(f"layer must be between 0 and {L - 1}, got {layer!r}.")


def _check_head(model: nn.Module, head: int) -> None:
    H = model.config.n_heads
    if not isinstance(head, int) or not 0 <= head < H:
        raise ValueError(f"head must be between 0 and {H - 1}, got {head!r}.")


def _causal_kwargs(causal: bool | None) -> dict:
    return {} if causal is None else {"causal": bool(causal)}


def attention_pattern(model: nn.Module, tokens, layer: int, head: int | None = None, *,
                      causal: bool | None = None, attn_impl: str | None = None) -> np.ndarray:
    """Attention weights of one layer for the first sequence: (H, T, T), or (T, T) for one ``head``.

    causal: None keeps the model's own masking (decoder causal, encoder bidirectional).
    Rows are queries (the token asking), columns keys (the token looked at); each row sums to 1.
    """
    _check_layer(model, layer)
    if head is not None:
        _check_head(model, head)
    name = f"blocks.{layer}.attn.hook_pattern"
    _, cache = run_with_cache(model, tokens, [name], attn_impl=attn_impl, **_causal_kwargs(causal))
    p = cache[name][0].float().cpu().numpy()  # (H, T, S)
    return p if head is None else p[head]


def all_patterns(model: nn.Module, tokens, *, causal: bool | None = None,
                 attn_impl: str | None = None) -> np.ndarray:
    """Every layer's and head's weights for the first sequence: (L, H, T, T), float32."""
    _, cache = run_with_cache(model, tokens, lambda n: n.endswith("attn.hook_pattern"), attn_impl=attn_impl,
                              **_causal_kwargs(causal))
    return cache.stack("attn.hook_pattern")[:, 0].float().cpu().numpy()


def compare_impls(model: nn.Module, tokens, **forward_kwargs) -> dict[str, float]:
    """Max |output - naive output| for each implementation (decoder logits, encoder hidden states).

    Runs without hooks, under ``torch.inference_mode``. ``{"naive": 0.0, "sdpa": ..., "tiled": ...}``.
    """
    tokens = _as_tokens(model, tokens)
    with torch.inference_mode():
        outs = {impl: model(tokens, attn_impl=impl, **forward_kwargs).float() for impl in ATTN_IMPLS}
    return {impl: float((out - outs["naive"]).abs().max()) for impl, out in outs.items()}


# --------------------------------------------------------------------------------------------------
# Head scores
# --------------------------------------------------------------------------------------------------

def head_scores(model: nn.Module, *, tokens=None, span_len: int | None = None, batch: int = 4, seed: int = 0,
                attn_impl: str | None = None) -> dict[str, np.ndarray]:
    """What kind of head each head looks like; each value is (L, H) float32 in [0, 1].

    ``induction`` is always measured on ``batch`` rows of ``[BOS] + r + r`` (``r`` = ``span_len`` random
    distinct tokens, ``explorer.heads.repeated_random_tokens``; BOS is the config's ``bos_token_id`` if set).
    ``previous_token``, ``first_token`` and ``duplicate_token`` are measured on ``tokens`` when given,
    else on that same repeated sequence. ``duplicate_token`` is NaN when no token repeats in ``tokens``.
    span_len default: min(32, what fits the context and the vocabulary).
    """
    config = model.config
    bos = config.bos_token_id
    n_prefix = 0 if bos is None else 1
    n_candidates = config.vocab_size - n_prefix
    if span_len is None:
        span_len = min(32, (config.max_seq_len - n_prefix) // 2, n_candidates)
    if not isinstance(span_len, int) or span_len < 1:
        raise ValueError(f"span_len must be a positive integer, got {span_len!r}.")
    if n_prefix + 2 * span_len > config.max_seq_len:
        raise ValueError(f"a repeated span of {span_len} tokens needs {n_prefix + 2 * span_len} positions, more than "
                         f"the model's context of {config.max_seq_len}: use span_len <= "
                         f"{(config.max_seq_len - n_prefix) // 2}.")
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}.")
    probe = repeated_random_tokens(config.vocab_size, span_len, batch, seed, bos_id=bos)  # (B, P + 2*span)
    is_pattern = lambda n: n.endswith("attn.hook_pattern")  # noqa: E731
    _, cache = run_with_cache(model, probe, is_pattern, attn_impl=attn_impl)
    rep = cache.stack("attn.hook_pattern").cpu()  # (L, B, H, T, T)
    scores = {"induction": induction_score(rep, span_len)}
    if tokens is None:
        pats, toks = rep, probe
    else:
        toks = _as_tokens(model, tokens)
        _, cache = run_with_cache(model, toks, is_pattern, attn_impl=attn_impl)
        pats, toks = cache.stack("attn.hook_pattern").cpu(), toks.cpu()
    if pats.shape[-2] >= 2:
        scores["previous_token"] = previous_token_score(pats)
        scores["first_token"] = first_token_score(pats)
    else:  # one token: nothing before it to look at
        nan = torch.full(pats.shape[:1] + pats.shape[2:3], float("nan"))
        scores["previous_token"] = scores["first_token"] = nan
    scores["duplicate_token"] = duplicate_token_score(pats, toks)
    order = ("previous_token", "first_token", "induction", "duplicate_token")
    return {k: scores[k].float().numpy() for k in order}


# --------------------------------------------------------------------------------------------------
# Generation trace
# --------------------------------------------------------------------------------------------------

def _provenance(model: nn.Module) -> dict[str, str]:
    p = next(model.parameters(), None)
    return {
        "device": str(p.device if p is not None else "cpu"),
        "dtype": str(p.dtype if p is not None else torch.float32).replace("torch.", ""),
        "torch": torch.__version__,
        "attn_impl": _effective_impl(model, None),
        "threads": str(torch.get_num_threads()),
    }


def generation_trace(model: nn.Module, tokens, max_new_tokens: int, *, temperature: float = 0.0,
                     top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                     use_cache: bool = True, top: int = 10) -> dict[str, Any]:
    """Generate from one prompt and record every step. Built on ``models.generate.generate``'s ``on_step``.

    Returns a dict:
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
    """
    check_sampling(temperature, top_k, top_p)
    if not isinstance(top, int) or top < 1:
        raise ValueError(f"top must be a positive integer, got {top!r}.")
    tokens = _as_tokens(model, tokens)
    if tokens.shape[0] != 1:
        raise ValueError(f"generation_trace follows one prompt; got a batch of {tokens.shape[0]}: pass one row.")
    T = tokens.shape[1]
    steps: list[dict[str, Any]] = []
    last = [0.0]
    final_cache = [None]

    def on_step(step: int, logits: torch.Tensor, nxt: torch.Tensor, cache) -> None:
        seconds = time.perf_counter() - last[0]
        row = logits[0].float()  # (V,)
        probs = sampling_probs(logits[:1], temperature=temperature, top_k=top_k, top_p=top_p)[0]  # (V,)
        plain = torch.softmax(row, dim=-1)
        top_ids = torch.topk(row, min(top, row.shape[-1])).indices
        chosen = int(nxt[0])
        n_layers = cache.n_layers if cache is not None else model.config.n_layers
        steps.append({
            "step": step,
            "position": T + step,
            "token": chosen,
            "top_ids": top_ids.tolist(),
            "top_probs": probs[top_ids].tolist(),
            "model_probs": plain[top_ids].tolist(),
            "chosen_prob": float(probs[chosen]),
            "chosen_rank": int((row > row[chosen]).sum()),
            "positions_computed": T if step == 0 else (1 if cache is not None else T + step),
            "cache_length": cache.length if cache is not None else 0,
            "cache_bytes_allocated_per_layer": cache.bytes_per_layer() if cache is not None else 0,
            "cache_bytes_used_per_layer": cache.bytes_used // n_layers if cache is not None else 0,
            "seconds": seconds,
        })
        final_cache[0] = cache
        last[0] = time.perf_counter()

    last[0] = time.perf_counter()
    out = generate(model, tokens, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                   use_cache=use_cache, seed=seed, on_step=on_step)
    seconds = [s["seconds"] for s in steps]
    decode = seconds[1:]
    cache = final_cache[0]
    totals = {
        "new_tokens": len(steps),
        "seconds": float(sum(seconds)),
        "prefill_seconds": float(seconds[0]) if seconds else 0.0,
        "decode_seconds": float(sum(decode)),
        "tokens_per_second": len(decode) / sum(decode) if decode and sum(decode) > 0 else float("nan"),
        "cache_bytes_allocated": cache.nbytes if cache is not None else 0,
        "cache_bytes_used": cache.bytes_used if cache is not None else 0,
    }
    out_list = out[0].tolist()
    return {
        "prompt": out_list[:T],
        "tokens": out_list,
        "new_tokens": out_list[T:],
        "steps": steps,
        "totals": totals,
        "settings": {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed,
                     "use_cache": use_cache, "max_new_tokens": max_new_tokens},
        "provenance": _provenance(model),
    }


def compare_cache(model: nn.Module, tokens, max_new_tokens: int, seed: int | None = 0, **sampling) -> dict[str, Any]:
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
    return {
        "with_cache": on,
        "without_cache": off,
        "identical": not diff,
        "first_difference": diff[0] if diff else None,
        "speedup": t_off / t_on if t_on > 0 else float("nan"),
    }


# --------------------------------------------------------------------------------------------------
# Positions: RoPE and the sinusoidal table
# --------------------------------------------------------------------------------------------------

_MAX_PROBE_POSITIONS = 2048


def _frequencies64(head_dim: int, theta: float) -> torch.Tensor:
    # models.rope's formula in float64: the probe's curves should show the maths, not fp32 rounding
    # (the model itself builds its tables in fp32; the captured q/k show that).
    return theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (D/2,)


def _rotate(x: torch.Tensor, theta: float, n: int) -> torch.Tensor:
    """x (D,) rotated to each position 0..n-1 with the model's ``apply_rope`` -> (n, D), float64."""
    angles = torch.outer(torch.arange(n, dtype=torch.float64), _frequencies64(x.shape[-1], theta))  # (n, D/2)
    angles = torch.cat((angles, angles), dim=-1)  # (n, D): rotate_half layout, pair i at i and i + D/2
    return apply_rope(x.double()[None, None, None].expand(1, 1, n, -1), angles.cos(), angles.sin())[0, 0]


def _relative_scores(q: torch.Tensor, k: torch.Tensor, theta: float, n: int) -> torch.Tensor:
    """score(m, n) = rot(q, m) · rot(k, n) / √D for m, n in 0..n-1 -> (n, n), float64."""
    return _rotate(q, theta, n) @ _rotate(k, theta, n).T / math.sqrt(q.shape[-1])


def _by_distance(scores: torch.Tensor) -> np.ndarray:
    """score as a function of m - n for m - n = -(n-1) .. n-1, read off row 0 and column 0."""
    return torch.cat((scores[0, 1:].flip(0), scores[:, 0])).numpy()


def rope_probe(model_or_config, *, theta: float | None = None, thetas: Sequence[float] | None = None,
               positions: int = 64, pairs: Sequence[int] | None = None, tokens=None, layer: int = 0,
               head: int = 0, seed: int = 0) -> dict[str, Any]:
    """What rotary positions do, from a model (or a ``ModelConfig``) and optionally real tokens.

    Returns a dict (angles in radians, positions in tokens):
        theta, head_dim, positions (T,), frequencies (D/2,) radians per position, wavelengths (D/2,)
            positions per full turn, angles (T, D/2) rotation of each pair at each position,
        pairs: the pair indices followed below (default: fastest, one in the middle, slowest); pair ``i``
            rotates dims ``(i, i + D/2)``,
        relative: for one fixed q and k vector (the captured q of the last token and k of the first token
            when ``tokens`` are given, else seeded random normals): ``scores`` (T, T) =
            rot(q, m)·rot(k, n)/√D for query position m and key position n, ``distances`` (2T-1,) m - n,
            ``by_distance`` (2T-1,) the score at each distance, ``max_deviation`` the largest gap between
            a score and the score at the same distance (≈ 0: only m - n matters), ``vectors`` (which q, k),
        theta_sweep: ``{theta: {"by_distance": (T,) score(d, 0) for d = 0..T-1, "wavelengths": (D/2,)}}``
            for ``thetas`` (default 100, 10 000, 1 000 000 and ``theta``),
        captured (None without a model and tokens): ``layer``, ``head``, ``kv_head``, ``q``, ``k`` (T, D)
            before rotation and ``rot_q``, ``rot_k`` after it (first sequence), ``q_pairs``, ``rot_q_pairs``,
            ``k_pairs``, ``rot_k_pairs`` (T, P, 2) the followed pairs as 2-D points, ``scores`` (T, T)
            rot_q·rot_kᵀ/√D and ``scores_without_rope`` q·kᵀ/√D (both unmasked), ``norm_change`` the
            largest relative change of a vector's length under rotation (≈ 0: rotations keep lengths).
    """
    model = model_or_config if isinstance(model_or_config, nn.Module) else None
    config = model.config if model is not None else model_or_config
    if not isinstance(config, ModelConfig):
        raise ValueError("rope_probe needs a Decoder or a ModelConfig.")
    if model is not None and not hasattr(model, "rope_cos"):
        raise ValueError("this model has no rotary positions (the encoder adds a sinusoidal table): use "
                         "sinusoidal_probe(seq_len, d_model).")
    theta = float(config.rope_theta if theta is None else theta)
    if not theta > 1.0:
        raise ValueError(f"theta must be greater than 1, got {theta!r}.")
    if not isinstance(positions, int) or not 1 <= positions <= _MAX_PROBE_POSITIONS:
        raise ValueError(f"positions must be an integer from 1 to {_MAX_PROBE_POSITIONS}, got {positions!r}.")
    D, T = config.head_dim, positions
    half = D // 2
    if pairs is None:
        pairs = sorted({0, half // 2, half - 1})
    pairs = [int(i) for i in pairs]
    if any(not 0 <= i < half for i in pairs):
        raise ValueError(f"pairs must lie in 0..{half - 1} (head_dim {D} has {half} pairs), got {pairs}.")
    sweep = [100.0, 10000.0, 1e6] if thetas is None else [float(t) for t in thetas]
    if any(not t > 1.0 for t in sweep):
        raise ValueError(f"every theta in thetas must be greater than 1, got {sweep}.")
    sweep = sorted(set(sweep) | {theta})

    freqs = _frequencies64(D, theta)  # (D/2,)
    result: dict[str, Any] = {
        "theta": theta,
        "head_dim": D,
        "positions": np.arange(T),
        "frequencies": freqs.numpy(),
        "wavelengths": (2 * math.pi / freqs).numpy(),
        "angles": torch.outer(torch.arange(T, dtype=torch.float64), freqs).numpy(),  # (T, D/2)
        "pairs": pairs,
        "captured": None,
    }

    captured = None
    if model is not None and tokens is not None:
        _check_layer(model, layer)
        _check_head(model, head)
        names = [f"blocks.{layer}.attn.hook_{n}" for n in ("q", "k", "rot_q", "rot_k")]
        _, cache = run_with_cache(model, tokens, names)
        kv_head = head // config.n_kv_groups
        q, rot_q = (cache[names[i]][0, head].double().cpu() for i in (0, 2))  # (T_tok, D)
        k, rot_k = (cache[names[i]][0, kv_head].double().cpu() for i in (1, 3))  # (T_tok, D)

        def as_pairs(x: torch.Tensor) -> np.ndarray:
            return torch.stack((x[:, pairs], x[:, [i + half for i in pairs]]), dim=-1).numpy()  # (T_tok, P, 2)

        norms = lambda a: a.norm(dim=-1).clamp_min(1e-30)  # noqa: E731
        captured = {
            "layer": layer, "head": head, "kv_head": kv_head,
            "tokens": _as_tokens(model, tokens)[0].tolist(),
            "q": q.numpy(), "k": k.numpy(), "rot_q": rot_q.numpy(), "rot_k": rot_k.numpy(),
            "q_pairs": as_pairs(q), "rot_q_pairs": as_pairs(rot_q),
            "k_pairs": as_pairs(k), "rot_k_pairs": as_pairs(rot_k),
            "scores": (rot_q @ rot_k.T / math.sqrt(D)).numpy(),
            "scores_without_rope": (q @ k.T / math.sqrt(D)).numpy(),
            "norm_change": float(max(((norms(rot_q) - norms(q)).abs() / norms(q)).max(),
                                     ((norms(rot_k) - norms(k)).abs() / norms(k)).max())),
        }
        result["captured"] = captured

    if captured is not None:
        qv, kv = torch.from_numpy(captured["q"][-1]), torch.from_numpy(captured["k"][0])
        vectors = f"captured q of the last token and k of the first token (layer {layer}, head {head})"
    else:
        g = torch.Generator().manual_seed(seed)
        qv = torch.randn(D, generator=g, dtype=torch.float64)
        kv = torch.randn(D, generator=g, dtype=torch.float64)
        vectors = f"random normal q and k (seed {seed})"
    scores = _relative_scores(qv, kv, theta, T)  # (T, T)
    m, n = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
    by_distance = torch.from_numpy(_by_distance(scores))
    expected = by_distance[(m - n) + (T - 1)]  # the score at the same distance, (T, T)
    result["relative"] = {
        "scores": scores.numpy(),
        "distances": np.arange(-(T - 1), T),
        "by_distance": by_distance.numpy(),
        "max_deviation": float((scores - expected).abs().max()),
        "vectors": vectors,
    }
    result["theta_sweep"] = {
        t: {"by_distance": _relative_scores(qv, kv, t, T)[:, 0].numpy(),
            "wavelengths": (2 * math.pi / _frequencies64(D, t)).numpy()}
        for t in sweep
    }
    return result


def sinusoidal_probe(seq_len: int, d_model: int, base: float = 10000.0) -> dict[str, Any]:
    """The encoder's sinusoidal position table and what it encodes.

    Returns table (T, C) (even channels sin, odd channels cos, ``models.rope.sinusoidal_table``),
    frequencies (C/2,) radians per position, wavelengths (C/2,) positions per full turn,
    similarity (T, T) = table · tableᵀ (dot product of two positions' codes), by_distance (T,) the dot
    product of position d with position 0 (it depends only on the distance: Σᵢ cos(d·ωᵢ)).
    """
    if not isinstance(seq_len, int) or not 1 <= seq_len <= _MAX_PROBE_POSITIONS:
        raise ValueError(f"seq_len must be an integer from 1 to {_MAX_PROBE_POSITIONS}, got {seq_len!r}.")
    if not isinstance(d_model, int) or d_model < 2 or d_model % 2:
        raise ValueError(f"d_model must be a positive even integer, got {d_model!r}.")
    if not base > 1.0:
        raise ValueError(f"base must be greater than 1, got {base!r}.")
    table = sinusoidal_table(seq_len, d_model, base).double()  # (T, C)
    freqs = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(base) / d_model))
    similarity = table @ table.T  # (T, T)
    return {
        "table": table.numpy(),
        "positions": np.arange(seq_len),
        "frequencies": freqs.numpy(),
        "wavelengths": (2 * math.pi / freqs).numpy(),
        "similarity": similarity.numpy(),
        "by_distance": similarity[:, 0].numpy(),
    }
