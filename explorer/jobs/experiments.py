"""The Experiments tab's long actions as jobs: a Stop ends them within a torch operation, a time cap ends them
with what they computed.

    for update in capped(model, lambda: iv.iter_knockout_sweep(model, [ids]), cap_s=EXPERIMENT_SECONDS):
        if update is STILL_RUNNING: ...     # every quarter second while a layer computes
        update.done, update.total, update.result, update.capped, update.finished

The steps (an iterator of (done, total, result so far), ``explorer.interventions``' ``iter_*``) run on a worker
thread (``measure.run.abandonable``) under the model's thread count, with a Stop check before every torch
operation (``state.threads.stop_between_ops``): closing the updates (Gradio's cancel, from the Stop button) ends
the worker after the operation it is in. Past ``cap_s`` the worker is stopped the same way and a last update says
``capped``, carrying the result of the steps completed.

    within_cap(compute, "the induction scores at span 120", "choose a shorter span")
                                        # a one-call probe: its value, or a sentence once it passes the cap

    EXPLORER_EXPERIMENT_SECONDS   the cap (default 60 s): the 270-head sweep on the SmolLM2-135M shape at 64 tokens
                                  ran 87 s uncapped on 2 cores
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from typing import Any, Callable, Iterator

from explorer.measure.run import STILL_RUNNING, abandonable
from explorer.state import session
from explorer.state.threads import TimeLimit, stop_between_ops, time_limit


def _seconds() -> float:
    try:
        return max(1.0, float(os.environ.get("EXPLORER_EXPERIMENT_SECONDS", "") or 60))
    except ValueError:  # a bad setting must not stop the app from starting
        return 60.0


EXPERIMENT_SECONDS = _seconds()


@dataclasses.dataclass
class Update:
    done: int  # steps completed (layers, or layers of each site)
    total: int
    result: Any  # the steps' result so far (entries not computed yet are NaN)
    elapsed: float  # seconds since the job started
    capped: bool = False  # the time cap ended it: ``result`` holds the ``done`` steps completed
    finished: bool = False  # every step completed


def capped(model, steps: Callable[[], Iterator], *, cap_s: float = EXPERIMENT_SECONDS) -> Iterator:
    """``steps()`` on a worker thread: yields ``STILL_RUNNING`` while a step computes, an ``Update`` after each step,
    and ends with an update that is ``finished`` or ``capped`` (after ``cap_s`` seconds). Nothing is yielded for a
    Stop: the caller closed these updates."""
    t0 = time.monotonic()

    def work():
        with session.threads_for(model), stop_between_ops():
            yield from steps()

    last = None
    with contextlib.closing(abandonable(work())) as updates:
        for item in updates:
            elapsed = time.monotonic() - t0
            if item is not STILL_RUNNING:
                done, total, result = item
                last = Update(done, total, result, elapsed, finished=done >= total)
                yield last
                if last.finished:
                    return
            elif elapsed <= cap_s:
                yield STILL_RUNNING
            if elapsed > cap_s:
                break  # closing the updates stops the worker before its next torch operation
    if last is None or not last.finished:
        yield Update(0 if last is None else last.done, 0 if last is None else last.total,
                     None if last is None else last.result, time.monotonic() - t0, capped=True)


def seconds_left(update: Update, layers: int) -> float:
    """About how many seconds ``update``'s job has left, from its pace so far: step i (a layer, or a layer of each
    site) counts as ``layers - i % layers`` rows of blocks, since its rows run from that layer to the last."""
    work = [layers - i % max(1, layers) for i in range(update.total)]
    done = sum(work[:update.done])
    return update.elapsed * (sum(work) - done) / done if done else float("nan")


def progress_text(what: str, update: Update, layers: int) -> str:
    """``what``: layer 6 of 30 done (4 s, about 3 s left)."""
    left = seconds_left(update, layers)
    about = f", about {left:.0f} s left" if left == left else ""
    return f"{what}: layer {update.done} of {update.total} done ({update.elapsed:.0f} s{about})."


def within_cap(compute: Callable[[], Any], what: str, change: str) -> Any:
    """``compute()`` on this thread, ended before its next torch operation once it passes ``EXPERIMENT_SECONDS``:
    then ValueError saying ``what`` ran past the limit and ``change`` (what to do instead)."""
    cap = EXPERIMENT_SECONDS
    try:
        with time_limit(cap), stop_between_ops():
            return compute()
    except TimeLimit:
        raise ValueError(f"{what} ran past the {cap:g} s limit on this model: {change}.") from None
