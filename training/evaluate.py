"""What the training loop measures on the decoder: held-out loss and head scores at several spans.

Induction is scored on ``<s> + r + r`` (``r`` = ``span`` distinct random token ids) at every span of
``PROBE_SPANS`` that fits the context, never at one span only: a model trained on one range of copy
distances can learn "look N back" instead of "find the earlier occurrence", and a single span hides
that. The previous-token and first-token scores come from the span-32 probe (or the longest span
that fits), the same sequence ``lens.heads.head_scores`` reads by default.
"""
from __future__ import annotations

import torch

from lens.heads import head_scores
from lens.loss import evaluate_loss

PROBE_SPANS = (8, 16, 32, 64, 120)
PROBE_ROWS = 8
PREVIOUS_TOKEN_SPAN = 32

# What the shipped decoder must reach (tests/test_default_model.py checks the shipped files).
TARGET_INDUCTION = 0.7
TARGET_PREVIOUS_TOKEN = 0.8
TARGET_HELD_OUT_LOSS = 1.10


def spans_that_fit(max_seq_len: int, spans=PROBE_SPANS) -> tuple[int, ...]:
    """The probe spans whose ``<s> + r + r`` fits the context."""
    return tuple(s for s in spans if 1 + 2 * s <= max_seq_len)


def best(matrix) -> tuple[float, int, int]:
    """(score, layer, head) of the highest entry of an (L, H) matrix."""
    t = torch.as_tensor(matrix, dtype=torch.float64)
    i = int(t.argmax())
    return float(t.flatten()[i]), i // t.shape[1], i % t.shape[1]


def probe_scores(model, spans, seed: int, rows: int = PROBE_ROWS) -> dict:
    """Head scores as JSON-ready lists: ``induction`` maps each span (as a string) to an (L, H)
    list; ``previous_token`` and ``first_token`` are (L, H) lists from the reference span."""
    induction = {}
    reference = None
    ref_span = PREVIOUS_TOKEN_SPAN if PREVIOUS_TOKEN_SPAN in spans else max(spans)
    for span in spans:
        scores = head_scores(model, span_len=span, batch=rows, seed=seed)
        induction[str(span)] = scores["induction"].tolist()
        if span == ref_span:
            reference = scores
    return {"induction": induction, "previous_token": reference["previous_token"].tolist(),
            "first_token": reference["first_token"].tolist()}


def evaluate(model, held_rows: torch.Tensor, spans, seed: int) -> dict:
    """Held-out story loss (nats/token) and the head scores, for one log entry."""
    model.eval()
    entry = {"held_out_loss": evaluate_loss(model, held_rows), **probe_scores(model, spans, seed)}
    model.train()
    return entry


def worst_span_induction(entry: dict) -> float:
    """The best induction head's score at the span where it is weakest."""
    return min(best(m)[0] for m in entry["induction"].values())


def meets_targets(entry: dict) -> bool:
    return (worst_span_induction(entry) >= TARGET_INDUCTION
            and best(entry["previous_token"])[0] >= TARGET_PREVIOUS_TOKEN)


def checkpoint_key(entry: dict) -> tuple:
    """Smaller is better: evaluations that meet the head targets first, by held-out loss; the
    others after them, by how far their weakest span is from the induction target, then loss."""
    if meets_targets(entry):
        return (0, entry["held_out_loss"])
    return (1, round(TARGET_INDUCTION - worst_span_induction(entry), 2), entry["held_out_loss"])
