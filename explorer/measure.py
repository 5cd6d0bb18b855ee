"""Memory and time, measured and predicted: attention implementations, the tiled trace, and calculators.

Notation: B batch, H query heads, Hkv key/value heads, T queries, S keys (T == S here: self-attention over
the whole sequence), D head dim, L layers, C model dim, F feed-forward dim, V vocabulary.

Two kinds of number live here and are never mixed up:
    measured   ``peak_bytes`` and ``seconds`` come from running the code. On CUDA the peak comes from the
               caching allocator's statistics; on CPU from the profiler's allocation events
               (``torch.profiler.profile(profile_memory=True)``), replayed in time order to find the
               highest point above the start. Process RSS is never used: the C allocator keeps freed pages.
    predicted  ``predicted_bytes`` walks the statements of each implementation in ``models.attention`` and
               keeps a running total of the tensors alive at each step: the peak extra memory an
               implementation allocates beyond its inputs. If the code there changes, the prediction here
               has to follow, and the test comparing the two says so.

Every size the app or the benchmark asks for is checked against ``MEMORY_BUDGET_BYTES`` before a single
tensor is allocated.
"""
from __future__ import annotations

import json
import os
import platform
import re
import statistics
import threading
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

from models.attention import naive_attention, sdpa_attention, tiled_attention
from models.config import ATTN_IMPLS, ModelConfig
from models.lora import PROJECTIONS

GIB = 2**30
MIB = 2**20

# One request on a 16 GB CPU Space: a quarter of the machine, so a few users and the model itself still fit.
DEFAULT_MEMORY_BUDGET_BYTES = 4 * GIB
DATA_DIR = Path(__file__).resolve().parent / "data"
REAL_CONFIGS_PATH = DATA_DIR / "real_configs.json"

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 2**10, "ki": 2**10, "m": 10**6, "mb": 10**6, "mib": MIB,
          "mi": MIB, "g": 10**9, "gb": 10**9, "gib": GIB, "gi": GIB, "t": 10**12, "tb": 10**12, "tib": 2**40,
          "ti": 2**40}


