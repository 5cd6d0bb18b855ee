"""Generation: prefill the cache with the prompt, then decode one token at a time (gpt-fast's shape).

Every token is computed by the model's own modules unless the caller passes a faster one-token path (``step``,
e.g. ``models.speed.fast_step``), as gpt-fast adds ``torch.compile`` at its call site: what runs by default is
the code the tutorial shows.

Notation: B batch, T prompt length, V vocabulary.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Optional

import torch

from .decoder import check_tokens
from .kv_cache import KVCache

# A one-token path chosen by the caller: step(model, token (B, 1), cache, pos) -> next-token logits (B, V), or None
# to let the modules compute this step (it must return None for any model it does not compute exactly).
Step = Callable[[torch.nn.Module, torch.Tensor, KVCache, int], Optional[torch.Tensor]]


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise ValueError, saying what to change, for settings that cannot sample."""
    if not isinstance(temperature, (int, float)) or math.isnan(temperature) or temperature < 0:
        raise ValueError(f"temperature must be 0 (greedy) or positive, got {temperature!r}.")
    if math.isinf(temperature):
        raise ValueError("temperature must be finite; use a large value such as 100 for near-uniform sampling.")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}.")
    if top_p is not None and (not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must lie in (0, 1], got {top_p!r}.")


def sampling_probs(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None) -> torch.Tensor:
    """The distribution a sampler draws from. logits (B, V) -> probabilities (B, V), fp32.

    Temperature 0 gives all mass to the argmax. The logits are shifted so their max is 0 before
    dividing by the temperature, so tiny temperatures give a one-hot row, never NaN.
    """
    logits = logits.float()
    if temperature == 0:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    # Below fp32's smallest normal number the temperature itself would round to 0 (and 0/0 is NaN);
    # any temperature that small already means "argmax", which the clamp keeps.
    temperature = max(temperature, torch.finfo(torch.float32).tiny)
    logits = (logits - logits.amax(-1, keepdim=True)) / temperature  # max is exactly 0 in every row
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p is not None and top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # drop a token when the tokens ranked above it already reach top_p (the top token always stays)
        drop_sorted = (sorted_p.cumsum(-1) - sorted_p) >= top_p
        probs = probs.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(logits: torch.Tensor, *, temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """Next token for each row. logits (B, V) -> (B,) int64."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = sampling_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]  # (B, 1) -> (B,)


def prefill(model, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Run the prompt (B, T) through the model, filling the cache; next-token logits (B, V)."""
    return model(tokens, start_pos=0, cache=cache, last_only=True)[:, -1]  # (B, 1, V) -> (B, V)


def decode_one(model, token: torch.Tensor, cache: KVCache, pos: int, step: Step | None = None) -> torch.Tensor:
    """One new token (B, 1) at position ``pos``; next-token logits (B, V), computed by the model's modules, or by
    ``step`` when the caller passed one and it did not step aside (return None)."""
    if step is not None:
        logits = step(model, token, cache, pos)
        if logits is not None:
            return logits
    return model(token, start_pos=pos, cache=cache, last_only=True)[:, -1]  # (B, 1, V) -> (B, V)


@torch.inference_mode()
def generate(
    model,
    tokens: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    use_cache: bool = True,
    seed: int | None = None,
    on_step: Callable[[int, torch.Tensor, torch.Tensor, KVCache | None], None] | None = None,
    stop_tokens: Iterable[int] | None = None,
    step: Step | None = None,
) -> torch.Tensor:
    """Continue ``tokens`` (B, T) by up to ``max_new_tokens``; returns (B, T + n), n <= max_new_tokens.

    stop_tokens: ids that end a sequence (the model's end-of-text / end-of-turn tokens). Generation ends
    once every row has produced one (that token included); a row that ended earlier repeats its stop token
    while the others go on, so the batch stays rectangular.

    use_cache=False recomputes the whole sequence every step (the slow way the cache exists to avoid).
    seed makes sampling repeatable. on_step(step, logits (B, V), next_token (B,), cache or None) is
    called after each token is chosen.

    The prompt is checked here, once (``check_tokens``): no step after it validates ids, which on a GPU
    would wait for the device at every token.

    step: a faster one-token path for the cached decode steps (``models.speed.fast_step``); None (the default)
    runs the modules at every step. The prompt always runs through the modules.
    """
    check_sampling(temperature, top_k, top_p)
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}.")
    check_tokens(tokens, model.config)
    B, T = tokens.shape
    total = T + max_new_tokens
    if total > model.config.max_seq_len:
        raise ValueError(f"prompt ({T}) + new tokens ({max_new_tokens}) exceed the model's context of "
                         f"{model.config.max_seq_len}: ask for at most {model.config.max_seq_len - T} new tokens.")
    generator = None
    if seed is not None:
        generator = torch.Generator(device=tokens.device).manual_seed(seed)
    out = torch.empty((B, total), dtype=torch.long, device=tokens.device)
    out[:, :T] = tokens
    if max_new_tokens == 0:
        return out
    stop = torch.tensor(sorted(set(stop_tokens or ())), dtype=torch.long, device=tokens.device)
    finished = torch.zeros(B, dtype=torch.bool, device=tokens.device)
    cache = model.new_cache(B, total) if use_cache else None
    logits = prefill(model, tokens, cache) if use_cache else model(tokens, last_only=True)[:, -1]
    for i in range(max_new_tokens):
        nxt = sample(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)  # (B,)
        if len(stop):
            nxt = torch.where(finished, out[:, T + i - 1], nxt)  # a finished row repeats its stop token
        out[:, T + i] = nxt
        if on_step is not None:
            on_step(i, logits, nxt, cache)
        if len(stop):
            finished |= torch.isin(nxt, stop)
            if bool(finished.all()):  # one device sync per step, only when stop tokens were asked for
                return out[:, :T + i + 1]
        if i == max_new_tokens - 1:
            break
        pos = T + i
        if use_cache:
            logits = decode_one(model, out[:, pos:pos + 1], cache, pos, step)
        else:
            logits = model(out[:, :pos + 1], last_only=True)[:, -1]
    return out
