"""How a model differs from Llama: each switch of ``models.config.FAMILY_SWITCHES``, its value, and the line of
``models/`` that applies it, found in the running code with ``inspect`` (so the table follows the code when the
code moves, and a test fails when a line it points at is gone).

Notation: ``L`` layers, ``W`` a local layer's sliding window.
"""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Callable

import models
from models import attention, block, decoder, kv_cache, layers
from models.config import FAMILY_SWITCHES, ModelConfig

MODELS_ROOT = Path(models.__file__).resolve().parent.parent  # paths are shown from the repository root

# switch -> where it acts: (function or class in models/, a piece of the one line in its source that applies it)
SITES: dict[str, tuple[tuple[Callable, str], ...]] = {
    "qkv_bias": ((attention.Attention.__init__, "bias=qkv_bias"),),
    "o_bias": ((attention.Attention.__init__, "bias=o_bias"),),
    "qk_norm": ((attention.Attention.forward, "if self.q_norm is not None"),),
    "head_dim": ((attention.Attention.__init__, "self.head_dim = "),),
    "norm_offset": ((layers.RMSNorm.forward, "if self.offset"),),
    "embed_scale": ((decoder.Decoder.forward, "if self.config.embed_scale"),),
    "hidden_act": ((layers.SwiGLU.forward, 'if self.act == "silu"'),),
    "sandwich_norm": ((block.PreNormBlock.forward, "if self.sandwich:"),),
    "attn_scale": ((attention.attention_scores, "scale = 1.0 / math.sqrt"),),
    "sliding_window": ((attention.build_mask, "if window is not None:"),
                       (kv_cache.KVCache.update, "return self._update_ring(")),
    "layer_types": ((decoder.DecoderBlock.__init__, "sliding_window=c.layer_window(layer)"),),
    "local_rope_theta": ((decoder.Decoder.forward, "local_rope = (self.rope_local_cos"),),
}


def where_applied(switch: str) -> list[str]:
    """``["models/attention.py:312", ...]``: the file and line of each place ``switch`` acts. RuntimeError when a
    line named in ``SITES`` is no longer in its function's source."""
    out = []
    for obj, marker in SITES[switch]:
        lines, start = inspect.getsourcelines(obj)
        hits = [start + i for i, line in enumerate(lines) if marker in line]
        if not hits:
            raise RuntimeError(f"{obj.__qualname__} no longer contains {marker!r}: update SITES[{switch!r}].")
        path = Path(inspect.getsourcefile(obj)).resolve().relative_to(MODELS_ROOT)
        out.append(f"{path.as_posix()}:{hits[0]}")
    return out


def _shown(config: ModelConfig, switch: str, value) -> str:
    if switch == "layer_types":
        if value is None:
            return "every layer global"
        local = [i for i, t in enumerate(value) if t == "sliding_attention"]
        return f"{len(local)} local, {len(value) - len(local)} global (global: {ranges(global_layers(config))})"
    if switch == "head_dim" and value is None:
        return "d_model / n_heads"
    if switch == "attn_scale":
        return "1/√head_dim" if value is None else f"{value:.4g} (1/√{value ** -2:.4g})"
    if switch == "embed_scale" and value != 1.0:
        return f"{value:.4g} (√{value ** 2:.4g})"
    return "—" if value is None else str(value)


def differences_table(config: ModelConfig) -> list[list[str]]:
    """One row per switch: [switch, this model's value, Llama's, what it does, where models/ applies it]; the
    switches this model changes first, marked ●."""
    rows = []
    changed = config.differences_from_llama()
    for switch, (llama, meaning) in FAMILY_SWITCHES.items():
        value = getattr(config, switch) if switch in changed else llama
        mark = "● " if switch in changed else ""
        rows.append([mark + switch, _shown(config, switch, value), _shown(config, switch, llama), meaning,
                     ", ".join(where_applied(switch))])
    return sorted(rows, key=lambda row: not row[0].startswith("●"))


def differences_sentence(config: ModelConfig) -> str:
    """One line above the table: which family, and how many switches it changes."""
    changed = config.differences_from_llama()
    if not changed:
        return f"**{config.family}**: Llama's block exactly; every switch below has Llama's value."
    return (f"**{config.family}** differs from Llama by {len(changed)} switch{'es' if len(changed) > 1 else ''}: "
            f"{', '.join(changed)} (● below), each applied at the line of models/ shown.")


def global_layers(config: ModelConfig) -> list[int]:
    return [i for i in range(config.n_layers) if config.layer_window(i) is None]


def ranges(layers_: list[int]) -> str:
    """[0, 1, 2, 4, 6, 7] -> '0–2, 4, 6–7'."""
    parts, start = [], None
    for i, n in enumerate(layers_):
        if start is None:
            start = n
        if i + 1 == len(layers_) or layers_[i + 1] != n + 1:
            parts.append(str(n) if n == start else f"{start}–{n}")
            start = None
    return ", ".join(parts) or "none"


def local_layers_sentence(config: ModelConfig, layer: int) -> str:
    """What the Attention tab says about sliding windows: '' for a model without local layers."""
    if config.layer_types is None:
        return ""
    local = [i for i in range(config.n_layers) if config.layer_window(i) is not None]
    W = config.sliding_window
    this = (f"Layer {layer} is **local**: each token sees only itself and the {W - 1} tokens before it, so its "
            "weights fill a band along the diagonal (the dashed line is the window's edge) and its KV cache keeps "
            f"only the last {W} positions." if layer in local else
            f"Layer {layer} is **global**: each token sees every token before it.")
    return (f"{this} This model's local layers (sliding window {W}): {ranges(local)}; global: "
            f"{ranges(global_layers(config))}.")
