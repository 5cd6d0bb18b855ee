"""One config for every model in the project.

``ModelConfig`` is validated on construction: a size that cannot build a model raises a
``ValueError`` whose sentence says what to change. Derived fields (``head_dim``, ``n_kv_groups``)
are computed in ``__post_init__`` and never stored twice.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

ATTN_IMPLS = ("naive", "sdpa", "tiled")
# The parameters each supported RoPE scaling needs, under transformers' names (``rope_parameters``).
ROPE_SCALING_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


def check_rope_scaling(scaling: dict[str, Any] | None) -> dict[str, Any] | None:
    """None for plain RoPE, else ``{"rope_type": ..., <its parameters>}`` with numbers checked.

    Raises ValueError naming what is supported for any other ``rope_type`` (yarn, dynamic, longrope, ...)
    or a missing or out-of-range parameter.
    """
    if not scaling:
        return None
    if not isinstance(scaling, dict):
        raise ValueError(f"rope_scaling must be None or a dict with a 'rope_type', got {scaling!r}.")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in ("default", None):
        return None
    if kind not in ROPE_SCALING_KEYS:
        raise ValueError(f"RoPE scaling {kind!r} is not supported: only plain RoPE and the scalings "
                         f"{sorted(ROPE_SCALING_KEYS)} load.")
    out: dict[str, Any] = {"rope_type": kind}
    for key in ROPE_SCALING_KEYS[kind]:
        value = scaling.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{kind} RoPE scaling needs a number for {key!r}, got {value!r}.")
        out[key] = int(value) if key == "original_max_position_embeddings" else float(value)
    if out["factor"] < 1.0:
        raise ValueError(f"the RoPE scaling factor must be at least 1, got {out['factor']:g}.")
    if kind == "llama3":
        if not 0 < out["low_freq_factor"] < out["high_freq_factor"]:
            raise ValueError("llama3 RoPE scaling needs 0 < low_freq_factor < high_freq_factor, got "
                             f"{out['low_freq_factor']:g} and {out['high_freq_factor']:g}.")
        if out["original_max_position_embeddings"] <= 0:
            raise ValueError("llama3 RoPE scaling needs a positive original_max_position_embeddings, got "
                             f"{out['original_max_position_embeddings']}.")
    return out


def check_attn_impl(name: str) -> str:
    if name not in ATTN_IMPLS:
        raise ValueError(f"attention implementation must be one of {ATTN_IMPLS}, got {name!r}.")
    return name


@dataclass
class ModelConfig:
    vocab_size: int = 4096
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int | None = None  # None: same as n_heads (plain multi-head attention)
    d_ff: int | None = None  # None: SwiGLU's usual 8/3 * d_model rounded up to a multiple of 64
    max_seq_len: int = 512
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # None: plain RoPE; else check_rope_scaling's dict
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    attn_impl: str = "sdpa"
    tile_size: int = 64  # key block size of the "tiled" implementation
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    head_dim: int = field(init=False)
    n_kv_groups: int = field(init=False)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len", "tile_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if not isinstance(self.n_kv_heads, int) or self.n_kv_heads <= 0:
            raise ValueError(f"n_kv_heads must be a positive integer, got {self.n_kv_heads!r}.")
        if self.d_ff is None:
            self.d_ff = 64 * -(-(8 * self.d_model // 3) // 64)
        if not isinstance(self.d_ff, int) or self.d_ff <= 0:
            raise ValueError(f"d_ff must be a positive integer, got {self.d_ff!r}.")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}): "
                f"choose n_heads among {_divisors(self.d_model)}."
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads}): "
                f"choose n_kv_heads among {_divisors(self.n_heads)}."
            )
        self.head_dim = self.d_model // self.n_heads
        if self.head_dim % 2:
            raise ValueError(
                f"head_dim = d_model / n_heads = {self.head_dim} must be even for rotary positions: "
                "change d_model or n_heads."
            )
        self.n_kv_groups = self.n_heads // self.n_kv_heads
        if not self.rope_theta > 1.0:
            raise ValueError(f"rope_theta must be greater than 1, got {self.rope_theta!r}.")
        self.rope_scaling = check_rope_scaling(self.rope_scaling)
        if not 0.0 < self.norm_eps < 1.0:
            raise ValueError(f"norm_eps must be between 0 and 1, got {self.norm_eps!r}.")
        check_attn_impl(self.attn_impl)

    # --- conversions -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for derived in ("head_dim", "n_kv_groups"):
            d.pop(derived)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        names = {f.name for f in fields(cls) if f.init}
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "ModelConfig":
        """From a transformers ``LlamaConfig`` dict (``config.json``)."""
        model_type = hf.get("model_type", "llama")
        if model_type not in ("llama", "mistral"):
            raise ValueError(
                f"Only Llama-family checkpoints (model_type 'llama') can be loaded, this one is {model_type!r}."
            )
        # transformers 5 keeps theta and scaling together in rope_parameters; older files have rope_theta at the
        # top and the scaling (its type under "type" or "rope_type") in rope_scaling
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        if rope.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError("Checkpoints that rotate only part of each head (partial_rotary_factor) are not supported.")
        if rope.get("rope_type", rope.get("type")) == "llama3":  # transformers' own fallback for a missing length
            rope.setdefault("original_max_position_embeddings", hf.get("max_position_embeddings"))
        scaling = check_rope_scaling(rope)
        theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
        head_dim = hf.get("head_dim")
        if head_dim is not None and head_dim * hf["num_attention_heads"] != hf["hidden_size"]:
            raise ValueError("Checkpoints whose head_dim * n_heads differs from hidden_size are not supported.")
        if hf.get("attention_bias") or hf.get("mlp_bias"):
            raise ValueError("Checkpoints with attention or MLP biases are not supported.")
        eos = hf.get("eos_token_id")
        return cls(
            vocab_size=hf["vocab_size"],
            d_model=hf["hidden_size"],
            n_layers=hf["num_hidden_layers"],
            n_heads=hf["num_attention_heads"],
            n_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
            d_ff=hf["intermediate_size"],
            max_seq_len=hf.get("max_position_embeddings", 2048),
            rope_theta=float(theta),
            rope_scaling=scaling,
            norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=eos[0] if isinstance(eos, list) else eos,
            pad_token_id=hf.get("pad_token_id"),
        )

    def to_hf(self) -> dict[str, Any]:
        """A transformers ``LlamaConfig`` dict for ``config.json``."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.d_model,
            "intermediate_size": self.d_ff,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_seq_len,
            "rms_norm_eps": self.norm_eps,
            "rope_parameters": {"rope_type": "default", **(self.rope_scaling or {}), "rope_theta": self.rope_theta},
            "tie_word_embeddings": self.tie_embeddings,
            "attention_bias": False,
            "mlp_bias": False,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "dtype": "float32",
        }


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]
