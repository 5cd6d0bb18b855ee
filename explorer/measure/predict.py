"""Predictions: walk the statements of each implementation in ``models.attention`` and keep a running total
of the tensors alive at each step: the peak extra memory an implementation allocates beyond its inputs. If the
code there changes, the prediction here has to follow, and the test comparing the two says so.

Notation: B batch, H query heads, Hkv key/value heads, T queries, S keys (T == S here), D head dim.
"""
from __future__ import annotations

from typing import Sequence

import torch

from lens import device as dev

from models.config import ATTN_IMPLS

from . import units
from .units import element_size, format_bytes

class _Live:
    """Running total of the tensors alive, and its highest point (bytes above the inputs)."""

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}
        self.now = 0
        self.peak = 0

    def alloc(self, name: str, nbytes: int) -> None:
        if nbytes <= 0:
            return
        self.free(name)  # a name is one tensor: re-binding it while the new one is built is done explicitly
        self.sizes[name] = nbytes
        self.now += nbytes
        self.peak = max(self.peak, self.now)

    def rebind(self, name: str, temp: str) -> None:
        """``name = <expression held in temp>``: the old tensor under ``name`` dies, temp takes its name."""
        self.free(name)
        if temp in self.sizes:
            self.sizes[name] = self.sizes.pop(temp)

    def free(self, *names: str) -> None:
        for name in names:
            self.now -= self.sizes.pop(name, 0)


