"""Positional probes: what rotary positions do (RoPE) and the encoder's sinusoidal table.

Notation: ``T`` positions, ``D`` head dim, ``C`` model dim; angles in radians, positions in tokens.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypedDict

import numpy as np
import torch

from lens.device import to_host
from torch import nn

from models.config import ModelConfig
from models.rope import apply_rope, scale_frequencies, sinusoidal_table

from lens.hooks import as_tokens, check_head, check_layer, run_with_cache


_MAX_PROBE_POSITIONS = 2048


def _frequencies64(dim: int, base: float, scaling: dict | None = None) -> torch.Tensor:
    """``models.rope.rope_frequencies`` in float64: base^(-2i/dim) radians per position, rescaled by the
    model's RoPE ``scaling`` if any, shape (dim/2,).

    The probe's curves should show the maths, not fp32 rounding (the model builds its tables in fp32; the
    captured q/k show that). The encoder's sinusoidal table turns at the same speeds (base^(-2i/C)).
    """
    return scale_frequencies(base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim), scaling)  # (dim/2,)


def _rotate(x: torch.Tensor, theta: float, n: int, scaling: dict | None = None) -> torch.Tensor:
    """x (D,) rotated to each position 0..n-1 with the model's ``apply_rope`` -> (n, D), float64."""
    freqs = _frequencies64(x.shape[-1], theta, scaling)
    angles = torch.outer(torch.arange(n, dtype=torch.float64), freqs)  # (n, D/2)
    angles = torch.cat((angles, angles), dim=-1)  # (n, D): rotate_half layout, pair i at i and i + D/2
    return apply_rope(x.double()[None, None, None].expand(1, 1, n, -1), angles.cos(), angles.sin())[0, 0]


def _relative_scores(q: torch.Tensor, k: torch.Tensor, theta: float, n: int,
                     scaling: dict | None = None) -> torch.Tensor:
    """score(m, n) = rot(q, m) · rot(k, n) / √D for m, n in 0..n-1 -> (n, n), float64."""
    return _rotate(q, theta, n, scaling) @ _rotate(k, theta, n, scaling).T / math.sqrt(q.shape[-1])


def _by_distance(scores: torch.Tensor) -> np.ndarray:
    """score as a function of m - n for m - n = -(n-1) .. n-1, read off row 0 and column 0."""
    return torch.cat((scores[0, 1:].flip(0), scores[:, 0])).numpy()


class RelativeScores(TypedDict):
    scores: np.ndarray  # (T, T)
    distances: np.ndarray  # (2T-1,)
    by_distance: np.ndarray  # (2T-1,)
    max_deviation: float
    vectors: str


class RopeProbe(TypedDict):
    """What ``rope_probe`` returns (the fields are described there)."""
    theta: float
    head_dim: int
    scaling: dict[str, Any] | None
    positions: np.ndarray
    plain_frequencies: np.ndarray
    frequencies: np.ndarray
    wavelengths: np.ndarray
    angles: np.ndarray
    pairs: list[int]
    captured: dict[str, Any] | None
    relative: RelativeScores
    theta_sweep: dict[float, dict[str, np.ndarray]]


class SinusoidalProbe(TypedDict):
    """What ``sinusoidal_probe`` returns (the fields are described there)."""
    table: np.ndarray
    positions: np.ndarray
    frequencies: np.ndarray
    wavelengths: np.ndarray
    similarity: np.ndarray
    by_distance: np.ndarray


