"""The one place that measures peak memory and wall time of a call.

On CUDA the peak comes from the caching allocator's statistics (``lens.device.cuda_peak_bytes``); on CPU from the profiler's allocation events
(``torch.profiler.profile(profile_memory=True)``), replayed in time order to find the highest point above the
start. The CPU path reads the profiler's flat event list (``kineto_results.events()``, the list torch's own
``key_averages`` is built from); its memory events' layout is checked against the torch versions it was written for,
and any other version raises a clear error instead of a wrong number.
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable

import torch

# torch's profiler library (Kineto) prints "profiler_start" / "profiler_stop" at each measurement, filling a
# server's log; its levels run 0 (verbose) to 5, so 6 prints nothing. Read at the first profile; an operator's
# own setting wins.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

from lens import device as dev
from explorer.state.locks import PROFILER_LOCK


def sync(device: str | torch.device | None = None) -> None:
    """Wait for the device to finish queued work (a no-op on the CPU), so a clock read after it is honest."""
    dev.synchronize(device)


# The profiler's memory events as read below ("[memory]" events of kineto_results.events(), with nbytes, start_ns and
# device_type) as they stand in the torch releases this was checked on (the pinned one); another release may move them.
PROFILER_TORCH_VERSIONS = ((2, 13), (2, 13))


def _check_profiler_api() -> None:
    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    lo, hi = PROFILER_TORCH_VERSIONS
    if not lo <= (major, minor) <= hi:
        raise RuntimeError(f"CPU peak memory is read from torch's private profiler events, checked on torch "
                           f"{lo[0]}.{lo[1]} to {hi[0]}.{hi[1]}; this is torch {torch.__version__}: check "
                           "explorer/measure/profile.py against it and widen PROFILER_TORCH_VERSIONS.")


def peak_bytes_cpu(fn: Callable[[], Any]) -> tuple[Any, int]:
    """Run ``fn`` once under the profiler; return (its result, peak bytes allocated above the start).

    The CPU allocator reports every allocation and free to the profiler; replaying them in time order
    gives the running total, whose maximum is the peak. Tensors alive before the call (inputs) are not
    counted; frees of them would only lower the curve.
    """
    _check_profiler_api()
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    # torch's profiler is one per process: two threads profiling at once crash it (seen in the app)
    with PROFILER_LOCK, profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    # every allocation (bytes > 0) and free (< 0) is one "[memory]" event
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type() == DeviceType.CPU)
    now = peak = 0
    for _, size in events:
        now += size
        peak = max(peak, now)
    return result, peak


def measure_peak_bytes(fn: Callable[[], Any], device: str | torch.device | None = None) -> tuple[Any, int]:
    """(result, peak bytes above the start) of one call, with the tracker that fits the device
    (``None``: the app's device)."""
    if dev.is_cuda(device):
        return dev.cuda_peak_bytes(fn, device)
    return peak_bytes_cpu(fn)


def memory_source(device: str | torch.device | None = None) -> str:
    """Where a measured peak comes from, said on every memory chart."""
    return "torch.cuda.max_memory_allocated" if dev.is_cuda(device) else "torch.profiler allocation events"


def timed(fn: Callable[[], Any], device: str | torch.device | None = None) -> tuple[Any, float]:
    """(result, wall seconds) of one call, the device synchronised before and after."""
    sync(device)
    t0 = time.perf_counter()
    result = fn()
    sync(device)
    return result, time.perf_counter() - t0


def time_call(fn: Callable[[], Any], *, repeats: int = 3, device: str | torch.device | None = None,
              warmup: int = 1) -> float:
    """Median wall seconds of ``repeats`` calls after ``warmup`` calls (device synchronised). Stopped work
    (``explorer.state.threads.check_stop``) ends before the next call."""
    from explorer.state.threads import check_stop

    times = []
    for i in range(warmup + max(1, repeats)):
        check_stop()
        if i < warmup:
            fn()
        else:
            times.append(timed(fn, device)[1])
    return statistics.median(times)

