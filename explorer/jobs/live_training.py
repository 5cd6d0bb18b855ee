"""Train one live (the Training tab's "Train one now"): one run per server at a time, on a worker thread, watched
by every visitor who presses the button while it runs.

    run = start(seconds, seed)     # a new run, or the one already running (another visitor's: same curves)
    for view in updates(run):      # about every second: (records so far, the run), then once more at the end
        ...
    stop(run)                      # ends it before the next step; the steps so far are written and loadable
    final_folder()                 # the last finished run's checkpoint (``live@final``), or None

The run trains ``training.live``'s 2-layer decoder on one intra-op thread, so the server's other core stays free
for every other visitor. Its records are capped (``MAX_RECORDS``); its checkpoint, with snapshots every
``SNAPSHOT_EVERY`` steps (at most ``MAX_SNAPSHOTS``) and at the phase change, goes to a folder that
``explorer.state.live_models`` bounds and deletes (replaced by the next run, 30 minutes after it ended, at exit).
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Iterator

from explorer.state import live_models
from explorer.state.threads import run_threads
from training.live import PHASE_SCORE, LiveSettings, check_seed, thin, train_live

MAX_SECONDS = 120.0        # the longest run a visitor may start: the phase change comes after 10-14 s
DEFAULT_SECONDS = 45.0       # the phase change came at 24 s with the machine loaded (bench/notes/live-training.md)
MAX_RECORDS = 400          # about one a second: a 120-second run needs far fewer
SNAPSHOT_EVERY = 200
MAX_SNAPSHOTS = 10
UPDATE_EVERY_S = 1.0
STOP_WAIT_S = 10.0         # the longest a step and the final write take here is well under a second

__all__ = ["LiveJob", "start", "stop", "records", "updates", "current", "final_folder", "PHASE_SCORE"]


class LiveJob:
    """One live run as the page sees it: its records so far, its phase change, whether and how it ended."""

    def __init__(self, seconds: float, seed: int, folder: Path, owner: str | None = None) -> None:
        self.seconds, self.seed, self.folder = seconds, seed, folder
        self.owner = owner  # the session that started it: on a public server only it may stop the class's run
        self.started = time.time()
        self.stop_event = threading.Event()
        self.finished = threading.Event()
        self.outcome: str | None = None      # None while running; then "time", "stop" or "failed"
        self.error: str | None = None
        self.phase: dict | None = None       # the phase change's record (step, seconds, best induction)
        self._records: list[dict] = []
        self._lock = threading.Lock()

    def add(self, record: dict) -> None:
        with self._lock:
            self._records = thin(self._records + [record], MAX_RECORDS)
            if record.get("phase_change") and self.phase is None:
                self.phase = record


_lock = threading.Lock()
_current: LiveJob | None = None


def check_seconds(seconds) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= MAX_SECONDS:
        raise ValueError(f"A live run lasts more than 0 and at most {MAX_SECONDS:g} seconds, not {seconds!r}: "
                         "choose a time in that range.")
    return float(seconds)


def start(seconds: float = DEFAULT_SECONDS, seed: int = 0, *, settings: LiveSettings | None = None,
          owner: str | None = None) -> LiveJob:
    """Start a live run on a worker thread, or return the one running now (whoever started it). ``owner`` (a
    session id) is the only one ``stop(..., by=...)`` obeys."""
    global _current
    seconds, seed = check_seconds(seconds), check_seed(seed)
    live_models.expire()
    with _lock:
        if _current is not None and not _current.finished.is_set():
            return _current
        job = LiveJob(seconds, seed, live_models.new_folder(), owner)
        _current = job
    threading.Thread(target=_work, args=(job, settings), name="live-training", daemon=True).start()
    return job


def _work(job: LiveJob, settings: LiveSettings | None) -> None:
    steps = range(0, SNAPSHOT_EVERY * MAX_SNAPSHOTS, SNAPSHOT_EVERY)
    try:
        with run_threads(1):
            run = train_live(job.seconds, job.seed, str(job.folder), settings=settings, on_step=job.add,
                             should_stop=job.stop_event.is_set, snapshot_steps=steps, snapshot_phase=True)
        live_models.publish(job.folder)
        job.outcome = run.stopped
    except Exception as exc:  # the page shows it; the worker thread must end with the run marked
        job.outcome, job.error = "failed", f"{type(exc).__name__}: {exc}"
        live_models.discard(job.folder)
    finally:
        job.finished.set()


def current() -> LiveJob | None:
    """The running run, or the last one started."""
    with _lock:
        return _current


def records(job: LiveJob) -> list[dict]:
    """The run's records so far (a copy), oldest first."""
    with job._lock:
        return list(job._records)


def updates(job: LiveJob, every: float = UPDATE_EVERY_S) -> Iterator[list[dict]]:
    """The records so far about every ``every`` seconds while the run trains, and once more when it has ended
    (its checkpoint written). Closing the generator leaves the run training: others may be watching it."""
    while not job.finished.wait(every):
        yield records(job)
    yield records(job)


def stop(job: LiveJob | None = None, wait_s: float = STOP_WAIT_S, *, by: str | None = None) -> LiveJob | None:
    """Stop ``job`` (default: the current one) before its next step and wait up to ``wait_s`` for its checkpoint
    to be written. Returns the run, or None when there was none. With ``by`` (a session id), a run someone else
    started is refused with a sentence: a watcher must not end the lecturer's run."""
    job = job or current()
    if job is not None and by is not None and job.owner is not None and by != job.owner:
        left = max(0.0, job.started + job.seconds - time.time())
        raise ValueError(f"Only the page that started this live run can stop it; it ends by itself in about "
                         f"{left:.0f} s and then loads as live@final.")
    if job is not None:
        job.stop_event.set()
        job.finished.wait(wait_s)
    return job


def final_folder() -> Path | None:
    """The checkpoint folder of the last run that ended (``live@final``), or None."""
    return live_models.published()
