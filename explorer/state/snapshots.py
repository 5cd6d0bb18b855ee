"""The default model as it was during its training: the snapshots ``python -m training`` saves under
``<default model>/checkpoints/step-NNNNN/`` (fp16, config.json + model.safetensors) and the training log that
measured them.

A snapshot is named ``default@step-700`` in the header picker and the Model tab. The Training tab reads them
through ``shared_snapshot``: one read-only copy per step in the result cache shared by every session, at most
``MAX_SHARED`` of them (each is about 4 MB in float32), so moving the step slider does not read a file again. A
visitor who loads a snapshot for every tab gets their own copy (``load_snapshot_checkpoint``), counted like any
visitor's model.
"""
from __future__ import annotations

import json
import re
import threading
from pathlib import Path

from models import Decoder, load_pretrained

from .cache import results
from .folders import default_model_dir, prepare
from .sizes import module_bytes
from .threads import run_threads

SNAPSHOT_DIR = "checkpoints"
NAME = re.compile(r"^default@step-(\d{1,7})$")
MAX_SHARED = 8  # snapshots kept loaded at once for the Training tab (about 4 MB each in float32)


def snapshot_name(step: int) -> str:
    return f"default@step-{step}"


def parse_name(source: str) -> int | None:
    """The step a ``default@step-N`` name asks for, or None when ``source`` is not such a name."""
    m = NAME.match((source or "").strip())
    return int(m.group(1)) if m else None


def snapshots_dir() -> Path:
    return default_model_dir() / SNAPSHOT_DIR


def snapshot_folder(step: int) -> Path:
    return snapshots_dir() / f"step-{step:05d}"


def available_steps() -> list[int]:
    """The steps whose snapshot folder holds a config.json and weights, in order."""
    try:
        folders = sorted(snapshots_dir().glob("step-*"))
    except OSError:
        return []
    steps = []
    for f in folders:
        m = re.fullmatch(r"step-(\d+)", f.name)
        if m and (f / "config.json").is_file() and (f / "model.safetensors").is_file():
            steps.append(int(m.group(1)))
    return sorted(steps)


def snapshot_names() -> list[str]:
    return [snapshot_name(s) for s in available_steps()]


def check_step(step: int) -> int:
    steps = available_steps()
    if step not in steps:
        shown = ", ".join(str(s) for s in steps[:30]) or "none: this model folder has no snapshots"
        raise ValueError(f"There is no snapshot at step {step}; the snapshots are at steps {shown}.")
    return step


def nearest_step(value: float, steps: list[int] | None = None) -> int:
    """The snapshot step closest to ``value`` (the earlier one on a tie)."""
    steps = available_steps() if steps is None else steps
    if not steps:
        raise ValueError("This model folder has no snapshots: train it with `python -m training`.")
    return min(steps, key=lambda s: (abs(s - value), s))


def _key(step: int) -> tuple:
    return ("snapshot", str(default_model_dir()), step)


def _is_snapshot(key) -> bool:
    return isinstance(key, tuple) and bool(key) and key[0] == "snapshot"


def shared_snapshot(step: int) -> Decoder:
    """The snapshot at ``step``, shared and read-only (never modify it), kept in the result cache
    (``explorer.state.cache.results``); at most ``MAX_SHARED`` at once, the least recently used dropped first."""
    model = results.get_or_compute(_key(step), lambda: read_snapshot(check_step(step)), nbytes=_model_bytes)
    results.drop_where(_is_snapshot, keep=MAX_SHARED)
    return model


def _model_bytes(model: Decoder) -> int:
    return sum(module_bytes(model).values())


def is_loaded(step: int) -> bool:
    return results.contains(_key(step))


def forget_shared() -> None:
    """Drop every shared snapshot (the benchmark times a step read from disk)."""
    results.drop_where(_is_snapshot)


def read_snapshot(step: int) -> Decoder:
    """The snapshot's weights, in float32 on the app's device, gradients off. Read on one intra-op thread: a
    snapshot is small, and more threads on shared cores only wait for each other (bench/notes/training-tab.md)."""
    with run_threads(1):
        model = prepare(load_pretrained(snapshot_folder(step)))
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def cached_count() -> int:
    return results.count_where(_is_snapshot)


_log_lock = threading.Lock()
_log: tuple[tuple, dict] | None = None


def training_log() -> dict:
    """The default model's ``training_log.json`` (read again only when the file changes); {} when absent."""
    global _log
    path = default_model_dir() / "training_log.json"
    try:
        stat = path.stat()
    except OSError:
        return {}
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    with _log_lock:
        if _log is not None and _log[0] == key:
            return _log[1]
    log = json.loads(path.read_text())
    with _log_lock:
        _log = (key, log)
    return log


def log_version() -> tuple:
    """What identifies the training log now read (its path, change time and size): keys for what is drawn from it."""
    training_log()
    with _log_lock:
        return _log[0] if _log is not None else ()


def logged_snapshots() -> list[dict]:
    """The log's snapshot entries whose folders exist, in step order."""
    have = set(available_steps())
    return sorted((e for e in training_log().get("snapshots", []) if e.get("step") in have), key=lambda e: e["step"])
