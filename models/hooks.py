"""Hook points: identity modules that name a place in the model (TransformerLens' idea).

A hook point's path in the module tree is its name (``blocks.3.attn.hook_pattern``). The model calls a
hook point only when something is registered on it, and ignores what it returns: hooks observe, they
never change what the model computes.
"""
from __future__ import annotations

import torch
from torch import nn


class HookPoint(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @property
    def active(self) -> bool:
        """True when a forward hook is registered here."""
        return bool(self._forward_hooks)

    def observe(self, x: torch.Tensor) -> None:
        """Show ``x`` to the registered hooks, if any; a no-op (one dict check) otherwise."""
        if self._forward_hooks:
            self(x)
