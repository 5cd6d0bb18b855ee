"""Positions: rotary tables for the decoder, the sinusoidal table for the encoder.

Notation: ``T`` positions, ``D`` head dim, ``C`` model dim.

RoPE pairs dimension ``i`` with dimension ``i + D/2`` (transformers' ``rotate_half`` layout), not the
adjacent pairs ``(2i, 2i+1)`` of Meta's original complex-number code: transformers' Llama conversion
permuted the q/k rows to this layout, so only this pairing loads its checkpoints unchanged.
Pair ``i`` turns by ``angle = position * theta ** (-2i / D)`` radians.

Context-extended checkpoints rescale those speeds once, when the table is built (``scale_frequencies``):
``linear`` divides every speed by ``factor``; ``llama3`` (Llama 3.1+) divides only the slow pairs, those
turning less than once in ``original_max_position_embeddings / low_freq_factor`` positions, leaves the fast
ones turning more than once in ``original_max_position_embeddings / high_freq_factor`` alone, and blends the
two in between. ``scaling`` is ``ModelConfig.rope_scaling``: None or a dict with ``rope_type`` and those
parameters under transformers' names.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

ROPE_TYPES = ("default", "linear", "llama3")


def scale_frequencies(freqs: torch.Tensor, scaling: Mapping[str, Any] | None) -> torch.Tensor:
    """``freqs`` (D/2,) radians per position, rescaled by ``scaling`` (None: unchanged). Same shape and dtype."""
    if not scaling:
        return freqs
    kind = scaling["rope_type"]
    if kind == "linear":  # position p turns like position p / factor did in training
        return freqs / scaling["factor"]
    if kind == "llama3":
        factor, context = scaling["factor"], scaling["original_max_position_embeddings"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        turns = context * freqs / (2 * math.pi)  # full turns of each pair over the original context
        # 0 for pairs that turned fewer than `low` times (scaled by 1/factor), 1 for more than `high` (kept)
        smooth = ((turns - low) / (high - low)).clamp(0.0, 1.0)
        return (1 - smooth) * freqs / factor + smooth * freqs
    raise ValueError(f"RoPE scaling {kind!r} is not supported: choose one of {ROPE_TYPES}.")


def rope_frequencies(head_dim: int, theta: float = 10000.0,
                     scaling: Mapping[str, Any] | None = None) -> torch.Tensor:
    """Angular speed of each of the ``D/2`` pairs, radians per position. Shape (D/2,), fp32."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    return scale_frequencies(freqs, scaling)


def rope_angles(seq_len: int, head_dim: int, theta: float = 10000.0,
                scaling: Mapping[str, Any] | None = None) -> torch.Tensor:
    """Rotation angle of every pair at every position, radians. Shape (T, D/2), fp32."""
    positions = torch.arange(seq_len, dtype=torch.int64).float()
    return torch.outer(positions, rope_frequencies(head_dim, theta, scaling))


def rope_tables(seq_len: int, head_dim: int, theta: float = 10000.0,
                scaling: Mapping[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables in ``rotate_half`` layout. Each (T, D), fp32."""
    angles = rope_angles(seq_len, head_dim, theta, scaling)
    angles = torch.cat((angles, angles), dim=-1)  # (T, D/2) -> (T, D): pair i at i and i + D/2
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dim."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # (..., D/2) twice -> (..., D)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (B, H, T, D) by the angles of its positions: ``cos``/``sin`` are (T, D)."""
    return x * cos.to(x.dtype) + rotate_half(x) * sin.to(x.dtype)


def rope_matrix(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """(D, D) R with ``x @ R == apply_rope(x, cos, sin)`` for vectors ``x`` (..., D) at one position (``cos``,
    ``sin``: (1, D), that position's row of the tables).

    ``apply_rope`` computes ``x * cos + rotate_half(x) * sin``: output ``j < D/2`` is ``x[j] cos[j] - x[j + D/2]
    sin[j]``, output ``j >= D/2`` is ``x[j] cos[j] + x[j - D/2] sin[j]``. R holds those coefficients (two per
    column, zeros elsewhere), so one small matmul does the rotation that takes ``apply_rope`` six kernels. Each
    output is the same two products (the zeros add exact zeros), so the result agrees up to the order of the
    additions."""
    c, s = cos[0], sin[0]
    half = c.shape[0] // 2
    i = torch.arange(half)
    R = torch.diag(c)
    R[i + half, i] = -s[:half]  # into j < D/2: -x[j + D/2] sin[j]
    R[i, i + half] = s[half:]   # into j >= D/2: +x[j - D/2] sin[j]
    return R


def sinusoidal_table(seq_len: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """The encoder's absolute positions ("Attention Is All You Need"). Shape (T, C), fp32.

    Even channels ``2i`` hold ``sin(pos / base**(2i/C))``, odd channels ``2i+1`` the cosine.
    """
    if d_model % 2:
        raise ValueError(f"d_model must be even for sinusoidal positions, got {d_model}.")
    positions = torch.arange(seq_len, dtype=torch.float32)[:, None]  # (T, 1)
    inv = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(base) / d_model))  # (C/2,)
    table = torch.zeros(seq_len, d_model)
    table[:, 0::2] = torch.sin(positions * inv)
    table[:, 1::2] = torch.cos(positions * inv)
    return table
