"""Model families: each transformers ``config.json`` read into ``ModelConfig``'s switches, and written back. This
module knows nothing of ``ModelConfig`` (``models.config`` builds itself from what it reads here), so the two
never import each other.

Llama is the baseline. Each other family that loads is Llama with a few switches (``config.FAMILY_SWITCHES``)
set otherwise; the model code applies each switch at the one place where it acts:

    model_type   transformers class   what differs from Llama (config.json field -> ModelConfig switch)
    llama        LlamaForCausalLM     nothing (attention_bias -> qkv_bias and o_bias, rarely set)
    mistral      MistralForCausalLM   sliding_window on every layer (when not null)
    qwen2        Qwen2ForCausalLM     qkv_bias (always on); use_sliding_window + layer_types
    qwen3        Qwen3ForCausalLM     qk_norm (always on); head_dim of its own; attention_bias -> qkv_bias, o_bias
    gemma3_text  Gemma3ForCausalLM    embed_scale sqrt(hidden_size), norm_offset 1, hidden_activation -> hidden_act,
                                      sandwich_norm, qk_norm, query_pre_attn_scalar -> attn_scale, sliding_window +
                                      layer_types, each layer type's rope_theta (local_rope_theta)

Numbers that are no switch (Qwen's RoPE theta of 1,000,000, tied embeddings) are read like Llama's. Two spellings
of RoPE settings are read: transformers 5's ``rope_parameters`` (for Gemma 3 one dict per layer type) and the older
top-level ``rope_theta`` / ``rope_scaling`` / ``rope_local_base_freq``. Written files use transformers 5's.
"""
from __future__ import annotations

import math
from typing import Any

FAMILIES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}
# The transformers families that load: Llama, and those that change it in a few named ways (FAMILY_SWITCHES).
MODEL_TYPES = tuple(FAMILIES)

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



def family_names() -> str:
    """'llama', 'mistral', ... and 'gemma3_text': for sentences that say what loads."""
    names = [repr(t) for t in FAMILIES]
    return ", ".join(names[:-1]) + " or " + names[-1]


# --- reading ------------------------------------------------------------------------------------------------------
def settings_from_hf(hf: dict[str, Any]) -> dict[str, Any]:
    """``ModelConfig``'s keyword arguments for a transformers ``config.json`` dict (``ModelConfig.from_hf``).
    Raises ValueError naming the families that load for any other ``model_type``, and for settings of a loading
    family that the model code does not implement."""
    model_type = hf.get("model_type", "llama")
    if model_type == "gemma3":
        raise ValueError("This is a Gemma 3 image-and-text checkpoint (model_type 'gemma3'): only Gemma 3's text-only "
                         "checkpoints (model_type 'gemma3_text', such as google/gemma-3-270m) load.")
    if model_type not in FAMILIES:
        raise ValueError(f"Only Llama-family checkpoints load (model_type {family_names()}), this one is "
                         f"{model_type!r}.")
    if hf.get("mlp_bias"):
        raise ValueError("Checkpoints with MLP biases (mlp_bias) are not supported.")
    gemma = model_type == "gemma3_text"
    own_head_dim = gemma or model_type == "qwen3"
    if not own_head_dim and hf.get("head_dim") not in (None, hf["hidden_size"] / hf["num_attention_heads"]):
        raise ValueError(f"{model_type} checkpoints whose head_dim * n_heads differs from hidden_size are not "
                         "supported (Qwen3 and Gemma 3 set a head_dim of their own).")
    eos = hf.get("eos_token_id")
    common = dict(
        family=model_type,
        vocab_size=hf["vocab_size"],
        d_model=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"],
        n_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        d_ff=hf["intermediate_size"],
        head_dim=hf.get("head_dim", 256 if gemma else 128 if model_type == "qwen3" else None),
        max_seq_len=hf.get("max_position_embeddings", 131072 if gemma else 2048),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", gemma)),  # Gemma's default is tied, the others' untied
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=eos[0] if isinstance(eos, list) else eos,
        pad_token_id=hf.get("pad_token_id"),
        hidden_act=hf.get("hidden_activation") or hf.get("hidden_act") or ("gelu_pytorch_tanh" if gemma else "silu"),
    )
    if model_type != "qwen2":  # Qwen2 always has q, k, v biases (below); the others one switch for all four
        common.update(qkv_bias=bool(hf.get("attention_bias")), o_bias=bool(hf.get("attention_bias")))
    return {**common, **_READERS[model_type](hf)}


def _rope(params: dict[str, Any], default_theta: float) -> tuple[float, dict[str, Any] | None]:
    """(theta, checked scaling) of one rope parameters dict."""
    params = dict(params or {})
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("Checkpoints that rotate only part of each head (partial_rotary_factor) are not supported.")
    return float(params.get("rope_theta", default_theta)), check_rope_scaling(params)


