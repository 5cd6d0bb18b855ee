"""A Llama-style decoder: token embedding, pre-norm blocks (RMSNorm, RoPE attention with grouped-query
heads, SwiGLU), final RMSNorm, LM head (optionally tied to the embedding).

The other families that load differ by the switches of ``ModelConfig`` (``config.FAMILY_SWITCHES``), each applied
where it acts: here the embedding scale (Gemma) and, per layer, the sliding window and the RoPE tables of local
layers; the rest in ``layers`` (norm offset, activation), ``attention`` (biases, QK-norm, head dim, scale, window
mask) and ``block`` (sandwich norms).

Notation: B batch, T positions in this call, S positions attended (cache included), V vocabulary,
C model dim, H query heads, Hkv key/value heads, D head dim.

Parameter names are transformers' Llama leaf names under our module paths (``blocks.{i}.attn.q_proj``
for ``model.layers.{i}.self_attn.q_proj``); ``models.loading`` maps the two prefixes.
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch
from torch import nn

from .attention import Attention
from .block import PreNormBlock, SwitchableAttention
from .config import ModelConfig, check_attn_impl
from .hooks import HookPoint
from .kv_cache import KVCache
from .layers import RMSNorm, SwiGLU
from .rope import rope_tables


class DecoderBlock(PreNormBlock):
    def __init__(self, config: ModelConfig, layer: int = 0) -> None:
        c = config

        def norm(dim: int = c.d_model) -> RMSNorm:
            return RMSNorm(dim, c.norm_eps, c.norm_offset)

        super().__init__(
            norm(),
            Attention(c.d_model, c.n_heads, c.n_kv_heads, causal=True, use_rope=True, impl=c.attn_impl,
                      tile_size=c.tile_size, head_dim=c.head_dim, qkv_bias=c.qkv_bias, o_bias=c.o_bias,
                      qk_norm=c.qk_norm, norm_eps=c.norm_eps, norm_offset=c.norm_offset, scale=c.attn_scale,
                      sliding_window=c.layer_window(layer)),
            norm(),
            SwiGLU(c.d_model, c.d_ff, c.hidden_act),
            pre_feedforward_layernorm=norm() if c.sandwich_norm else None,
            post_feedforward_layernorm=norm() if c.sandwich_norm else None,
        )


class Decoder(SwitchableAttention, nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(DecoderBlock(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps, config.norm_offset)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        cos, sin = rope_tables(config.max_seq_len, config.head_dim, config.rope_theta,
                               config.rope_scaling)  # (T_max, D) each
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        cos = sin = None
        if config.local_rope_theta is not None:  # Gemma 3: local layers turn at their own speeds
            cos, sin = rope_tables(config.max_seq_len, config.head_dim, config.local_rope_theta)  # (T_max, D) each
        self.register_buffer("rope_local_cos", cos, persistent=False)
        self.register_buffer("rope_local_sin", sin, persistent=False)
        self.hook_embed = HookPoint()
        self.hook_logits = HookPoint()
        self.apply(init_weights)

    def forward(
        self,
        tokens: torch.Tensor,
        *,
        start_pos: int = 0,
        cache: KVCache | None = None,
        key_padding: torch.Tensor | None = None,
        causal: bool = True,
        attn_impl: str | None = None,
        last_only: bool = False,
        rope_theta: float | None = None,
        start_at_layer: int = 0,
        resid: torch.Tensor | None = None,
        stop_at_layer: int | None = None,
    ) -> torch.Tensor:
        """tokens (B, T) -> logits (B, T, V), or (B, 1, V) with ``last_only``.

        start_pos: position of tokens[:, 0]; with a ``cache`` the new keys/values are written there and
        attention covers positions 0 .. start_pos + T - 1. key_padding: bool (B, S), False on padding keys.
        causal=False lets every token see every other (a view for teaching; the model was trained causal).
        attn_impl: use this implementation for this call only.
        rope_theta: rotate q and k with tables for this theta, this call only (the model's own tables and
        config stay as they are): the same weights seen through other rotary frequencies (the model's RoPE
        scaling, if any, applied to them as to its own), in every layer, local ones included.
        start_at_layer, resid: begin at block ``start_at_layer`` with ``resid`` (B, T, C), the residual stream
        entering it, instead of the embedded ``tokens`` (which still give B and T): an intervention at layer l
        need not recompute the layers before it (TransformerLens' ``start_at_layer``).
        stop_at_layer: end before block ``stop_at_layer`` and return the residual stream entering it (B, T, C)
        instead of logits (TransformerLens' ``stop_at_layer``): with ``start_at_layer`` one block at a time, so a
        caller may add rows to the batch between blocks.

        The token ids are not range-checked here: reading them is a host sync on a GPU, once per decode
        step. Callers that take ids from outside call ``check_tokens`` once (``generate`` does).
        """
        check_positions(tokens, self.config, start_pos)
        if attn_impl is not None:
            check_attn_impl(attn_impl)
        T = tokens.shape[1]
        if rope_theta is None:
            cos, sin = self.rope_cos, self.rope_sin  # (T_max, D) each
        else:
            scaling = self.config.rope_scaling
            cos, sin = _rope_tables_for(start_pos + T, self.config.head_dim, _check_theta(rope_theta),
                                        tuple(scaling.items()) if scaling else None,
                                        self.rope_cos.dtype, self.rope_cos.device)  # (start_pos + T, D) each
        rope = (cos[start_pos:start_pos + T], sin[start_pos:start_pos + T])  # (T, D) each
        local_rope = rope
        if self.rope_local_cos is not None and rope_theta is None:
            local_rope = (self.rope_local_cos[start_pos:start_pos + T], self.rope_local_sin[start_pos:start_pos + T])
        if resid is None and start_at_layer == 0:
            x = self.embed_tokens(tokens)  # (B, T, C)
            if self.config.embed_scale != 1.0:  # Gemma: times sqrt(C), rounded to the weights' dtype as Gemma rounds it
                x = x * torch.tensor(self.config.embed_scale, dtype=x.dtype)
            x = self.hook_embed(x)
        else:
            x = _check_resid(resid, start_at_layer, tokens.shape, self.config)
        stop = len(self.blocks) if stop_at_layer is None else _check_stop(stop_at_layer, start_at_layer, self.config)
        for i in range(start_at_layer, stop):
            block = self.blocks[i]
            x = block(x, rope=rope if block.attn.sliding_window is None else local_rope, cache=cache, layer=i,
                      start_pos=start_pos, key_padding=key_padding, causal=causal, impl=attn_impl)
        if stop_at_layer is not None:
            return x  # (B, T, C): the residual stream entering block ``stop``
        if last_only:
            x = x[:, -1:]  # (B, 1, C): generation needs only the next-token logits
        logits = self.lm_head(self.norm(x))  # (B, T, V)
        logits = self.hook_logits(logits)
        return logits

    def new_cache(self, batch: int, max_len: int | None = None) -> KVCache:
        """A fresh preallocated cache in this model's dtype and device."""
        p = self.embed_tokens.weight
        return KVCache.for_model(self.config, batch, max_len, dtype=p.dtype, device=p.device)

    def num_parameters(self) -> int:
        """Distinct parameters (a tied embedding counts once)."""
        return sum(p.numel() for p in self.parameters())


def check_tokens(tokens: torch.Tensor, config: ModelConfig, start_pos: int = 0) -> None:
    """Raise ValueError, saying what to change, unless ``tokens`` is a (B, T) integer tensor of ids in
    0 .. V-1 at positions ``start_pos`` .. ``start_pos + T - 1`` inside the context.

    Reading the ids (min and max) waits for the device: call this once where ids come in from outside
    (``generate``, the app), not inside every forward.
    """
    check_positions(tokens, config, start_pos)
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= config.vocab_size:
        raise ValueError(f"token ids must lie in 0..{config.vocab_size - 1}, got {lo}..{hi}.")


def check_positions(tokens: torch.Tensor, config: ModelConfig, start_pos: int = 0) -> None:
    # Shape, dtype and positions only: metadata the host already knows, so this costs no device sync.
    if tokens.dim() != 2 or tokens.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"tokens must be an integer tensor of shape (batch, length), got {tuple(tokens.shape)} "
                         f"{tokens.dtype}.")
    if tokens.shape[1] == 0:
        raise ValueError("tokens is empty: give at least one token.")
    if start_pos < 0 or start_pos + tokens.shape[1] > config.max_seq_len:
        raise ValueError(f"positions {start_pos}..{start_pos + tokens.shape[1] - 1} exceed the model's context "
                         f"of {config.max_seq_len}: shorten the input.")


def _check_theta(theta) -> float:
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta) or theta <= 1:
        raise ValueError(f"rope_theta must be a finite number greater than 1, got {theta!r}.")
    return float(theta)


