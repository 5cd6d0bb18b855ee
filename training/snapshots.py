"""The decoder's training checkpoints: every evaluation and the best weights so far (:class:`Checkpoints`), the
fp16 snapshots written during training (``checkpoints/step-NNNNN/``, measured from the saved weights), and which
snapshots to keep once training ends (the fixed steps and every one across the measured phase change)."""
from __future__ import annotations

import copy
import os
from typing import Protocol, Sequence

import torch

from .evaluate import PREVIOUS_TOKEN_SPAN, PROBE_ROWS, best, checkpoint_key, evaluate


class SnapshotSettings(Protocol):
    """What choosing the snapshots reads of the loop's ``TrainSettings`` (named here: the loop imports this module)."""
    snapshot_steps: Sequence[int]
    snapshot_min: int


class Checkpoints:
    """Every evaluation in order, and a copy of the weights of the best one so far."""

    def __init__(self):
        self.history: list[dict] = []
        self.best_entry: dict | None = None
        self.best_state: dict | None = None
        self.snapshots: list[dict] = []     # the snapshots written, in order (save_snapshot)

    def consider(self, entry: dict, model) -> None:
        self.history.append(entry)
        if self.best_entry is None or checkpoint_key(entry) < checkpoint_key(self.best_entry):
            self.best_entry = entry
            self.best_state = copy.deepcopy(model.state_dict())


SNAPSHOT_DIR = "checkpoints"


def snapshot_folder(out: str, step: int) -> str:
    return os.path.join(out, SNAPSHOT_DIR, f"step-{step:05d}")


def save_snapshot(model, step: int, out: str, held_rows: torch.Tensor, spans, seed: int) -> dict:
    """Write the decoder as it is at ``step`` in fp16 and measure those saved weights (not the fp32
    ones being trained), so the log's scores are what loading the snapshot gives."""
    from lens.loss import repeated_half_loss
    from models import save_pretrained

    saved = copy.deepcopy(model)
    with torch.no_grad():
        for p in saved.parameters():    # what load_pretrained(folder) reads back: fp16 values in fp32
            p.copy_(p.half().float())
    folder = snapshot_folder(out, step)
    save_pretrained(saved, folder, dtype=torch.float16)
    entry = {"step": step, "folder": os.path.relpath(folder, out),
             "bytes": os.path.getsize(os.path.join(folder, "model.safetensors")),
             **evaluate(saved, held_rows, spans, seed)}
    saved.eval()
    ref_span = PREVIOUS_TOKEN_SPAN if PREVIOUS_TOKEN_SPAN in spans else max(spans)  # as probe_scores
    entry["repeated_half_span"] = ref_span
    entry["repeated_half_loss"] = repeated_half_loss(saved, ref_span, PROBE_ROWS, seed)
    return entry


def phase_window(entries: list[dict], key: str, span: int, lo: float = 0.2, hi: float = 0.8):
    """(last step under ``lo`` before the first at ``hi`` or more, that first step) of the best head's ``key``
    score ("induction" at ``span``, or "previous_token"); None when it never reaches ``hi``."""
    scores = [(e["step"], best(e[key][str(span)] if key == "induction" else e[key])[0]) for e in entries]
    top = next((step for step, v in scores if v >= hi), None)
    if top is None:
        return None
    below = [step for step, v in scores if v < lo and step < top]
    return (below[-1] if below else scores[0][0]), top


def kept_snapshots(entries: list[dict], s: SnapshotSettings) -> list[dict]:
    """The snapshots to keep (see ``TrainSettings.snapshot_steps``): the fixed steps, and every one across the
    measured phase changes, one more on each side, widened until ``snapshot_min`` are kept."""
    steps = [e["step"] for e in entries]
    span = entries[0].get("repeated_half_span", PREVIOUS_TOKEN_SPAN) if entries else PREVIOUS_TOKEN_SPAN
    windows = [w for w in (phase_window(entries, k, span) for k in ("induction", "previous_token")) if w]
    if windows:
        lo, hi = min(w[0] for w in windows), max(w[1] for w in windows)
        i, j = steps.index(lo), steps.index(hi)
    else:  # no phase change measured: keep the fixed steps, widened around the middle if too few
        i = j = len(steps) // 2
    keep = lambda i, j: set(s.snapshot_steps) | set(steps[max(0, i - 1):j + 2])  # noqa: E731
    while len(keep(i, j) & set(steps)) < min(s.snapshot_min, len(steps)):
        i, j = i - 1, j + 1
    kept = keep(i, j)
    return [e for e in entries if e["step"] in kept]
