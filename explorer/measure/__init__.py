"""Memory and time, measured and predicted: attention implementations, the tiled trace, and calculators.

Notation: B batch, H query heads, Hkv key/value heads, T queries, S keys (T == S here: self-attention over
the whole sequence), D head dim, L layers, C model dim, F feed-forward dim, V vocabulary.

Two kinds of number live here and are never mixed up:
    measured   ``peak_bytes`` and ``seconds`` come from running the code (``run``, through ``profile``: the
               one place that reads the allocator or the profiler). Process RSS is never used: the C
               allocator keeps freed pages.
    predicted  ``predicted_bytes`` (``predict``) walks the statements of each implementation in
               ``models.attention`` and keeps a running total of the tensors alive at each step.

The package by job:
    units        bytes parsed and formatted, dtypes, the memory budget (``MEMORY_BUDGET_BYTES``)
    predict      predicted peak bytes per implementation; the budget check before anything is allocated
    profile      peak memory and wall time of one call (private torch profiler API behind a version check)
    run          measurements: attention_memory, sweeps (timed_sweep stops before the time limit), tiled_trace
    calculators  parameters, weight bytes, KV cache, LoRA from a configuration; real configurations as data
    machine      CPU, cores, versions: where a number comes from

Every size the app or the benchmark asks for is checked against ``MEMORY_BUDGET_BYTES`` before a single
tensor is allocated. The budget lives in ``units``; ``measure.MEMORY_BUDGET_BYTES`` reads it there, so a test
or an operator changes it in one place (``measure.units.MEMORY_BUDGET_BYTES``).
"""
from __future__ import annotations

from .calculators import (
    COMPONENTS,
    DATA_DIR,
    REAL_CONFIGS_PATH,
    attention_variants,
    kv_cache_bytes,
    load_real_configs,
    lora_linear_parameters,
    lora_parameters,
    module_bytes,
    parameter_count,
    parameter_memory,
    parameters_by_component,
    projection_shapes,
    real_config,
    real_config_table,
)
from lens.machine import cpu_cores, cpu_model, machine_info, runtime_info
from .predict import (
    check_budget,
    input_bytes,
    largest_fitting_seq_len,
    predict_attention_bytes,
    predict_naive_bytes,
    predict_sdpa_bytes,
    predict_tiled_bytes,
    request_bytes,
    sdpa_cpu_split_sizes,
)
from .profile import measure_peak_bytes, memory_source, peak_bytes_cpu, sync, time_call, timed
from .run import (
    SweepStep,
    attention_memory,
    attention_sweep,
    copy_bandwidth,
    random_qkv,
    tiled_trace,
    timed_sweep,
)
from .units import (
    DEFAULT_MEMORY_BUDGET_BYTES,
    DTYPES,
    GIB,
    MIB,
    budget_from_env,
    as_dtype,
    element_size,
    format_bytes,
    parse_bytes,
    resolve_budget,
)
from . import units


def __getattr__(name: str):
    if name == "MEMORY_BUDGET_BYTES":  # read where it lives, so a change there is seen here
        return units.MEMORY_BUDGET_BYTES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