def _plain_rope(hf: dict[str, Any]) -> dict[str, Any]:
    # transformers 5 keeps theta and scaling together in rope_parameters; older files have rope_theta at the
    # top and the scaling (its type under "type" or "rope_type") in rope_scaling
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    if rope.get("rope_type", rope.get("type")) == "llama3":  # transformers' own fallback for a missing length
        rope.setdefault("original_max_position_embeddings", hf.get("max_position_embeddings"))
    theta, scaling = _rope(rope, hf.get("rope_theta", 10000.0))
    return dict(rope_theta=theta, rope_scaling=scaling)


def _llama(hf: dict[str, Any]) -> dict[str, Any]:
    return _plain_rope(hf)


def _mistral(hf: dict[str, Any]) -> dict[str, Any]:
    window = hf.get("sliding_window", 4096)  # MistralConfig's default when the file leaves it out
    layer_types = None if window is None else ["sliding_attention"] * hf["num_hidden_layers"]
    return dict(**_plain_rope(hf), sliding_window=window, layer_types=layer_types)


def _qwen_windows(hf: dict[str, Any]) -> dict[str, Any]:
    # Qwen's window is used only with use_sliding_window, and then on the layers layer_types marks (by default
    # every layer from max_window_layers on), as Qwen2Config.__post_init__ decides
    if not hf.get("use_sliding_window"):
        return dict(sliding_window=None, layer_types=None)
    window, n = hf.get("sliding_window", 4096), hf["num_hidden_layers"]
    types = hf.get("layer_types") or ["sliding_attention" if i >= hf.get("max_window_layers", 28) else
                                      "full_attention" for i in range(n)]
    if window is None or "sliding_attention" not in types:
        return dict(sliding_window=None, layer_types=None)
    return dict(sliding_window=window, layer_types=types)


def _qwen2(hf: dict[str, Any]) -> dict[str, Any]:
    return dict(**_plain_rope(hf), **_qwen_windows(hf), qkv_bias=True, o_bias=False)


def _qwen3(hf: dict[str, Any]) -> dict[str, Any]:
    return dict(**_plain_rope(hf), **_qwen_windows(hf), qk_norm=True)


def _gemma3(hf: dict[str, Any]) -> dict[str, Any]:
    if hf.get("use_bidirectional_attention"):
        raise ValueError("Gemma 3 checkpoints with bidirectional attention (use_bidirectional_attention) are not "
                         "supported: only causal ones load.")
    for name in ("final_logit_softcapping", "attn_logit_softcapping"):
        if hf.get(name) is not None:
            raise ValueError(f"Checkpoints with {name} (Gemma 2's soft-capping) are not supported.")
    n = hf["num_hidden_layers"]
    pattern = hf.get("sliding_window_pattern", hf.get("_sliding_window_pattern", 6))
    types = hf.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    rope = hf.get("rope_parameters") or {}
    if "full_attention" in rope or "sliding_attention" in rope:  # transformers 5: one dict per layer type
        theta, scaling = _rope(rope.get("full_attention"), 1_000_000.0)
        local_theta, local_scaling = _rope(rope.get("sliding_attention"), 10_000.0)
    else:  # older files: the global layers' settings at the top, the local layers' theta as rope_local_base_freq
        theta, scaling = _rope(hf.get("rope_scaling"), hf.get("rope_theta", 1_000_000.0))
        local_theta, local_scaling = float(hf.get("rope_local_base_freq", 10_000.0)), None
    if local_scaling is not None:
        raise ValueError("Gemma 3 checkpoints whose local (sliding-window) layers scale RoPE are not supported.")
    local = "sliding_attention" in types
    head_dim = hf.get("head_dim", 256)
    return dict(
        rope_theta=theta, rope_scaling=scaling,
        embed_scale=math.sqrt(hf["hidden_size"]),
        norm_offset=1.0,
        sandwich_norm=True,
        qk_norm=True,
        attn_scale=float(hf.get("query_pre_attn_scalar", head_dim)) ** -0.5,
        sliding_window=hf.get("sliding_window", 4096) if local else None,
        layer_types=types if local else None,
        local_rope_theta=local_theta if local else None,
    )


_READERS = {"llama": _llama, "mistral": _mistral, "qwen2": _qwen2, "qwen3": _qwen3, "gemma3_text": _gemma3}


