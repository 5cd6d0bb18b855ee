"""The pre-norm residual block both models share: x + attn(norm(x)), then x + mlp(norm(x)).

Notation: B batch, T positions, C model dim.
Hooks: hook_resid_pre, hook_attn_out, hook_resid_mid, hook_mlp_out, hook_resid_post, all (B, T, C).
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
                 mlp: nn.Module) -> None:
        super().__init__()
        self.input_layernorm = input_layernorm
        self.attn = attn
        self.post_attention_layernorm = post_attention_layernorm
        self.mlp = mlp
        for name in ("resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post"):
            setattr(self, f"hook_{name}", HookPoint())

    def forward(self, x: torch.Tensor, **attn_kwargs) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C); ``attn_kwargs`` go to the attention module (rope, cache, masks...)."""
        x = self.hook_resid_pre(x)
        a = self.attn(self.input_layernorm(x), **attn_kwargs)
        a = self.hook_attn_out(a)
        x = x + a
        x = self.hook_resid_mid(x)
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
