"""The fast tier samples a long parametrization: ``fast_first(rows, n)`` keeps the first ``n`` rows in it and marks
the rest slow, so the whole matrix still runs in the full suite (``.ci/run``) while the tier stays within its time.

A row is one value, or a tuple of values when the test takes several arguments (``unpack=True``)."""
from __future__ import annotations

import pytest


def fast_first(rows, n: int = 1, *, unpack: bool = False) -> list:
    rows = list(rows)
    if not 0 < n <= len(rows):
        raise ValueError(f"keep between 1 and {len(rows)} rows in the fast tier, not {n}")
    out = []
    for i, row in enumerate(rows):
        values = tuple(row) if unpack else (row,)
        out.append(pytest.param(*values, marks=() if i < n else (pytest.mark.slow,)))
    return out
