"""One token followed through the decoder, step by step, with the real values of one hooked forward.

Notation: ``T`` tokens in the prompt, ``p`` the chosen position, ``L`` layers, ``H`` query heads, ``Hkv``
key/value heads, ``D`` head dim, ``C`` model dim, ``F`` feed-forward dim, ``V`` vocabulary.

``walk(model, ids, position)`` runs the model once through ``probes.run_with_cache`` and keeps, for the token
at ``position`` only, every hooked value of every layer (``Walkthrough``: about 12k numbers per layer at
SmolLM2-135M's shape, plus the logits row). ``Walkthrough.steps(layer)`` lays them out in the order of a
from-scratch tutorial, with one layer expanded and the others collapsed; each ``Step`` carries its title with
shapes, one plain sentence, the formula and the function in ``models/`` that computes it.

Every value is a hook's tensor; nothing the model computes is recomputed here another way. Two things are
derived from hooked values, because no hook holds them: the softmax of the final logits (the probabilities
the sampler draws from, ``models.generate.sampling_probs`` at temperature 1) and the logit lens, which sends
each layer's residual stream through the model's own final norm and LM head modules.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from models.config import ModelConfig
from models.decoder import check_tokens

from explorer import probes
# LAYER_STEPS and STEP_NAMES are read by the tab through this module, with the stops they name.
from explorer.probes.walkthrough_steps import (LAYER_STEPS, STEP_KEYS, STEP_NAMES, Step,  # noqa: F401
                                               mlp_norm_name, tutorial_steps)
from lens.device import to_host
from lens.hooks import model_lock

TOP_K = 10  # next tokens listed at the end
LENS_K = 5  # tokens per layer in the logit lens


@dataclass(frozen=True)
class LayerTrace:
    """Every hooked value of one block for the chosen token (position ``p``). Vectors are float32."""

    layer: int
    resid_pre: np.ndarray  # (C,) blocks.i.hook_resid_pre
    rms1: float  # blocks.i.input_layernorm.hook_scale: the RMS the token was divided by
    normed1: np.ndarray  # (C,) blocks.i.input_layernorm.hook_normalized
    q: np.ndarray  # (H, D) blocks.i.attn.hook_q, before RoPE
    k: np.ndarray  # (Hkv, D) blocks.i.attn.hook_k
    v: np.ndarray  # (Hkv, D) blocks.i.attn.hook_v
    rot_q: np.ndarray  # (H, D) blocks.i.attn.hook_rot_q
    rot_k: np.ndarray  # (Hkv, D) blocks.i.attn.hook_rot_k
    scores: np.ndarray  # (H, T) blocks.i.attn.hook_attn_scores row p: scaled, -inf on masked keys
    pattern: np.ndarray  # (H, T) blocks.i.attn.hook_pattern row p
    z: np.ndarray  # (H, D) blocks.i.attn.hook_z: each head's weighted sum of values
    attn_out: np.ndarray  # (C,) blocks.i.hook_attn_out (o_proj's output)
    resid_mid: np.ndarray  # (C,) blocks.i.hook_resid_mid
    rms2: float  # blocks.i.post_attention_layernorm.hook_scale
    normed2: np.ndarray  # (C,) blocks.i.post_attention_layernorm.hook_normalized
    gate: np.ndarray  # (F,) blocks.i.mlp.hook_gate
    up: np.ndarray  # (F,) blocks.i.mlp.hook_up
    post: np.ndarray  # (F,) blocks.i.mlp.hook_post = SiLU(gate) * up
    mlp_out: np.ndarray  # (C,) blocks.i.hook_mlp_out (down_proj's output)
    resid_post: np.ndarray  # (C,) blocks.i.hook_resid_post
    # What another family adds (None for Llama): QK-norm's outputs, and with sandwich norms the attention's and
    # the MLP's outputs before their own norms (o_proj and down_proj of the hooked z and post, by the modules).
    q_normed: np.ndarray | None = None  # (H, D) blocks.i.attn.hook_q_normed
    k_normed: np.ndarray | None = None  # (Hkv, D) blocks.i.attn.hook_k_normed
    attn_raw: np.ndarray | None = None  # (C,) o_proj(z) before post_attention_layernorm
    rms_attn: float | None = None  # blocks.i.post_attention_layernorm.hook_scale (sandwich)
    mlp_raw: np.ndarray | None = None  # (C,) down_proj(post) before post_feedforward_layernorm
    rms_mlp: float | None = None  # blocks.i.post_feedforward_layernorm.hook_scale


@dataclass(frozen=True)
class LogitLens:
    """What each layer's residual stream would predict through the final norm and LM head.

    Row 0 is the embedding (before any layer), row ``i + 1`` the output of layer ``i``; the last row is the
    model's own prediction. ids/probs (L + 1, k): each row's top-k tokens and their probabilities.
    final_id: the model's top next token; final_probs (L + 1,): its probability at each row.
    """

    rows: tuple[str, ...]
    ids: np.ndarray
    probs: np.ndarray
    final_id: int
    final_probs: np.ndarray


@dataclass(frozen=True)
class Walkthrough:
    """The chosen token's trip through the model (``walk``'s result)."""

    config: ModelConfig
    ids: tuple[int, ...]
    position: int
    attn_impl: str
    pattern_source: str
    embed: np.ndarray  # (C,) hook_embed row p
    layers: tuple[LayerTrace, ...]
    final_rms: float  # norm.hook_scale
    final_normed: np.ndarray  # (C,) norm.hook_normalized
    logits: np.ndarray  # (V,) hook_logits row p
    top_ids: np.ndarray  # (TOP_K,) int64, most likely next tokens first
    top_probs: np.ndarray  # (TOP_K,) softmax(logits) at those ids
    lens: LogitLens

    @property
    def token_id(self) -> int:
        return self.ids[self.position]

    @property
    def n_steps(self) -> int:
        return len(STEP_KEYS)

    def nbytes(self) -> int:
        """Bytes of the arrays held (what a memo of this result costs)."""
        arrays = [self.embed, self.final_normed, self.logits, self.top_ids, self.top_probs, self.lens.ids,
                  self.lens.probs, self.lens.final_probs]
        arrays += [v for t in self.layers for v in vars(t).values() if isinstance(v, np.ndarray)]
        return sum(a.nbytes for a in arrays)

    def steps(self, layer: int, token: str | None = None) -> list[Step]:
        """Every stop in tutorial order, with ``layer`` expanded. ``token``: how to name the token in titles."""
        return tutorial_steps(self, check_layer(layer, self.config.n_layers), token or f"token {self.position}")

    def step(self, index: int, layer: int, token: str | None = None) -> Step:
        """Stop ``index`` (0 .. n_steps - 1) with ``layer`` expanded."""
        index = check_step(index)
        return self.steps(layer, token)[index]


# --------------------------------------------------------------------------------------------------
# Validation (what a person can get wrong)
# --------------------------------------------------------------------------------------------------

def _whole(value, what: str, lo: int, hi: int) -> int:
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if isinstance(value, float) and value.is_integer():
        value, ok = int(value), True
    if not ok or not lo <= value <= hi:
        raise ValueError(f"{what} must be a whole number from {lo} to {hi}, got {value!r}.")
    return int(value)


def check_layer(layer, n_layers: int) -> int:
    return _whole(layer, "layer", 0, n_layers - 1)


def check_step(index) -> int:
    return _whole(index, "step", 0, len(STEP_KEYS) - 1)


def check_ids(ids, config: ModelConfig) -> tuple[int, ...]:
    """Token ids as a tuple; ValueError unless 1..max_seq_len ids within the vocabulary."""
    try:
        ids = tuple(int(i) for i in np.asarray(ids, dtype=np.int64).reshape(-1))
    except (TypeError, ValueError, OverflowError):
        raise ValueError("tokens must be a list of integer ids.") from None
    if not ids:
        raise ValueError("The prompt produced no tokens: type a sentence.")
    if len(ids) > config.max_seq_len:
        raise ValueError(f"The prompt is {len(ids)} tokens long; the model's context is {config.max_seq_len}: "
                         "shorten it.")
    check_tokens(torch.tensor([ids]), config)  # the decoder's own rule for ids, with its sentence
    return ids


def check_position(position, n_tokens: int) -> int:
    """The chosen token's position; None means the last token."""
    if position is None:
        return n_tokens - 1
    return _whole(position, "token position", 0, n_tokens - 1)


