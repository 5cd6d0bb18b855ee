"""Low-rank adapters (LoRA): ``y = W0 x + (alpha / r) · B A x`` with ``W0`` frozen.

Notation: ``in``/``out`` the features of the adapted linear, ``r`` the rank.
``A`` (r, in) starts random, ``B`` (out, r) starts at zero, so a fresh adapter changes nothing, to the bit.
"""
from __future__ import annotations

import copy
import math

import torch
from torch import nn

from .block import PROJECTIONS
from .layers import replace_linears

def check_lora(rank: int, alpha: float, linears=(), *, shapes=()) -> None:
    """Raise ValueError, saying what to change, unless ``rank`` and ``alpha`` fit every given projection.

    linears: ``nn.Linear`` layers to adapt; shapes: (out_features, in_features) pairs of projections not
    built yet (a form checking its settings before any model is touched). The rank must be at most the
    smaller side of each: above it, B A (out x r times r x in) holds more numbers than the weight it
    updates, and its rank is capped by that side anyway.
    """
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise ValueError(f"LoRA rank must be a positive integer, got {rank!r}.")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"LoRA alpha must be a positive number, got {alpha!r}.")
    sides = [min(lin.out_features, lin.in_features) for lin in linears] + [min(out, in_) for out, in_ in shapes]
    smallest = min(sides, default=rank)
    if rank > smallest:
        raise ValueError(f"rank {rank} exceeds the smaller side ({smallest}) of a chosen projection: choose a rank "
                         f"of at most {smallest}, where a low-rank update is still smaller than the weight.")


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, *, rank: int, alpha: float) -> None:
        super().__init__()
        check_lora(rank, alpha, [base])
        self.base = base
        base.weight.requires_grad_(False)
        w = base.weight
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, dtype=w.dtype, device=w.device))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, dtype=w.dtype, device=w.device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # as nn.Linear initialises its weight
        self.rank, self.alpha = rank, float(alpha)
        self.scale = self.alpha / rank
        self.merged = False  # B A has been added into base.weight
        self.disabled = False  # adapter switched off: the layer computes W0 x alone

    def delta_weight(self) -> torch.Tensor:
        """(alpha / r) · B A, shape (out, in)."""
        return (self.lora_B @ self.lora_A) * self.scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if self.merged or self.disabled:
            return y
        return y + (x @ self.lora_A.T @ self.lora_B.T) * self.scale  # (..., in) -> (..., r) -> (..., out)

    @torch.no_grad()
    def merge(self) -> None:
        if not self.merged:
            if self.disabled:
                raise ValueError("switch the adapter on before merging it.")
            self.base.weight += self.delta_weight()
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """Subtract B A again; W0 comes back up to float rounding."""
        if self.merged:
            self.base.weight -= self.delta_weight()
            self.merged = False

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha}, merged={self.merged}, disabled={self.disabled}"


def lora_layers(model: nn.Module) -> list[LoRALinear]:
    return [m for m in model.modules() if isinstance(m, LoRALinear)]


def attach_lora(model: nn.Module, targets=("q_proj", "v_proj"), *, rank: int = 8, alpha: float = 16.0) -> list[str]:
    """Wrap the named projections of every block in LoRA adapters; freeze everything else.

    Returns the adapted module paths. Raises ValueError for unknown targets or an adapted model.
    """
    targets = tuple(targets)
    unknown = [t for t in targets if t not in PROJECTIONS]
    if not targets or unknown:
        raise ValueError(f"LoRA targets must be a non-empty subset of {PROJECTIONS}, got {list(targets)}.")
    if lora_layers(model):
        raise ValueError("this model already has LoRA adapters: detach them first.")
    check_lora(rank, alpha, [m for n, m in model.named_modules()
                             if type(m) is nn.Linear and n.rsplit(".", 1)[-1] in targets])  # before any change
    for p in model.parameters():
        p.requires_grad_(False)
    return replace_linears(model, targets, lambda lin: LoRALinear(lin, rank=rank, alpha=alpha))


def detach_lora(model: nn.Module) -> int:
    """Put every adapted projection back as its plain ``nn.Linear`` holding W0 (unmerged). Returns how many."""
    count = 0
    for path, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, LoRALinear):
                child.unmerge()
                setattr(parent, name, child.base)
                count += 1
    return count


def merge_lora(model: nn.Module) -> None:
    for layer in lora_layers(model):
        layer.merge()


def unmerge_lora(model: nn.Module) -> None:
    for layer in lora_layers(model):
        layer.unmerge()


def set_lora_enabled(model: nn.Module, enabled: bool) -> None:
    """Switch adapters on or off (a merged adapter is unmerged first, so "off" really means W0)."""
    for layer in lora_layers(model):
        if not enabled:
            layer.unmerge()
        layer.disabled = not enabled


ADAPTER_MODES = ("off", "on", "merged")


def adapter_mode(model: nn.Module) -> str | None:
    """The adapters' state: "off" (W0 x), "on" (W0 x + (alpha/r) B A x), "merged" (B A added into W0),
    or None when the model has no LoRA layers. Raises ValueError when layers disagree in a way no single
    mode describes (some off, some on): ``set_adapter_mode`` puts them in one state.
    """
    layers = lora_layers(model)
    if not layers:
        return None
    if all(layer.disabled for layer in layers):
        return "off"
    if any(layer.disabled for layer in layers):
        raise ValueError("some LoRA adapters are off and others on: call set_adapter_mode(model, mode) to put them "
                         "all in one state.")
    # A mix of merged and unmerged layers computes what "on" computes (up to rounding).
    return "merged" if all(layer.merged for layer in layers) else "on"


def set_adapter_mode(model: nn.Module, mode: str) -> None:
    """Put every adapter in ``mode``: "off", "on" or "merged" (see ``adapter_mode``).

    "merged" gives the outputs of "on" up to rounding, without the extra B A work per token. "off" gives
    W0 x to the bit unless the adapter has been merged since it was attached: unmerging subtracts B A
    again, which brings W0 back only up to float rounding.
    """
    if mode not in ADAPTER_MODES:
        raise ValueError(f"adapter mode must be one of {ADAPTER_MODES}, got {mode!r}.")
    layers = lora_layers(model)
    if not layers:
        raise ValueError("this model has no LoRA adapters to switch: attach (fine-tune) one first.")
    for layer in layers:
        if mode != "merged":  # a merged layer staying merged is left alone: each round trip adds rounding
            layer.unmerge()
        layer.disabled = mode == "off"
        if mode == "merged":
            layer.merge()


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Trainable and frozen parameter counts (each shared tensor once)."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return {"trainable": trainable, "frozen": total - trainable, "total": total}


@torch.no_grad()
def folded_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with plain ``nn.Linear`` layers holding the weights it computes with now: each adapter
    that is on added into its base weight (W0 + (alpha/r) B A), each adapter that is off left out (W0). The
    original is untouched; a model without adapters comes back as a plain copy."""
    out = copy.deepcopy(model)
    for parent in list(out.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, LoRALinear):
                if not child.disabled:
                    child.merge()
                setattr(parent, name, child.base)
    return out
