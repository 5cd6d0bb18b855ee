"""Where the model trained live in the Training tab lies on disk, and how ``live@final`` / ``live@step-N`` name it.

Every live run writes into its own folder under one root in the temporary directory (``EXPLORER_LIVE_ROOT``
overrides it), so the files are bounded: the folder of the run being trained, and the folder of the last run that
ended (published, the one ``live@...`` names). Publishing a run deletes the one it replaces; a published run is
deleted ``KEEP_S`` seconds after it ended (checked whenever a name is resolved or a run starts); the whole root goes
when the process exits. A visitor who loaded ``live@final`` keeps their copy in memory after its files are gone.
"""
from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path

KEEP_S = 30 * 60                 # a finished run stays loadable this long
SNAPSHOT_DIR = "checkpoints"     # training.live writes its snapshots here, as step-NNNNN
NAME = re.compile(r"^live@(final|step-(\d{1,7}))$")

_lock = threading.Lock()
_published: tuple[Path, float] | None = None   # (folder, when it ended)
_root: Path | None = None


def parse_name(source) -> str | int | None:
    """"final" for ``live@final``, the step for ``live@step-N``, None when ``source`` is no such name."""
    m = NAME.match(source.strip()) if isinstance(source, str) else None
    if m is None:
        return None
    return "final" if m.group(1) == "final" else int(m.group(2))


def root() -> Path:
    """This process's folder for live runs (made on first use, removed at exit)."""
    global _root
    with _lock:
        if _root is None:
            base = Path(os.environ.get("EXPLORER_LIVE_ROOT") or tempfile.gettempdir())
            base.mkdir(parents=True, exist_ok=True)
            _root = Path(tempfile.mkdtemp(prefix=f"explorer-live-{os.getpid()}-", dir=base))
            atexit.register(shutil.rmtree, _root, True)
        return _root


def new_folder() -> Path:
    """An empty folder for the next run's checkpoint."""
    return Path(tempfile.mkdtemp(prefix="run-", dir=root()))


def publish(folder: Path, ended: float | None = None) -> None:
    """Make ``folder`` (a finished run's checkpoint) the one ``live@...`` names; the run it replaces is deleted."""
    global _published
    with _lock:
        old, _published = _published, (Path(folder), time.time() if ended is None else ended)
    if old is not None and old[0] != Path(folder):
        shutil.rmtree(old[0], ignore_errors=True)


def discard(folder: Path) -> None:
    """Delete a run's folder that will never be published (its training failed)."""
    with _lock:
        if _published is not None and _published[0] == Path(folder):
            return
    shutil.rmtree(folder, ignore_errors=True)


def expire(now: float | None = None) -> None:
    """Delete the published run once it is ``KEEP_S`` seconds old."""
    global _published
    now = time.time() if now is None else now
    with _lock:
        old = _published
        if old is None or now - old[1] < KEEP_S:
            return
        _published = None
    shutil.rmtree(old[0], ignore_errors=True)


def published() -> Path | None:
    """The folder of the last finished live run, or None (none yet, or it expired)."""
    expire()
    with _lock:
        return _published[0] if _published is not None else None


def snapshot_steps(folder: Path) -> list[int]:
    found = []
    for f in (folder / SNAPSHOT_DIR).glob("step-*"):
        m = re.fullmatch(r"step-(\d+)", f.name)
        if m and (f / "config.json").is_file():
            found.append(int(m.group(1)))
    return sorted(found)


def names() -> list[str]:
    """The names a visitor can load now: ``live@final`` and one per snapshot, or [] before any run ended."""
    folder = published()
    if folder is None:
        return []
    return ["live@final", *(f"live@step-{n}" for n in snapshot_steps(folder))]


def folder_for(source: str) -> Path:
    """The checkpoint folder ``live@final`` or ``live@step-N`` names; ValueError saying what to do otherwise."""
    which = parse_name(source)
    if which is None:
        raise ValueError(f"{source[:40]!r} is not a live name: write live@final or live@step-N.")
    folder = published()
    if folder is None:
        raise ValueError("No live run has finished in the last 30 minutes: press Train one now in the Training tab, "
                         "wait for it to end (or press Stop), then load live@final.")
    if which == "final":
        return folder
    steps = snapshot_steps(folder)
    if which not in steps:
        shown = ", ".join(str(n) for n in steps) or "none"
        raise ValueError(f"The last live run has no snapshot at step {which}; its snapshots are at steps {shown}: "
                         "load one of those, or live@final.")
    return folder / SNAPSHOT_DIR / f"step-{which:05d}"
