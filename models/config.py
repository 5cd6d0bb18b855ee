"""One config for every model in the project.

``ModelConfig`` is validated on construction: a size that cannot build a model raises a
``ValueError`` whose sentence says what to change. Derived fields (``n_kv_groups``, and ``head_dim`` when not
given) are computed in ``__post_init__`` and never stored twice.

Every default is Llama's. The fields after ``pad_token_id`` are the switches by which the other families that load
(Qwen2, Qwen3, Gemma 3, Mistral) differ from Llama, one behaviour each, applied at the one place in the model code
where it acts (``FAMILY_SWITCHES`` says what each does; ``models.families`` reads them from config.json).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

# The transformers families that load (MODEL_TYPES) and RoPE scaling as config.json spells it are config.json's
# facts: they live with its reader, which knows nothing of this class.
from .families import MODEL_TYPES, ROPE_SCALING_KEYS, check_rope_scaling, config_to_hf, settings_from_hf  # noqa: F401

ATTN_IMPLS = ("naive", "sdpa", "tiled")
def check_attn_impl(name: str) -> str:
    if name not in ATTN_IMPLS:
        raise ValueError(f"attention implementation must be one of {ATTN_IMPLS}, got {name!r}.")
    return name


# The MLP gate's activation, by transformers' ``hidden_act`` names: SiLU makes SwiGLU (Llama, Qwen), the tanh
# approximation of GELU makes GeGLU (Gemma).
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
LAYER_TYPES = ("full_attention", "sliding_attention")  # transformers' names for a global and a local layer

# What other families change, one switch each, with Llama's value (the default) and what it does.
# ``explorer`` lists these for a loaded model; ``models.families`` reads and writes them in config.json.
FAMILY_SWITCHES = {
    "qkv_bias": (False, "biases on the q, k and v projections"),
    "o_bias": (False, "a bias on the output projection o_proj"),
    "qk_norm": (False, "RMSNorm on each head's q and k before RoPE (QK-norm)"),
    "head_dim": (None, "head dim set by the checkpoint, not d_model / n_heads"),
    "norm_offset": (0.0, "RMSNorm scales by (norm_offset + w): Gemma stores w around 0"),
    "embed_scale": (1.0, "the token embeddings are multiplied by this (Gemma: sqrt(d_model))"),
    "hidden_act": ("silu", "the MLP gate's activation: silu (SwiGLU) or gelu_pytorch_tanh (GeGLU)"),
    "sandwich_norm": (False, "a norm after attention and after the MLP as well as before (4 norms a block)"),
    "attn_scale": (None, "scores are multiplied by this instead of 1/sqrt(head_dim)"),
    "sliding_window": (None, "a local layer sees only its last sliding_window keys (itself included)"),
    "layer_types": (None, "which layers are local (sliding_attention) and which global (full_attention)"),
    "local_rope_theta": (None, "the RoPE theta of local layers (None: the global layers' theta and scaling)"),
}


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
    # --- what other families change (FAMILY_SWITCHES); every default is Llama's --------------------------------
    family: str = "llama"  # the transformers model_type these values came from: what save_pretrained writes
    head_dim: int | None = None  # None: d_model / n_heads
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    norm_offset: float = 0.0
    embed_scale: float = 1.0
    hidden_act: str = "silu"
    sandwich_norm: bool = False
    attn_scale: float | None = None  # None: 1 / sqrt(head_dim)
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None  # None: every layer full_attention
    local_rope_theta: float | None = None
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
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}): "
                f"choose n_heads among {_divisors(self.d_model)}, or set head_dim."
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads}): "
                f"choose n_kv_heads among {_divisors(self.n_heads)}."
            )
        if self.head_dim is None:
            self.head_dim = self.d_model // self.n_heads
        if not isinstance(self.head_dim, int) or isinstance(self.head_dim, bool) or self.head_dim <= 0:
            raise ValueError(f"head_dim must be a positive integer or None (d_model / n_heads), got {self.head_dim!r}.")
        if self.head_dim % 2:
            raise ValueError(
                f"head_dim = {self.head_dim} must be even for rotary positions: change d_model, n_heads or head_dim."
            )
        self.n_kv_groups = self.n_heads // self.n_kv_heads
        if not self.rope_theta > 1.0:
            raise ValueError(f"rope_theta must be greater than 1, got {self.rope_theta!r}.")
        self.rope_scaling = check_rope_scaling(self.rope_scaling)
        if not 0.0 < self.norm_eps < 1.0:
            raise ValueError(f"norm_eps must be between 0 and 1, got {self.norm_eps!r}.")
        check_attn_impl(self.attn_impl)
        self._check_family_switches()

    def _check_family_switches(self) -> None:
        if self.family not in MODEL_TYPES:
            raise ValueError(f"family must be one of the model types {MODEL_TYPES}, got {self.family!r}.")
        for name in ("qkv_bias", "o_bias", "qk_norm", "sandwich_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}.")
        if not _finite(self.norm_offset):
            raise ValueError(f"norm_offset must be a number (0 for Llama, 1 for Gemma), got {self.norm_offset!r}.")
        if not _finite(self.embed_scale) or self.embed_scale <= 0:
            raise ValueError(f"embed_scale must be a positive number (1 for Llama), got {self.embed_scale!r}.")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act must be one of {ACTIVATIONS}, got {self.hidden_act!r}.")
        if self.attn_scale is not None and (not _finite(self.attn_scale) or self.attn_scale <= 0):
            raise ValueError(f"attn_scale must be a positive number or None (1/sqrt(head_dim)), got {self.attn_scale!r}.")
        window = self.sliding_window
        if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window <= 0):
            raise ValueError(f"sliding_window must be a positive integer or None, got {window!r}.")
        if self.layer_types is not None:
            if isinstance(self.layer_types, str) or len(self.layer_types) != self.n_layers \
                    or any(t not in LAYER_TYPES for t in self.layer_types):
                raise ValueError(f"layer_types must name each of the {self.n_layers} layers with one of {LAYER_TYPES}, "
                                 f"got {self.layer_types!r}.")
            self.layer_types = tuple(self.layer_types)
        local = self.layer_types is not None and "sliding_attention" in self.layer_types
        if local and window is None:
            raise ValueError("layer_types has sliding_attention layers but sliding_window is None: set the window.")
        if window is not None and not local:
            raise ValueError(f"sliding_window is {window} but no layer is local: mark the local layers "
                             "'sliding_attention' in layer_types, or set sliding_window to None.")
        if self.local_rope_theta is not None and (not _finite(self.local_rope_theta) or self.local_rope_theta <= 1):
            raise ValueError(f"local_rope_theta must be greater than 1 or None, got {self.local_rope_theta!r}.")

    # --- per layer ---------------------------------------------------------------------------
    def layer_window(self, layer: int) -> int | None:
        """How many keys layer ``layer`` sees (itself included), or None for a global layer."""
        if self.layer_types is not None and self.layer_types[layer] == "sliding_attention":
            return self.sliding_window
        return None

    def layer_rope(self, layer: int) -> tuple[float, dict[str, Any] | None]:
        """(theta, scaling) of layer ``layer``'s rotary tables: a local layer's own theta when set."""
        if self.local_rope_theta is not None and self.layer_window(layer) is not None:
            return self.local_rope_theta, None
        return self.rope_theta, self.rope_scaling

    def differences_from_llama(self) -> dict[str, Any]:
        """{switch: value} for every FAMILY_SWITCHES switch whose value is not Llama's (head_dim only when it is
        not d_model / n_heads)."""
        out = {}
        for name, (llama, _) in FAMILY_SWITCHES.items():
            value = getattr(self, name)
            if name == "head_dim":
                llama = self.d_model // self.n_heads if self.d_model % self.n_heads == 0 else None
            if value != llama:
                out[name] = value
        return out

    # --- conversions -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("n_kv_groups")
        if self.d_model == self.n_heads * self.head_dim:
            d["head_dim"] = None  # derived again, so a dict edited to another d_model or n_heads stays consistent
        if d["layer_types"] is not None:
            d["layer_types"] = list(d["layer_types"])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        names = {f.name for f in fields(cls) if f.init}
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "ModelConfig":
        """From a transformers ``config.json`` dict of a family that loads (``models.families.FAMILIES``)."""
        return cls(**settings_from_hf(hf))

    def to_hf(self) -> dict[str, Any]:
        """A transformers ``config.json`` dict whose model_type is this config's ``family`` (``models.families``)."""
        return config_to_hf(self)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]
