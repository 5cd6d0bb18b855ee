"""The numbers a lesson's text quotes, computed from the loaded model when the step opens (``{name}`` in a deck).

Each function takes the model, its tokenizer and the step's settings (the link keys: ``prompt``, ``layer``,
``head``, ``heads``) and returns the number as the text shows it. A deck that quotes them stays true on every
model; ``NUMBERS`` names them (docs/decks.md lists them for lecturers).
"""
from __future__ import annotations

import numpy as np
import torch

from explorer.interventions import check_heads, knockout_before_after
from explorer.probes.patterns import attention_pattern
from explorer.state.text import encode_with_notice, token_strings
from lens.heads import repeated_suffix_len
from lens.hooks import as_tokens, run_with_cache

MAX_TOKENS = 64


def _ids(model, tokenizer, settings: dict) -> list[int]:
    prompt = settings.get("prompt")
    if not prompt:
        raise ValueError("this number needs the step's settings to give a prompt.")
    ids, _, _ = encode_with_notice(tokenizer, prompt, min(MAX_TOKENS, model.config.max_seq_len))
    if len(ids) < 2:
        raise ValueError("this number needs a prompt of at least 2 tokens.")
    return ids


def _head(settings: dict) -> tuple[int, int]:
    try:
        return int(settings.get("layer", 0)), int(settings.get("head", 0))
    except ValueError:
        raise ValueError("layer and head must be whole numbers.") from None


def _pattern(model, tokenizer, settings) -> np.ndarray:
    layer, head = _head(settings)
    return np.asarray(attention_pattern(model, _ids(model, tokenizer, settings), layer, head), dtype=np.float64)


def sink_share(model, tokenizer, settings) -> str:
    """The head's mean weight on token 0 over the rows that can look elsewhere (queries 1..T-1)."""
    p = _pattern(model, tokenizer, settings)
    return f"{float(np.mean(p[1:, 0])):.2f}"


def previous_share(model, tokenizer, settings) -> str:
    """The head's mean weight on the token just before the query (queries 1..T-1)."""
    p = _pattern(model, tokenizer, settings)
    return f"{float(np.mean(np.diagonal(p, offset=-1))):.2f}"


def _next(model, tokenizer, settings) -> tuple[str, float]:
    logits, _ = run_with_cache(model, as_tokens(model, _ids(model, tokenizer, settings)), [])
    probs = torch.softmax(logits[0, -1].double(), -1)
    best = int(torch.argmax(probs))
    return token_strings(tokenizer, [best])[0], float(probs[best])


def top_token(model, tokenizer, settings) -> str:
    """The model's most likely next token after the prompt, in quotes (its leading space shows)."""
    return f"“{_next(model, tokenizer, settings)[0]}”"


def top_prob(model, tokenizer, settings) -> str:
    return f"{_next(model, tokenizer, settings)[1]:.2f}"


def _knockout(model, tokenizer, settings) -> tuple[float, float, float, float]:
    """(whole prompt before, after, repeated part before, after): mean nats per token with ``heads`` knocked out."""
    ids = _ids(model, tokenizer, settings)
    heads = []
    for part in str(settings.get("heads", "")).split(","):
        if part.strip():
            layer, _, head = part.strip().partition(".")
            try:
                heads.append((int(layer), int(head)))
            except ValueError:
                raise ValueError(f"a head is written layer.head, got {part.strip()[:20]!r}.") from None
    if not heads:
        raise ValueError("this number needs the step's settings to give heads.")
    r = knockout_before_after(model, torch.tensor([ids]), check_heads(model, heads))
    before, after = r["before"].double().numpy(), r["after"].double().numpy()
    n_rep = repeated_suffix_len(ids)
    if not n_rep:
        raise ValueError("the repeated part's loss needs a prompt that ends with the same words twice.")
    part = slice(len(ids) - n_rep - 1, None)  # the predictions of the second copy's tokens
    return float(before.mean()), float(after.mean()), float(before[part].mean()), float(after[part].mean())


def repeat_before(model, tokenizer, settings) -> str:
    return f"{_knockout(model, tokenizer, settings)[2]:.3f}"


def repeat_after(model, tokenizer, settings) -> str:
    return f"{_knockout(model, tokenizer, settings)[3]:.3f}"


def repeat_change(model, tokenizer, settings) -> str:
    _, _, b, a = _knockout(model, tokenizer, settings)
    return f"{a - b:+.3f}"


def n_layers(model, tokenizer, settings) -> str:
    return str(model.config.n_layers)


def n_heads(model, tokenizer, settings) -> str:
    return str(model.config.n_heads)


NUMBERS = {f.__name__: f for f in (sink_share, previous_share, top_token, top_prob, repeat_before, repeat_after,
                                   repeat_change, n_layers, n_heads)}


def fill(text: str, model, tokenizer, settings: dict, given: dict[str, str] | None = None, escape=str) -> str:
    """``text`` with each ``{name}`` replaced by ``NUMBERS[name]`` computed now (or by ``given[name]``), passed
    through ``escape`` (a token of the model is shown as text); a number that cannot be computed on this model
    reads "(not computable on this model: why)"."""
    from explorer.lessons import placeholders

    values = dict(given or {})
    for name in placeholders(text):
        if name in values:
            continue
        try:
            values[name] = NUMBERS[name](model, tokenizer, settings)
        except (ValueError, IndexError) as exc:
            values[name] = f"(not computable on this model: {exc})"
    return text.format(**{name: escape(value) for name, value in values.items()})
