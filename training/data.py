"""Training rows: story rows from the corpus, and rows that repeat spans of random tokens.

Every function returns LongTensor rows of ``seq_len + 1`` tokens (inputs plus the shifted target)
and draws only from the seed or ``torch.Generator`` it is given.
"""
from __future__ import annotations

import math

import torch

from . import corpus


def story_rows(tok, seed: int, n_rows: int, seq_len: int) -> torch.Tensor:
    """``n_rows`` rows of ``seq_len + 1`` tokens, each starting at a story's ``<s>``.

    Stories (``<s> story </s>``) are appended until the row is full; the story that overflows is
    cut (its rest is dropped, the next row starts a fresh story). Returns LongTensor (n_rows, seq_len + 1).
    """
    eos = tok.token_to_id("</s>")
    gen = corpus.stories(seed)
    rows: list[list[int]] = []
    while len(rows) < n_rows:
        encoded = [e.ids + [eos] for e in tok.encode_batch([next(gen) for _ in range(256)])]
        rows.extend(_pack(encoded, seq_len + 1, n_rows - len(rows)))
    return torch.tensor(rows, dtype=torch.long)


def _pack(encoded: list[list[int]], width: int, limit: int) -> list[list[int]]:
    """Concatenate whole stories into rows of ``width`` tokens; a partly filled last row is dropped."""
    rows: list[list[int]] = []
    row: list[int] = []
    for ids in encoded:
        row.extend(ids)
        if len(row) >= width:
            rows.append(row[:width])
            row = []
            if len(rows) == limit:
                break
    return rows


def token_pool(story: torch.Tensor, vocab_size: int, n_special: int, g: torch.Generator) -> torch.Tensor:
    """Every non-special token id, most frequent in ``story`` first; ids that never occur there
    (BPE merge steps, single characters) follow in a seeded random order. (vocab_size - n_special,)"""
    freq = torch.bincount(story.flatten(), minlength=vocab_size).double()
    freq[:n_special] = -1.0
    noise = torch.rand(vocab_size, generator=g) * 0.5   # breaks ties among unseen tokens, seeded
    return torch.argsort(freq + noise, descending=True)[: vocab_size - n_special]


def pool_size(step: int, steps: int, start: int, grow: tuple[float, float], n_tokens: int) -> int:
    """How many pool tokens the random spans draw from at ``step``: ``start`` until ``grow[0]`` of
    training, then linearly up to all ``n_tokens`` at ``grow[1]`` (copying forms on a small pool
    first; a growing pool makes it general)."""
    a, b = grow
    f = step / max(1, steps)
    t = min(1.0, max(0.0, (f - a) / max(1e-9, b - a)))
    return min(n_tokens, round(start + t * (n_tokens - start)))


def span_length(span: tuple[int, int], g: torch.Generator) -> int:
    """A span length in ``span`` (inclusive): half the time uniform, half log-uniform, so short
    spans are common and long ones are not rare."""
    lo, hi = span
    u = float(torch.rand((), generator=g))
    if float(torch.rand((), generator=g)) < 0.5:
        return lo + min(hi - lo, int(u * (hi - lo + 1)))
    return min(hi, int(math.exp(math.log(lo) + u * (math.log(hi + 1) - math.log(lo)))))


def place_repeats(width: int, span: tuple[int, int], max_gap: int, max_lead: int,
                  g: torch.Generator) -> list[tuple[int, int, int]]:
    """Where the copies go in a row of ``width`` tokens (position 0 is ``<s>``): a list of
    ``(first, second, length)``. Each pair is some lead tokens, a span, a gap of 0..``max_gap``
    tokens, the same span again; pairs follow one another until the row is full."""
    out = []
    cursor = 1
    while True:
        lead = int(torch.randint(0, max_lead + 1, (), generator=g))
        gap = int(torch.randint(0, max_gap + 1, (), generator=g))
        n = span_length(span, g)
        room = width - cursor - lead
        if 2 * n + gap > room:
            gap = min(gap, max(0, room - 2 * span[0]))
            n = (room - gap) // 2
            if n < span[0]:
                return out
        first = cursor + lead
        out.append((first, first + n + gap, n))
        cursor = first + 2 * n + gap


def repeated_span_rows(background: torch.Tensor, pool: torch.Tensor, n_pool: int, bos_id: int,
                       span: tuple[int, int], max_gap: int, max_lead: int,
                       g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows in which spans of random tokens recur: ``background`` (N, W) with pairs of copies
    written over it.

    Each span is ``length`` distinct tokens from the first ``n_pool`` ids of ``pool``, written at
    ``first`` and again at ``second`` (see :func:`place_repeats`). The background is whatever the
    caller passes: story rows (copies inside text) or random tokens (copies alone). Position 0 is
    ``<s>``. Returns (rows, second): a new LongTensor (N, W) and a bool (N, W) that is True on the
    tokens of every second copy, the only ones a model can predict from earlier in the row.
    """
    rows = background.clone()
    rows[:, 0] = bos_id
    W = rows.shape[1]
    # All placements first, then the tokens: the same generator state gives the same placements.
    placements = [place_repeats(W, span, max_gap, max_lead, g) for _ in range(len(rows))]
    copies = torch.zeros(rows.shape, dtype=torch.bool)
    for row, is_copy, where in zip(rows, copies, placements):
        for first, second, n in where:
            if n <= n_pool:
                r = pool[torch.randperm(n_pool, generator=g)[:n]]
            else:
                r = pool[torch.randint(0, n_pool, (n,), generator=g)]
            row[first:first + n] = r
            row[second:second + n] = r
            is_copy[second:second + n] = True
    return rows, copies


def random_background(n_rows: int, width: int, pool: torch.Tensor, n_pool: int,
                      g: torch.Generator) -> torch.Tensor:
    """(n_rows, width) tokens drawn uniformly from the first ``n_pool`` ids of ``pool``."""
    return pool[torch.randint(0, n_pool, (n_rows, width), generator=g)]


def unigram_entropy(targets: torch.Tensor, vocab_size: int) -> float:
    """Entropy (nats) of the unigram distribution of ``targets``: the loss of a model that knows
    only how often each token occurs, measured on the same tokens (a lower bound for such a model)."""
    counts = torch.bincount(targets.flatten(), minlength=vocab_size).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())
