"""Calculators from a configuration alone (nothing allocated): parameters, weight bytes, KV cache, LoRA, and
real model configurations stored as data (``explorer/data/real_configs.json``).

Notation: L layers, C model dim, F feed-forward dim, V vocabulary, H query heads, Hkv key/value heads, D head dim.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import torch

from models.config import ModelConfig
from models.block import PROJECTIONS

from .units import element_size
# What the shared state counts before it loads a model lives there; these are the calculators' too.
from explorer.state.sizes import as_config as _cfg, module_bytes, parameter_count, projection_shapes  # noqa: F401

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
REAL_CONFIGS_PATH = DATA_DIR / "real_configs.json"


def parameter_memory(config: ModelConfig | dict) -> dict[str, int]:
    """Bytes of the weights: fp32 (4 per parameter), bf16 (2), int8 (1: the textbook figure), and
    int8_models_quant: what ``models.quant.quantize_int8`` holds (the projections and the LM head int8 + one fp32
    scale per output row; the embedding and norms left in fp32: a tied head gets its own int8 rows beside the
    embedding's fp32 table)."""
    c = _cfg(config)
    n = parameter_count(c)
    head = c.vocab_size * c.d_model  # the LM head's weight, tied or not
    proj = c.n_layers * sum(i * o for i, o in projection_shapes(c).values()) + head
    rows = c.n_layers * sum(o for _, o in projection_shapes(c).values()) + c.vocab_size
    rest = n["total"] - proj + (head - n["lm_head"])  # a tied head's table, counted once in the total, stays fp32
    return {"parameters": n["total"], "fp32": 4 * n["total"], "bf16": 2 * n["total"], "int8": n["total"],
            "int8_models_quant": proj + 4 * rows + 4 * rest}


def kv_cache_bytes(config: ModelConfig | dict, *, seq_len: int | None = None, batch: int = 1,
                   dtype: torch.dtype | str = torch.float16) -> dict[str, Any]:
    """KV cache size, as ``models.kv_cache.KVCache`` allocates it: each layer holds 2 · Hkv · D values per position
    it keeps, all ``seq_len`` positions (default: the model's context) for a global layer, at most its window W
    for a local (sliding-window) one, whose cache is a ring that stops growing at W.

    Returns bytes: ``per_token`` (what one more position adds while no window is full: L · 2 · Hkv · D · bytes),
    ``per_sequence`` and ``batch`` (``batch`` sequences), ``all_global`` (``batch`` sequences if every layer kept
    every position) and ``saved`` (their difference); and ``local_layers`` (indices) and ``window`` (or None).
    """
    c = _cfg(config)
    seq_len = c.max_seq_len if seq_len is None else seq_len
    if not isinstance(seq_len, int) or seq_len <= 0 or not isinstance(batch, int) or batch <= 0:
        raise ValueError(f"seq_len and batch must be positive integers, got {seq_len!r} and {batch!r}.")
    per_layer = 2 * c.n_kv_heads * c.head_dim * element_size(dtype)  # one position of one layer: K and V
    windows = [c.layer_window(i) for i in range(c.n_layers)]
    kept = sum(seq_len if w is None else min(w, seq_len) for w in windows)  # positions held, all layers
    per_sequence = per_layer * kept
    all_global = per_layer * c.n_layers * seq_len * batch
    return {"per_token": per_layer * c.n_layers, "per_sequence": per_sequence, "batch": per_sequence * batch,
            "seq_len": seq_len, "all_global": all_global, "saved": all_global - per_sequence * batch,
            "local_layers": [i for i, w in enumerate(windows) if w is not None],
            "window": c.sliding_window if any(w is not None for w in windows) else None}


def attention_variants(config: ModelConfig | dict, *, seq_len: int | None = None,
                       dtype: torch.dtype | str = torch.float16) -> dict[str, dict[str, int]]:
    """The same model as MHA (Hkv = H), its own GQA setting, and MQA (Hkv = 1): KV heads, KV-cache bytes
    and parameter counts of each."""
    c = _cfg(config)
    out = {}
    for name, hkv in (("MHA", c.n_heads), ("GQA", c.n_kv_heads), ("MQA", 1)):
        v = ModelConfig.from_dict({**c.to_dict(), "n_kv_heads": hkv})
        out[name] = {"n_kv_heads": hkv, **kv_cache_bytes(v, seq_len=seq_len, dtype=dtype),
                     "parameters": parameter_count(v)["total"]}
    return out


def lora_linear_parameters(in_features: int, out_features: int, rank: int) -> dict[str, float]:
    """One adapted projection: full = in·out, lora = r·(in + out) (A is r × in, B is out × r)."""
    if min(in_features, out_features, rank) <= 0:
        raise ValueError("in_features, out_features and rank must be positive.")
    full, lora = in_features * out_features, rank * (in_features + out_features)
    return {"full": full, "lora": lora, "ratio": full / lora}


def lora_parameters(config: ModelConfig | dict, rank: int, targets: Sequence[str] = ("q_proj", "v_proj")) -> dict:
    """Trainable LoRA parameters for ``rank`` on ``targets`` in every layer, beside the frozen total."""
    c = _cfg(config)
    bad = [t for t in targets if t not in PROJECTIONS]
    if not targets or bad:
        raise ValueError(f"LoRA targets must be a non-empty subset of {PROJECTIONS}, got {list(targets)}.")
    shapes = projection_shapes(c)
    adapted = sum(shapes[t][0] * shapes[t][1] for t in targets) * c.n_layers
    trainable = sum(rank * (shapes[t][0] + shapes[t][1]) for t in targets) * c.n_layers
    total = parameter_count(c)["total"]
    return {"trainable": trainable, "adapted_weights": adapted, "frozen": total, "ratio": adapted / trainable,
            "trainable_fraction": trainable / total}


def load_real_configs(path: str | os.PathLike = REAL_CONFIGS_PATH) -> dict[str, dict[str, Any]]:
    """{name: {"source": url, "hf_repo": ..., "config": transformers config.json fields}} from the JSON file."""
    data = json.loads(Path(path).read_text())
    return {name: entry for name, entry in data["models"].items()}


def real_config(name: str) -> ModelConfig:
    """A named real configuration as a ``ModelConfig`` (e.g. 'Llama-2-70B')."""
    configs = load_real_configs()
    if name not in configs:
        raise ValueError(f"unknown configuration {name!r}: choose one of {sorted(configs)}.")
    return ModelConfig.from_hf(configs[name]["config"])


def real_config_table(seq_len: int | None = None, dtype: torch.dtype | str = torch.float16) -> list[dict[str, Any]]:
    """One row per named configuration: sizes, parameters, weight bytes, KV cache bytes (context or seq_len)."""
    rows = []
    for name, entry in load_real_configs().items():
        c = ModelConfig.from_hf(entry["config"])
        rows.append({"name": name, "source": entry["source"], "n_layers": c.n_layers, "d_model": c.d_model,
                     "n_heads": c.n_heads, "n_kv_heads": c.n_kv_heads, "head_dim": c.head_dim,
                     "parameters": parameter_count(c)["total"], **{f"weights_{k}": v for k, v in
                                                                  parameter_memory(c).items() if k != "parameters"},
                     "kv": kv_cache_bytes(c, seq_len=seq_len, dtype=dtype)})
    return rows



# ---------------------------------------------------------------------------------------------------
# A built model: what it holds (counted on the module, so a LoRA adapter attached to it counts too)
# ---------------------------------------------------------------------------------------------------
COMPONENTS = ("embedding", "attention", "MLP", "norms", "LM head")


def parameters_by_component(model: torch.nn.Module) -> dict[str, int]:
    """Distinct parameters (a tied head counts once, under the embedding) grouped by what they belong to,
    by transformers' Llama parameter names; anything else under "other"."""
    parts = dict.fromkeys(COMPONENTS, 0)
    for name, p in model.named_parameters():  # named_parameters yields a shared tensor once
        if name.startswith("embed_tokens"):
            key = "embedding"
        elif name.startswith("lm_head"):
            key = "LM head"
        elif ".attn." in name:
            key = "attention"
        elif ".mlp." in name:
            key = "MLP"
        elif "norm" in name:
            key = "norms"
        else:
            key = "other"
            parts.setdefault(key, 0)
        parts[key] += p.numel()
    return parts
