"""Next-token loss: what training minimises, what a fine-tune reports, what a knock-out changes.

Notation: N rows, T positions, V vocabulary. Losses are in nats per token.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .hooks import as_tokens


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


def token_losses(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """logits (B, T, V) of a forward over tokens (B, T) -> (B, T - 1): the loss, in nats, of predicting each
    next token, computed in fp32 (position t is the loss of tokens[:, t + 1] given tokens[:, :t + 1])."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, T - 1, V)
    return -logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)


def per_token_loss(model: nn.Module, tokens) -> torch.Tensor:
    """The loss of predicting each next token of one sequence, in nats: (T,) or (1, T) ids -> (T - 1,)."""
    tokens = as_tokens(model, tokens)
    if tokens.shape[0] != 1 or tokens.shape[1] < 2:
        raise ValueError(f"per_token_loss takes one sequence of at least 2 tokens, got shape {tuple(tokens.shape)}.")
    with torch.inference_mode():
        return token_losses(model(tokens), tokens)[0]


@torch.no_grad()
def repeated_half_loss(model: nn.Module, span_len: int = 32, batch: int = 8, seed: int = 0) -> float:
    """Mean loss (nats per token) on the second copy of ``r`` in the induction probe ``[BOS] + r + r``
    (``lens.heads.repeated_random_tokens``, the same rows ``head_scores`` reads with this seed), from
    its second token on: the first token of the copy cannot be known, every later one can be copied."""
    from .heads import repeated_random_tokens

    config = model.config
    bos = config.bos_token_id
    tokens = repeated_random_tokens(config.vocab_size, span_len, batch, seed, bos_id=bos)
    device = next(model.parameters()).device
    losses = token_losses(model(tokens.to(device)), tokens.to(device))  # (B, P + 2*span - 1)
    n_prefix = 0 if bos is None else 1
    return float(losses[:, n_prefix + span_len:].mean())
