"""A stand-in model for loss tests: whatever it is given, it returns the logits it was built with."""
from __future__ import annotations

import torch


class FixedLogits(torch.nn.Module):
    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits
