"""Attention patterns, the three implementations compared, and head scores.

Notation: ``L`` layers, ``B`` batch, ``H`` query heads, ``T`` queries, ``S`` keys.
"""
from __future__ import annotations

from typing import TypedDict

import numpy as np
import torch

from explorer.device import to_host
from torch import nn

from models.config import ATTN_IMPLS
from explorer.heads import (
    duplicate_token_score,
    first_token_score,
    induction_score,
    previous_token_score,
    repeated_random_tokens,
)

from .hooks import _as_tokens, check_head, check_layer, run_with_cache


def _causal_kwargs(causal: bool | None) -> dict:
    return {} if causal is None else {"causal": bool(causal)}


def attention_pattern(model: nn.Module, tokens, layer: int, head: int | None = None, *,
                      causal: bool | None = None, attn_impl: str | None = None, **forward_kwargs) -> np.ndarray:
    """Attention weights of one layer for the first sequence: (H, T, T), or (T, T) for one ``head``.

    causal: None keeps the model's own masking (decoder causal, encoder bidirectional).
    forward_kwargs: passed to the model for this call (a decoder's ``rope_theta``, for instance).
    Rows are queries (the token asking), columns keys (the token looked at); each row sums to 1.
    """
    check_layer(model, layer)
    if head is not None:
        check_head(model, head)
    name = f"blocks.{layer}.attn.hook_pattern"
    _, cache = run_with_cache(model, tokens, [name], attn_impl=attn_impl, **_causal_kwargs(causal), **forward_kwargs)
    p = to_host(cache[name][0])  # (H, T, S), the figure boundary
    return p if head is None else p[head]


def _is_pattern(name: str) -> bool:
    return name.endswith("attn.hook_pattern")


def patterns_with_source(model: nn.Module, tokens, *, causal: bool | None = None,
                         attn_impl: str | None = None) -> tuple[np.ndarray, str]:
    """``all_patterns`` and the sentence saying how the weights were obtained (``ActivationCache.pattern_source``)."""
    _, cache = run_with_cache(model, tokens, _is_pattern, attn_impl=attn_impl, **_causal_kwargs(causal))
    return to_host(cache.stack("attn.hook_pattern")[:, 0]), cache.pattern_source


class PromptForward(TypedDict):
    """One forward of a prompt, everything the Attention tab reads from it."""
    patterns: np.ndarray  # (L, H, T, T) float32
    source: str  # how the weights were obtained
    top_ids: np.ndarray  # (k,) the most likely next tokens after the last one
    top_probs: np.ndarray  # (k,) their probabilities (softmax of the last logits, float64)
    logits: torch.Tensor  # (1, T, V) the forward's output for the first sequence (compare_impls' known)
    attn_impl: str  # the implementation that forward ran


def prompt_forward(model: nn.Module, tokens, *, causal: bool | None = None, top_k: int = 5) -> PromptForward:
    """Every head's weights and the next-token prediction after the last token, from one forward pass."""
    logits, cache = run_with_cache(model, tokens, _is_pattern, **_causal_kwargs(causal))
    probs = torch.softmax(logits[0, -1].double(), dim=-1)  # (V,)
    top = torch.topk(probs, min(top_k, probs.shape[-1]))
    return PromptForward(patterns=to_host(cache.stack("attn.hook_pattern")[:, 0]), source=cache.pattern_source,
                         top_ids=to_host(top.indices), top_probs=to_host(top.values), logits=logits[:1].detach(),
                         attn_impl=cache.attn_impl)


def all_patterns(model: nn.Module, tokens, *, causal: bool | None = None,
                 attn_impl: str | None = None) -> np.ndarray:
    """Every layer's and head's weights for the first sequence: (L, H, T, T), float32."""
    return patterns_with_source(model, tokens, causal=causal, attn_impl=attn_impl)[0]


def compare_impls(model: nn.Module, tokens, *, known: dict[str, torch.Tensor] | None = None,
                  **forward_kwargs) -> dict[str, float]:
    """Max |output - naive output| for each implementation (decoder logits, encoder hidden states).

    Runs without hooks, under ``torch.inference_mode``. ``{"naive": 0.0, "sdpa": ..., "tiled": ...}``.
    known: ``{impl: output}`` already computed for these tokens and arguments (a recorded forward: hooks only
    observe, so it is the same tensor): those implementations are not run again.
    """
    tokens = _as_tokens(model, tokens, forward_kwargs.get("start_pos", 0))
    known = {impl: out for impl, out in (known or {}).items() if impl in ATTN_IMPLS}
    with torch.inference_mode():
        outs = {impl: (known[impl] if impl in known else model(tokens, attn_impl=impl, **forward_kwargs)).float()
                for impl in ATTN_IMPLS}
    return {impl: float((out - outs["naive"]).abs().max()) for impl, out in outs.items()}


# --------------------------------------------------------------------------------------------------
# Head scores
# --------------------------------------------------------------------------------------------------

class HeadScores(TypedDict):
    """Each (L, H) float32 in [0, 1] (NaN where a score has nothing to measure)."""
    previous_token: np.ndarray
    first_token: np.ndarray
    induction: np.ndarray
    duplicate_token: np.ndarray


def pattern_scores(patterns: torch.Tensor | np.ndarray, tokens) -> dict[str, np.ndarray]:
    """Previous-token, first-token (sink) and duplicate-token scores of captured weights, no forward run.

    patterns: (L, B, H, T, T) attention weights; tokens: (B, T) the ids they were computed on.
    Returns ``{"previous_token", "first_token", "duplicate_token"}``, each (L, H) float32; with one token
    (nothing before it to look at) the first two are NaN.
    """
    pats = torch.as_tensor(patterns)
    toks = torch.as_tensor(tokens).to(pats.device)
    if toks.dim() == 1:
        toks = toks[None]
    if pats.shape[-2] >= 2:
        scores = {"previous_token": previous_token_score(pats), "first_token": first_token_score(pats)}
    else:  # one token: nothing before it to look at
        nan = torch.full(pats.shape[:1] + pats.shape[2:3], float("nan"), device=pats.device)  # (L, H)
        scores = {"previous_token": nan, "first_token": nan}
    scores["duplicate_token"] = duplicate_token_score(pats, toks)
    return {k: to_host(v.float()) for k, v in scores.items()}


def head_scores(model: nn.Module, *, tokens=None, span_len: int | None = None, batch: int = 4, seed: int = 0,
                attn_impl: str | None = None) -> HeadScores:
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
    toks = None if tokens is None else _as_tokens(model, tokens)  # refused before anything runs
    probe = repeated_random_tokens(config.vocab_size, span_len, batch, seed, bos_id=bos)  # (B, P + 2*span)
    last_only = {"last_only": True} if hasattr(model, "lm_head") else {}  # a decoder: only the weights are read
    _, cache = run_with_cache(model, probe, _is_pattern, attn_impl=attn_impl, **last_only)
    rep = cache.stack("attn.hook_pattern")  # (L, B, H, T, T)
    if toks is None:
        pats, toks = rep, probe
    else:
        _, cache = run_with_cache(model, toks, _is_pattern, attn_impl=attn_impl, **last_only)
        pats = cache.stack("attn.hook_pattern")
    scores = pattern_scores(pats, toks)
    return HeadScores(previous_token=scores["previous_token"], first_token=scores["first_token"],
                      induction=to_host(induction_score(rep, span_len).float()),
                      duplicate_token=scores["duplicate_token"])

