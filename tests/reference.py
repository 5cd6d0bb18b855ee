"""Independent oracles for the tests: NumPy in float64, written from the formulas, sharing no code with models/."""
from __future__ import annotations

import numpy as np


def numpy_attention(q, k, v, *, causal: bool, key_padding=None):
    """One head. q (T, D), k (S, D), v (S, D), key_padding (S,) bool or None -> out (T, D), weights (T, S)."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    T, S = q.shape[0], k.shape[0]
    scores = q @ k.T / np.sqrt(q.shape[1])
    allowed = np.ones((T, S), dtype=bool)
    if causal:
        allowed &= np.arange(S)[None, :] <= (S - T + np.arange(T))[:, None]
    if key_padding is not None:
        allowed &= np.asarray(key_padding, dtype=bool)[None, :]
    scores = np.where(allowed, scores, -np.inf)
    scores -= scores.max(axis=1, keepdims=True)
    w = np.exp(scores)
    w /= w.sum(axis=1, keepdims=True)
    return w @ v, w