def parse_bytes(text: str | int) -> int:
    """'4294967296', '4GiB', '512 MB' -> bytes. Raises ValueError for anything else."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = _SIZE.match(str(text))
        if not match or (match.group(2) or "").lower() not in _UNITS:
            raise ValueError(f"{text!r} is not a size in bytes: write e.g. 4294967296, 4GiB or 512MB.")
        value = int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])
    if value <= 0:
        raise ValueError(f"a memory budget must be positive, got {text!r}.")
    return value


def _budget_from_env() -> int:
    raw = os.environ.get("EXPLORER_MEMORY_BUDGET")
    if not raw:
        return DEFAULT_MEMORY_BUDGET_BYTES
    try:
        return parse_bytes(raw)
    except ValueError as exc:  # a bad setting must not stop the app from starting
        warnings.warn(f"EXPLORER_MEMORY_BUDGET ignored ({exc}); using {format_bytes(DEFAULT_MEMORY_BUDGET_BYTES)}.")
        return DEFAULT_MEMORY_BUDGET_BYTES


def format_bytes(n: float | None) -> str:
    """1536 -> '1.5 KiB'. Binary units, three significant figures."""
    if n is None:
        return "—"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} TiB"


#: Bytes one request may use (inputs plus the largest implementation's predicted peak).
#: Override with the environment variable ``EXPLORER_MEMORY_BUDGET`` (bytes, or e.g. ``8GiB``).
MEMORY_BUDGET_BYTES = _budget_from_env()

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16, "float64": torch.float64}


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}.")
    return DTYPES[dtype]


def element_size(dtype: torch.dtype | str) -> int:
    return torch.empty((), dtype=as_dtype(dtype)).element_size()


# ---------------------------------------------------------------------------------------------------
# Predictions: walk each implementation's statements, keeping the bytes alive at every step.
# ---------------------------------------------------------------------------------------------------
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


def _check_sizes(seq_len: int, n_heads: int, head_dim: int, n_kv_heads: int | None, batch: int) -> int:
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
    hkv = _check_sizes(seq_len, n_heads, head_dim, n_kv_heads, batch)
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
                       device: str = "cpu", threads: int | None = None) -> int:
    """Peak bytes of the fused kernel: the (B, H, T, D) output, the (B, H, T) log-sum-exp and, on CPU,
    one fp32 scratch block per thread (q_split × kv_split scores, running max/sum, q_split × D output)."""
    _check_sizes(seq_len, n_heads, head_dim, n_kv_heads, batch)
    e = element_size(dtype)
    out = batch * n_heads * seq_len * head_dim * e
    lse = batch * n_heads * seq_len * 4
    if str(device).startswith("cuda"):
        return out + lse  # the CUDA kernels keep their blocks in shared memory and registers
    threads = torch.get_num_threads() if threads is None else threads
    qs, ks = sdpa_cpu_split_sizes(seq_len)
    per_thread = (qs * ks + 2 * qs + qs * head_dim) * 4
    if e != 4:  # reduced-precision inputs get a second copy of the score block in their own dtype
        per_thread += qs * ks * e
    return out + lse + threads * per_thread


def predict_tiled_bytes(seq_len: int, n_heads: int, head_dim: int, *, n_kv_heads: int | None = None,
                        batch: int = 1, dtype: torch.dtype | str = torch.float32, causal: bool = True,
                        block_size: int = 64) -> int:
    """Peak bytes of ``tiled_attention``: O(T · block + T · D), never O(T · S).

    Alive throughout: the fp32 accumulator (B, H, T, D) and the running max and sum (B, H, T). Per key block:
    the fp32 scores (B, H, T, block), which turn into the probabilities in place (reduced-precision inputs
    first hold the matmul's result in their own dtype), the repeated K/V block under GQA, and one of: the
    block's causal mask and its negation (T, block) bool, the new row max and correction, or the product
    P · V (B, H, T, D). At the end ``acc / l`` (and its cast back to the input dtype).
    """
    hkv = _check_sizes(seq_len, n_heads, head_dim, n_kv_heads, batch)
    if not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}.")
    e, T, D = element_size(dtype), seq_len, head_dim
    bs = min(block_size, seq_len)
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
                            device: str = "cpu", block_size: int = 64) -> int:
    """Predicted peak bytes one implementation allocates beyond its inputs q (B, H, T, D), k, v (B, Hkv, S, D)."""
    kw = dict(n_kv_heads=n_kv_heads, batch=batch, dtype=dtype, causal=causal)
    if impl == "naive":
        return predict_naive_bytes(seq_len, n_heads, head_dim, **kw)
    if impl == "sdpa":
        return predict_sdpa_bytes(seq_len, n_heads, head_dim, device=device, **kw)
    if impl == "tiled":
        return predict_tiled_bytes(seq_len, n_heads, head_dim, block_size=block_size, **kw)
    raise ValueError(f"attention implementation must be one of {ATTN_IMPLS}, got {impl!r}.")


def input_bytes(seq_len: int, n_heads: int, head_dim: int, *, n_kv_heads: int | None = None, batch: int = 1,
                dtype: torch.dtype | str = torch.float32) -> int:
    """Bytes of q (B, H, T, D) plus k and v (B, Hkv, T, D)."""
    hkv = _check_sizes(seq_len, n_heads, head_dim, n_kv_heads, batch)
    return batch * (n_heads + 2 * hkv) * seq_len * head_dim * element_size(dtype)


def request_bytes(seq_len: int, n_heads: int, head_dim: int, *, impls: Sequence[str] = ATTN_IMPLS,
                  n_kv_heads: int | None = None, batch: int = 1, dtype: torch.dtype | str = torch.float32,
                  causal: bool = True, device: str = "cpu", block_size: int = 64) -> int:
    """What ``attention_memory`` holds at its highest: the inputs, one kept output per implementation (for
    the comparison) and the largest implementation's predicted peak (they run one after another)."""
    kw = dict(n_kv_heads=n_kv_heads, batch=batch, dtype=dtype)
    outputs = len(impls) * batch * n_heads * seq_len * head_dim * element_size(dtype)
    peak = max(predict_attention_bytes(i, seq_len, n_heads, head_dim, causal=causal, device=device,
                                       block_size=block_size, **kw) for i in impls)
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
    budget = MEMORY_BUDGET_BYTES if budget_bytes is None else budget_bytes
    need = request_bytes(seq_len, n_heads, head_dim, impls=impls, **kw)
    if need > budget:
        worst = max(impls, key=lambda i: predict_attention_bytes(i, seq_len, n_heads, head_dim, **kw))
        fits = largest_fitting_seq_len(budget, n_heads, head_dim, impls=impls, limit=seq_len, **kw)
        hint = f"choose a sequence length of at most {fits}" if fits else "use fewer heads or a smaller head_dim"
        raise ValueError(
            f"seq_len {seq_len} is predicted to need {format_bytes(need)} ({need} bytes; {worst} attention is the "
            f"largest part), over the memory budget of {format_bytes(budget)} ({budget} bytes): {hint}, leave out "
            f"{worst!r}, or raise the budget (EXPLORER_MEMORY_BUDGET)."
        )
    return need


# ---------------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------------
def _sync(device: str | torch.device) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)