# --- writing ------------------------------------------------------------------------------------------------------
def misfits(config: Any, model_type: str) -> list[str]:
    """Why ``model_type``'s transformers class cannot hold ``config``, a ``ModelConfig`` (one sentence per
    switch); [] when it can."""
    c, out = config, []
    gemma = model_type == "gemma3_text"

    def want(name: str, value, why: str) -> None:
        if getattr(c, name) != value:
            out.append(f"{why}: {name} must be {value!r}, not {getattr(c, name)!r}")

    if model_type == "qwen2":
        want("qkv_bias", True, "Qwen2 always has q, k and v biases")
        want("o_bias", False, "Qwen2 has no o_proj bias")
    elif c.qkv_bias != c.o_bias:
        out.append(f"{model_type} has one attention_bias for q, k, v and o alike: qkv_bias and o_bias must be equal")
    if model_type == "mistral" and c.qkv_bias:
        out.append("Mistral has no attention biases: qkv_bias and o_bias must be False")
    want("qk_norm", model_type in ("qwen3", "gemma3_text"), f"{model_type} {'has' if c.qk_norm else 'has no'} QK-norm")
    want("norm_offset", 1.0 if gemma else 0.0, f"{model_type}'s RMSNorm scales by "
         f"{'(1 + w)' if gemma else 'w'}")
    want("sandwich_norm", gemma, f"{model_type} {'has' if gemma else 'has no'} sandwich norms")
    if gemma:
        if not math.isclose(c.embed_scale, math.sqrt(c.d_model), rel_tol=1e-9):
            out.append(f"Gemma 3 scales embeddings by sqrt(d_model) = {math.sqrt(c.d_model):.6g}: embed_scale is "
                       f"{c.embed_scale!r}")
        scalar = (c.attn_scale or c.head_dim ** -0.5) ** -2
        if abs(scalar - round(scalar)) > 1e-6 * scalar:
            out.append(f"Gemma 3 stores attn_scale as query_pre_attn_scalar ** -0.5 with a whole number: "
                       f"{c.attn_scale!r} gives {scalar:g}")
    else:
        want("embed_scale", 1.0, f"{model_type} does not scale its embeddings")
        want("attn_scale", None, f"{model_type} scales scores by 1/sqrt(head_dim)")
        want("local_rope_theta", None, f"{model_type}'s local layers share the global RoPE")
    if model_type not in ("qwen3", "gemma3_text") and c.head_dim * c.n_heads != c.d_model:
        out.append(f"{model_type}'s head_dim is d_model / n_heads: head_dim must be {c.d_model / c.n_heads:g}, "
                   f"not {c.head_dim}")
    if model_type == "llama" and c.sliding_window is not None:
        out.append("Llama has no sliding-window layers: sliding_window must be None")
    if model_type == "mistral" and c.layer_types is not None and "full_attention" in c.layer_types:
        out.append("Mistral's window covers every layer or none: layer_types must all be 'sliding_attention'")
    return out


def config_to_hf(config: Any) -> dict[str, Any]:
    """A transformers ``config.json`` dict that ``config.family``'s class loads (``config`` a ``ModelConfig``).
    Raises ValueError, naming the families that could hold it, when a switch is set in a way that class cannot
    express."""
    c, model_type = config, config.family
    problems = misfits(c, model_type)
    if problems:
        fit = [t for t in FAMILIES if not misfits(c, t)]
        hint = f"set family to {' or '.join(map(repr, fit))}" if fit else "no transformers family holds it"
        raise ValueError(f"transformers' {FAMILIES[model_type]} cannot hold this config ({'; '.join(problems)}): "
                         f"change those switches or {hint}.")
    rope = {"rope_type": "default", **(c.rope_scaling or {}), "rope_theta": c.rope_theta}
    hf: dict[str, Any] = {
        "architectures": [FAMILIES[model_type]],
        "model_type": model_type,
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "intermediate_size": c.d_ff,
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "hidden_act": c.hidden_act,
        "max_position_embeddings": c.max_seq_len,
        "rms_norm_eps": c.norm_eps,
        "rope_parameters": rope,
        "tie_word_embeddings": c.tie_embeddings,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": c.eos_token_id,
        "pad_token_id": c.pad_token_id,
        "dtype": "float32",
    }
    if model_type == "llama":
        hf.update(attention_bias=c.qkv_bias, mlp_bias=False)
    elif model_type == "mistral":
        hf.update(sliding_window=c.sliding_window)
    elif model_type in ("qwen2", "qwen3"):
        hf.update(use_sliding_window=c.sliding_window is not None, sliding_window=c.sliding_window,
                  max_window_layers=c.n_layers, layer_types=list(c.layer_types or ["full_attention"] * c.n_layers))
        if model_type == "qwen3":
            hf.update(attention_bias=c.qkv_bias)
    else:  # gemma3_text
        local = {"rope_type": "default", "rope_theta": c.local_rope_theta} if c.local_rope_theta else dict(rope)
        hf.pop("hidden_act")
        hf.update(hidden_activation=c.hidden_act, attention_bias=c.qkv_bias,
                  query_pre_attn_scalar=round((c.attn_scale or c.head_dim ** -0.5) ** -2),
                  sliding_window=c.sliding_window or c.max_seq_len, layer_types=list(c.layer_types or ["full_attention"] * c.n_layers),
                  rope_parameters={"full_attention": rope, "sliding_attention": local},
                  final_logit_softcapping=None, attn_logit_softcapping=None, use_bidirectional_attention=False)
    return hf
