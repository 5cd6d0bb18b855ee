"""Measurements: each attention implementation run on the same random q, k, v for its peak memory, time and
agreement; sweeps over sequence lengths (every size budget-checked before anything is allocated); the tiled
loop traced block by block; the machine's copy bandwidth.

Notation: B batch, H query heads, Hkv key/value heads, T queries (T == S), D head dim.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

import torch

from lens import device as dev

from explorer.state.locks import MEASURE_LOCK
from explorer.state.threads import check_stop, stop_between_ops
from explorer.state.threads import default_threads
from models.attention import attention, naive_attention, tiled_attention
from models.config import ATTN_IMPLS

from . import units
from .predict import check_sizes, check_budget, predict_attention_bytes, predict_naive_bytes
from .profile import measure_peak_bytes, memory_source, time_call
from .units import MIB, as_dtype, format_bytes


def random_qkv(seq_len: int, n_heads: int, head_dim: int, *, n_kv_heads: int | None = None, batch: int = 1,
               dtype: torch.dtype | str = torch.float32, device: str | torch.device | None = None, seed: int = 0):
    """q (B, H, T, D), k and v (B, Hkv, T, D): standard normal from a fixed seed (drawn on the CPU, so every
    device gets the same numbers)."""
    hkv = check_sizes(seq_len, n_heads, head_dim, n_kv_heads, batch)
    g = torch.Generator().manual_seed(seed)
    dtype = as_dtype(dtype)
    q = torch.randn(batch, n_heads, seq_len, head_dim, generator=g)
    k = torch.randn(batch, hkv, seq_len, head_dim, generator=g)
    v = torch.randn(batch, hkv, seq_len, head_dim, generator=g)
    return tuple(t.to(device=dev.resolve(device), dtype=dtype) for t in (q, k, v))


def _check_impls(impls: Iterable[str]) -> tuple[str, ...]:
    impls = tuple(impls)
    bad = [i for i in impls if i not in ATTN_IMPLS]
    if not impls or bad:
        raise ValueError(f"implementations must be a non-empty subset of {ATTN_IMPLS}, got {list(impls)}.")
    return impls


def attention_memory(seq_len: int, n_heads: int, head_dim: int, *, n_kv_heads: int | None = None, batch: int = 1,
                     dtype: torch.dtype | str = torch.float32, device: str | torch.device | None = None,
                     impls: Sequence[str] = ATTN_IMPLS, causal: bool = True, repeats: int = 3,
                     tile_size: int = 64, seed: int = 0,
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
    device = dev.resolve(device)  # a GPU asked for where there is none: a sentence, before anything runs
    kw = dict(n_kv_heads=n_kv_heads, batch=batch, dtype=dtype, causal=causal, device=device, tile_size=tile_size)
    check_budget(seq_len, n_heads, head_dim, impls=impls, budget_bytes=budget_bytes, **kw)
    q, k, v = random_qkv(seq_len, n_heads, head_dim, n_kv_heads=n_kv_heads, batch=batch, dtype=dtype,
                         device=device, seed=seed)
    source = memory_source(device)
    results: dict[str, dict[str, Any]] = {}
    outputs: dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        for impl in impls:
            def fn(q, k, v, impl=impl):
                with stop_between_ops():  # one naive T = 4,096 call is 1-2 s of products: Stop between them
                    return attention(q, k, v, impl=impl, causal=causal, tile_size=tile_size)[0]

            if dev.is_cuda(device):
                # a first CUDA call allocates lasting workspaces (cuBLAS, kernels); keep them out of the peak
                fn(q, k, v)
            check_stop()  # a Stop ends the sweep before the next implementation's calls
            # the profiled call is also the timing's warm-up; its output is kept for the comparison
            outputs[impl], peak = measure_peak_bytes(lambda: fn(q, k, v), device)
            seconds = time_call(lambda: fn(q, k, v), repeats=repeats, device=device, warmup=0)
            results[impl] = {
                "peak_bytes": int(peak),
                "predicted_bytes": predict_attention_bytes(impl, seq_len, n_heads, head_dim, **kw),
                "seconds": seconds,
                "max_abs_diff": None,
                "memory_source": source,
                "kernel": dev.sdpa_backend(q, k, v, causal=causal) if impl == "sdpa" else None,
            }
    if "naive" in outputs:
        ref = outputs["naive"].float()
        for impl, out in outputs.items():
            results[impl]["max_abs_diff"] = float((out.float() - ref).abs().max())
    return results


def attention_sweep(seq_lens: Sequence[int], n_heads: int = 8, head_dim: int = 64, *,
                    n_kv_heads: int | None = None, batch: int = 1, dtype: torch.dtype | str = torch.float32,
                    device: str | torch.device | None = None, impls: Sequence[str] = ATTN_IMPLS, causal: bool = True,
                    repeats: int = 3, tile_size: int = 64, seed: int = 0, budget_bytes: int | None = None,
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
    budget = units.resolve_budget(budget_bytes)
    kw = dict(n_kv_heads=n_kv_heads, batch=batch, dtype=dtype, causal=causal, device=device, tile_size=tile_size)
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
                       "memory_source": None, "kernel": None, "refused": refused[impl]}
            rows.append(row)
            if on_result is not None:
                on_result(row)
    return rows


class SweepStep(NamedTuple):
    """What ``timed_sweep`` has after each sequence length."""
    rows: list[dict[str, Any]]  # every row so far (``attention_sweep``'s rows)
    elapsed: float  # seconds since the sweep started
    stopped_before: tuple[int, float] | None  # (T, predicted seconds) when the time limit ended the sweep there


def timed_sweep(seq_lens: Sequence[int], n_heads: int, head_dim: int, *, impls: Sequence[str] = ATTN_IMPLS,
                time_limit: float, repeats: int = 3,
                on_start: Callable[[int, int], None] | None = None, **kw) -> Iterator[SweepStep]:
    """``attention_sweep`` one length at a time, yielding after each, within ``time_limit`` seconds.

    Every size is budget-checked first (nothing is allocated unless all fit). Before each next length the
    time it will take is extrapolated from the previous one as T² (attention time grows at most like T²); when
    that would pass ``time_limit`` the sweep stops there and its last step says where. Each length holds
    ``MEASURE_LOCK`` (one measurement on the cores at a time) and runs on the start-up thread count, as do the
    budget checks (SDPA's predicted scratch memory grows with it). ``on_start(i, T)`` is called before length i.
    kw: ``n_kv_heads``, ``dtype``, ``causal``, ``device``, ``tile_size``.
    """
    seq_lens, impls = list(seq_lens), tuple(impls)
    with default_threads():
        for T in seq_lens:
            check_budget(T, n_heads, head_dim, impls=impls, **kw)
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    last: tuple[int, float] | None = None  # (T, seconds) of the previous length
    for i, T in enumerate(seq_lens):
        if last is not None:
            expect = last[1] * (T / last[0]) ** 2
            if time.perf_counter() - t0 + expect > time_limit:
                yield SweepStep(list(rows), time.perf_counter() - t0, (T, expect))
                return
        if on_start is not None:
            on_start(i, T)
        s0 = time.perf_counter()
        with default_threads(), MEASURE_LOCK:
            rows += attention_sweep([T], n_heads, head_dim, impls=impls, repeats=repeats, **kw)
        last = (T, time.perf_counter() - s0)
        yield SweepStep(list(rows), time.perf_counter() - t0, None)


def tiled_trace(seq_len: int, n_heads: int, head_dim: int, tile_size: int, seed: int = 0, *,
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
    hkv = check_sizes(seq_len, n_heads, head_dim, n_kv_heads, 1)
    if not isinstance(tile_size, int) or isinstance(tile_size, bool) or tile_size <= 0:
        raise ValueError(f"tile_size must be a positive integer, got {tile_size!r}.")
    n_blocks = -(-seq_len // tile_size)
    state = n_heads * seq_len * (head_dim + 2) * 4  # one block's copies of m, l, out
    need = (n_blocks + 3) * state + n_heads * seq_len * seq_len * 4 + \
        predict_naive_bytes(seq_len, n_heads, head_dim, n_kv_heads=hkv)
    budget = units.resolve_budget(budget_bytes)
    if need > budget:
        raise ValueError(f"a trace of {n_blocks} blocks at seq_len {seq_len} needs about {format_bytes(need)}, over the "
                         f"budget of {format_bytes(budget)}: use a shorter sequence or a larger tile_size.")
    q, k, v = random_qkv(seq_len, n_heads, head_dim, n_kv_heads=hkv, seed=seed)
    blocks: list[dict[str, Any]] = []

    def on_block(st: dict) -> None:
        blocks.append({"block": int(st["block"]), "start": int(st["start"]), "stop": int(st["stop"]),
                       "m": st["m"][0].numpy(), "l": st["l"][0].numpy(), "out": st["out"][0].numpy()})

    with torch.inference_mode():
        out = tiled_attention(q, k, v, causal=causal, tile_size=tile_size, on_block=on_block)
        ref, weights = naive_attention(q, k, v, causal=causal)
    return {"blocks": blocks, "out": out[0].numpy(), "reference": ref[0].numpy(), "weights": weights[0].numpy(),
            "max_abs_diff": float((out - ref).abs().max()), "seq_len": seq_len, "n_heads": n_heads,
            "head_dim": head_dim, "tile_size": tile_size, "causal": causal}


def copy_bandwidth(nbytes: int = 256 * MIB, *, repeats: int = 5, device: str | torch.device | None = None) -> float:
    """Measured memory bandwidth in bytes/s of a large tensor copy (bytes read + bytes written per second)."""
    device = dev.resolve(device)
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    seconds = time_call(lambda: dst.copy_(src), repeats=repeats, device=device, warmup=1)
    return 2 * nbytes / seconds


#: What ``abandonable`` yields while the current item is still being computed.
STILL_RUNNING = object()


def abandonable(items: Iterator, poll_s: float = 0.25, stop: threading.Event | None = None) -> Iterator:
    """``items`` produced on a worker thread, yielding ``STILL_RUNNING`` every ``poll_s`` seconds while one is
    computed. Closing this generator (a Stop) returns within ``poll_s``: the worker ends after the torch operation
    it is in (``attention_memory`` checks the stop between operations), releases its locks, and starts nothing
    further. ``stop``: an event another request may set to the same end (this generator then ends when the worker
    does, after the items it finished)."""
    import queue

    out: "queue.Queue" = queue.Queue()
    stop = threading.Event() if stop is None else stop
    done = object()

    def work() -> None:
        from explorer.state.threads import Stopped, stoppable

        try:
            with stoppable(stop):  # checked before each timed call inside the step, not only between steps
                for item in items:
                    out.put((item, None))
                    if stop.is_set():
                        break
        except Stopped:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            out.put((None, exc))
        finally:
            out.put((done, None))
            close = getattr(items, "close", None)
            if close is not None:
                close()

    # Not a daemon: one still inside a torch kernel at interpreter exit aborts the process (explorer.web.serving.close
    # says how); the interpreter waits for this one, which ends after its current step once closed.
    threading.Thread(target=work, name="abandonable-measurement").start()
    try:
        while True:
            try:
                item, exc = out.get(timeout=poll_s)
            except queue.Empty:
                yield STILL_RUNNING
                continue
            if exc is not None:
                raise exc
            if item is done:
                return
            yield item
    finally:
        stop.set()