# torch's profiler is one per process: two threads profiling at once crash it (seen in the app), so every
# CPU peak measurement takes this lock, whoever calls it.
_PROFILER_LOCK = threading.Lock()


def peak_bytes_cpu(fn: Callable[[], Any]) -> tuple[Any, int]:
    """Run ``fn`` once under the profiler; return (its result, peak bytes allocated above the start).

    The CPU allocator reports every allocation and free to the profiler; replaying them in time order
    gives the running total, whose maximum is the peak. Tensors alive before the call (inputs) are not
    counted; frees of them would only lower the curve.
    """
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with _PROFILER_LOCK, profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    events.sort(key=lambda ev: ev[0])
    now = peak = 0
    for _, size in events:
        now += size
        peak = max(peak, now)
    return result, peak


def peak_bytes_cuda(fn: Callable[[], Any], device: str | torch.device = "cuda") -> tuple[Any, int]:
    """Run ``fn`` once; peak bytes the CUDA caching allocator handed out above what was allocated before."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    result = fn()
    torch.cuda.synchronize(device)
    return result, torch.cuda.max_memory_allocated(device) - start


def measure_peak_bytes(fn: Callable[[], Any], device: str | torch.device = "cpu") -> tuple[Any, int]:
    """(result, peak bytes above the start) of one call, with the tracker that fits the device."""
    if str(device).startswith("cuda"):
        return peak_bytes_cuda(fn, device)
    return peak_bytes_cpu(fn)


def time_call(fn: Callable[[], Any], *, repeats: int = 3, device: str | torch.device = "cpu",
              warmup: int = 1) -> float:
    """Median wall seconds of ``repeats`` calls after ``warmup`` calls (device synchronised)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _impl_fn(impl: str, causal: bool, block_size: int) -> Callable:
    if impl == "naive":
        return lambda q, k, v: naive_attention(q, k, v, causal=causal)[0]
    if impl == "sdpa":
        return lambda q, k, v: sdpa_attention(q, k, v, causal=causal)
    if impl == "tiled":
        return lambda q, k, v: tiled_attention(q, k, v, causal=causal, tile_size=block_size)
    raise ValueError(f"attention implementation must be one of {ATTN_IMPLS}, got {impl!r}.")


def random_qkv(seq_len: int, n_heads: int, head_dim: int, *, n_kv_heads: int | None = None, batch: int = 1,
               dtype: torch.dtype | str = torch.float32, device: str = "cpu", seed: int = 0):
    """q (B, H, T, D), k and v (B, Hkv, T, D): standard normal from a fixed seed (drawn on the CPU, so every
    device gets the same numbers)."""
    hkv = _check_sizes(seq_len, n_heads, head_dim, n_kv_heads, batch)
    g = torch.Generator().manual_seed(seed)
    dtype = as_dtype(dtype)
    q = torch.randn(batch, n_heads, seq_len, head_dim, generator=g)
    k = torch.randn(batch, hkv, seq_len, head_dim, generator=g)
    v = torch.randn(batch, hkv, seq_len, head_dim, generator=g)
    return tuple(t.to(device=device, dtype=dtype) for t in (q, k, v))


def _check_impls(impls: Iterable[str]) -> tuple[str, ...]:
    impls = tuple(impls)
    bad = [i for i in impls if i not in ATTN_IMPLS]
    if not impls or bad:
        raise ValueError(f"implementations must be a non-empty subset of {ATTN_IMPLS}, got {list(impls)}.")
    return impls


