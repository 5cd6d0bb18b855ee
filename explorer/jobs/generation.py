"""The generation tab's stream as a job: the prompt's tokens in, one ``GenerationRun`` out after every new token.

    for run in stream(model, ids, max_new_tokens=64, temperature=0.0, top_k=None, top_p=None, seed=0,
                      decode=probes.generation.MODULES, stops=stop_ids, top=10):
        ...  # run.steps so far (``probes.stream_generation``'s records); run.done on the last one

The model's lock is held around each step's computation only (``probes.stream_generation``), never while the
caller holds a run, so a caller that stops reading (Gradio's cancel, the Stop button) frees the model within one
token. Settings are checked by the caller; the loop itself checks what ``models.generate.generate_steps`` checks.
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

from explorer import probes
from explorer.probes.generation import DECODE_PATHS
from explorer.state import session
from explorer.state.cache import model_id, results
from explorer.state.locks import MEASURE_LOCK
from lens.hooks import model_lock
from models.speed import decode_layout_bytes


@dataclasses.dataclass
class GenerationRun:
    """One generation as far as it went: its prompt, its settings' consequences and its steps."""
    ids: list[int]  # the prompt's token ids
    stops: list[int]  # the ids that end it (the model's end-of-text / end-of-turn tokens)
    schedule: set[int]  # the steps at which the uncached forward is timed too (``probes.uncached_schedule``)
    stood_aside: str | None  # why the chosen fast step would not compute this model (None: it would, or none chosen)
    steps: list[dict] = dataclasses.field(default_factory=list)  # ``probes.stream_generation``'s records
    check: dict | None = None  # ``probes.generation.modules_check`` of the fast step's tokens, when it computed any
    layout_bytes: int = 0  # what the fast step's own copy of the weights holds (``models.speed.decode_layout_bytes``)
    done: bool = False


def warm_up(model, ids: list[int], decode: str) -> None:
    """One short untimed run per model and decode path, so the first visitor's timings do not include one-off
    start-up costs (first allocations, kernel selection, the fast step choosing its products' library)."""
    def run() -> bool:
        for use_cache in (True, False):
            probes.generation_trace(model, ids[:8], 2, use_cache=use_cache, step=DECODE_PATHS[decode])
        return True

    results.get_or_compute(("generation.warm_up", model_id(model), decode), run)


def stream(model, ids: list[int], *, max_new_tokens: int, temperature: float, top_k: int | None,
           top_p: float | None, seed: int, decode: str, stops, top: int) -> Iterator[GenerationRun]:
    """Generate from ``ids`` with the KV cache, timing the uncached forward at a few steps beside it; yields the
    run after every token, then once more, ``done``, with the fast step's tokens checked against the modules
    (``decode``: a key of ``DECODE_PATHS``)."""
    step = DECODE_PATHS[decode]
    with session.default_threads(), model_lock(model):
        warm_up(model, ids, decode)
        stood_aside = None if step is None else step.why_not(model)  # under the lock: no other user's hooks on it
    run = GenerationRun(ids=ids, stops=stops, schedule=probes.uncached_schedule(max_new_tokens),
                        stood_aside=stood_aside)
    steps = probes.stream_generation(
        model, ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, stop_tokens=stops,
        uncached_at=run.schedule, top=top, step_lock=model_lock(model), measure_lock=MEASURE_LOCK, step=step)
    with session.default_threads():
        for st in steps:
            run.steps.append(st)
            yield run
        if any(st["fast_step"] for st in run.steps):  # the fast step's tokens, checked against the modules
            with model_lock(model):
                run.check = probes.generation.modules_check(model, ids, run.steps)
            run.layout_bytes = decode_layout_bytes(model)
    run.done = True
    yield run
