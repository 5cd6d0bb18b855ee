"""Scaled dot-product attention three ways, and the multi-head / grouped-query module around it.

Notation (used in every shape comment):
    B batch, T queries, S keys, H query heads, Hkv key/value heads, G = H / Hkv queries per KV head,
    D head dim, C model dim.

Masks are given as three facts, never as a materialised ``(T, S)`` matrix, so the tiled path can build
each block's mask from indices:
    causal       query ``t`` sits at absolute position ``S - T + t`` (the last ``T`` of ``S`` positions,
                 which is what a KV cache holds) and sees keys at positions ``<= S - T + t``.
    window       optional (sliding-window layers: Mistral, Gemma 3): a query sees only the keys fewer than
                 ``window`` positions before it, itself included (without ``causal``: on either side).
    key_padding  optional bool ``(B, S)``, True where the key is a real token, False where it is padding.
A row with no visible key (a padding query under left padding) gets uniform weights in every
implementation instead of NaN; its output is meaningless and callers ignore it.

Implementations (one dispatcher, ``attention(..., impl=...)``):
    "naive"  softmax(Q Kᵀ / √D + mask) V written out; materialises the (B, H, T, S) weights.
    "sdpa"   torch.nn.functional.scaled_dot_product_attention: fused flash / memory-efficient kernels.
    "tiled"  FlashAttention's online softmax written in PyTorch: loops over key blocks keeping a running
             max ``m``, running sum ``l`` and a rescaled output accumulator; never holds a T × S matrix.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .config import check_attn_impl
from .hooks import HookPoint
from .kv_cache import KVCache
from .layers import RMSNorm
from .rope import apply_rope


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, Hkv, S, D) -> (B, Hkv * n_rep, S, D): KV head ``j`` serves query heads ``j*n_rep ... j*n_rep + n_rep - 1``."""
    if n_rep == 1:
        return x
    B, Hkv, S, D = x.shape
    x = x[:, :, None].expand(B, Hkv, n_rep, S, D)  # (B, Hkv, G, S, D), no copy yet
    return x.reshape(B, Hkv * n_rep, S, D)  # (B, H, S, D)


def build_mask(
    T: int,
    S: int,
    *,
    causal: bool,
    key_padding: torch.Tensor | None = None,
    device: torch.device | str | None = None,
    key_start: int = 0,
    key_stop: int | None = None,
    window: int | None = None,
) -> torch.Tensor | None:
    """Which keys each query may see, as bool (B or 1, 1, T, key_stop - key_start); True = visible.

    None means every key is visible. ``key_start``/``key_stop`` select one block of keys (the tiled path
    builds one block at a time and never the whole T × S mask). ``window``: see the module docstring.
    """
    key_stop = S if key_stop is None else key_stop
    mask = None
    if causal or window is not None:
        q_pos = torch.arange(S - T, S, device=device)  # (T,) absolute positions of the queries
        k_pos = torch.arange(key_start, key_stop, device=device)  # (S_block,)
        if causal:
            mask = (k_pos[None, :] <= q_pos[:, None])[None, None]  # (1, 1, T, S_block)
        if window is not None:  # the band: a local layer sees only the keys fewer than `window` positions away
            near = ((q_pos[:, None] - k_pos[None, :]).abs() < window)[None, None]  # (1, 1, T, S_block)
            mask = near if mask is None else mask & near
    if key_padding is not None:
        pad = key_padding[:, None, None, key_start:key_stop].bool()  # (B, 1, 1, S_block)
        mask = pad if mask is None else mask & pad  # (B, 1, T, S_block)
    return mask


def _fill_value(dtype: torch.dtype) -> float:
    # The most negative finite value, not -inf: an all-masked row then stays finite (uniform weights)
    # and the tiled path's running max never computes -inf - (-inf).
    return torch.finfo(dtype).min


def attention_scores(q: torch.Tensor, k: torch.Tensor, *, scale: float | None = None) -> torch.Tensor:
    """Scaled scores Q Kᵀ / √D. q (B, H, T, D), k (B, Hkv, S, D) -> (B, H, T, S)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k = repeat_kv(k, q.shape[1] // k.shape[1])  # (B, H, S, D)
    return torch.matmul(q, k.transpose(2, 3)) * scale  # (B, H, T, S)


def attention_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    causal: bool,
    key_padding: torch.Tensor | None = None,
    scale: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """softmax(Q Kᵀ / √D + mask) in fp32, cast back to q's dtype. (B, H, T, S); rows sum to 1."""
    scores = attention_scores(q, k, scale=scale)  # (B, H, T, S)
    mask = build_mask(q.shape[2], k.shape[2], causal=causal, key_padding=key_padding, device=q.device, window=window)
    if mask is not None:
        scores = scores.masked_fill(~mask, _fill_value(scores.dtype))
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)


def naive_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    key_padding: torch.Tensor | None = None,
    scale: float | None = None,
    window: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The textbook formula. Returns out (B, H, T, D) and weights (B, H, T, S)."""
    weights = attention_weights(q, k, causal=causal, key_padding=key_padding, scale=scale,
                                window=window)  # (B, H, T, S)
    out = torch.matmul(weights, repeat_kv(v, q.shape[1] // v.shape[1]))  # (B, H, T, S) @ (B, H, S, D)
    return out, weights


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    key_padding: torch.Tensor | None = None,
    scale: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """PyTorch's fused kernels. GQA without copying K/V (``enable_gqa``). Returns (B, H, T, D)."""
    T, S = q.shape[2], k.shape[2]
    if window is not None and window >= S and causal:
        window = None  # a window as long as the keys hides nothing a causal mask does not
    mask = None
    is_causal = False
    if key_padding is None and causal and T == S and window is None:
        is_causal = True  # SDPA's own causal flag keeps the flash kernel; it aligns top-left, right for T == S
    elif key_padding is not None or (causal and T > 1) or window is not None:
        mask = build_mask(T, S, causal=causal, key_padding=key_padding, device=q.device, window=window)
    # (a single query at the end of the sequence sees every key: no mask at all)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=k.shape[1] != q.shape[1]
    )


