"""The encoder's held-out evaluation, shared by ``python -m training --encoder`` (which writes the numbers into
the model card) and the app (which shows them): the held-out stories, which positions are hidden, and top-1
accuracy of the encoder at them beside the decoder's next-token guess at the same positions.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

HELD_OUT_FILE = "held_out_stories.txt"
MASK_RATE = 0.15
MASK_SEED = 4321       # which held-out positions are hidden when accuracy is measured


def load_encoder_tokenizer(folder: str | os.PathLike):
    """The encoder folder's tokenizer (a copy of the default decoder's), as a transformers tokenizer.
    Read as ``PreTrainedTokenizerFast`` directly: ``AutoTokenizer`` would try to read config.json as a
    transformers model config, which this folder's is not."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(folder))


def choose_positions(sequences: list[list[int]], special_ids, rate: float = MASK_RATE,
                     seed: int = MASK_SEED) -> list[torch.Tensor]:
    """For each sequence a bool (T,): each non-special position hidden with probability ``rate``."""
    g = torch.Generator().manual_seed(seed)
    special = torch.tensor(sorted(special_ids))
    out = []
    for ids in sequences:
        x = torch.tensor(ids)
        out.append(~torch.isin(x, special) & (torch.rand(len(ids), generator=g) < rate))
    return out


@torch.no_grad()
def masked_accuracy(encoder, sequences: list[list[int]], chosen: list[torch.Tensor],
                    mask_id: int) -> float:
    """Top-1 accuracy of the encoder when every ``chosen`` position is replaced by ``mask_id``."""
    hits = total = 0
    for ids, c in zip(sequences, chosen):
        x = torch.tensor(ids).masked_fill(c, mask_id)
        pred = encoder(x[None])[0].argmax(-1)                       # (T,)
        hits += int((pred == torch.tensor(ids))[c].sum())
        total += int(c.sum())
    return hits / max(1, total)


@torch.no_grad()
def next_token_accuracy(decoder, sequences: list[list[int]], chosen: list[torch.Tensor]) -> float:
    """The decoder's top-1 at the ``chosen`` positions: its argmax after the (unmasked) tokens
    before each one."""
    hits = total = 0
    for ids, c in zip(sequences, chosen):
        x = torch.tensor(ids)
        pred = decoder(x[None, :-1])[0].argmax(-1)                  # (T - 1,): guesses for 1..T-1
        hits += int((pred == x[1:])[c[1:]].sum())
        total += int(c[1:].sum())
    return hits / max(1, total)


def held_out_sequences(tokenizer, stories: list[str], max_len: int) -> list[list[int]]:
    """Each story as ``<s> story`` ids, cut to ``max_len`` tokens."""
    return [list(tokenizer(s, truncation=True, max_length=max_len)["input_ids"]) for s in stories]


def held_out_stories(folder: str | os.PathLike) -> list[str]:
    """The held-out stories shipped beside an encoder, one per line."""
    path = Path(folder) / HELD_OUT_FILE
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
