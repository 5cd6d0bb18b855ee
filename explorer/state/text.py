"""Text in: the prompt cleaned, tokenized and labelled for the screen.

Notation: ``T`` tokens.
"""
from __future__ import annotations

import re
from typing import Any

import torch

MAX_TEXT_CHARS = 100_000
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")  # half of a UTF-16 pair alone: not a character, no tokenizer takes it


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
    if _SURROGATE.search(text):
        raise ValueError("The text holds a broken character (half of an emoji or symbol, cut in two), which no "
                         "tokenizer can read: type or paste the text again.")
    text = _CONTROL.sub("", text)
    if not text.strip():
        raise ValueError("The prompt is empty: type a sentence.")
    return text


SPECIAL_OPEN, SPECIAL_CLOSE = "⟨", "⟩"  # a special token reads ⟨<|im_end|>⟩ on screen, never as a plain word
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<end_of_turn>", "</s>")


def special_ids(tokenizer) -> set[int]:
    """Ids of the tokenizer's special tokens: the named ones (bos, eos, pad, ...) and added tokens marked special."""
    ids = set(getattr(tokenizer, "all_special_ids", None) or ())
    for i, tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(tok, "special", False):
            ids.add(int(i))
    return ids


def mark_special(token: str) -> str:
    """``<|im_end|>`` -> ``⟨<|im_end|>⟩``."""
    return f"{SPECIAL_OPEN}{token}{SPECIAL_CLOSE}"


def marked(i: int, token: str | None) -> str:
    """A special token as ``⟨<|im_end|>⟩``; an id the model has a row for but the tokenizer no token (``token`` None)
    as ``⟨id 40000⟩``: a vocabulary padded past the tokenizer's, or random weights at a larger vocabulary."""
    return mark_special(f"id {i}" if token is None else str(token))


def token_strings(tokenizer, ids: list[int]) -> list[str]:
    """How each token reads on screen (one string per id; a byte piece of a longer character shows as ``�``;
    a special token as ``⟨<|im_end|>⟩``, an id without a token as ``⟨id 40000⟩``)."""
    special = special_ids(tokenizer)
    out = []
    for i in ids:
        token = tokenizer.convert_ids_to_tokens(i)
        if i in special or token is None:
            out.append(marked(i, token))
            continue
        s = tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if not s:
            s = str(token)
        out.append(s)
    return out


def decoded_segments(tokenizer, ids: list[int], after: list[int] = ()) -> list[tuple[str, bool]]:
    """The text of ``ids`` as (text, is_special) runs: ordinary tokens decoded together (so characters split
    across tokens come out whole), each special token on its own as ``⟨<|im_end|>⟩``.

    after: the tokens that come before ``ids`` (say the prompt, when ``ids`` are the generated tokens): the
    first run is decoded after them, so the space a tokenizer drops at the start of a text is kept."""
    special = special_ids(tokenizer)
    out: list[tuple[str, bool]] = []
    before = [i for i in after if i not in special][-1:]
    run: list[int] = []
    for i in list(ids) + [None]:
        token = None if i is None else tokenizer.convert_ids_to_tokens(i)
        if i is not None and i not in special and token is not None:
            run.append(i)
            continue
        if run:
            def dec(t):
                return tokenizer.decode(t, skip_special_tokens=False, clean_up_tokenization_spaces=False)
            whole, head = dec(before + run), dec(before)
            out.append((whole[len(head):] if before and whole.startswith(head) else dec(run), False))
            run, before = [], []
        if i is not None:
            out.append((marked(i, token), True))
    return out


def decode_marked(tokenizer, ids: list[int]) -> str:
    """The text of ``ids`` with every special token shown as ``⟨<|im_end|>⟩``."""
    return "".join(text for text, _ in decoded_segments(tokenizer, ids))


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def chat_prompt(tokenizer, text: str) -> str:
    """``text`` as one user turn, wrapped by the tokenizer's chat template with the assistant's turn opened
    (``apply_chat_template(..., add_generation_prompt=True)``). The result already holds the template's
    special tokens: encode it with ``add_special_tokens=False``."""
    if not has_chat_template(tokenizer):
        raise ValueError("This model's tokenizer has no chat template: switch chat off.")
    return tokenizer.apply_chat_template([{"role": "user", "content": clean_text(text)}], tokenize=False,
                                         add_generation_prompt=True)


def stop_token_ids(tokenizer, config=None, generation_config: dict | None = None) -> list[int]:
    """The ids that end a generation: ``eos_token_id`` of the model's config, its generation_config and its
    tokenizer, and end-of-turn tokens such as ``<|im_end|>`` when the vocabulary has them."""
    found: set[int] = set()

    def add(value) -> None:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            found.add(value)
        elif isinstance(value, (list, tuple)):
            for v in value:
                add(v)

    add(getattr(config, "eos_token_id", None))
    add((generation_config or {}).get("eos_token_id"))
    add(getattr(tokenizer, "eos_token_id", None))
    vocab = tokenizer.get_vocab()
    for tok in END_OF_TURN:
        if tok in vocab:
            add(vocab[tok])
    return sorted(found)


def encode(tokenizer, text: str, max_len: int, *, truncate: bool = False) -> tuple[list[int], list[str]]:
    """Token ids and their unique labels ``"{i}·{token}"`` for ``text``.

    Longer than ``max_len`` tokens: ``PromptTooLong`` (a ValueError) saying so, or with ``truncate`` the first
    ``max_len`` tokens (use ``encode_with_notice`` to get the sentence to show).
    """
    ids, labels, _ = encode_with_notice(tokenizer, text, max_len, truncate=truncate)
    return ids, labels


def encode_with_notice(tokenizer, text: str, max_len: int, *, truncate: bool = True,
                       add_special_tokens: bool = True) -> tuple[list[int], list[str], str]:
    """Like ``encode``; also returns a notice ("" when nothing was cut) to show beside the figure.
    add_special_tokens=False for text that already holds them (a chat template's output)."""
    from explorer.figures.common import token_labels

    text = clean_text(text)
    ids = list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])
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
