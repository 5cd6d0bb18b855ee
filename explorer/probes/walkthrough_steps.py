"""The walkthrough's stops: their keys and names, and for each its title with shapes, one plain sentence, the
formula, the function in ``models/`` that computes it and the hooked arrays it shows.

Notation as in :mod:`explorer.probes.walkthrough`, which computes the values (``walk``); this module only lays
them out (``tutorial_steps``), so the words can change without touching the hooked forward.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from models.config import ModelConfig
from models.rope import rope_frequencies

# The stepper's stops, in tutorial order; "layer" stops belong to the expanded layer.
STEP_KEYS = ("embed", "norm1", "qkv", "rope", "scores", "mask", "softmax", "mix", "o_proj", "resid1", "norm2",
             "swiglu", "down", "resid2", "layers", "final_norm", "logits", "top")
STEP_NAMES = {
    "embed": "embedding", "norm1": "RMSNorm", "qkv": "q, k, v", "rope": "RoPE", "scores": "scores q·k/√D",
    "mask": "causal mask", "softmax": "softmax", "mix": "weighted sum of v", "o_proj": "o_proj",
    "resid1": "residual add", "norm2": "RMSNorm", "swiglu": "SwiGLU gate·up", "down": "down_proj",
    "resid2": "residual add", "layers": "all layers", "final_norm": "final norm", "logits": "logits",
    "top": "next token",
}
LAYER_STEPS = frozenset(STEP_KEYS[STEP_KEYS.index("norm1"):STEP_KEYS.index("resid2") + 1])


@dataclass(frozen=True)
class Step:
    """One stop of the walkthrough.

    key: one of ``STEP_KEYS``. layer: the layer it belongs to, or None outside the blocks.
    code: where in ``models/`` it is computed, as ``"models/<file>.py: <qualified name>"``.
    hooks: the hook points its arrays come from. arrays: name -> NumPy array for the chosen token.
    scalars: name -> number shown in the text (an RMS, a position).
    """

    key: str
    layer: int | None
    title: str
    sentence: str
    formula: str
    code: tuple[str, ...]
    hooks: tuple[str, ...]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    scalars: dict[str, float] = field(default_factory=dict)


def mlp_norm_name(config: ModelConfig) -> str:
    """The block's norm before the MLP: Llama calls it post_attention_layernorm; with sandwich norms (Gemma)
    that name is the norm after attention, and the one before the MLP is pre_feedforward_layernorm."""
    return "pre_feedforward_layernorm" if config.sandwich_norm else "post_attention_layernorm"


def _shape(*dims) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


def tutorial_steps(w, layer: int, token: str) -> list[Step]:
    """Every stop of ``w`` (a ``Walkthrough``) in tutorial order, with ``layer`` expanded; ``token`` names the token
    in titles."""
    c = w.config
    C, H, Hkv, D, F, V, L = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff, c.vocab_size, c.n_layers
    G = H // Hkv
    p, T = w.position, len(w.ids)
    t = w.layers[layer]
    b = f"blocks.{layer}."
    at = f"Layer {layer} · "
    theta, scaling = c.layer_rope(layer)
    freqs = rope_frequencies(D, theta, scaling).numpy()
    window = c.layer_window(layer)
    n_masked = T - p - 1
    n_far = max(0, p + 1 - window) if window is not None else 0  # keys a local layer's window leaves behind
    # Another family's switches, said where they act (the same steps, so links and step numbers stay put)
    gain = "(1 + g)" if c.norm_offset else "g"
    gain_note = (f" Its gain is stored around 0 and used as {c.norm_offset:g} + g (Gemma)." if c.norm_offset
                 else "")
    scale = c.attn_scale if c.attn_scale is not None else 1.0 / math.sqrt(D)
    act = {"silu": ("SwiGLU", "SiLU", "SiLU(g) = g · σ(g)"),
           "gelu_pytorch_tanh": ("GeGLU", "GELU", "GELU(g) ≈ g · Φ(g), tanh approximation")}[c.hidden_act]
    qkv_arrays = {"q": t.q, "k": t.k, "v": t.v}
    if t.q_normed is not None:
        qkv_arrays.update({"q normed": t.q_normed, "k normed": t.k_normed})
    o_arrays = {"o": t.attn_out} if t.attn_raw is None else {"o_proj(z)": t.attn_raw, "norm(o)": t.attn_out}
    m_arrays = {"m": t.mlp_out} if t.mlp_raw is None else {"down_proj(h)": t.mlp_raw, "norm(m)": t.mlp_out}
    steps = [
        Step("embed", None, f"Embedding of {token} · id {w.token_id} · row {_shape(C)} of a {V} × {C} table"
             + (f" · × {c.embed_scale:.4g}" if c.embed_scale != 1.0 else ""),
             f"The token id {w.token_id} picks one row of the embedding table: from here on, the token is this "
             f"vector of {C} numbers, the start of its residual stream."
             + (f" This family multiplies the row by √{C} = {c.embed_scale:.4g} first (Gemma), so the stream "
                "starts at the size the layers expect." if c.embed_scale != 1.0 else ""),
             "x₀ = E[id]" + (f" · {c.embed_scale:.4g}" if c.embed_scale != 1.0 else ""),
             ("models/decoder.py: Decoder.forward",), ("hook_embed",),
             {"x0": w.embed}),
        Step("norm1", layer, f"{at}RMSNorm before attention · x {_shape(C)} → x̂ {_shape(C)} · RMS {t.rms1:.4g}",
             f"The stream is divided by its root-mean-square ({t.rms1:.4g}) so every layer reads a vector of the "
             f"same size, then each of the {C} dimensions is multiplied by a learned gain.{gain_note}",
             f"x̂ = x / √(mean(x²) + ε) ⊙ {gain}", ("models/layers.py: RMSNorm.forward",),
             (b + "hook_resid_pre", b + "input_layernorm.hook_scale", b + "input_layernorm.hook_normalized"),
             {"x": t.resid_pre, "x̂": t.normed1}, {"rms": t.rms1}),
        Step("qkv", layer, f"{at}q {_shape(H, D)}, k {_shape(Hkv, D)}, v {_shape(Hkv, D)} · {H} query heads, "
             f"{Hkv} key/value heads",
             f"Three linear maps turn x̂ into a query (what this token looks for), a key (what it offers to later "
             f"tokens) and a value (what it passes on), split into heads of {D} numbers; "
             + (f"each key/value head is shared by {G} query heads (grouped-query attention)." if G > 1 else
                "every query head has its own key and value head.")
             + (" Each map adds a learned bias (Qwen2)." if c.qkv_bias else "")
             + (f" Then each head's q and k are RMS-normalised over their {D} numbers (q_norm, k_norm: QK-norm), "
                "so their dot products stay in range however large the stream grows." if c.qk_norm else "")
             + (f" The heads are {D} wide although {C} / {H} = {C / H:g}: this family sets the head size on its "
                "own." if C != H * D else ""),
             "q = x̂ W_qᵀ" + (" + b_q" if c.qkv_bias else "") + ", k = x̂ W_kᵀ" + (" + b_k" if c.qkv_bias else "")
             + ", v = x̂ W_vᵀ" + (" + b_v" if c.qkv_bias else "") + ", split into heads of D"
             + ("; q ← RMSNorm(q), k ← RMSNorm(k) per head" if c.qk_norm else ""),
             ("models/attention.py: Attention.forward", "models/attention.py: Attention._heads")
             + (("models/layers.py: RMSNorm.forward",) if c.qk_norm else ()),
             (b + "attn.hook_q", b + "attn.hook_k", b + "attn.hook_v")
             + ((b + "attn.hook_q_normed", b + "attn.hook_k_normed") if c.qk_norm else ()), qkv_arrays),
        Step("rope", layer, f"{at}RoPE turns q {_shape(H, D)} and k {_shape(Hkv, D)} by position {p}",
             f"Each pair of dimensions (i, i + {D // 2}) of q and k is rotated by the angle position × speed: "
             f"at position {p} the fastest pair turns {p * freqs[0]:.3g} rad, the slowest "
             f"{p * freqs[-1]:.3g} rad, so a query–key dot product depends on how far apart the two tokens are."
             + (f" This layer is local and turns at its own base, θ = {theta:,.0f} (the global layers use "
                f"{c.rope_theta:,.0f})." if theta != c.rope_theta else ""),
             "q' = q ⊙ cos(pθ) + rotate_half(q) ⊙ sin(pθ), θᵢ = base^(−2i/D)",
             ("models/rope.py: apply_rope", "models/rope.py: rotate_half", "models/rope.py: rope_tables"),
             (b + "attn.hook_q", b + "attn.hook_rot_q", b + "attn.hook_k", b + "attn.hook_rot_k"),
             {"q": t.q if t.q_normed is None else t.q_normed, "q'": t.rot_q,  # RoPE turns QK-norm's output
              "k": t.k if t.k_normed is None else t.k_normed, "k'": t.rot_k}, {"position": p}),
        Step("scores", layer, f"{at}scores of {token} against the {p + 1} keys up to it · {_shape(H, p + 1)}",
             f"Each query head takes the dot product of its rotated query with the rotated key of every token up "
             + (f"to this one, divided by √{D} = {math.sqrt(D):.3g} so the scores do not grow with the head size."
                if c.attn_scale is None else
                f"to this one, multiplied by {scale:.4g} (this family's own scale, 1/√query_pre_attn_scalar, "
                f"instead of 1/√{D})."),
             "sⱼ = q'·k'ⱼ / √D" if c.attn_scale is None else f"sⱼ = q'·k'ⱼ · {scale:.4g}", ("models/attention.py: attention_scores", "models/attention.py: repeat_kv"),
             (b + "attn.hook_attn_scores",), {"scores": t.scores[:, :p + 1]}),
        Step("mask", layer, f"{at}{'sliding-window' if window else 'causal'} mask over all {T} keys · "
             f"{_shape(H, T)} · {n_masked + n_far} masked",
             (f"The {n_masked} later token(s) get a score of −∞, so this token cannot read the future: the model "
              "was trained to predict the next token from the past alone." if n_masked else
              "This is the last token of the prompt: every key lies before or at it, so the mask hides nothing "
              "later (earlier tokens of the prompt have their later keys set to −∞).")
             + (f" This layer is local: it sees only the last {window} keys (itself included), so the "
                f"{n_far} older one(s) are −∞ too, and its KV cache never holds more than {window} positions."
                if window else ""),
             "sⱼ = −∞ for j > p" + (f" or j ≤ p − {window}" if window else ""), ("models/attention.py: build_mask",), (b + "attn.hook_attn_scores",),
             {"scores": t.scores}),
        Step("softmax", layer, f"{at}softmax · attention weights of {token} · {_shape(H, T)}, each row sums to 1",
             f"Softmax turns each head's scores into weights between 0 and 1 that sum to 1; the masked keys get "
             f"exactly 0. ({w.pattern_source[0].upper() + w.pattern_source[1:]}.)",
             "aⱼ = exp(sⱼ) / Σᵢ exp(sᵢ)", ("models/attention.py: attention_weights",), (b + "attn.hook_pattern",),
             {"weights": t.pattern}),
        Step("mix", layer, f"{at}weighted sum of values · z {_shape(H, D)}",
             f"Each head adds up the value vectors of the tokens it attends to, weighted by its attention weights: "
             f"z is what this token gathered from the context (computed by the {w.attn_impl} implementation).",
             "z_h = Σⱼ aₕⱼ vⱼ", ("models/attention.py: attention", "models/attention.py: repeat_kv"),
             (b + "attn.hook_z",), {"z": t.z}),
        Step("o_proj", layer, f"{at}o_proj · {H} heads × {D} → {_shape(C)}"
             + (f" · then its own RMSNorm (RMS {t.rms_attn:.4g})" if t.attn_raw is not None else ""),
             f"The {H} heads' outputs are laid side by side ({H * D} numbers) and one linear map mixes them back "
             f"into the model's {C} dimensions."
             + (f" This family normalises that output too before adding it (the sandwich's norm after attention, "
                f"post_attention_layernorm: divided by its RMS {t.rms_attn:.4g}, times {gain})."
                if t.attn_raw is not None else ""),
             "o = concat(z₁ … z_H) W_oᵀ" + ("; o ← RMSNorm(o)" if t.attn_raw is not None else ""),
             ("models/attention.py: Attention.forward",)
             + (("models/block.py: PreNormBlock.forward",) if t.attn_raw is not None else ()),
             (b + "attn.hook_z", b + "hook_attn_out") if t.attn_raw is not None else (b + "hook_attn_out",),
             o_arrays),
        Step("resid1", layer, f"{at}residual add · x + o → {_shape(C)}",
             "Attention's output is added to the stream rather than replacing it: the token keeps what it was "
             "and gains what it read.",
             "x ← x + o", ("models/block.py: PreNormBlock.forward",),
             (b + "hook_resid_pre", b + "hook_attn_out", b + "hook_resid_mid"),
             {"x": t.resid_pre, "o": t.attn_out, "x + o": t.resid_mid}),
        Step("norm2", layer, f"{at}RMSNorm before the MLP · {_shape(C)} · RMS {t.rms2:.4g}",
             f"The same normalisation again, with its own gain: divided by its RMS ({t.rms2:.4g}), scaled per "
             "dimension." + (" (In this family it is pre_feedforward_layernorm: post_attention_layernorm is the "
                             "norm after attention.)" if c.sandwich_norm else ""),
             f"x̂ = x / √(mean(x²) + ε) ⊙ {gain}", ("models/layers.py: RMSNorm.forward",),
             (b + "hook_resid_mid", b + f"{mlp_norm_name(c)}.hook_scale", b + f"{mlp_norm_name(c)}.hook_normalized"),
             {"x": t.resid_mid, "x̂": t.normed2}, {"rms": t.rms2}),
        Step("swiglu", layer, f"{at}{act[0]} · gate, up and {act[1]}(gate) · up, each {_shape(F)}",
             f"Two linear maps widen the token to {F} numbers; {act[1]} of the gate decides how much of each "
             "up-projected feature passes (near 0 for negative gates, the gate itself for large ones)."
             + (" (GeGLU: Llama's SwiGLU with GELU, tanh-approximated, in place of SiLU.)" if act[0] == "GeGLU"
                else ""),
             f"h = {act[1]}(x̂ W_gateᵀ) ⊙ (x̂ W_upᵀ), {act[2]}", ("models/layers.py: SwiGLU.forward",),
             (b + "mlp.hook_gate", b + "mlp.hook_up", b + "mlp.hook_post"),
             {"gate": t.gate, "up": t.up, f"{act[1]}(gate) · up": t.post}),
        Step("down", layer, f"{at}down_proj · {_shape(F)} → {_shape(C)}"
             + (f" · then its own RMSNorm (RMS {t.rms_mlp:.4g})" if t.mlp_raw is not None else ""),
             f"A third linear map brings the {F} features back to the model's {C} dimensions."
             + (f" This family normalises it before adding it (post_feedforward_layernorm: divided by its RMS "
                f"{t.rms_mlp:.4g}, times {gain}), the second half of the sandwich." if t.mlp_raw is not None
                else ""),
             "m = h W_downᵀ" + ("; m ← RMSNorm(m)" if t.mlp_raw is not None else ""),
             ("models/layers.py: SwiGLU.forward",)
             + (("models/block.py: PreNormBlock.forward",) if t.mlp_raw is not None else ()),
             (b + "mlp.hook_post", b + "hook_mlp_out") if t.mlp_raw is not None else (b + "hook_mlp_out",),
             m_arrays),
        Step("resid2", layer, f"{at}residual add · x + m → {_shape(C)}",
             f"The MLP's output is added to the stream too: this is layer {layer}'s output, the input of "
             + (f"layer {layer + 1}." if layer + 1 < L else "the final norm."),
             "x ← x + m", ("models/block.py: PreNormBlock.forward",),
             (b + "hook_resid_mid", b + "hook_mlp_out", b + "hook_resid_post"),
             {"x": t.resid_mid, "m": t.mlp_out, "x + m": t.resid_post}),
        Step("layers", None, f"The residual stream of {token} through all {L} layers · {_shape(L + 1, C)}",
             f"Every layer repeats the same two steps (attention, then MLP), each adding to the stream; layer "
             f"{layer} is the one expanded above (pick another with the layer menu).",
             "x_{i+1} = x_i + attn(norm(x_i)) + mlp(norm(x_i + attn(norm(x_i))))",
             ("models/decoder.py: Decoder.forward", "models/block.py: PreNormBlock.forward"),
             ("hook_embed",) + tuple(f"blocks.{i}.hook_resid_post" for i in range(L))
             + tuple(f"blocks.{i}.input_layernorm.hook_scale" for i in range(L)) + ("norm.hook_scale",),
             {"stream": np.stack([w.embed] + [x.resid_post for x in w.layers]),
              # each state's RMS is the scale the next norm divided it by (its hook_scale)
              "rms": np.array([x.rms1 for x in w.layers] + [w.final_rms], dtype=np.float32)},
             {"layer": layer}),
        Step("final_norm", None, f"Final RMSNorm · {_shape(C)} · RMS {w.final_rms:.4g}",
             f"After the last layer one more RMSNorm (RMS {w.final_rms:.4g}) prepares the stream for the "
             "prediction.",
             f"x̂ = x / √(mean(x²) + ε) ⊙ {gain}", ("models/layers.py: RMSNorm.forward",),
             (f"blocks.{L - 1}.hook_resid_post", "norm.hook_scale", "norm.hook_normalized"),
             {"x": w.layers[-1].resid_post, "x̂": w.final_normed}, {"rms": w.final_rms}),
        Step("logits", None, f"Logits · {_shape(V)}, one score per vocabulary token · top {len(w.top_ids)} shown",
             "The LM head takes the dot product of x̂ with every token's output vector"
             + (" (the embedding table itself: tied weights)" if c.tie_embeddings else "")
             + f": {V} scores, called logits; higher means more likely next.",
             "logits = x̂ W_headᵀ", ("models/decoder.py: Decoder.forward",), ("hook_logits",),
             {"logits": w.logits[w.top_ids], "ids": w.top_ids},
             {"max": float(w.logits.max()), "min": float(w.logits.min()), "mean": float(w.logits.mean())}),
        Step("top", None, f"Next token after {token} · top {len(w.top_ids)} of {V} probabilities",
             f"Softmax turns the logits into probabilities; the most likely next token has "
             f"{100 * float(w.top_probs[0]):.1f}%, and these {len(w.top_ids)} together "
             f"{100 * float(w.top_probs.sum()):.1f}%.",
             "P(next = v) = exp(logit_v) / Σ_u exp(logit_u)",
             ("models/generate.py: sampling_probs",), ("hook_logits",),
             {"probs": w.top_probs, "ids": w.top_ids}),
    ]
    assert tuple(s.key for s in steps) == STEP_KEYS
    return steps
