"""``python -m explorer.bench --out DIR [--quick] [--device cpu|cuda] [--dtype float32|bfloat16]``

Writes DIR/bench.md and DIR/bench.json, everything measured in this run on this machine:
  (a) naive vs sdpa vs tiled attention: measured and predicted peak memory, time, agreement, over lengths;
  (b) greedy decoding of 128 tokens with and without the KV cache (tokens compared);
  (c) our decoder vs transformers' LlamaForCausalLM on the same random weights at the SmolLM2-135M shape:
      prefill time at T=128 and T=512, greedy decoding of 64 tokens (tokens/s), measured interleaved, and
      decoding against the memory-bandwidth bound (weight bytes read per token / measured copy bandwidth);
  (d) the machine.
The markdown opens with the project's targets (issues 3 and 7), each with its measured value and pass/fail.
``--quick`` runs smaller (fewer lengths and layers, fewer repeats) and says so in the report.
"""
from __future__ import annotations

from .command import main, run_bench
from .report import render_markdown
from .runs import app_handler, bench_app, settings_for, weight_bytes_per_token
from .targets import TARGETS, Target, evaluate_targets, metrics

__all__ = ["main", "run_bench", "render_markdown", "app_handler", "bench_app", "settings_for",
           "weight_bytes_per_token", "TARGETS", "Target", "evaluate_targets", "metrics"]