def check_sizes(seq_len: int, n_heads: int, head_dim: int, n_kv_heads: int | None, batch: int) -> int:
    for name, value in (("seq_len", seq_len), ("n_heads", n_heads), ("head_dim", head_dim), ("batch", batch)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    if not isinstance(n_kv_heads, int) or n_kv_heads <= 0 or n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads must be a positive divisor of n_heads ({n_heads}), got {n_kv_heads!r}.")
    return n_kv_heads


def predict_naive_bytes(seq_len: int, n_heads: int, head_dim: int, *, n_kv_heads: int | None = None,
                        batch: int = 1, dtype: torch.dtype | str = torch.float32, causal: bool = True) -> int:
    """Peak bytes ``naive_attention`` allocates beyond q, k, v: the (B, H, T, S) scores live twice at once."""
    hkv = check_sizes(seq_len, n_heads, head_dim, n_kv_heads, batch)
    e, T, S = element_size(dtype), seq_len, seq_len
    X = batch * n_heads * T * S  # elements of one (B, H, T, S) tensor
    kv_copy = batch * n_heads * S * head_dim * e if hkv != n_heads else 0  # repeat_kv materialises (B, H, S, D)
    live = _Live()
    # attention_scores: k = repeat_kv(k); matmul(q, kᵀ) then * scale (two (B, H, T, S) at once)
    live.alloc("k_rep", kv_copy)
    live.alloc("qk", X * e)
    live.alloc("scores", X * e)
    live.free("qk", "k_rep")
    if causal:  # build_mask: (T,) and (S,) int64 positions, a (T, S) bool mask
        live.alloc("q_pos", 8 * T)
        live.alloc("k_pos", 8 * S)
        live.alloc("mask", T * S)
        live.free("q_pos", "k_pos")
        live.alloc("not_mask", T * S)  # scores.masked_fill(~mask, ...) -> a new (B, H, T, S)
        live.alloc("filled", X * e)
        live.free("not_mask")
        live.rebind("scores", "filled")
    # softmax(scores, dtype=float32) converts first when the input is not fp32, then .to(q.dtype)
    if e != 4:
        live.alloc("scores32", X * 4)
    live.alloc("probs32", X * 4)
    live.free("scores32")
    if e != 4:
        live.alloc("weights", X * e)
        live.free("probs32")
    else:
        live.rebind("weights", "probs32")
    live.free("scores", "mask")  # attention_weights returns
    # out = weights @ repeat_kv(v)
    live.alloc("v_rep", kv_copy)
    live.alloc("out", batch * n_heads * T * head_dim * e)
    return live.peak


def sdpa_cpu_split_sizes(seq_len: int) -> tuple[int, int]:
    """Query and key block sizes of PyTorch's CPU flash kernel (aten FlashAttentionKernel.cpp)."""
    q_split = 256 if seq_len >= 768 else 64 if seq_len >= 192 else 32
    return min(q_split, seq_len), min(512, seq_len)


def predict_sdpa_bytes(seq_len: int, n_heads: int, head_dim: int, *, n_kv_heads: int | None = None,
                       batch: int = 1, dtype: torch.dtype | str = torch.float32, causal: bool = True,
                       device: str | torch.device | None = None, threads: int | None = None) -> int:
    """Peak bytes of the fused kernel: the (B, H, T, D) output, the (B, H, T) log-sum-exp and, on CPU,
    one fp32 scratch block per thread (q_split × kv_split scores, running max/sum, q_split × D output).

    bf16 on a CPU with AMX (``lens.device.cpu_has_amx``), from 64 keys on: a bf16 copy of K and of V
    (B, Hkv, S, D) laid out for the AMX kernel, and one (kv_split × D) bf16 block per thread beside it (fitted to
    torch 2.13's allocation events on an Intel Xeon at T = 64 ... 2048, D = 16 ... 128, 2 to 8 heads, GQA and
    batch 2; within 1 % at odd T; not seen on a 2-core AMD EPYC without AMX)."""
    hkv = check_sizes(seq_len, n_heads, head_dim, n_kv_heads, batch)
    e = element_size(dtype)
    out = batch * n_heads * seq_len * head_dim * e
    lse = batch * n_heads * seq_len * 4
    if dev.is_cuda(device):
        return out + lse  # the CUDA kernels keep their blocks in shared memory and registers
    threads = torch.get_num_threads() if threads is None else threads
    qs, ks = sdpa_cpu_split_sizes(seq_len)
    per_thread = (qs * ks + 2 * qs + qs * head_dim) * 4
    if e != 4:  # reduced-precision inputs get a second copy of the score block in their own dtype
        per_thread += qs * ks * e
    repacked = 0
    if units.as_dtype(dtype) == torch.bfloat16 and seq_len >= 64 and dev.cpu_has_amx():
        repacked = 2 * batch * hkv * seq_len * head_dim * e
        per_thread += ks * head_dim * e
    return out + lse + threads * per_thread + repacked


def predict_tiled_bytes(seq_len: int, n_heads: int, head_dim: int, *, n_kv_heads: int | None = None,
                        batch: int = 1, dtype: torch.dtype | str = torch.float32, causal: bool = True,
                        tile_size: int = 64) -> int:
    """Peak bytes of ``tiled_attention``: O(T · block + T · D), never O(T · S).

    Alive throughout: the fp32 accumulator (B, H, T, D) and the running max and sum (B, H, T). Per key block:
    the fp32 scores (B, H, T, block), which turn into the probabilities in place (reduced-precision inputs
    first hold the matmul's result in their own dtype), the repeated K/V block under GQA, and one of: the
    block's causal mask and its negation (T, block) bool, the new row max and correction, or the product
    P · V (B, H, T, D). At the end ``acc / l`` (and its cast back to the input dtype).
    """
    hkv = check_sizes(seq_len, n_heads, head_dim, n_kv_heads, batch)
    if not isinstance(tile_size, int) or tile_size <= 0:
        raise ValueError(f"tile_size must be a positive integer, got {tile_size!r}.")
    e, T, D = element_size(dtype), seq_len, head_dim
    bs = min(tile_size, seq_len)
    BH = batch * n_heads
    rows = 2 * BH * T * 4  # m and l
    acc = BH * T * D * 4
    scores = BH * T * bs * 4
    kv_block = 2 * BH * bs * D * e if hkv != n_heads else 0  # repeat_kv copies a block of K and of V
    mask = 2 * T * bs + 8 * (T + bs) if causal else 0  # bool mask, its negation, the int64 positions
    pv = BH * T * D * 4 + (BH * bs * D * 4 if e != 4 else 0)  # P · V (and V's fp32 copy)
    first = scores + BH * T * bs * e if e != 4 else scores  # matmul result beside its fp32 copy
    during = acc + rows + kv_block + max(first, scores + max(mask, rows, pv))
    final = acc + rows + BH * T * D * 4 + (BH * T * D * e if e != 4 else 0)
    return max(during, final)


def predict_attention_bytes(impl: str, seq_len: int, n_heads: int, head_dim: int, *, n_kv_heads: int | None = None,
                            batch: int = 1, dtype: torch.dtype | str = torch.float32, causal: bool = True,
                            device: str | torch.device | None = None, tile_size: int = 64) -> int:
    """Predicted peak bytes one implementation allocates beyond its inputs q (B, H, T, D), k, v (B, Hkv, S, D)."""
    kw = dict(n_kv_heads=n_kv_heads, batch=batch, dtype=dtype, causal=causal)
    if impl == "naive":
        return predict_naive_bytes(seq_len, n_heads, head_dim, **kw)
    if impl == "sdpa":
        return predict_sdpa_bytes(seq_len, n_heads, head_dim, device=device, **kw)
    if impl == "tiled":
        return predict_tiled_bytes(seq_len, n_heads, head_dim, tile_size=tile_size, **kw)
    raise ValueError(f"attention implementation must be one of {ATTN_IMPLS}, got {impl!r}.")


def input_bytes(seq_len: int, n_heads: int, head_dim: int, *, n_kv_heads: int | None = None, batch: int = 1,
                dtype: torch.dtype | str = torch.float32) -> int:
    """Bytes of q (B, H, T, D) plus k and v (B, Hkv, T, D)."""
    hkv = check_sizes(seq_len, n_heads, head_dim, n_kv_heads, batch)
    return batch * (n_heads + 2 * hkv) * seq_len * head_dim * element_size(dtype)


def request_bytes(seq_len: int, n_heads: int, head_dim: int, *, impls: Sequence[str] = ATTN_IMPLS,
                  n_kv_heads: int | None = None, batch: int = 1, dtype: torch.dtype | str = torch.float32,
                  causal: bool = True, device: str | torch.device | None = None, tile_size: int = 64) -> int:
    """What ``attention_memory`` holds at its highest: the inputs, one kept output per implementation (for
    the comparison) and the largest implementation's predicted peak (they run one after another)."""
    kw = dict(n_kv_heads=n_kv_heads, batch=batch, dtype=dtype)
    outputs = len(impls) * batch * n_heads * seq_len * head_dim * element_size(dtype)
    peak = max(predict_attention_bytes(i, seq_len, n_heads, head_dim, causal=causal, device=device,
                                       tile_size=tile_size, **kw) for i in impls)
    return input_bytes(seq_len, n_heads, head_dim, **kw) + outputs + peak


def largest_fitting_seq_len(budget_bytes: int, n_heads: int, head_dim: int, *, impls: Sequence[str] = ATTN_IMPLS,
                            limit: int = 2**20, **kw) -> int:
    """The longest sequence whose request fits ``budget_bytes`` (0 if none does). Predictions only."""
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if request_bytes(mid, n_heads, head_dim, impls=impls, **kw) <= budget_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo


def check_budget(seq_len: int, n_heads: int, head_dim: int, *, impls: Sequence[str] = ATTN_IMPLS,
                 budget_bytes: int | None = None, **kw) -> int:
    """Raise ValueError, before anything is allocated, when a request's prediction exceeds the budget.

    Returns the predicted request bytes. ``budget_bytes=None`` means ``MEMORY_BUDGET_BYTES``.
    """
    budget = units.resolve_budget(budget_bytes)
    need = request_bytes(seq_len, n_heads, head_dim, impls=impls, **kw)
    if need > budget:
        worst = max(impls, key=lambda i: predict_attention_bytes(i, seq_len, n_heads, head_dim, **kw))
        fits = largest_fitting_seq_len(budget, n_heads, head_dim, impls=impls, limit=seq_len, **kw)
        hint = f"choose a sequence length of at most {fits}" if fits else "use fewer heads or a smaller head_dim"
        raise ValueError(
            f"seq_len {seq_len} is predicted to need {format_bytes(need)} ({need} bytes; {worst} attention is the "
            f"largest part), over the memory budget of {format_bytes(budget)} ({budget} bytes): {hint}, or leave out "
            f"{worst!r}."
        )
    return need