def attention_memory(seq_len: int, n_heads: int, head_dim: int, *, n_kv_heads: int | None = None, batch: int = 1,
                     dtype: torch.dtype | str = torch.float32, device: str = "cpu",
                     impls: Sequence[str] = ATTN_IMPLS, causal: bool = True, repeats: int = 3,
                     block_size: int = 64, seed: int = 0,
                     budget_bytes: int | None = None) -> dict[str, dict[str, Any]]:
    """Measure each implementation on the same random q, k, v (created first, not counted).

    Returns {impl: {"peak_bytes", "predicted_bytes", "seconds", "max_abs_diff", "memory_source"}}:
    peak_bytes     measured peak allocated above the inputs during one call (bytes)
    predicted_bytes  the analytic peak from ``predict_attention_bytes`` (bytes)
    seconds        median wall time of ``repeats`` calls after a warm-up call (the one measured for memory)
    max_abs_diff   max |out - naive out| (0.0 for naive itself; None when "naive" is not among ``impls``)
    Raises ValueError before allocating when the predicted request exceeds ``budget_bytes``
    (default ``MEMORY_BUDGET_BYTES``).
    """
    impls = _check_impls(impls)
    dtype = as_dtype(dtype)
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but this machine has no CUDA GPU: use device='cpu'.")
    kw = dict(n_kv_heads=n_kv_heads, batch=batch, dtype=dtype, causal=causal, device=device, block_size=block_size)
    check_budget(seq_len, n_heads, head_dim, impls=impls, budget_bytes=budget_bytes, **kw)
    q, k, v = random_qkv(seq_len, n_heads, head_dim, n_kv_heads=n_kv_heads, batch=batch, dtype=dtype,
                         device=device, seed=seed)
    source = "torch.cuda.max_memory_allocated" if str(device).startswith("cuda") else "torch.profiler allocation events"
    results: dict[str, dict[str, Any]] = {}
    outputs: dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        for impl in impls:
            fn = _impl_fn(impl, causal, block_size)
            if str(device).startswith("cuda"):
                # a first CUDA call allocates lasting workspaces (cuBLAS, kernels); keep them out of the peak
                fn(q, k, v)
            # the profiled call is also the timing's warm-up; its output is kept for the comparison
            outputs[impl], peak = measure_peak_bytes(lambda: fn(q, k, v), device)
            seconds = time_call(lambda: fn(q, k, v), repeats=repeats, device=device, warmup=0)
            results[impl] = {
                "peak_bytes": int(peak),
                "predicted_bytes": predict_attention_bytes(impl, seq_len, n_heads, head_dim, **kw),
                "seconds": seconds,
                "max_abs_diff": None,
                "memory_source": source,
            }
    if "naive" in outputs:
        ref = outputs["naive"].float()
        for impl, out in outputs.items():
            results[impl]["max_abs_diff"] = float((out.float() - ref).abs().max())
    return results