def tiled_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    key_padding: torch.Tensor | None = None,
    scale: float | None = None,
    tile_size: int = 64,
    on_block: Callable[[dict], None] | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """FlashAttention's online softmax over key blocks. Returns (B, H, T, D).

    Per key block ``[s0, s1)``: scores ``s`` (B, H, T, s1 - s0); new running max ``m' = max(m, rowmax s)``;
    ``p = exp(s - m')``; the old sum and accumulator are rescaled by ``exp(m - m')`` before ``p`` is added.
    At the end ``out = acc / l``. Peak extra memory is O(T · tile_size + T · D), not O(T · S): the running
    sum and accumulator are updated in place, and each block's scores turn into its probabilities in place.
    ``on_block`` (optional) receives after every block a dict with ``block``, ``start``, ``stop`` and copies
    of ``m`` (B, H, T), ``l`` (B, H, T) and the output so far ``acc / l`` (B, H, T, D). With a causal ``window``
    the blocks wholly before every query's window are skipped: a local layer's work grows with the window, not S.
    """
    if tile_size <= 0:
        raise ValueError(f"tile_size must be a positive integer, got {tile_size}.")
    B, H, T, D = q.shape
    S = k.shape[2]
    n_rep = H // k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    fill = _fill_value(torch.float32)
    m = torch.full((B, H, T, 1), fill, dtype=torch.float32, device=q.device)  # running row max
    l = torch.zeros((B, H, T, 1), dtype=torch.float32, device=q.device)  # running row sum of exp
    acc = torch.zeros((B, H, T, D), dtype=torch.float32, device=q.device)  # unnormalised output
    first = 0 if window is None or not causal else max(0, S - T - window + 1)  # the first query's oldest key
    for block, s0 in enumerate(range(first - first % tile_size, S, tile_size)):
        s1 = min(s0 + tile_size, S)
        kb = repeat_kv(k[:, :, s0:s1], n_rep)  # (B, H, s1 - s0, D)
        vb = repeat_kv(v[:, :, s0:s1], n_rep)  # (B, H, s1 - s0, D)
        s = torch.matmul(q, kb.transpose(2, 3)).float().mul_(scale)  # (B, H, T, s1 - s0)
        # A causal block that even the first query sees whole needs no mask at all.
        if key_padding is not None or (causal and s1 - 1 > S - T) or window is not None:
            mask = build_mask(T, S, causal=causal, key_padding=key_padding, device=q.device,
                              key_start=s0, key_stop=s1, window=window)
            s.masked_fill_(~mask, fill)
            del mask
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (B, H, T, 1)
        p = s.sub_(m_new).exp_()  # (B, H, T, s1 - s0), in place: the scores become the probabilities
        correction = torch.exp(m - m_new)  # (B, H, T, 1): how much the old max overstated the new one
        l.mul_(correction).add_(p.sum(dim=-1, keepdim=True))
        acc.mul_(correction).add_(torch.matmul(p, vb.float()))  # (B, H, T, D)
        m = m_new
        if on_block is not None:
            on_block(
                {"block": block, "start": s0, "stop": s1, "m": m[..., 0].clone(), "l": l[..., 0].clone(),
                 "out": (acc / l).clone()}
            )
        del s, p  # let this block's scores go before the next block's are made
    return (acc / l).to(q.dtype)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    impl: str = "sdpa",
    causal: bool = True,
    key_padding: torch.Tensor | None = None,
    scale: float | None = None,
    tile_size: int = 64,
    window: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Dispatch to one implementation. q (B, H, T, D), k/v (B, Hkv, S, D) with H % Hkv == 0.

    Returns (out (B, H, T, D), weights (B, H, T, S) for "naive", else None).
    """
    check_attn_impl(impl)
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]}).")
    if impl == "naive":
        return naive_attention(q, k, v, causal=causal, key_padding=key_padding, scale=scale, window=window)
    if impl == "sdpa":
        return sdpa_attention(q, k, v, causal=causal, key_padding=key_padding, scale=scale, window=window), None
    out = tiled_attention(q, k, v, causal=causal, key_padding=key_padding, scale=scale, tile_size=tile_size,
                          window=window)
    return out, None


class Attention(nn.Module):
    """Multi-head attention with grouped-query heads, optional RoPE, optional cross-attention (``context``).

    ``n_kv_heads`` from 1 (multi-query) to ``n_heads`` (multi-head); query head ``h`` reads KV head
    ``h // (n_heads // n_kv_heads)``. Projections are named like transformers' Llama and bias-free unless asked.
    What other families change (keyword-only, each None/False/0 by default, which is Llama):
        head_dim        D set on its own (Qwen3, Gemma 3), not d_model / n_heads: q_proj is (H·D, C).
        qkv_bias        biases on q_proj, k_proj and v_proj (Qwen2); o_bias one on o_proj.
        qk_norm         an RMSNorm over each head's D dims of q and of k before RoPE (Qwen3, Gemma 3), with
                        ``norm_eps`` and ``norm_offset`` as the model's other norms.
        scale           scores times this instead of 1/√D (Gemma 3: query_pre_attn_scalar ** -0.5).
        sliding_window  this layer sees only the keys fewer than this many positions back (Mistral, Gemma 3).
    Hook points (observers only): hook_q, hook_k, hook_v (B, H or Hkv, T, D) before RoPE; with qk_norm,
    hook_q_normed, hook_k_normed after the norm; hook_rot_q, hook_rot_k after RoPE; hook_attn_scores (B, H, T, S)
    scaled scores with masked entries at -inf; hook_pattern (B, H, T, S); hook_z (B, H, T, D) the heads' outputs
    before o_proj.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        *,
        causal: bool = True,
        use_rope: bool = True,
        impl: str = "sdpa",
        tile_size: int = 64,
        head_dim: int | None = None,
        qkv_bias: bool = False,
        o_bias: bool = False,
        qk_norm: bool = False,
        norm_eps: float = 1e-6,
        norm_offset: float = 0.0,
        scale: float | None = None,
        sliding_window: int | None = None,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if head_dim is None and d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads}), or give head_dim.")
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads ({n_heads}) must be divisible by n_kv_heads ({n_kv_heads}).")
        if sliding_window is not None and sliding_window <= 0:
            raise ValueError(f"sliding_window must be a positive number of positions or None, got {sliding_window}.")
        check_attn_impl(impl)
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = d_model // n_heads if head_dim is None else head_dim
        self.causal, self.use_rope = causal, use_rope
        self.impl, self.tile_size = impl, tile_size
        self.scale, self.sliding_window = scale, sliding_window
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=o_bias)
        for name in ("q", "k", "v"):
            setattr(self, f"hook_{name}", HookPoint())
        self.q_norm = self.k_norm = None
        if qk_norm:  # registered here so hook names list in the order the forward reaches them
            self.q_norm = RMSNorm(self.head_dim, norm_eps, norm_offset)
            self.k_norm = RMSNorm(self.head_dim, norm_eps, norm_offset)
            self.hook_q_normed, self.hook_k_normed = HookPoint(), HookPoint()
        for name in ("rot_q", "rot_k", "attn_scores", "pattern", "z"):
            setattr(self, f"hook_{name}", HookPoint())

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, n, self.head_dim).transpose(1, 2)  # (B, T, n*D) -> (B, n, T, D)

    def forward(
        self,
        x: torch.Tensor,
        *,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        context: torch.Tensor | None = None,
        key_padding: torch.Tensor | None = None,
        cache: KVCache | None = None,
        layer: int = 0,
        start_pos: int = 0,
        causal: bool | None = None,
        impl: str | None = None,
    ) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C).

        rope: (cos, sin) rows for these T positions, each (T, D). context: (B, S, C) for cross-attention.
        cache + layer + start_pos: write this step's K/V at ``start_pos`` and attend to everything cached (a
        sliding-window layer's cache gives back only the keys its window can reach).
        causal / impl: per-call overrides of the module's settings (the module itself is never changed).
        """
        impl = impl or self.impl
        causal = self.causal if causal is None else causal
        window, scale = self.sliding_window, self.scale
        B, T, _ = x.shape
        kv_in = x if context is None else context
        q = self._heads(self.q_proj(x), self.n_heads)  # (B, H, T, D)
        k = self._heads(self.k_proj(kv_in), self.n_kv_heads)  # (B, Hkv, S_new, D)
        v = self._heads(self.v_proj(kv_in), self.n_kv_heads)  # (B, Hkv, S_new, D)
        q = self.hook_q(q)
        k = self.hook_k(k)
        v = self.hook_v(v)
        if self.q_norm is not None:  # QK-norm: every head's q and k at the same RMS, whatever the residual's size
            q = self.hook_q_normed(self.q_norm(q))
            k = self.hook_k_normed(self.k_norm(k))
        if self.use_rope and rope is not None and context is None:
            cos, sin = rope
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            q = self.hook_rot_q(q)
            k = self.hook_rot_k(k)
        if cache is not None:
            k, v = cache.update(layer, start_pos, k, v)  # (B, Hkv, S, D): S = start_pos + T, or the window's
            if key_padding is not None and key_padding.shape[1] > k.shape[2]:
                key_padding = key_padding[:, -k.shape[2]:]  # a local layer's cache keeps only the last keys
        if context is not None:
            causal, window = False, None
        if self.hook_pattern.edits:  # an edited pattern must be the one that weighs the values: the naive math
            weights = self.hook_pattern(attention_weights(q, k, causal=causal, key_padding=key_padding, scale=scale,
                                                          window=window))
            out = torch.matmul(weights, repeat_kv(v, self.n_heads // self.n_kv_heads))  # (B, H, T, D)
        else:
            out, weights = attention(
                q, k, v, impl=impl, causal=causal, key_padding=key_padding, scale=scale, tile_size=self.tile_size,
                window=window,
            )
        if self.hook_attn_scores.active:
            scores = attention_scores(q, k, scale=scale)  # (B, H, T, S)
            mask = build_mask(T, k.shape[2], causal=causal, key_padding=key_padding, device=q.device, window=window)
            self.hook_attn_scores(scores if mask is None else scores.masked_fill(~mask, float("-inf")))
        if self.hook_pattern.active and not self.hook_pattern.edits:
            # SDPA and the tiled path never form the weights: recompute them with the naive math from
            # the same rotated q and k, so the pattern shown is the one that produced this output.
            if weights is None:
                weights = attention_weights(q, k, causal=causal, key_padding=key_padding, scale=scale, window=window)
            self.hook_pattern(weights)
        out = self.hook_z(out)
        out = out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)  # (B, H, T, D) -> (B, T, H*D)
        return self.o_proj(out)
