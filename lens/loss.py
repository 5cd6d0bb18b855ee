"""Next-token loss: what training minimises, what a fine-tune reports, what a knock-out changes.

Notation: N rows, T positions, V vocabulary. Losses are in nats per token.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def next_token_loss(model: nn.Module, rows: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats per token) of predicting rows[:, 1:] from rows[:, :-1]."""
    logits = model(rows[:, :-1])  # (N, T, V)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), rows[:, 1:].reshape(-1))


@torch.no_grad()
def evaluate_loss(model: nn.Module, rows: torch.Tensor, batch: int = 16) -> float:
    """Mean next-token loss over all rows (weighted by token count), in nats per token."""
    total, count = 0.0, 0
    for i in range(0, rows.shape[0], batch):
        chunk = rows[i:i + batch]
        n = chunk[:, 1:].numel()
        total += float(next_token_loss(model, chunk)) * n
        count += n
    return total / count