def attention_sweep(seq_lens: Sequence[int], n_heads: int = 8, head_dim: int = 64, *,
                    n_kv_heads: int | None = None, batch: int = 1, dtype: torch.dtype | str = torch.float32,
                    device: str = "cpu", impls: Sequence[str] = ATTN_IMPLS, causal: bool = True,
                    repeats: int = 3, block_size: int = 64, seed: int = 0, budget_bytes: int | None = None,
                    over_budget: str = "raise",
                    on_result: Callable[[dict], None] | None = None) -> list[dict[str, Any]]:
    """``attention_memory`` over sequence lengths; one row per (seq_len, impl).

    Every size is checked against the budget before anything is measured or allocated.
    over_budget="raise": a size whose prediction exceeds the budget raises ValueError (the size, the
    predicted bytes, the budget and what to change). over_budget="skip": each implementation whose own
    request would not fit is left out for that size and reported as a row with ``refused`` set to the
    reason (so sdpa and tiled still run at lengths where naive cannot). Rows: seq_len, impl, peak_bytes,
    predicted_bytes, seconds, max_abs_diff, refused (None or the reason).
    """
    impls = _check_impls(impls)
    if over_budget not in ("raise", "skip"):
        raise ValueError(f"over_budget must be 'raise' or 'skip', got {over_budget!r}.")
    seq_lens = list(seq_lens)
    if not seq_lens:
        raise ValueError("give at least one sequence length.")
    budget = MEMORY_BUDGET_BYTES if budget_bytes is None else budget_bytes
    kw = dict(n_kv_heads=n_kv_heads, batch=batch, dtype=dtype, causal=causal, device=device, block_size=block_size)
    plan: list[tuple[int, tuple[str, ...], dict[str, str]]] = []
    for T in seq_lens:  # the whole plan first: nothing runs if any size would be refused
        if over_budget == "raise":
            check_budget(T, n_heads, head_dim, impls=impls, budget_bytes=budget, **kw)
            plan.append((T, impls, {}))
            continue
        run, refused = [], {}
        for impl in impls:
            try:
                check_budget(T, n_heads, head_dim, impls=(impl,), budget_bytes=budget, **kw)
                run.append(impl)
            except ValueError as exc:
                refused[impl] = str(exc)
        while run:  # what runs together keeps one output each: drop the largest until they fit together
            try:
                check_budget(T, n_heads, head_dim, impls=tuple(run), budget_bytes=budget, **kw)
                break
            except ValueError as exc:
                worst = max(run, key=lambda i: predict_attention_bytes(i, T, n_heads, head_dim, **kw))
                run.remove(worst)
                refused[worst] = str(exc)
        plan.append((T, tuple(run), refused))
    rows = []
    for T, run, refused in plan:
        measured = attention_memory(T, n_heads, head_dim, impls=run, repeats=repeats, seed=seed,
                                    budget_bytes=budget, **kw) if run else {}
        for impl in impls:
            if impl in measured:
                row = {"seq_len": T, "impl": impl, **measured[impl], "refused": None}
            else:
                row = {"seq_len": T, "impl": impl, "peak_bytes": None, "seconds": None, "max_abs_diff": None,
                       "predicted_bytes": predict_attention_bytes(impl, T, n_heads, head_dim, **kw),
                       "memory_source": None, "refused": refused[impl]}
            rows.append(row)
            if on_result is not None:
                on_result(row)
    return rows


