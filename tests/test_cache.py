"""The shared result cache: bounded, evicting, one computation per key at a time, keyed by weights."""
from __future__ import annotations

import threading
import time

import numpy as np
import torch

from explorer.state.cache import ResultCache, approx_bytes, model_id, weights_key


def test_bounded_in_bytes_and_entries_least_recent_out():
    cache = ResultCache(max_bytes=3000, max_entries=10)
    for i in range(5):
        cache.put(i, np.zeros(100, dtype=np.float64))  # 800 bytes each
    assert cache.stats()["bytes"] <= 3000
    assert cache.get(0) is None and cache.get(4) is not None
    small = ResultCache(max_bytes=10**9, max_entries=3)
    for i in range(5):
        small.put(i, "x")
    assert small.stats()["entries"] == 3 and small.get(1) is None and small.get(2) == "x"


def test_too_large_value_is_served_not_kept():
    cache = ResultCache(max_bytes=100)
    value = cache.get_or_compute("big", lambda: np.zeros(1000))
    assert value.shape == (1000,) and cache.stats()["entries"] == 0


def test_concurrent_callers_compute_once():
    cache = ResultCache()
    calls = []

    def compute():
        calls.append(1)
        time.sleep(0.2)
        return 42

    out = []
    threads = [threading.Thread(target=lambda: out.append(cache.get_or_compute("k", compute))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [42] * 8 and len(calls) == 1


def test_failed_computation_is_not_cached_and_waiters_retry():
    cache = ResultCache()
    attempts = []

    def flaky():
        attempts.append(1)
        if len(attempts) == 1:
            time.sleep(0.1)
            raise ValueError("first try fails")
        return "ok"

    results, errors = [], []

    def call():
        try:
            results.append(cache.get_or_compute("k", flaky))
        except ValueError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
        time.sleep(0.02)
    for t in threads:
        t.join()
    assert len(errors) == 1 and results and all(r == "ok" for r in results)


def test_weights_key_follows_in_place_changes_and_ids_are_not_reused():
    layer = torch.nn.Linear(3, 3)
    before = weights_key(layer)
    assert weights_key(layer) == before
    with torch.no_grad():
        layer.weight.add_(1.0)
    assert weights_key(layer) != before
    first = model_id(layer)
    del layer
    assert model_id(torch.nn.Linear(3, 3)) != first


def test_approx_bytes_counts_arrays_and_tensors():
    assert approx_bytes(np.zeros((10, 10), dtype=np.float32)) == 400
    assert approx_bytes(torch.zeros(10, dtype=torch.float16)) == 20
    assert approx_bytes({"a": np.zeros(100)}) >= 800
