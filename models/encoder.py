"""A classic Transformer encoder: embedding scaled by √C, sinusoidal absolute positions, pre-norm blocks
with LayerNorm, bidirectional multi-head attention and a GELU feed-forward, final LayerNorm.

Notation: B batch, T positions, C model dim.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .attention import Attention
from .block import PreNormBlock, SwitchableAttention
from .config import ModelConfig
from .decoder import check_positions, init_weights
from .hooks import HookPoint
from .layers import GeluMLP, LayerNorm
from .rope import sinusoidal_table


class EncoderBlock(PreNormBlock):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(
            LayerNorm(config.d_model, config.norm_eps),
            Attention(config.d_model, config.n_heads, config.n_kv_heads, causal=False, use_rope=False,
                      impl=config.attn_impl, tile_size=config.tile_size),
            LayerNorm(config.d_model, config.norm_eps),
            GeluMLP(config.d_model, config.d_ff),
        )


class Encoder(SwitchableAttention, nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.register_buffer("positions", sinusoidal_table(config.max_seq_len, config.d_model), persistent=False)
        self.blocks = nn.ModuleList(EncoderBlock(config) for _ in range(config.n_layers))
        self.norm = LayerNorm(config.d_model, config.norm_eps)
        self.hook_embed = HookPoint()
        self.apply(init_weights)

    def forward(self, tokens: torch.Tensor, *, key_padding: torch.Tensor | None = None, causal: bool = False,
                attn_impl: str | None = None) -> torch.Tensor:
        """tokens (B, T) -> hidden states (B, T, C). key_padding: bool (B, T), False on padding tokens.

        Token ids are not range-checked here (see ``models.decoder.check_tokens``, called where ids come in).
        """
        check_positions(tokens, self.config)
        T = tokens.shape[1]
        x = self.embed_tokens(tokens) * math.sqrt(self.config.d_model) + self.positions[:T]  # (B, T, C)
        x = self.hook_embed(x)
        for block in self.blocks:
            x = block(x, key_padding=key_padding, causal=causal, impl=attn_impl)
        return self.norm(x)


class EncoderForMaskedLM(nn.Module):
    """The encoder with BERT's masked-language-model output: logits = hidden · Eᵀ + b, where E is the
    token embedding (tied, so the head adds only the bias b). tokens (B, T) -> logits (B, T, V)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.mlm_bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, tokens: torch.Tensor, **encoder_kwargs) -> torch.Tensor:
        hidden = self.encoder(tokens, **encoder_kwargs)  # (B, T, C)
        return nn.functional.linear(hidden, self.encoder.embed_tokens.weight, self.mlm_bias)  # (B, T, V)
