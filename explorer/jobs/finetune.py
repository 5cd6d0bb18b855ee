"""The LoRA fine-tune as a job: one run per session at a time, on a worker thread, stoppable from another request.

    run, updates = start(state, model, rows=..., ids=..., targets=..., rank=..., alpha=..., settings=...)
    for item in updates:          # STILL_RUNNING while a step computes, else ("start", loss before),
        ...                       # ("step", record) per completed step, ("end", loss after)
    updates.close()               # a caller that stops listening (Gradio's cancel) stops the worker too
    stop(state)                   # another request: stop this session's run, wait for its worker to end

A run's record (``FinetuneRun``) says whether it ended and how, and the steps it completed: the adapter on the
model is the one after exactly that many, whatever ended it.
"""
from __future__ import annotations

import math
import threading
import uuid
from collections import OrderedDict
from typing import Iterator

from explorer import finetune
from explorer.measure.run import abandonable
from explorer.state import session
from explorer.state.threads import stop_between_ops
from lens.hooks import model_lock
from models.lora import attach_lora, detach_lora

RUN_KEY = "finetune_run"  # where a session's state keeps the token of its latest run
STOP_WAIT_S = 10.0  # how long ``stop`` waits for the worker to end (it ends within an operation)
_KEEP_RUNS = 1024


class FinetuneRun:
    """One fine-tune's worker, as a Stop request finds it: its stop, whether it ended and how, and the steps it
    completed (the adapter on the model is the one after exactly that many)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.finished = threading.Event()
        self.steps = 0
        self.outcome: str | None = None  # None while running; then "done", "diverged", "stopped" or "failed"


# Runs by the token a session's state keeps; the newest _KEEP_RUNS are kept after they end, so a Stop that lands just
# after its run ended still finds where it ended. No model or state is held here.
_RUNS: "OrderedDict[str, FinetuneRun]" = OrderedDict()
_RUNS_LOCK = threading.Lock()


def start(state: dict, model, *, rows, ids, targets, rank: int, alpha: float, settings: dict
          ) -> tuple[FinetuneRun, Iterator]:
    """Register a run for this session (``state[RUN_KEY]``) and return it with its updates; the training starts
    on a worker thread when the updates are first read.

    model: the session's own copy (never the shared one). rows, ids: the text as ``finetune.make_rows`` cut it and
    its token ids; targets, rank, alpha: the adapter (checked); settings: ``finetune.iter_finetune``'s keywords.
    The updates yield ``STILL_RUNNING`` every quarter second while a step computes (so a caller can be closed at
    once), ("start", loss before training), ("step", record) per completed step and ("end", loss after). A
    diverged run's adapter is removed before its step is yielded; its outcome says so.
    """
    run, token = FinetuneRun(), uuid.uuid4().hex
    with _RUNS_LOCK:
        _RUNS[token] = run
        while len(_RUNS) > _KEEP_RUNS:
            _RUNS.popitem(last=False)
    state[RUN_KEY] = token
    work = _training(run, model, model_lock(model), state, rows, targets, rank, alpha, ids, settings)
    return run, abandonable(work, stop=run.stop)


def find(state) -> FinetuneRun | None:
    """This session's latest run (running or ended), or None."""
    token = state.get(RUN_KEY) if isinstance(state, dict) else None
    with _RUNS_LOCK:
        return _RUNS.get(token) if isinstance(token, str) else None


def stop(state, wait_s: float = STOP_WAIT_S) -> FinetuneRun | None:
    """Stop this session's running fine-tune and wait up to ``wait_s`` for its worker to end. Returns the run
    (``finished`` unset if it is still ending; ``outcome`` "stopped", or another if it ended on its own just
    before), or None when nothing was running."""
    run = find(state)
    if run is None or run.outcome in ("done", "diverged", "failed"):
        return None
    run.stop.set()
    run.finished.wait(wait_s)
    return run


def _training(run: FinetuneRun, model, lock, state: dict, rows, targets, rank: int, alpha: float, ids,
              settings: dict):
    """The fine-tune's work, on ``abandonable``'s worker thread (where a Stop reaches it inside a step). The
    session's state and ``run`` say the steps completed as soon as each completes."""
    try:
        with session.threads_for(model):  # a defined thread count: the same numbers under load as alone
            with lock:
                detach_lora(model)  # the adapter swap itself is never cut by a Stop: it is whole, and the state says so
                attach_lora(model, targets, rank=rank, alpha=alpha)
                state["lora"] = {"rank": rank, "alpha": alpha, "targets": list(targets), "mode": "on",
                                 "trained_steps": 0}
                with stop_between_ops():
                    start_loss = finetune.evaluate_loss(model, rows)
            yield "start", start_loss
            gen = finetune.iter_finetune(model, ids, **settings)
            try:
                while True:
                    with lock:  # per step: the session's other requests on its model run between steps
                        record = next(gen, None)
                    if record is None:
                        break
                    if not math.isfinite(record["loss"]) or record["stopped"] == "diverged":
                        with lock:
                            detach_lora(model)
                        state.pop("lora", None)
                        run.outcome = "diverged"
                        yield "step", record
                        return
                    run.steps = state["lora"]["trained_steps"] = record["step"]
                    yield "step", record
            finally:
                with lock:
                    gen.close()
            with lock, stop_between_ops():
                end_loss = finetune.evaluate_loss(model, rows)
            run.outcome = "done"
            yield "end", end_loss
    finally:
        if run.outcome is None:
            run.outcome = "stopped" if run.stop.is_set() else "failed"
        run.finished.set()
