"""Every lock the app's requests share, and the one order they are taken in.

The locks:
    model_lock(model)  (lens.hooks) one re-entrant lock per model object (freed with the model). Held by every run that
                       registers hooks on the model (``probes.run_with_cache``) and by everything that changes
                       a model in place (LoRA attached, trained, switched on, off or merged), so hooked runs on
                       one model never see each other's captures and never see a model half-changed.
    MEASURE_LOCK       one measurement on the cores at a time: the memory lab's sweeps, and the generation
                       timings (which must not run beside a sweep on the same cores).
    PROFILER_LOCK      torch's profiler is one per process: two threads profiling at once crash it, so every
                       CPU peak-memory measurement holds this, whoever calls it.

The rule: take them in the order ``model_lock -> MEASURE_LOCK -> PROFILER_LOCK``, never the other way round.
Computed views are kept in ``explorer.state.cache.results``, whose own guard is held only to read or write its
books, never while computing. Module-private guards (the default model's loader, the private-model registry, the
fast step's layouts in ``models.speed.layout``) are held around their own work only and take no lock from this
list except in this same order.
"""
from __future__ import annotations

import contextlib
import threading

from lens.hooks import model_lock  # noqa: F401 (first in the order below; it lives with the hooks)

MEASURE_LOCK = threading.Lock()
PROFILER_LOCK = threading.Lock()

class Busy(ValueError):
    """Another measurement holds MEASURE_LOCK; the message says so in a sentence (a ValueError, so
    ``panels.user_errors`` shows it)."""


@contextlib.contextmanager
def measuring(wait_s: float = 0.0, retry_s: float = 10.0):
    """Hold MEASURE_LOCK for the block, waiting at most ``wait_s`` seconds for it; otherwise raise ``Busy``.

    In the order above it comes after a model lock (``model_lock -> MEASURE_LOCK``), but never wait for it
    while holding one: a caller that holds a model's lock and waits here makes every view of that model wait
    behind the measurement in series. Holding a model lock, take it with ``wait_s=0`` (``Busy`` at once if a
    measurement runs); a long measurement takes it holding no model lock.
    """
    if not MEASURE_LOCK.acquire(timeout=wait_s) if wait_s > 0 else not MEASURE_LOCK.acquire(blocking=False):
        raise Busy(f"Another measurement is running on this machine: try again in about {retry_s:.0f} s.")
    try:
        yield
    finally:
        MEASURE_LOCK.release()
