"""Sizes the shared state reads before and after it loads a model: bytes parsed, formatted and read from the
environment, a configuration's parameters, a module's bytes. Primitives: ``explorer.measure`` re-exports them as its
units and calculators.
"""
from __future__ import annotations

import os
import re

import torch

from models.config import ModelConfig

GIB = 2**30
MIB = 2**20

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


def bytes_setting(name: str, default: int) -> int:
    """A size in bytes from the environment variable ``name`` ('4GiB', '512MB', ...), or ``default`` when it is
    unset or unreadable (a bad setting must not stop the app from starting)."""
    raw = os.environ.get(name)
    try:
        return parse_bytes(raw) if raw else default
    except ValueError:
        return default


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


def as_config(config: ModelConfig | dict) -> ModelConfig:
    if isinstance(config, ModelConfig):
        return config
    if isinstance(config, dict):
        return ModelConfig.from_hf(config) if "hidden_size" in config else ModelConfig.from_dict(config)
    raise ValueError(f"expected a ModelConfig or a config dict, got {type(config).__name__}.")


def projection_shapes(config: ModelConfig | dict) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each per-layer projection, by transformers' Llama name."""
    c = as_config(config)
    hd = c.head_dim
    return {"q_proj": (c.d_model, c.n_heads * hd), "k_proj": (c.d_model, c.n_kv_heads * hd),
            "v_proj": (c.d_model, c.n_kv_heads * hd), "o_proj": (c.n_heads * hd, c.d_model),
            "gate_proj": (c.d_model, c.d_ff), "up_proj": (c.d_model, c.d_ff), "down_proj": (c.d_ff, c.d_model)}


def parameter_count(config: ModelConfig | dict) -> dict[str, int]:
    """Parameters by part: embedding V·C, per layer (projections, their biases if any, two norms, or four with
    sandwich norms, and QK-norm's two D-wide norms), final norm, untied LM head."""
    c = as_config(config)
    embedding = c.vocab_size * c.d_model
    biases = c.qkv_bias * (c.n_heads + 2 * c.n_kv_heads) * c.head_dim + c.o_bias * c.d_model
    norms = (4 if c.sandwich_norm else 2) * c.d_model + (2 * c.head_dim if c.qk_norm else 0)
    per_layer = sum(i * o for i, o in projection_shapes(c).values()) + biases + norms
    lm_head = 0 if c.tie_embeddings else c.vocab_size * c.d_model
    total = embedding + c.n_layers * per_layer + c.d_model + lm_head
    return {"embedding": embedding, "per_layer": per_layer, "layers": c.n_layers * per_layer, "final_norm": c.d_model,
            "lm_head": lm_head, "total": total}


def module_bytes(model: torch.nn.Module) -> dict[str, int]:
    """Bytes a module holds: ``parameters`` (weights) and ``buffers`` (e.g. the rotary tables)."""
    return {"parameters": sum(p.numel() * p.element_size() for p in model.parameters()),
            "buffers": sum(b.numel() * b.element_size() for b in model.buffers())}
