"""Instruments every panel reads: hook names, ``run_with_cache``, attention patterns, head scores, the
generation trace and the positional (RoPE / sinusoidal) probes.

Notation: ``B`` batch, ``T`` queries, ``S`` keys, ``L`` layers, ``H`` query heads, ``Hkv`` key/value heads,
``D`` head dim, ``C`` model dim, ``V`` vocabulary.

Everything here observes the model through its hook points (``models.hooks.HookPoint``) and never changes
what it computes. The package by job:
    patterns      attention patterns, the implementations compared
    generation    the generation trace, with and without the KV cache
    positions     the RoPE and sinusoidal probes
    walkthrough   one token followed through the decoder, step by step
    encoder_probe the encoder beside the decoder (fill in the blank, masks, norms)
Hook names, ``run_with_cache`` and head scores live in ``lens`` (training uses them too); they are handed on here.
"""
from __future__ import annotations

from .generation import (CacheComparison, GenerationStep, GenerationTrace, compare_cache, generation_trace,
                         stream_generation, uncached_schedule)
from lens.heads import HeadScores, head_scores, pattern_scores
from lens.hooks import ActivationCache, check_head, check_layer, hook_names, run_with_cache
from .patterns import (
    all_patterns,
    attention_pattern,
    compare_impls,
    patterns_with_source,
    PromptForward,
    prompt_forward,
)
from .positions import RopeProbe, SinusoidalProbe, rope_probe, sinusoidal_probe

__all__ = [
    "ActivationCache",
    "hook_names",
    "run_with_cache",
    "check_layer",
    "check_head",
    "attention_pattern",
    "all_patterns",
    "patterns_with_source",
    "PromptForward",
    "prompt_forward",
    "compare_impls",
    "HeadScores",
    "head_scores",
    "pattern_scores",
    "GenerationStep",
    "GenerationTrace",
    "CacheComparison",
    "generation_trace",
    "stream_generation",
    "uncached_schedule",
    "compare_cache",
    "RopeProbe",
    "SinusoidalProbe",
    "rope_probe",
    "sinusoidal_probe",
]
