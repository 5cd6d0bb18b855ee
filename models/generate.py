"""Generation: prefill the cache with the prompt, then decode one token at a time (gpt-fast's shape).

Every token is computed by the model's own modules unless the caller passes a faster one-token path (``step``,
e.g. ``models.speed.fast_step``), as gpt-fast adds ``torch.compile`` at its call site: what runs by default is
the code the tutorial shows.

Notation: B batch, T prompt length, V vocabulary.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Iterator, NamedTuple, Optional

import torch

from .decoder import check_tokens
from .kv_cache import KVCache

# A one-token path chosen by the caller: step(model, token (B, 1), cache, pos) -> next-token logits (B, V), or None
# to let the modules compute this step (it must return None for any model it does not compute exactly).
Step = Callable[[torch.nn.Module, torch.Tensor, KVCache, int], Optional[torch.Tensor]]

# Besides 0 (greedy), the temperatures accepted: for realistic logits 1e-9 already samples greedily and 1e12
# uniformly, so nothing beyond them is worth the extremes of float32 division.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-9, 1e12


def _shown(x) -> str:
    return f"{x:g}" if isinstance(x, (int, float)) and not isinstance(x, bool) else repr(x)


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise ValueError, saying what to change, for settings that cannot sample (the one place these rules live:
    the app's generation tab turns its boxes into numbers and asks here)."""
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or math.isnan(temperature):
        raise ValueError(f"temperature must be a number, got {_shown(temperature)}.")
    if temperature < 0:
        raise ValueError(f"temperature must be 0 (greedy) or positive, got {_shown(temperature)}.")
    if temperature > MAX_TEMPERATURE:
        raise ValueError("temperature must be at most 1e12 (a finite number); 100 already samples almost "
                         "uniformly.")
    if 0 < temperature < MIN_TEMPERATURE:
        raise ValueError(f"temperature must be 0 (greedy) or at least 1e-9, got {_shown(temperature)}: below that "
                         "the softmax overflows; use 0 for greedy decoding.")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise ValueError(f"top-k must be a whole number of at least 1 (blank or None for no cut-off), got "
                         f"{_shown(top_k)}.")
    if top_p is not None and (not isinstance(top_p, (int, float)) or isinstance(top_p, bool)
                              or not 0.0 < top_p <= 1.0):
        raise ValueError(f"top-p must lie in (0, 1] (1 = no cut-off), got {_shown(top_p)}.")


def check_lengths(model, tokens: torch.Tensor, max_new_tokens: int) -> None:
    """Raise ValueError, saying what to change, unless ``tokens`` (B, T) holds ids the model reads and T plus
    ``max_new_tokens`` fits its context. The ids are read here, once: no step after it validates them, which on
    a GPU would wait for the device at every token."""
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}.")
    check_tokens(tokens, model.config)
    T, context = tokens.shape[1], model.config.max_seq_len
    if T + max_new_tokens > context:
        raise ValueError(f"prompt ({T}) + new tokens ({max_new_tokens}) exceed the model's context of {context}: "
                         f"ask for at most {context - T} new tokens.")


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


class NewToken(NamedTuple):
    """One step of ``generate_steps``: the tokens chosen and what they were chosen from."""
    index: int  # 0 for the first new token (chosen from the prompt's forward)
    position: int  # where the tokens go in the sequence: T + index
    token: torch.Tensor  # (B,) int64
    logits: torch.Tensor  # (B, V): the next-token logits the tokens were drawn from
    cache: KVCache | None  # the KV cache after this step's forward (None without a cache)
    fast: bool  # True when ``step`` computed ``logits`` (never for the prompt's forward)


def generate_steps(model, tokens: torch.Tensor, max_new_tokens: int, *, temperature: float = 0.0,
                   top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None,
                   use_cache: bool = True, stop_tokens: Iterable[int] | None = None,
                   step: Step | None = None) -> Iterator[NewToken]:
    """The generation loop, one new token per ``next()``: continue ``tokens`` (B, T) by up to ``max_new_tokens``.

    Everything is checked here, before the first step (``check_sampling``, ``check_lengths``). Each ``next()``
    computes one step (the prompt's prefill, or one token's decode) and samples from it, so a caller that times or
    locks around ``next()`` times or locks exactly one step; nothing runs while the caller holds a ``NewToken``.

    stop_tokens: ids that end a sequence. The loop ends once every row has produced one (that step included); a
    row that ended earlier repeats its stop token while the others go on, so the batch stays rectangular.
    use_cache=False recomputes the whole sequence every step (the slow way the cache exists to avoid).
    step: a faster one-token path for the cached decode steps (``models.speed.fast_step``); None runs the modules.
    """
    check_sampling(temperature, top_k, top_p)
    check_lengths(model, tokens, max_new_tokens)
    return _steps(model, tokens, max_new_tokens, temperature, top_k, top_p, generator, use_cache,
                  sorted(set(stop_tokens or ())), step)


@torch.inference_mode()
def _steps(model, tokens, max_new_tokens, temperature, top_k, top_p, generator, use_cache, stop_ids, step):
    B, T = tokens.shape
    out = torch.empty((B, T + max_new_tokens), dtype=torch.long, device=tokens.device)
    out[:, :T] = tokens
    stop = torch.tensor(stop_ids, dtype=torch.long, device=tokens.device)
    finished = torch.zeros(B, dtype=torch.bool, device=tokens.device)
    cache = None
    for i in range(max_new_tokens):
        pos, fast = T + i, False  # the new token goes at pos; the one before it is the last one fed
        if i == 0:
            cache = model.new_cache(B, T + max_new_tokens) if use_cache else None
            logits = prefill(model, tokens, cache) if use_cache else model(tokens, last_only=True)[:, -1]
        elif use_cache:
            logits = None if step is None else step(model, out[:, pos - 1:pos], cache, pos - 1)
            fast = logits is not None
            if not fast:
                logits = decode_one(model, out[:, pos - 1:pos], cache, pos - 1)
        else:
            logits = model(out[:, :pos], last_only=True)[:, -1]  # (B, V): the whole sequence again
        nxt = sample(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)  # (B,)
        if len(stop):
            nxt = torch.where(finished, out[:, pos - 1], nxt)  # a finished row repeats its stop token
        out[:, pos] = nxt
        yield NewToken(i, pos, nxt, logits, cache, fast)
        if len(stop):
            finished |= torch.isin(nxt, stop)
            if bool(finished.all()):  # one device sync per step, only when stop tokens were asked for
                return


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

    ``generate_steps`` run to the end (its arguments, and what stop_tokens, use_cache and step do, are described
    there). seed makes sampling repeatable. on_step(index, logits (B, V), next_token (B,), cache or None) is called
    after each token is chosen.
    """
    generator = None if seed is None else torch.Generator(device=tokens.device).manual_seed(seed)
    steps = generate_steps(model, tokens, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                           generator=generator, use_cache=use_cache, stop_tokens=stop_tokens, step=step)
    new = []
    for st in steps:
        new.append(st.token)
        if on_step is not None:
            on_step(st.index, st.logits, st.token, st.cache)
    return torch.cat([tokens.long(), *(t[:, None] for t in new)], dim=1)  # (B, T + n)
