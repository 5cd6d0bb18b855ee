"""The Training tab on the shipped model's snapshots: each snapshot read from disk, and the step slider's answer
timed as the tab computes it (``python -m explorer.bench.training`` runs these rows alone).

The slider's answer is timed cold (the snapshot read from disk first, as Play reads them when the shared cache of
``explorer.state.snapshots.MAX_SHARED`` has evicted it) and warm (the snapshot already in memory); both include
the scores, the pattern, the 24-token continuation, the figures and the JSON Gradio sends. Each step's time is
the median of three answers; the report gives the median and the slowest step.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

STEP_HEAD = "L1H0"  # any head: the answer's cost does not depend on which one
REPEATS = 3


def _sent_bytes(outputs) -> int:
    """Bytes of the JSON Gradio sends for a handler's outputs (figures as ``gr.Plot`` serialises them)."""
    import json

    import gradio as gr

    plot = gr.Plot(render=False)
    total = 0
    for v in outputs:
        if hasattr(v, "to_json") or isinstance(getattr(v, "plot", None), str):  # a Figure or a figure's payload
            total += len(plot.postprocess(v).plot)
        else:
            total += len(json.dumps(v, default=str))
    return total


def bench_training() -> dict[str, Any]:
    """{"skipped": why} when the default model has no snapshots; else the load and step-answer times."""
    from explorer.panels import training as tab
    from explorer.state import snapshots

    steps = snapshots.available_steps()
    if len(snapshots.logged_snapshots()) < 2:
        return {"skipped": "the default model folder has no training snapshots"}
    loads, sizes = [], []
    for step in steps:
        t0 = time.perf_counter()
        snapshots.read_snapshot(step)
        loads.append(time.perf_counter() - t0)
        sizes.append((snapshots.snapshot_folder(step) / "model.safetensors").stat().st_size)
    tab.step_view(steps[-1], STEP_HEAD, tab.DEFAULT_PROMPT)  # the curves drawn once, as at start-up
    cold, warm, payload = [], [], 0
    for step in steps:  # each step's time is the median of REPEATS answers: one stall of a shared core is not a step
        c, w = [], []
        for _ in range(REPEATS):
            snapshots.forget_shared()  # cold: the snapshot read from disk inside the answer
            t0 = time.perf_counter()
            out = tab.step_view(step, STEP_HEAD, tab.DEFAULT_PROMPT)
            c.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            tab.step_view(step, STEP_HEAD, tab.DEFAULT_PROMPT)
            w.append(time.perf_counter() - t0)
        payload = max(payload, _sent_bytes(out))
        cold.append(statistics.median(c))
        warm.append(statistics.median(w))
    return {"snapshots": len(steps), "total_bytes": sum(sizes),
            "load_seconds": {"median": statistics.median(loads), "max": max(loads)},
            "step_cold_seconds": {"median": statistics.median(cold), "max": max(cold)},
            "step_warm_seconds": {"median": statistics.median(warm), "max": max(warm)},
            "payload_bytes": payload}


if __name__ == "__main__":
    for key, value in bench_training().items():
        print(key, value)


LIVE_SEEDS = (0, 1, 2, 3, 4)
LIVE_SECONDS = 90.0  # the limit for each seed; a run ends 5 s after its phase change to keep this row short


def bench_live(log=print) -> dict[str, Any]:
    """``python -m training.live`` as the Training tab's "Train one now" runs it (one thread), once per seed: the
    seconds until its best induction score first reached 0.5, the final losses and scores, and the curves."""
    import torch
    from training.live import bench

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return bench(list(LIVE_SEEDS), LIVE_SECONDS, log=lambda line: log(f"live training: {line}"), after_phase_s=5.0)
    finally:
        torch.set_num_threads(threads)

