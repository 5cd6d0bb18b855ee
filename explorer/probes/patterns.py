"""Attention patterns, the three implementations compared, and head scores.

Notation: ``L`` layers, ``B`` batch, ``H`` query heads, ``T`` queries, ``S`` keys.
"""
from __future__ import annotations

from typing import TypedDict

import numpy as np
import torch

from lens.device import to_host
from torch import nn

from models.config import ATTN_IMPLS

from lens.heads import is_pattern
from lens.hooks import as_tokens, check_head, check_layer, run_with_cache


def _causal_kwargs(causal: bool | None) -> dict:
    return {} if causal is None else {"causal": bool(causal)}


def attention_pattern(model: nn.Module, tokens, layer: int, head: int | None = None, *,
                      causal: bool | None = None, attn_impl: str | None = None, **forward_kwargs) -> np.ndarray:
    """Attention weights of one layer for the first sequence: (H, T, T), or (T, T) for one ``head``.

    causal: None keeps the model's own masking (decoder causal, encoder bidirectional).
    forward_kwargs: passed to the model for this call (a decoder's ``rope_theta``, for instance).
    Rows are queries (the token asking), columns keys (the token looked at); each row sums to 1.
    """
    check_layer(model, layer)
    if head is not None:
        check_head(model, head)
    name = f"blocks.{layer}.attn.hook_pattern"
    _, cache = run_with_cache(model, tokens, [name], attn_impl=attn_impl, **_causal_kwargs(causal), **forward_kwargs)
    p = to_host(cache[name][0])  # (H, T, S), the figure boundary
    return p if head is None else p[head]


def patterns_with_source(model: nn.Module, tokens, *, causal: bool | None = None,
                         attn_impl: str | None = None) -> tuple[np.ndarray, str]:
    """``all_patterns`` and the sentence saying how the weights were obtained (``ActivationCache.pattern_source``)."""
    _, cache = run_with_cache(model, tokens, is_pattern, attn_impl=attn_impl, **_causal_kwargs(causal))
    return to_host(cache.stack("attn.hook_pattern")[:, 0]), cache.pattern_source


class PromptForward(TypedDict):
    """One forward of a prompt, everything the Attention tab reads from it."""
    patterns: np.ndarray  # (L, H, T, T) float32
    source: str  # how the weights were obtained
    top_ids: np.ndarray  # (k,) the most likely next tokens after the last one
    top_probs: np.ndarray  # (k,) their probabilities (softmax of the last logits, float64)
    logits: torch.Tensor  # (1, T, V) the forward's output for the first sequence (compare_impls' known)
    attn_impl: str  # the implementation that forward ran


def prompt_forward(model: nn.Module, tokens, *, causal: bool | None = None, top_k: int = 5) -> PromptForward:
    """Every head's weights and the next-token prediction after the last token, from one forward pass."""
    logits, cache = run_with_cache(model, tokens, is_pattern, **_causal_kwargs(causal))
    probs = torch.softmax(logits[0, -1].double(), dim=-1)  # (V,)
    top = torch.topk(probs, min(top_k, probs.shape[-1]))
    return PromptForward(patterns=to_host(cache.stack("attn.hook_pattern")[:, 0]), source=cache.pattern_source,
                         top_ids=to_host(top.indices), top_probs=to_host(top.values), logits=logits[:1].detach(),
                         attn_impl=cache.attn_impl)


def all_patterns(model: nn.Module, tokens, *, causal: bool | None = None,
                 attn_impl: str | None = None) -> np.ndarray:
    """Every layer's and head's weights for the first sequence: (L, H, T, T), float32."""
    return patterns_with_source(model, tokens, causal=causal, attn_impl=attn_impl)[0]


def compare_impls(model: nn.Module, tokens, *, known: dict[str, torch.Tensor] | None = None,
                  **forward_kwargs) -> dict[str, float]:
    """Max |output - naive output| for each implementation (decoder logits, encoder hidden states).

    Runs without hooks, under ``torch.inference_mode``. ``{"naive": 0.0, "sdpa": ..., "tiled": ...}``.
    known: ``{impl: output}`` already computed for these tokens and arguments (a recorded forward: hooks only
    observe, so it is the same tensor): those implementations are not run again.
    """
    tokens = as_tokens(model, tokens, forward_kwargs.get("start_pos", 0))
    known = {impl: out for impl, out in (known or {}).items() if impl in ATTN_IMPLS}
    with torch.inference_mode():
        outs = {impl: (known[impl] if impl in known else model(tokens, attn_impl=impl, **forward_kwargs)).float()
                for impl in ATTN_IMPLS}
    return {impl: float((out - outs["naive"]).abs().max()) for impl, out in outs.items()}


# --------------------------------------------------------------------------------------------------
# Head scores
# --------------------------------------------------------------------------------------------------