# --------------------------------------------------------------------------------------------------
# The computation
# --------------------------------------------------------------------------------------------------

def _np(t: torch.Tensor) -> np.ndarray:
    return to_host(t.float()).copy()  # a copy: the row must not keep the whole sequence alive


def walk(model: nn.Module, ids, position: int | None = None) -> Walkthrough:
    """Run ``model`` once on ``ids`` (one prompt) with every hook recorded; keep the token at ``position``.

    position: 0 .. T - 1, None for the last token. Raises ValueError for empty or out-of-vocabulary ids and for
    a position outside the prompt. Another family's switches (``ModelConfig.differences_from_llama``) show in
    the same steps: QK-norm beside q and k, the sandwich norms beside o and m, GeGLU, the scales, the window.
    """
    config = model.config
    ids = check_ids(ids, config)
    p = check_position(position, len(ids))
    _, cache = probes.run_with_cache(model, [list(ids)])

    def vec(name):  # (B, T, C) -> (C,)
        return _np(cache[name][0, p])

    def heads(name):  # (B, H, T, D) -> (H, D)
        return _np(cache[name][0, :, p])

    def rms(name):  # (B, T, 1) -> scalar
        return float(cache[name][0, p, 0])

    layers = []
    for i in range(config.n_layers):
        b = f"blocks.{i}."
        extra = {}
        if config.qk_norm:
            extra.update(q_normed=heads(b + "attn.hook_q_normed"), k_normed=heads(b + "attn.hook_k_normed"))
        norm2 = mlp_norm_name(config)
        if config.sandwich_norm:
            block = model.blocks[i]
            with model_lock(model), torch.inference_mode():  # the modules' own products on the hooked inputs
                attn_raw = block.attn.o_proj(cache[b + "attn.hook_z"][0, :, p].reshape(1, -1))[0]
                mlp_raw = block.mlp.down_proj(cache[b + "mlp.hook_post"][0, p][None])[0]
            extra.update(attn_raw=_np(attn_raw), rms_attn=rms(b + "post_attention_layernorm.hook_scale"),
                         mlp_raw=_np(mlp_raw), rms_mlp=rms(b + "post_feedforward_layernorm.hook_scale"))
        layers.append(LayerTrace(
            layer=i, resid_pre=vec(b + "hook_resid_pre"), rms1=rms(b + "input_layernorm.hook_scale"),
            normed1=vec(b + "input_layernorm.hook_normalized"), q=heads(b + "attn.hook_q"),
            k=heads(b + "attn.hook_k"), v=heads(b + "attn.hook_v"), rot_q=heads(b + "attn.hook_rot_q"),
            rot_k=heads(b + "attn.hook_rot_k"), scores=heads(b + "attn.hook_attn_scores"),
            pattern=heads(b + "attn.hook_pattern"), z=heads(b + "attn.hook_z"), attn_out=vec(b + "hook_attn_out"),
            resid_mid=vec(b + "hook_resid_mid"), rms2=rms(b + f"{norm2}.hook_scale"),
            normed2=vec(b + f"{norm2}.hook_normalized"), gate=vec(b + "mlp.hook_gate"),
            up=vec(b + "mlp.hook_up"), post=vec(b + "mlp.hook_post"), mlp_out=vec(b + "hook_mlp_out"),
            resid_post=vec(b + "hook_resid_post"), **extra,
        ))
    logits = cache["hook_logits"][0, p].float()  # (V,)
    probs = torch.softmax(logits, dim=-1)
    top = torch.topk(probs, min(TOP_K, config.vocab_size))
    stream = torch.stack([cache["hook_embed"][0, p]] + [cache[f"blocks.{i}.hook_resid_post"][0, p]
                                                        for i in range(config.n_layers)])  # (L + 1, C)
    lens = _logit_lens(model, stream, int(top.indices[0]))
    return Walkthrough(
        config=config, ids=ids, position=p, attn_impl=cache.attn_impl, pattern_source=cache.pattern_source,
        embed=vec("hook_embed"), layers=tuple(layers), final_rms=rms("norm.hook_scale"),
        final_normed=vec("norm.hook_normalized"), logits=_np(logits), top_ids=to_host(top.indices).copy(),
        top_probs=_np(top.values), lens=lens,
    )


def _logit_lens(model: nn.Module, stream: torch.Tensor, final_id: int) -> LogitLens:
    """stream (L + 1, C): the residual stream before layer 0 and after each layer, at the chosen token."""
    # The model's own final norm and LM head modules: the last row is exactly the path the model takes.
    with model_lock(model), torch.inference_mode():
        logits = model.lm_head(model.norm(stream[None]))[0].float()  # (1, L + 1, C) -> (L + 1, V)
    probs = torch.softmax(logits, dim=-1)
    top = torch.topk(probs, min(LENS_K, probs.shape[-1]), dim=-1)
    rows = ("embedding",) + tuple(f"layer {i}" for i in range(stream.shape[0] - 1))
    return LogitLens(rows=rows, ids=to_host(top.indices).copy(), probs=_np(top.values), final_id=final_id,
                     final_probs=_np(probs[:, final_id]))
