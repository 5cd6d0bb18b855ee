"""Norms and feed-forwards: RMSNorm + SwiGLU (or GeGLU) for the decoder, LayerNorm + GELU for the encoder.

Notation: B batch, T positions, C model dim, F feed-forward dim.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ACTIVATIONS
from .hooks import HookPoint


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) * weight, computed in fp32 whatever the input dtype (as Llama does).

    offset (Gemma: 1.0): scale by ``offset + weight`` instead, multiplied in fp32 before the cast back (as Gemma
    does); such a checkpoint stores weights around 0, so a new one starts at ``1 - offset`` (a scale of 1).
    Hooks: hook_scale (B, T, 1) the RMS each position was divided by; hook_normalized (B, T, C) the output.
    """

    def __init__(self, dim: int, eps: float = 1e-5, offset: float = 0.0) -> None:
        super().__init__()
        self.eps, self.offset = eps, offset
        self.weight = nn.Parameter(torch.full((dim,), 1.0 - offset))
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        variance = x.pow(2).mean(-1, keepdim=True)  # (B, T, 1)
        if self.hook_scale.active:
            self.hook_scale(torch.sqrt(variance + self.eps))
        if self.offset:  # Gemma: (offset + w), in fp32
            out = (x * torch.rsqrt(variance + self.eps) * (self.offset + self.weight.float())).to(dtype)
        else:
            out = self.weight * (x * torch.rsqrt(variance + self.eps)).to(dtype)
        out = self.hook_normalized(out)
        return out


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm with the same two hook points as RMSNorm (hook_scale is the standard deviation)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__(dim, eps=eps)
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.hook_scale.active:
            self.hook_scale(torch.sqrt(x.float().var(-1, unbiased=False, keepdim=True) + self.eps))
        out = super().forward(x)
        out = self.hook_normalized(out)
        return out


class SwiGLU(nn.Module):
    """down_proj(act(gate_proj(x)) * up_proj(x)), bias-free, Llama's names. ``act`` "silu" is SwiGLU (Llama, Qwen);
    "gelu_pytorch_tanh", GELU's tanh approximation, makes it GeGLU (Gemma).

    Hooks: hook_gate (B, T, F) gate before the activation; hook_up (B, T, F); hook_post (B, T, F) the product fed to
    down_proj.
    """

    def __init__(self, d_model: int, d_ff: int, act: str = "silu") -> None:
        super().__init__()
        if act not in ACTIVATIONS:
            raise ValueError(f"the MLP activation must be one of {ACTIVATIONS}, got {act!r}.")
        self.act = act
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)
        self.hook_gate = HookPoint()
        self.hook_up = HookPoint()
        self.hook_post = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        gate = self.hook_gate(gate)
        up = self.hook_up(up)
        if self.act == "silu":
            h = F.silu(gate) * up
        else:  # Gemma's GeGLU
            h = F.gelu(gate, approximate="tanh") * up
        h = self.hook_post(h)
        return self.down_proj(h)


class GeluMLP(nn.Module):
    """The classic feed-forward: down_proj(gelu(up_proj(x))), with biases.

    Hooks: hook_pre (B, T, F) before GELU; hook_post (B, T, F) after it.
    """

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.up_proj = nn.Linear(d_model, d_ff)
        self.down_proj = nn.Linear(d_ff, d_model)
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up_proj(x)
        h = self.hook_pre(h)
        h = F.gelu(h)
        h = self.hook_post(h)
        return self.down_proj(h)


def replace_linears(model: nn.Module, targets, factory) -> list[str]:
    """Swap every ``nn.Linear`` whose attribute name is in ``targets`` for ``factory(linear)``.

    Returns the dotted paths replaced. Used by LoRA and int8 alike.
    """
    targets = set(targets)
    swapped = []
    for path, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if name in targets and type(child) is nn.Linear:
                setattr(parent, name, factory(child))
                swapped.append(f"{path}.{name}" if path else name)
    return swapped
