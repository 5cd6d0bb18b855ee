"""Head scores: what kind of head an attention pattern looks like.

The scores are pure functions over attention patterns: record the patterns however you like (hook points,
transformers' ``output_attentions``) and pass them in. ``head_scores`` records them from a model itself
(``run_with_cache``) on repeated random tokens.

Notation: ``B`` batch, ``H`` heads, ``T`` query positions, ``S`` key positions (``S == T`` for a
plain forward pass), ``L`` layers. ``pattern[..., t, s]`` is how much query ``t`` attends to key
``s``; each row sums to 1 over ``s <= t``.

Every score takes ``pattern`` shaped ``(B, H, T, S)`` and returns ``(H,)``, or shaped
``(L, B, H, T, S)`` and returns ``(L, H)``: the batch axis is always the one before the heads.
Scores are averages of attention weights, so they lie in [0, 1]; 1 means the head puts all of its
weight where the score looks.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

import torch
from torch import nn

from lens.device import to_host
from lens.hooks import as_tokens, run_with_cache

__all__ = [
    "previous_token_score",
    "first_token_score",
    "induction_score",
    "duplicate_token_score",
    "repeated_random_tokens",
    "repeated_suffix_len",
    "without_sink",
    "offset_profile",
    "is_pattern",
    "HeadScores",
    "pattern_scores",
    "head_scores",
    "induction_scores",
]


def _as_pattern(pattern) -> torch.Tensor:
    p = torch.as_tensor(pattern)
    if p.dim() not in (4, 5):
        raise ValueError(
            f"pattern must be (B, H, T, S) or (L, B, H, T, S); got {p.dim()} dimensions "
            f"{tuple(p.shape)}.")
    if p.shape[-1] < p.shape[-2]:
        raise ValueError(f"pattern has fewer keys ({p.shape[-1]}) than queries ({p.shape[-2]}); "
                         "pass the full (T, S) square of a forward pass.")
    return p.to(torch.float64)


def _offset(p: torch.Tensor) -> int:
    # With S > T (queries are the last T of S positions, as with a KV cache), query t sits at
    # absolute position t + S - T.
    return p.shape[-1] - p.shape[-2]


def previous_token_score(pattern) -> torch.Tensor:
    """Mean weight each head puts on the token just before the query.

    Mean over batch and queries ``t >= 1`` of ``pattern[..., t, t - 1]``. ``(B, H, T, S) -> (H,)``.
    """
    p = _as_pattern(pattern)
    T, off = p.shape[-2], _offset(p)
    if T + off < 2:
        raise ValueError("previous-token score needs a sequence of at least 2 tokens.")
    t = torch.arange(T)
    keep = (t + off) >= 1
    q, k = t[keep], t[keep] + off - 1
    vals = p[..., q, k]                       # (..., B, H, n)
    return vals.mean(dim=-1).mean(dim=-2).to(torch.float32)


def first_token_score(pattern) -> torch.Tensor:
    """Mean weight each head puts on key 0 (the first token, usually BOS: an "attention sink").

    Mean over batch and queries ``t >= 1`` (query 0 can only look at itself).
    ``(B, H, T, S) -> (H,)``.
    """
    p = _as_pattern(pattern)
    T, off = p.shape[-2], _offset(p)
    t = torch.arange(T)
    keep = (t + off) >= 1
    if not keep.any():
        raise ValueError("first-token score needs a sequence of at least 2 tokens.")
    vals = p[..., t[keep], 0]                  # (..., B, H, n)
    return vals.mean(dim=-1).mean(dim=-2).to(torch.float32)


def induction_score(pattern, span_len: int) -> torch.Tensor:
    """Mean weight on "the token after this token's earlier occurrence".

    The input must END with a random span repeated twice: ``prefix + r + r`` with ``len(r) ==
    span_len`` and any prefix (usually a BOS token, or nothing). With ``P = len(prefix)`` the
    second copy occupies positions ``P + span_len .. P + 2*span_len - 1`` (the last ``span_len``
    positions); query ``j`` there holds the token seen at ``j - span_len``, so an induction head
    attends to ``j - span_len + 1``, the token that came next last time. The score is the mean
    over the batch and over all ``span_len`` queries of the second copy of
    ``pattern[..., j, j - span_len + 1]``. Because positions are counted from the end, a BOS
    offset needs no argument: ``[BOS] + r + r`` and ``r + r`` are both scored correctly.
    ``(B, H, T, S) -> (H,)``.
    """
    p = _as_pattern(pattern)
    if span_len < 1:
        raise ValueError(f"span_len must be at least 1; got {span_len}.")
    T, off = p.shape[-2], _offset(p)
    n = T + off                               # absolute sequence length
    if n < 2 * span_len:
        raise ValueError(f"the sequence has {n} tokens; it must end with two copies of the "
                         f"span, so at least 2 * span_len = {2 * span_len}.")
    if T < span_len:
        raise ValueError(f"the pattern has {T} queries; the whole second copy ({span_len}) "
                         "must be among them.")
    q = torch.arange(T - span_len, T)         # query rows of the second copy
    k = q + off - span_len + 1                # absolute key positions
    vals = p[..., q, k]                       # (..., B, H, span_len)
    return vals.mean(dim=-1).mean(dim=-2).to(torch.float32)


def duplicate_token_score(pattern, tokens) -> torch.Tensor:
    """Weight each head puts on earlier positions that hold the same token as the query.

    For every query ``t`` whose token already occurred at some ``s < t``, sum the weight on all
    such ``s``; average over those queries and the batch. ``tokens`` is ``(B, S)`` (or ``(S,)``
    for one sequence); the last ``T`` of them are the queries. ``(B, H, T, S) -> (H,)``.
    Heads get NaN when no token repeats anywhere in the batch (the score is undefined then).
    """
    p = _as_pattern(pattern)
    tok = torch.as_tensor(tokens)
    if tok.dim() == 1:
        tok = tok.unsqueeze(0)
    B, T, S = p.shape[-4], p.shape[-2], p.shape[-1]
    if tok.shape != (B, S):
        raise ValueError(f"tokens must be (B, S) = {(B, S)} to match the pattern; got "
                         f"{tuple(tok.shape)}.")
    off = S - T
    q_tok = tok[:, off:]                                              # (B, T)
    same = q_tok[:, :, None] == tok[:, None, :]                       # (B, T, S)
    q_pos = torch.arange(T)[:, None] + off
    earlier = torch.arange(S)[None, :] < q_pos                        # (T, S)
    mask = (same & earlier).to(p.dtype)                               # (B, T, S)
    has_dup = mask.sum(-1) > 0                                        # (B, T)
    weight = (p * mask[:, None]).sum(-1)                              # (..., B, H, T)
    n = has_dup.sum()
    if n == 0:
        shape = p.shape[:-4] + (p.shape[-3],)
        return torch.full(shape, float("nan"))
    total = (weight * has_dup[:, None, :].to(p.dtype)).sum(dim=(-1, -3))  # (..., H)
    return (total / n).to(torch.float32)


def repeated_random_tokens(vocab_size: int, span_len: int, batch: int, seed: int,
                           bos_id: int | None = None,
                           candidates: Sequence[int] | torch.Tensor | None = None
                           ) -> torch.Tensor:
    """The induction probe: ``batch`` rows of ``[bos_id] + r + r``, ``r`` random tokens.

    Tokens of ``r`` are drawn without replacement (no token twice within a span, so each query of
    the second copy has exactly one earlier occurrence) from ``candidates`` if given, else from
    ``0 .. vocab_size - 1`` except ``bos_id``. Deterministic from ``seed``.
    Returns LongTensor ``(batch, 2 * span_len)``, or ``(batch, 1 + 2 * span_len)`` with a BOS.
    """
    if candidates is None:
        pool = torch.arange(vocab_size)
        if bos_id is not None:
            pool = pool[pool != bos_id]
    else:
        pool = torch.as_tensor(candidates, dtype=torch.long).flatten()
    if span_len < 1 or batch < 1:
        raise ValueError("span_len and batch must be at least 1.")
    if len(pool) < span_len:
        raise ValueError(f"cannot draw {span_len} distinct tokens from {len(pool)} candidates; "
                         "use a shorter span.")
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(batch):
        r = pool[torch.randperm(len(pool), generator=g)[:span_len]]
        parts = [r, r]
        if bos_id is not None:
            parts.insert(0, torch.tensor([bos_id]))
        rows.append(torch.cat(parts))
    return torch.stack(rows).long()


def repeated_suffix_len(tokens: Sequence[int]) -> int:
    """The longest ``L`` such that ``tokens`` ends with the same ``L`` tokens twice (``... + r + r``), else 0.

    A prompt that repeats itself can then be scored for induction on its own tokens (``induction_score`` with
    ``span_len=L``), instead of on random tokens.
    """
    t = list(tokens)
    for span in range(len(t) // 2, 0, -1):
        if t[-2 * span:-span] == t[-span:]:
            return span
    return 0


def without_sink(pattern) -> torch.Tensor:
    """Weights with key 0 removed and each row renormalised over the keys left: ``(..., T, S) -> (..., T, S - 1)``.

    The attention sink (most of a row's weight on token 0) hides what the rest of the row does; this shows
    that rest as shares of the weight not on token 0. Row 0 (which can only see key 0) has nothing left and
    is NaN; so is any row whose weight was all on key 0.
    """
    p = torch.as_tensor(pattern).to(torch.float64)
    rest = p[..., 1:]
    total = rest.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, rest / total.clamp_min(torch.finfo(p.dtype).tiny), torch.nan)


def offset_profile(pattern) -> torch.Tensor:
    """Where one head's weight goes, by distance back: ``(T, T) -> (T,)``, over queries ``t >= 1``.

    Entry ``d`` is the mean over the queries ``t = 1 .. T-1`` of ``pattern[t, t - d]``, counting only keys
    ``t - d >= 1`` (a query with no such key adds 0): ``d = 0`` the token itself, ``d = 1`` the previous token.
    Key 0 is left out (``first_token_score`` measures it), so the profile plus the weight on key 0 sums to 1
    for a causal pattern: each entry is a share of the rows' weight, comparable across ``d``.
    """
    p = torch.as_tensor(pattern).to(torch.float64)
    if p.dim() != 2 or p.shape[0] != p.shape[1] or p.shape[0] < 2:
        raise ValueError(f"pattern must be one head's square (T, T) weights, T >= 2; got {tuple(p.shape)}.")
    T = p.shape[0]
    rest = p[1:, 1:]  # queries 1.., keys 1..: diagonal -d holds pattern[t, t - d] for t - d >= 1
    return torch.stack([torch.diagonal(rest, offset=-d).sum() for d in range(T - 1)] + [p.new_zeros(())]) / (T - 1)


def is_pattern(name: str) -> bool:
    return name.endswith("attn.hook_pattern")


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
    distinct tokens, ``lens.heads.repeated_random_tokens``; BOS is the config's ``bos_token_id`` if set).
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
    _check_probe(config, n_prefix, span_len, batch)
    toks = None if tokens is None else as_tokens(model, tokens)  # refused before anything runs
    probe = repeated_random_tokens(config.vocab_size, span_len, batch, seed, bos_id=bos)  # (B, P + 2*span)
    last_only = {"last_only": True} if hasattr(model, "lm_head") else {}  # a decoder: only the weights are read
    _, cache = run_with_cache(model, probe, is_pattern, attn_impl=attn_impl, **last_only)
    rep = cache.stack("attn.hook_pattern")  # (L, B, H, T, T)
    if toks is None:
        pats, toks = rep, probe
    else:
        _, cache = run_with_cache(model, toks, is_pattern, attn_impl=attn_impl, **last_only)
        pats = cache.stack("attn.hook_pattern")
    scores = pattern_scores(pats, toks)
    return HeadScores(previous_token=scores["previous_token"], first_token=scores["first_token"],
                      induction=to_host(induction_score(rep, span_len).float()),
                      duplicate_token=scores["duplicate_token"])


def _check_probe(config, n_prefix: int, span_len: int, batch: int) -> None:
    """The repeated-span probe fits the model's context, and its batch is a positive integer (ValueError)."""
    if n_prefix + 2 * span_len > config.max_seq_len:
        raise ValueError(f"a repeated span of {span_len} tokens needs {n_prefix + 2 * span_len} positions, more than "
                         f"the model's context of {config.max_seq_len}: use span_len <= "
                         f"{(config.max_seq_len - n_prefix) // 2}.")
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}.")


