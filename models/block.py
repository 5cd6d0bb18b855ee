"""The pre-norm residual block both models share: x + attn(norm(x)), then x + mlp(norm(x)).

With ``sandwich`` norms (Gemma 3) each sublayer's output is normalised too before it joins the residual stream:
x + norm(attn(norm(x))), then x + norm(mlp(norm(x))): four norms a block. The modules keep transformers' names,
which then mean different places: Llama's ``post_attention_layernorm`` is the norm before the MLP; Gemma's is the
norm after attention, and its norm before the MLP is ``pre_feedforward_layernorm``.

Notation: B batch, T positions, C model dim.
Hooks: hook_resid_pre, hook_attn_out, hook_resid_mid, hook_mlp_out, hook_resid_post, all (B, T, C); with
sandwich norms hook_attn_out and hook_mlp_out are the normalised outputs (each norm's own hook_normalized too).
"""
from __future__ import annotations

import torch
from torch import nn

from .attention import Attention
from .config import check_attn_impl
from .hooks import HookPoint

# The linear projections of a block, named as transformers' Llama names them (what LoRA and int8 may replace).
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class PreNormBlock(nn.Module):
    def __init__(self, input_layernorm: nn.Module, attn: Attention, post_attention_layernorm: nn.Module,
                 mlp: nn.Module, *, pre_feedforward_layernorm: nn.Module | None = None,
                 post_feedforward_layernorm: nn.Module | None = None) -> None:
        """Llama: ``post_attention_layernorm`` is the norm before the MLP. Sandwich (Gemma): give the two feed-forward
        norms as well; ``post_attention_layernorm`` then normalises the attention's output."""
        super().__init__()
        if (pre_feedforward_layernorm is None) != (post_feedforward_layernorm is None):
            raise ValueError("sandwich norms need both pre_feedforward_layernorm and post_feedforward_layernorm.")
        self.input_layernorm = input_layernorm
        self.attn = attn
        self.post_attention_layernorm = post_attention_layernorm
        self.sandwich = pre_feedforward_layernorm is not None
        if self.sandwich:
            self.pre_feedforward_layernorm = pre_feedforward_layernorm
        self.mlp = mlp
        if self.sandwich:
            self.post_feedforward_layernorm = post_feedforward_layernorm
        for name in ("resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post"):
            setattr(self, f"hook_{name}", HookPoint())

    def forward(self, x: torch.Tensor, **attn_kwargs) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C); ``attn_kwargs`` go to the attention module (rope, cache, masks...)."""
        x = self.hook_resid_pre(x)
        a = self.attn(self.input_layernorm(x), **attn_kwargs)
        if self.sandwich:  # Gemma: the attention's output is normalised before it is added
            a = self.post_attention_layernorm(a)
        a = self.hook_attn_out(a)
        x = x + a
        x = self.hook_resid_mid(x)
        if self.sandwich:
            m = self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        else:
            m = self.mlp(self.post_attention_layernorm(x))
        m = self.hook_mlp_out(m)
        x = x + m
        x = self.hook_resid_post(x)
        return x


class SwitchableAttention:
    """``set_attn_impl`` for a model whose blocks are ``PreNormBlock``s in ``self.blocks``."""

    def set_attn_impl(self, name: str):
        """Choose "naive", "sdpa" or "tiled" for every layer from now on."""
        self.config.attn_impl = check_attn_impl(name)
        for block in self.blocks:
            block.attn.impl = name
        return self
