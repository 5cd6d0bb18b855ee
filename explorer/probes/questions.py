"""Questions for a class to answer before the model does: the choices and the model's own answer, computed now.

Each function runs the model once and returns a ``Question``: the question in words, 2-6 choices (the model's
tokens or the prompt's, or bins of a measured change), and the model's value for each choice (a probability,
an attention weight, or 1 for the bin the measurement fell in). Choices are shown as text, never as HTML.

    next_token(model, tokenizer, ids)                 which token comes next: top tokens and a prompt token, shuffled
    attended_key(model, tokenizer, ids, layer, head)  which earlier token the last token's head looks at most
    knockout_effect(model, ids, heads)                 how the loss (on the repeated part, if any) moves
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch import nn

from explorer.interventions import check_heads, knockout_before_after
from explorer.probes.patterns import attention_pattern
from explorer.state.text import special_ids, token_strings
from lens.heads import repeated_suffix_len
from lens.hooks import as_tokens, run_with_cache

N_CHOICES = 4
MAX_LABEL = 40


@dataclass(frozen=True)
class Question:
    kind: str  # "next_token", "attention", "knockout"
    text: str
    choices: tuple[str, ...]
    values: tuple[float, ...]  # the model's value for each choice
    value_name: str  # what ``values`` are: "probability", "attention weight", "measured"
    answer: str  # one sentence: the model's own answer


def quoted(token: str) -> str:
    """A token as a choice reads: in quotes (its leading space shows), control characters visible, short."""
    text = token.replace("\n", "⏎").replace("\t", "⇥")
    text = text if len(text) <= MAX_LABEL else text[:MAX_LABEL - 1] + "…"
    return f"“{text}”"


def _last_logits(model: nn.Module, ids) -> torch.Tensor:
    tokens = as_tokens(model, ids)
    logits, _ = run_with_cache(model, tokens, [])
    return logits[0, -1].double()  # (V,)


def next_token(model: nn.Module, tokenizer, ids, *, seed: int | None = None, n: int = N_CHOICES) -> Question:
    """Which token comes next after ``ids``? The model's top ``n - 1`` tokens and one token of the prompt (a
    plausible distractor), shuffled; ``values`` are the model's softmax over its whole vocabulary for each."""
    probs = torch.softmax(_last_logits(model, ids), dim=-1)  # (V,) float64
    order = torch.argsort(probs, descending=True).tolist()
    special = special_ids(tokenizer)
    picked: list[int] = []
    labels: list[str] = []

    def take(i: int) -> None:
        label = quoted(token_strings(tokenizer, [i])[0])
        if i not in picked and i not in special and label not in labels:
            picked.append(i)
            labels.append(label)

    for i in order:
        if len(picked) >= n - 1:
            break
        take(i)
    for i in reversed([int(t) for t in ids]):  # a token the prompt already holds, latest first
        if len(picked) >= n:
            break
        take(i)
    for i in order:
        if len(picked) >= n:
            break
        take(i)
    rng = random.Random(seed)
    pairs = list(zip(picked, labels))
    rng.shuffle(pairs)
    values = tuple(float(probs[i]) for i, _ in pairs)
    best = max(range(len(pairs)), key=lambda k: values[k])
    text = f"Which token does the model predict next after “…{_tail(tokenizer, ids)}”?"
    return Question("next_token", text, tuple(lab for _, lab in pairs), values, "probability",
                    f"The model's most likely of these is {pairs[best][1]}, with probability {values[best]:.2f}.")


def _tail(tokenizer, ids, n: int = 8) -> str:
    text = tokenizer.decode([int(t) for t in list(ids)[-n:]], skip_special_tokens=True).replace("\n", " ")
    return text.strip()[-60:]


def attended_key(model: nn.Module, tokenizer, ids, layer: int, head: int, *, n: int = N_CHOICES) -> Question:
    """Which earlier token does head (``layer``, ``head``) look at most from the last token? Choices: the key it
    weights most, token 0, the previous token and the token itself (then the next-heaviest keys), in prompt order;
    ``values`` are that row of the head's attention weights (its softmax over the keys)."""
    ids = [int(t) for t in ids]
    if len(ids) < 2:
        raise ValueError("Asking which token a head looks at needs a prompt of at least 2 tokens.")
    row = torch.as_tensor(attention_pattern(model, ids, layer, head)[-1], dtype=torch.float64)  # (S,)
    q = len(ids) - 1
    order = torch.argsort(row, descending=True).tolist()
    keys: list[int] = []
    for k in [order[0], 0, q - 1, q, *order[1:]]:
        if k not in keys and len(keys) < min(n, q + 1):
            keys.append(k)
    keys.sort()
    strings = token_strings(tokenizer, ids)
    choices = tuple(f"{k}·{quoted(strings[k])}" for k in keys)
    values = tuple(float(row[k]) for k in keys)
    best = keys.index(order[0])
    text = (f"Layer {layer}, head {head}: from the last token {quoted(strings[q])}, which token does it look at "
            f"most?")
    return Question("attention", text, choices, values, "attention weight",
                    f"The head puts {values[best]:.2f} of its weight on {choices[best]}.")


#: Bins of the loss change (nats per token) a knock-out question offers, low to high.
KNOCKOUT_BINS = ((float("-inf"), 0.0, "goes down"), (0.0, 0.1, "up by less than 0.1"),
                 (0.1, 1.0, "up by 0.1 to 1"), (1.0, float("inf"), "up by more than 1"))


def knockout_effect(model: nn.Module, ids, heads, how: str = "zero") -> Question:
    """With ``heads`` knocked out (``how``: "zero" or "mean", as ``explorer.interventions.ablate_heads``), how does
    the mean next-token loss move? On a prompt that ends with the same tokens twice, the loss on that repeated part
    (the part the Experiments figure shades and its sentence quotes); otherwise on the whole prompt. Choices are the
    bins of ``KNOCKOUT_BINS`` (nats per token); ``values`` are 1 for the bin the change falls in, 0 elsewhere."""
    heads = check_heads(model, heads)
    tokens = as_tokens(model, ids)
    if tokens.shape[1] < 2:
        raise ValueError("A knock-out question needs a prompt of at least 2 tokens.")
    r = knockout_before_after(model, tokens, heads, how)
    n_rep = repeated_suffix_len([int(t) for t in tokens[0]])
    part = slice(tokens.shape[1] - n_rep - 1, None) if n_rep else slice(None)  # the second copy's predictions
    base, after = float(r["before"][part].double().mean()), float(r["after"][part].double().mean())
    delta = after - base
    hit = next(k for k, (lo, hi, _) in enumerate(KNOCKOUT_BINS) if lo <= delta < hi)
    names = ", ".join(f"L{lay}H{h}" for lay, h in heads)
    choices = tuple(f"The loss {label}" for _, _, label in KNOCKOUT_BINS)
    where = (f"on the repeated part of this prompt (its last {n_rep} tokens, shaded in the figure)" if n_rep
             else "on this prompt")
    text = f"Knock out {names}: how does the loss {where} change (nats per token)?"
    return Question("knockout", text, choices, tuple(1.0 if k == hit else 0.0 for k in range(len(choices))),
                    "measured", f"Measured: {base:.3f} → {after:.3f} nats/token {where}, a change of {delta:+.3f} "
                    f"({KNOCKOUT_BINS[hit][2]}).")