def rope_probe(model_or_config, *, theta: float | None = None, thetas: Sequence[float] | None = None,
               positions: int = 64, pairs: Sequence[int] | None = None, tokens=None, layer: int = 0,
               head: int = 0, seed: int = 0) -> RopeProbe:
    """What rotary positions do, from a model (or a ``ModelConfig``) and optionally real tokens.

    Returns a ``RopeProbe`` (angles in radians, positions in tokens):
        theta, head_dim, scaling (the model's ``rope_scaling``: None or its dict), positions (T,),
            plain_frequencies (D/2,) θ^(-2i/D) radians per position before any scaling, frequencies (D/2,)
            the ones the model rotates by (scaled, when it has RoPE scaling; everything below uses these),
            wavelengths (D/2,) positions per full turn, angles (T, D/2) rotation of each pair at each position,
        pairs: the pair indices followed below (default: fastest, one in the middle, slowest); pair ``i``
            rotates dims ``(i, i + D/2)``,
        relative: for one fixed q and k vector (the captured q of the last token and k of the first token
            when ``tokens`` are given, else seeded random normals): ``scores`` (T, T) =
            rot(q, m)·rot(k, n)/√D for query position m and key position n, ``distances`` (2T-1,) m - n,
            ``by_distance`` (2T-1,) the score at each distance, ``max_deviation`` the largest gap between
            a score and the score at the same distance (≈ 0: only m - n matters), ``vectors`` (which q, k),
        theta_sweep: ``{theta: {"by_distance": (T,) score(d, 0) for d = 0..T-1, "wavelengths": (D/2,)}}``
            for ``thetas`` (default 100, 10 000, 1 000 000 and ``theta``),
        captured (None without a model and tokens): ``layer``, ``head``, ``kv_head``, ``q``, ``k`` (T, D)
            before rotation and ``rot_q``, ``rot_k`` after it (first sequence), ``q_pairs``, ``rot_q_pairs``,
            ``k_pairs``, ``rot_k_pairs`` (T, P, 2) the followed pairs as 2-D points, ``scores`` (T, T)
            rot_q·rot_kᵀ/√D and ``scores_without_rope`` q·kᵀ/√D (both unmasked), ``norm_change`` the
            largest relative change of a vector's length under rotation (≈ 0: rotations keep lengths).
    """
    model = model_or_config if isinstance(model_or_config, nn.Module) else None
    config = model.config if model is not None else model_or_config
    if not isinstance(config, ModelConfig):
        raise ValueError("rope_probe needs a Decoder or a ModelConfig.")
    if model is not None and not hasattr(model, "rope_cos"):
        raise ValueError("this model has no rotary positions (the encoder adds a sinusoidal table): use "
                         "sinusoidal_probe(seq_len, d_model).")
    theta = float(config.rope_theta if theta is None else theta)
    if not theta > 1.0:
        raise ValueError(f"theta must be greater than 1, got {theta!r}.")
    if not isinstance(positions, int) or not 1 <= positions <= _MAX_PROBE_POSITIONS:
        raise ValueError(f"positions must be an integer from 1 to {_MAX_PROBE_POSITIONS}, got {positions!r}.")
    D, T = config.head_dim, positions
    half = D // 2
    if pairs is None:
        pairs = sorted({0, half // 2, half - 1})
    pairs = [int(i) for i in pairs]
    if any(not 0 <= i < half for i in pairs):
        raise ValueError(f"pairs must lie in 0..{half - 1} (head_dim {D} has {half} pairs), got {pairs}.")
    sweep = [100.0, 10000.0, 1e6] if thetas is None else [float(t) for t in thetas]
    if any(not t > 1.0 for t in sweep):
        raise ValueError(f"every theta in thetas must be greater than 1, got {sweep}.")
    sweep = sorted(set(sweep) | {theta})

    scaling = config.rope_scaling
    freqs = _frequencies64(D, theta, scaling)  # (D/2,)
    result: RopeProbe = {  # type: ignore[typeddict-item]  (relative and theta_sweep are added below)
        "theta": theta,
        "head_dim": D,
        "scaling": dict(scaling) if scaling else None,
        "positions": np.arange(T),
        "plain_frequencies": _frequencies64(D, theta).numpy(),
        "frequencies": freqs.numpy(),
        "wavelengths": (2 * math.pi / freqs).numpy(),
        "angles": torch.outer(torch.arange(T, dtype=torch.float64), freqs).numpy(),  # (T, D/2)
        "pairs": pairs,
        "captured": None,
    }

    captured = None
    if model is not None and tokens is not None:
        check_layer(model, layer)
        check_head(model, head)
        names = [f"blocks.{layer}.attn.hook_{n}" for n in ("q", "k", "rot_q", "rot_k")]
        _, cache = run_with_cache(model, tokens, names)
        kv_head = head // config.n_kv_groups
        # the figure boundary: this probe's q and k go to the host once, in float64, for the pair geometry
        q, rot_q = (torch.from_numpy(to_host(cache[names[i]][0, head].double())) for i in (0, 2))  # (T_tok, D)
        k, rot_k = (torch.from_numpy(to_host(cache[names[i]][0, kv_head].double())) for i in (1, 3))  # (T_tok, D)

        def as_pairs(x: torch.Tensor) -> np.ndarray:
            return torch.stack((x[:, pairs], x[:, [i + half for i in pairs]]), dim=-1).numpy()  # (T_tok, P, 2)

        norms = lambda a: a.norm(dim=-1).clamp_min(1e-30)  # noqa: E731
        captured = {
            "layer": layer, "head": head, "kv_head": kv_head,
            "tokens": as_tokens(model, tokens)[0].tolist(),
            "q": q.numpy(), "k": k.numpy(), "rot_q": rot_q.numpy(), "rot_k": rot_k.numpy(),
            "q_pairs": as_pairs(q), "rot_q_pairs": as_pairs(rot_q),
            "k_pairs": as_pairs(k), "rot_k_pairs": as_pairs(rot_k),
            "scores": (rot_q @ rot_k.T / math.sqrt(D)).numpy(),
            "scores_without_rope": (q @ k.T / math.sqrt(D)).numpy(),
            "norm_change": float(max(((norms(rot_q) - norms(q)).abs() / norms(q)).max(),
                                     ((norms(rot_k) - norms(k)).abs() / norms(k)).max())),
        }
        result["captured"] = captured

    if captured is not None:
        qv, kv = torch.from_numpy(captured["q"][-1]), torch.from_numpy(captured["k"][0])
        vectors = f"captured q of the last token and k of the first token (layer {layer}, head {head})"
    else:
        g = torch.Generator().manual_seed(seed)
        qv = torch.randn(D, generator=g, dtype=torch.float64)
        kv = torch.randn(D, generator=g, dtype=torch.float64)
        vectors = f"random normal q and k (seed {seed})"
    scores = _relative_scores(qv, kv, theta, T, scaling)  # (T, T)
    m, n = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
    by_distance = torch.from_numpy(_by_distance(scores))
    expected = by_distance[(m - n) + (T - 1)]  # the score at the same distance, (T, T)
    result["relative"] = RelativeScores(**{
        "scores": scores.numpy(),
        "distances": np.arange(-(T - 1), T),
        "by_distance": by_distance.numpy(),
        "max_deviation": float((scores - expected).abs().max()),
        "vectors": vectors,
    })
    result["theta_sweep"] = {
        t: {"by_distance": _relative_scores(qv, kv, t, T, scaling)[:, 0].numpy(),
            "wavelengths": (2 * math.pi / _frequencies64(D, t, scaling)).numpy()}
        for t in sweep
    }
    return result


def sinusoidal_probe(seq_len: int, d_model: int, base: float = 10000.0) -> SinusoidalProbe:
    """The encoder's sinusoidal position table and what it encodes.

    Returns table (T, C) (even channels sin, odd channels cos, ``models.rope.sinusoidal_table``),
    frequencies (C/2,) radians per position, wavelengths (C/2,) positions per full turn,
    similarity (T, T) = table · tableᵀ (dot product of two positions' codes), by_distance (T,) the dot
    product of position d with position 0 (it depends only on the distance: Σᵢ cos(d·ωᵢ)).
    """
    if not isinstance(seq_len, int) or not 1 <= seq_len <= _MAX_PROBE_POSITIONS:
        raise ValueError(f"seq_len must be an integer from 1 to {_MAX_PROBE_POSITIONS}, got {seq_len!r}.")
    if not isinstance(d_model, int) or d_model < 2 or d_model % 2:
        raise ValueError(f"d_model must be a positive even integer, got {d_model!r}.")
    if not base > 1.0:
        raise ValueError(f"base must be greater than 1, got {base!r}.")
    table = sinusoidal_table(seq_len, d_model, base).double()  # (T, C)
    freqs = _frequencies64(d_model, base)  # (C/2,): the table's channel pair i turns at base^(-2i/C)
    similarity = table @ table.T  # (T, T)
    return SinusoidalProbe(**{
        "table": table.numpy(),
        "positions": np.arange(seq_len),
        "frequencies": freqs.numpy(),
        "wavelengths": (2 * math.pi / freqs).numpy(),
        "similarity": similarity.numpy(),
        "by_distance": similarity[:, 0].numpy(),
    })