def induction_scores(model: nn.Module, span_len: int, *, batch: int = 4, seed: int = 0) -> np.ndarray:
    """``head_scores(model, span_len=span_len, batch=batch, seed=seed)["induction"]``, (L, H) float32, from one
    forward that keeps of each layer's weights only the second copy's induction entries (B, H, span_len).

    The same numbers: the same probe rows and the same weights (recomputed with the naive formula where the layer
    ran SDPA), averaged in float64 as ``induction_score`` does. What it saves: the (L, B, H, T, T) stack of every
    layer's weights in float64 and the scores no one asked for (4 rows at span 120 on 30 layers of 9 heads: a
    502 MB stack and three more scores over it)."""
    config = model.config
    n_prefix = 0 if config.bos_token_id is None else 1
    if not isinstance(span_len, int) or isinstance(span_len, bool) or span_len < 1:
        raise ValueError(f"span_len must be a positive integer, got {span_len!r}.")
    _check_probe(config, n_prefix, span_len, batch)
    probe = repeated_random_tokens(config.vocab_size, span_len, batch, seed, bos_id=config.bos_token_id)
    T = probe.shape[1]
    q = torch.arange(T - span_len, T)  # the second copy's queries; each looks for key q - span_len + 1

    def keep(name: str, pattern: torch.Tensor) -> torch.Tensor:  # (B, H, T, T) -> (B, H, span_len)
        return pattern[..., q, q - span_len + 1].to(torch.float64)

    last_only = {"last_only": True} if hasattr(model, "lm_head") else {}
    _, cache = run_with_cache(model, probe, is_pattern, reduce=keep, **last_only)
    vals = cache.stack("attn.hook_pattern")  # (L, B, H, span_len) float64
    return to_host(vals.mean(dim=-1).mean(dim=-2).to(torch.float32))