# A figure redrawn for one rope_theta override calls the forward several times with it: the last two tables asked
# for are kept (bounded: two pairs of (length, D) tensors), so each is built once.
@lru_cache(maxsize=2)
def _rope_tables_for(length: int, head_dim: int, theta: float, scaling: tuple | None, dtype: torch.dtype,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    # Built outside inference mode so a later call with autograd on may still use them.
    with torch.inference_mode(False), torch.no_grad():
        cos, sin = rope_tables(length, head_dim, theta, dict(scaling) if scaling else None)  # (length, D) each
        return cos.to(device=device, dtype=dtype), sin.to(device=device, dtype=dtype)


def init_weights(module: nn.Module) -> None:
    # Llama's initializer_range: N(0, 0.02) for every linear and embedding, norms at one.
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)


def _check_resid(resid: torch.Tensor | None, layer: int, token_shape, config: ModelConfig) -> torch.Tensor:
    if not isinstance(layer, int) or not 0 <= layer <= config.n_layers:
        raise ValueError(f"start_at_layer must be between 0 and {config.n_layers}, got {layer!r}.")
    shape = (*token_shape, config.d_model)
    if resid is None or tuple(resid.shape) != shape:
        got = "nothing" if resid is None else tuple(resid.shape)
        raise ValueError(f"starting at layer {layer} needs resid, the residual stream entering it, of shape "
                         f"{shape} (batch, positions, model dim); got {got}.")
    return resid


def _check_stop(stop: int, start: int, config: ModelConfig) -> int:
    if isinstance(stop, bool) or not isinstance(stop, int) or not start <= stop <= config.n_layers:
        raise ValueError(f"stop_at_layer must be between start_at_layer ({start}) and {config.n_layers}, got {stop!r}.")
    return stop
