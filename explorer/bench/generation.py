"""The KV cache & generation tab's stream, timed: time to the first streamed token and the total time of a
``GENERATION_TOKENS``-token greedy generation, including the uncached comparison at its bounded schedule
(``probes.uncached_schedule``), exactly as the tab runs it (``probes.stream_generation``), with each of the tab's
decode paths (the modules, its default, and the fast step)."""
from __future__ import annotations

import time
from typing import Any

import torch

from explorer import probes
from lens.device import synchronize

GENERATION_TOKENS = 128


def _time_stream(model, prompt: torch.Tensor, settings: dict[str, Any], step) -> dict[str, Any]:
    schedule = probes.uncached_schedule(GENERATION_TOKENS)
    for _ in probes.stream_generation(model, prompt, 4, uncached_at={0, 3}, step=step):
        pass
    firsts, totals, fast = [], [], 0
    n = 0
    for _ in range(max(1, settings.get("cache_repeats", 1))):
        synchronize(prompt.device)
        start = time.perf_counter()
        first = None
        n = fast = 0
        for st in probes.stream_generation(model, prompt, GENERATION_TOKENS, uncached_at=schedule, step=step):
            n += 1
            fast += st["fast_step"]
            if first is None:
                first = time.perf_counter() - start
        totals.append(time.perf_counter() - start)
        firsts.append(first)
    first_s, total_s = sorted(firsts)[len(firsts) // 2], sorted(totals)[len(totals) // 2]
    return {"first_token_seconds": first_s, "total_seconds": total_s, "new_tokens": n,
            "uncached_steps": len(schedule), "tokens_per_second": n / total_s if total_s > 0 else float("nan"),
            "repeats": len(totals), "fast_steps": fast}


def bench_generation(model, prompt: torch.Tensor, settings: dict[str, Any]) -> dict[str, Any]:
    """Median over ``settings["cache_repeats"]`` runs (after one untimed warm-up run of 4 tokens), for each decode
    path of the tab (``probes.generation.DECODE_PATHS``).

    Returns, for the tab's default path (the modules): first_token_seconds (call to the first yielded step: cache
    allocation, prefill, first sample), total_seconds (call to the last step, uncached timings included),
    new_tokens, uncached_steps (how many steps also ran the uncached forward), tokens_per_second (new tokens /
    total), fast_steps (steps the fast step computed); ``path`` names it, and ``paths`` holds the same for each path."""
    paths = {name: _time_stream(model, prompt, settings, step)
             for name, step in probes.generation.DECODE_PATHS.items()}
    default = probes.generation.DEFAULT_DECODE
    return {**paths[default], "path": default, "paths": paths}
