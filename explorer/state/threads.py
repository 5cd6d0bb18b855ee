"""How many intra-op threads a block of work runs on.

The count is per calling thread (OpenMP), but a thread that starts while another has lowered it inherits the
lowered value, so every block below ends by putting its thread back to ``DEFAULT_THREADS``: no request changes
what the next one runs with.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time

import torch


SMALL_MODEL_PARAMETERS = 20_000_000

# The intra-op thread count at start-up (EXPLORER_THREADS overrides it).
DEFAULT_THREADS = int(os.environ.get("EXPLORER_THREADS", "0") or 0) or torch.get_num_threads()


@contextlib.contextmanager
def run_threads(n: int):
    """Run the block on ``n`` intra-op threads (this thread only), then back to ``DEFAULT_THREADS``."""
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != DEFAULT_THREADS:
            torch.set_num_threads(DEFAULT_THREADS)


def default_threads():
    """The start-up thread count for this block: measurements and their predictions (the fused kernel's
    scratch memory grows with the thread count) do not depend on what another request set."""
    return run_threads(DEFAULT_THREADS)


def threads_for(model: torch.nn.Module):
    """Run a small model's interactive forward passes on one intra-op thread, then restore the setting.

    On a few shared cores, OpenMP threads on a small model's matmuls spend their time waiting for each other;
    larger models keep every thread.
    """
    small = sum(p.numel() for p in model.parameters()) < SMALL_MODEL_PARAMETERS
    return run_threads(1 if small else DEFAULT_THREADS)


class Stopped(Exception):
    """The visitor pressed Stop: raised by ``check_stop`` inside the work, between two operations."""


_stop = threading.local()


@contextlib.contextmanager
def stoppable(event: threading.Event):
    """Within the block, ``check_stop()`` on this thread raises ``Stopped`` once ``event`` is set."""
    before = getattr(_stop, "event", None)
    _stop.event = event
    try:
        yield
    finally:
        _stop.event = before


class TimeLimit(Exception):
    """A ``time_limit`` block ran past its seconds: raised by ``check_stop`` between two operations."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """Within the block, ``check_stop()`` on this thread raises ``TimeLimit`` once ``seconds`` have passed (an
    outer limit that ends sooner still holds), so a one-call probe with no steps to stop between is capped too."""
    before = getattr(_stop, "deadline", None)
    deadline = time.monotonic() + seconds
    _stop.deadline = deadline if before is None else min(before, deadline)
    try:
        yield
    finally:
        _stop.deadline = before


def check_stop() -> None:
    """Raise ``Stopped`` when this thread's work was stopped (``stoppable``), ``TimeLimit`` past its ``time_limit``;
    cheap enough to call per kernel, so a Stop frees the cores after the kernel running now rather than after a
    whole measured length."""
    event = getattr(_stop, "event", None)
    if event is not None and event.is_set():
        raise Stopped("stopped")
    deadline = getattr(_stop, "deadline", None)
    if deadline is not None and time.monotonic() > deadline:
        raise TimeLimit("time limit")


class _StopBetweenOps(torch.overrides.TorchFunctionMode):
    """``check_stop`` before every torch operation: about 1 µs an operation (measured), nothing beside a
    T = 4,096 naive attention's 0.2-0.5 s products, so a Stop waits for one operation, not one whole call."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        check_stop()
        return func(*args, **(kwargs or {}))


def stop_between_ops():
    """Within the block, a Stop (``stoppable``) or a ``time_limit`` ends the work before the next torch operation;
    where neither can come (the benchmark, tests, start-up) nothing changes."""
    if getattr(_stop, "event", None) is None and getattr(_stop, "deadline", None) is None:
        return contextlib.nullcontext()
    return _StopBetweenOps()


def _detached(t: torch.Tensor) -> torch.Tensor:
    return t.detach()  # not ``t`` itself: a saved output would then hold its own graph in a reference cycle


def stop_in_backward():
    """Within the block, the backward pass of a graph built here checks for a Stop (``stoppable``) before each
    node that reads a saved tensor, so a Stop ends a long backward after the kernel running now. Checked in a
    saved-tensor unpack hook, which runs on whichever thread runs the backward: the event is taken here, not from
    that thread. Where no Stop can come, nothing is hooked."""
    event = getattr(_stop, "event", None)
    if event is None:
        return contextlib.nullcontext()

    def unpack(t: torch.Tensor) -> torch.Tensor:
        if event.is_set():
            raise Stopped("stopped")
        return t

    return torch.autograd.graph.saved_tensors_hooks(_detached, unpack)
