"""Text in: the prompt cleaned, tokenized and labelled for the screen.

Notation: ``T`` tokens.
"""
from __future__ import annotations

import re
from typing import Any

import torch

MAX_TEXT_CHARS = 100_000
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069]")


class PromptTooLong(ValueError):
    """The prompt has more tokens than the view takes (a ValueError: the sentence says what to change)."""

    def __init__(self, n_tokens: int, max_len: int) -> None:
        super().__init__(f"The prompt is {n_tokens} tokens long; this view takes at most {max_len}: shorten it.")
        self.n_tokens, self.max_len = n_tokens, max_len


def clean_text(text: Any) -> str:
    """The prompt with control characters removed (tabs and newlines kept). Raises ValueError if empty."""
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise ValueError("The prompt must be text.")
    if len(text) > MAX_TEXT_CHARS:  # refused before the tokenizer spends time and memory on it
        raise ValueError(f"The text is {len(text):,} characters long; paste at most {MAX_TEXT_CHARS:,} (every view "
                         "uses far fewer tokens than that).")
    text = _CONTROL.sub("", text)
    if not text.strip():
        raise ValueError("The prompt is empty: type a sentence.")
    return text


def token_strings(tokenizer, ids: list[int]) -> list[str]:
    """How each token reads on screen (one string per id; a byte piece of a longer character shows as ``�``)."""
    out = []
    for i in ids:
        s = tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if not s:
            s = str(tokenizer.convert_ids_to_tokens(i))
        out.append(s)
    return out


def encode(tokenizer, text: str, max_len: int, *, truncate: bool = False) -> tuple[list[int], list[str]]:
    """Token ids and their unique labels ``"{i}·{token}"`` for ``text``.

    Longer than ``max_len`` tokens: ``PromptTooLong`` (a ValueError) saying so, or with ``truncate`` the first
    ``max_len`` tokens (use ``encode_with_notice`` to get the sentence to show).
    """
    ids, labels, _ = encode_with_notice(tokenizer, text, max_len, truncate=truncate)
    return ids, labels


def encode_with_notice(tokenizer, text: str, max_len: int, *, truncate: bool = True) -> tuple[list[int], list[str], str]:
    """Like ``encode``; also returns a notice ("" when nothing was cut) to show beside the figure."""
    from .figures.common import token_labels

    text = clean_text(text)
    ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
    if not ids:
        raise ValueError("The prompt produced no tokens: type a sentence.")
    notice = ""
    if len(ids) > max_len:
        if not truncate:
            raise PromptTooLong(len(ids), max_len)
        notice = f"The prompt is {len(ids)} tokens long; only the first {max_len} are shown."
        ids = ids[:max_len]
    return ids, token_labels(token_strings(tokenizer, ids)), notice


def as_tensor(ids: list[int], model: torch.nn.Module) -> torch.Tensor:
    """(1, T) int64 on the model's device."""
    return torch.tensor([ids], dtype=torch.int64, device=model.embed_tokens.weight.device)
