"""What the Training tab computes: a snapshot's head scores and loss on the repeated half, measured now the way
``python -m training`` measured them; one head's pattern; a greedy continuation; and, from the training log,
where the induction phase change lies and in which order the circuit's parts appeared.

Notation: ``L`` layers, ``H`` query heads. Scores are in [0, 1], losses in nats per token.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from lens.device import to_host
from lens.heads import head_scores, repeated_random_tokens
from lens.loss import repeated_half_loss

# As training/evaluate.py measures (PREVIOUS_TOKEN_SPAN, PROBE_ROWS; tests/test_training_tab.py checks they agree):
# the previous-token and sink scores and the repeated-half loss on the span-32 probe, 8 rows.
REFERENCE_SPAN = 32
PROBE_ROWS = 8
PHASE_LEVELS = (0.2, 0.8)   # the phase change: where the best induction score crosses these
APPEARED = 0.5              # a part of the circuit "appeared" at the first snapshot where its score passed this


def step_scores(model: nn.Module, seed: int, span: int = REFERENCE_SPAN, rows: int = PROBE_ROWS) -> dict:
    """Every head's previous-token, first-token (sink) and induction scores, (L, H) arrays, and the loss on the
    repeated half, on ``rows`` rows of ``[BOS] + r + r`` (``r`` = ``span`` random tokens) from ``seed``."""
    scores = head_scores(model, span_len=span, batch=rows, seed=seed)
    return {"previous_token": np.asarray(scores["previous_token"], dtype=float),
            "first_token": np.asarray(scores["first_token"], dtype=float),
            "induction": np.asarray(scores["induction"], dtype=float),
            "repeated_half_loss": repeated_half_loss(model, span, rows, seed)}


def probe_tokens(model: nn.Module, span: int, seed: int) -> torch.Tensor:
    """One row of the induction probe, ``[BOS] + r + r``: (1, 1 + 2 * span) ids."""
    c = model.config
    return repeated_random_tokens(c.vocab_size, span, 1, seed, bos_id=c.bos_token_id)


def head_pattern(model: nn.Module, tokens: torch.Tensor, layer: int, head: int) -> np.ndarray:
    """(T, T) attention weights of one head on ``tokens`` (one row)."""
    from explorer.probes.patterns import attention_pattern

    return attention_pattern(model, tokens, layer, head)


def greedy_continuation(model: nn.Module, ids: list[int], max_new: int, eos: int | None) -> list[int]:
    """The model's greedy continuation of ``ids``, cut at ``eos``."""
    from models import generate

    device = next(model.parameters()).device
    out = generate(model, torch.tensor([ids], device=device), max_new, temperature=0.0,
                   stop_tokens=[eos] if eos is not None else None)
    new = to_host(out[0, len(ids):]).tolist()
    return new[:new.index(eos)] if eos is not None and eos in new else new


# --- from the training log ------------------------------------------------------------------------------------

def best(matrix) -> tuple[float, int, int]:
    """(score, layer, head) of the highest entry of an (L, H) matrix."""
    m = np.asarray(matrix, dtype=float)
    i = int(np.argmax(m))
    return float(m.flat[i]), i // m.shape[1], i % m.shape[1]


def curves(entries: list[dict], span: str = str(REFERENCE_SPAN)) -> dict:
    """The log's snapshot entries as curves over steps: losses, the best head's scores, every head's scores."""
    steps = [e["step"] for e in entries]
    out = {"steps": steps,
           "held_out_loss": [e["held_out_loss"] for e in entries],
           "repeated_half_loss": [e.get("repeated_half_loss") for e in entries],
           "span": span}
    for kind in ("previous_token", "first_token", "induction"):
        mats = [np.asarray(e[kind][span] if kind == "induction" else e[kind], dtype=float) for e in entries]
        out[kind] = np.stack(mats) if mats else np.zeros((0, 0, 0))  # (steps, L, H)
        out[f"best_{kind}"] = [best(m) for m in mats]
    return out


def first_step(steps: list[int], values: list[float], level: float, *, below: bool = False) -> int | None:
    """The first step whose value reaches ``level`` (falls to it with ``below``); None if none does."""
    for s, v in zip(steps, values):
        if v is not None and (v <= level if below else v >= level):
            return s
    return None


def phase_change(c: dict) -> dict:
    """Where the best induction score (at the curves' span) first reaches 0.2 and 0.8, with the losses there, and
    when each part of the circuit appeared: {start, end, start_entry, end_entry, parts: [(step, what, head)]}."""
    steps = c["steps"]
    ind = [b[0] for b in c["best_induction"]]
    start, end = (first_step(steps, ind, level) for level in PHASE_LEVELS)
    at = {s: i for i, s in enumerate(steps)}

    def entry(step):
        if step is None:
            return None
        i = at[step]
        return {"step": step, "induction": ind[i], "previous_token": c["best_previous_token"][i][0],
                "held_out_loss": c["held_out_loss"][i], "repeated_half_loss": c["repeated_half_loss"][i]}

    parts = []
    for kind, what in (("previous_token", "a previous-token head"), ("induction", "an induction head")):
        values = [b[0] for b in c[f"best_{kind}"]]
        s = first_step(steps, values, APPEARED)
        if s is not None:
            _, layer, head = c[f"best_{kind}"][at[s]]
            parts.append((s, what, f"L{layer}H{head}"))
    halves = c["repeated_half_loss"]
    if halves and halves[0] is not None:
        s = first_step(steps, halves, halves[0] / 2, below=True)
        if s is not None:
            parts.append((s, "the loss on the repeated half fell below half its untrained value", None))
    parts.sort(key=lambda p: p[0])
    return {"start": start, "end": end, "start_entry": entry(start), "end_entry": entry(end), "parts": parts,
            "before": {s: steps[max(0, at[s] - 1)] for s in steps}}


def order_sentence(phase: dict) -> str:
    """The order in which the circuit's parts appeared, as measured on the snapshots (never assumed)."""
    parts = phase["parts"]
    if not parts:
        return f"No part of the circuit passed {APPEARED} in these snapshots."
    said = []
    for step, what, head in parts:
        prev = phase["before"][step]
        where = f"step {step}" if prev == step else f"between steps {prev} and {step}"
        said.append(f"{what}{f' ({head})' if head else ''} passed {APPEARED} {where}"
                    if head else f"{what} {where}")
    text = "; then ".join(said)
    same = len({p[0] for p in parts}) < len(parts)
    note = " (parts named at the same step appeared between the same two snapshots: their order inside that " \
           "interval is not measured)" if same else ""
    return f"In the order measured on the snapshots: {text}{note}."