def tiled_trace(seq_len: int, n_heads: int, head_dim: int, block_size: int, seed: int = 0, *,
                n_kv_heads: int | None = None, causal: bool = True,
                budget_bytes: int | None = None) -> dict[str, Any]:
    """The tiled (online-softmax) attention block by block, for the animation. Batch 1, fp32.

    Returns a dict of NumPy arrays:
      blocks   list, one per key block: {"block", "start", "stop" (keys [start, stop)), "m" (H, T) running
               max, "l" (H, T) running sum of exp(score - m), "out" (H, T, D) output so far (acc / l)}
      out      (H, T, D) the final tiled output;  reference (H, T, D) naive attention's output
      weights  (H, T, T) naive attention weights (what the blocks are summing over)
      max_abs_diff  max |out - reference|
    """
    hkv = _check_sizes(seq_len, n_heads, head_dim, n_kv_heads, 1)
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}.")
    n_blocks = -(-seq_len // block_size)
    state = n_heads * seq_len * (head_dim + 2) * 4  # one block's copies of m, l, out
    need = (n_blocks + 3) * state + n_heads * seq_len * seq_len * 4 + \
        predict_naive_bytes(seq_len, n_heads, head_dim, n_kv_heads=hkv)
    budget = MEMORY_BUDGET_BYTES if budget_bytes is None else budget_bytes
    if need > budget:
        raise ValueError(f"a trace of {n_blocks} blocks at seq_len {seq_len} needs about {format_bytes(need)}, over the "
                         f"budget of {format_bytes(budget)}: use a shorter sequence or a larger block_size.")
    q, k, v = random_qkv(seq_len, n_heads, head_dim, n_kv_heads=hkv, seed=seed)
    blocks: list[dict[str, Any]] = []

    def on_block(st: dict) -> None:
        blocks.append({"block": int(st["block"]), "start": int(st["start"]), "stop": int(st["stop"]),
                       "m": st["m"][0].numpy(), "l": st["l"][0].numpy(), "out": st["out"][0].numpy()})

    with torch.inference_mode():
        out = tiled_attention(q, k, v, causal=causal, tile_size=block_size, on_block=on_block)
        ref, weights = naive_attention(q, k, v, causal=causal)
    return {"blocks": blocks, "out": out[0].numpy(), "reference": ref[0].numpy(), "weights": weights[0].numpy(),
            "max_abs_diff": float((out - ref).abs().max()), "seq_len": seq_len, "n_heads": n_heads,
            "head_dim": head_dim, "block_size": block_size, "causal": causal}


# ---------------------------------------------------------------------------------------------------
# Calculators: parameters, KV cache, LoRA; real model configurations stored as data
# ---------------------------------------------------------------------------------------------------
def _cfg(config: ModelConfig | dict) -> ModelConfig:
    if isinstance(config, ModelConfig):
        return config
    if isinstance(config, dict):
        return ModelConfig.from_hf(config) if "hidden_size" in config else ModelConfig.from_dict(config)
    raise ValueError(f"expected a ModelConfig or a config dict, got {type(config).__name__}.")


def projection_shapes(config: ModelConfig | dict) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each per-layer projection, by transformers' Llama name."""
    c = _cfg(config)
    hd = c.head_dim
    return {"q_proj": (c.d_model, c.n_heads * hd), "k_proj": (c.d_model, c.n_kv_heads * hd),
            "v_proj": (c.d_model, c.n_kv_heads * hd), "o_proj": (c.n_heads * hd, c.d_model),
            "gate_proj": (c.d_model, c.d_ff), "up_proj": (c.d_model, c.d_ff), "down_proj": (c.d_ff, c.d_model)}


def parameter_count(config: ModelConfig | dict) -> dict[str, int]:
    """Parameters by part: embedding V·C, per layer (projections + two norms), final norm, untied LM head."""
    c = _cfg(config)
    embedding = c.vocab_size * c.d_model
    per_layer = sum(i * o for i, o in projection_shapes(c).values()) + 2 * c.d_model
    lm_head = 0 if c.tie_embeddings else c.vocab_size * c.d_model
    total = embedding + c.n_layers * per_layer + c.d_model + lm_head
    return {"embedding": embedding, "per_layer": per_layer, "layers": c.n_layers * per_layer, "final_norm": c.d_model,
            "lm_head": lm_head, "total": total}


def parameter_memory(config: ModelConfig | dict) -> dict[str, int]:
    """Bytes of the weights: fp32 (4 per parameter), bf16 (2), int8 (1: the textbook figure), and
    int8_models_quant: what ``models.quant`` holds (projections int8 + one fp32 scale per output row;
    embedding, LM head and norms left in fp32)."""
    c = _cfg(config)
    n = parameter_count(c)
    proj = c.n_layers * sum(i * o for i, o in projection_shapes(c).values())
    rows = c.n_layers * sum(o for _, o in projection_shapes(c).values())
    rest = n["total"] - proj
    return {"parameters": n["total"], "fp32": 4 * n["total"], "bf16": 2 * n["total"], "int8": n["total"],
            "int8_models_quant": proj + 4 * rows + 4 * rest}


def kv_cache_bytes(config: ModelConfig | dict, *, seq_len: int | None = None, batch: int = 1,
                   dtype: torch.dtype | str = torch.float16) -> dict[str, int]:
    """KV cache size: per token L · 2 · Hkv · D · bytes (keys and values of every layer), per sequence of
    ``seq_len`` tokens (default: the model's context), and for ``batch`` sequences."""
    c = _cfg(config)
    seq_len = c.max_seq_len if seq_len is None else seq_len
    if not isinstance(seq_len, int) or seq_len <= 0 or not isinstance(batch, int) or batch <= 0:
        raise ValueError(f"seq_len and batch must be positive integers, got {seq_len!r} and {batch!r}.")
    per_token = c.n_layers * 2 * c.n_kv_heads * c.head_dim * element_size(dtype)
    return {"per_token": per_token, "per_sequence": per_token * seq_len, "batch": per_token * seq_len * batch,
            "seq_len": seq_len}


def attention_variants(config: ModelConfig | dict, *, seq_len: int | None = None,
                       dtype: torch.dtype | str = torch.float16) -> dict[str, dict[str, int]]:
    """The same model as MHA (Hkv = H), its own GQA setting, and MQA (Hkv = 1): KV heads, KV-cache bytes
    and parameter counts of each."""
    c = _cfg(config)
    out = {}
    for name, hkv in (("MHA", c.n_heads), ("GQA", c.n_kv_heads), ("MQA", 1)):
        v = ModelConfig.from_dict({**c.to_dict(), "n_kv_heads": hkv})
        out[name] = {"n_kv_heads": hkv, **kv_cache_bytes(v, seq_len=seq_len, dtype=dtype),
                     "parameters": parameter_count(v)["total"]}
    return out


def lora_linear_parameters(in_features: int, out_features: int, rank: int) -> dict[str, float]:
    """One adapted projection: full = in·out, lora = r·(in + out) (A is r × in, B is out × r)."""
    if min(in_features, out_features, rank) <= 0:
        raise ValueError("in_features, out_features and rank must be positive.")
    full, lora = in_features * out_features, rank * (in_features + out_features)
    return {"full": full, "lora": lora, "ratio": full / lora}


def lora_parameters(config: ModelConfig | dict, rank: int, targets: Sequence[str] = ("q_proj", "v_proj")) -> dict:
    """Trainable LoRA parameters for ``rank`` on ``targets`` in every layer, beside the frozen total."""
    c = _cfg(config)
    bad = [t for t in targets if t not in PROJECTIONS]
    if not targets or bad:
        raise ValueError(f"LoRA targets must be a non-empty subset of {PROJECTIONS}, got {list(targets)}.")
    shapes = projection_shapes(c)
    adapted = sum(shapes[t][0] * shapes[t][1] for t in targets) * c.n_layers
    trainable = sum(rank * (shapes[t][0] + shapes[t][1]) for t in targets) * c.n_layers
    total = parameter_count(c)["total"]
    return {"trainable": trainable, "adapted_weights": adapted, "frozen": total, "ratio": adapted / trainable,
            "trainable_fraction": trainable / total}


def load_real_configs(path: str | os.PathLike = REAL_CONFIGS_PATH) -> dict[str, dict[str, Any]]:
    """{name: {"source": url, "hf_repo": ..., "config": transformers config.json fields}} from the JSON file."""
    data = json.loads(Path(path).read_text())
    return {name: entry for name, entry in data["models"].items()}


def real_config(name: str) -> ModelConfig:
    """A named real configuration as a ``ModelConfig`` (e.g. 'Llama-2-70B')."""
    configs = load_real_configs()
    if name not in configs:
        raise ValueError(f"unknown configuration {name!r}: choose one of {sorted(configs)}.")
    return ModelConfig.from_hf(configs[name]["config"])


def real_config_table(seq_len: int | None = None, dtype: torch.dtype | str = torch.float16) -> list[dict[str, Any]]:
    """One row per named configuration: sizes, parameters, weight bytes, KV cache bytes (context or seq_len)."""
    rows = []
    for name, entry in load_real_configs().items():
        c = ModelConfig.from_hf(entry["config"])
        rows.append({"name": name, "source": entry["source"], "n_layers": c.n_layers, "d_model": c.d_model,
                     "n_heads": c.n_heads, "n_kv_heads": c.n_kv_heads, "head_dim": c.head_dim,
                     "parameters": parameter_count(c)["total"], **{f"weights_{k}": v for k, v in
                                                                  parameter_memory(c).items() if k != "parameters"},
                     "kv": kv_cache_bytes(c, seq_len=seq_len, dtype=dtype)})
    return rows


# ---------------------------------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def machine_info(device: str = "cpu", dtype: torch.dtype | str = torch.float32) -> dict[str, Any]:
    """Where the numbers come from: CPU, cores, threads, versions, device, dtype, UTC date."""
    info = {"cpu": cpu_model(), "cores": cpu_cores(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "device": str(device),
            "dtype": str(as_dtype(dtype)).replace("torch.", ""),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    if hasattr(os, "getloadavg"):  # other processes on the same cores move every time measured here
        info["load_average_1min"] = round(os.getloadavg()[0], 2)
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    if str(device).startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def copy_bandwidth(nbytes: int = 256 * MIB, *, repeats: int = 5, device: str = "cpu") -> float:
    """Measured memory bandwidth in bytes/s of a large tensor copy (bytes read + bytes written per second)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    seconds = time_call(lambda: dst.copy_(src), repeats=repeats, device=device, warmup=1)
    return 2 * nbytes / seconds
