"""Numbers out of range, extreme temperatures, layers and heads far out: a short sentence before anything runs.

Shared helpers and fixtures: tests/hostile.py.
"""
from __future__ import annotations

import math
import re

import gradio as gr
import pytest

from tests.hostile import (  # noqa: F401 - fixtures are found by their names here
    VIEWS, check_finite, forbid, forbid_model_runs, fresh, hub_local_only, served,
)

pytestmark = pytest.mark.usefixtures("served")  # not an argument: hypothesis would print the model


def _numbers_cases():
    from explorer.panels import encoder_decoder, generation, lora, memory, positions

    quiet = lambda *a, **k: None  # noqa: E731
    g = lambda **kw: generation.generate(**{**dict(prompt="Tom has a red", max_new_tokens=4, temperature=0.8,  # noqa
                                                     top_k=50, top_p=0.95, seed=0, state=fresh()), **kw})
    ft = lambda **kw: list(lora.lora_finetune(**{**dict(rank=2, alpha=4, targets=["q_proj"],  # noqa: E731
                                                         text="Tom has a red ball. Anna has a red ball.", steps=2,
                                                         lr=1e-2, max_seconds=5, state=fresh(), progress=quiet), **kw}))
    mc = lambda **kw: list(memory.memory_compare(**{**dict(max_T=128, n_heads=2, head_dim=16, n_kv_heads=2,  # noqa
                                                           impls=["naive"], causal=True, dtype="float32",
                                                           progress=quiet), **kw}))
    return {
        "negative length": (lambda: g(max_new_tokens=-1), "new tokens must be a whole number"),
        "zero length": (lambda: g(max_new_tokens=0), "new tokens must be a whole number"),
        "absurd length": (lambda: g(max_new_tokens=10**9), "new tokens must be a whole number"),
        "top_p above 1": (lambda: g(top_p=1.5), r"top-p must lie in \(0, 1\]"),
        "top_p 0": (lambda: g(top_p=0), r"top-p must lie in \(0, 1\]"),
        "top_p negative": (lambda: g(top_p=-0.2), r"top-p must lie in \(0, 1\]"),
        "negative temperature": (lambda: g(temperature=-1), "temperature must be 0"),
        "infinite temperature": (lambda: g(temperature=float("inf")), "temperature must be at most"),
        "NaN temperature": (lambda: g(temperature=float("nan")), "temperature must be a number"),
        "underflowing temperature": (lambda: g(temperature=1e-300), "at least 1e-9"),
        "denormal temperature": (lambda: g(temperature=5e-324), "at least 1e-9"),
        "top_k 0": (lambda: g(top_k=0), "top-k must be a whole number"),
        "rank 0": (lambda: lora.lora(0, 16, ["q_proj"], fresh()), "rank must be a whole number from 1"),
        "rank 0 fine-tune": (lambda: ft(rank=0), "rank must be a whole number from 1"),
        "absurd steps": (lambda: ft(steps=10**9), "steps must be a whole number from 1 to"),
        "negative steps": (lambda: ft(steps=-3), "steps must be a whole number from 1 to"),
        "absurd time limit": (lambda: ft(max_seconds=10**6), "time limit must lie in"),
        "huge learning rate": (lambda: ft(lr=1e9), "learning rate must lie in"),
        "negative sweep length": (lambda: mc(max_T=-5), "max sequence length must be a whole number"),
        "absurd sweep length": (lambda: mc(max_T=10**12), "max sequence length must be a whole number"),
        "infinite sweep length": (lambda: mc(max_T=float("inf")), "max sequence length must be a whole number"),
        "infinite trace block": (lambda: memory.memory_trace(64, float("inf"), True, 0), "block size must be"),
        "infinite fine-tune steps": (lambda: ft(steps=float("inf")), "steps must be a whole number from 1 to"),
        "KV heads not dividing": (lambda: mc(n_heads=3, n_kv_heads=2), "must divide"),
        "absurd trace": (lambda: memory.memory_trace(10**9, 8, True, 0), "trace length must be"),
        "negative KV length": (lambda: generation.kv_calculator("this app's model", -1, 1, "float16", fresh()),
                               "sequence length must be a whole number"),
        "theta below 1": (lambda: positions.rope_view("Tom", 0.5, 5, [0], 0, 0, fresh()), "rope_theta must lie"),
        "token far out": (lambda: encoder_decoder.encoder_decoder_view("Tom has", 0, 0, 10**6, fresh()),
                          "token position must be"),
        "layer far out": (lambda: encoder_decoder.encoder_decoder_view("Tom has", 10**6, 0, 0, fresh()),
                          "layer must be between"),
    }


@pytest.mark.parametrize("case", [
    "negative length", "zero length", "absurd length", "top_p above 1", "top_p 0", "top_p negative",
    "negative temperature", "infinite temperature", "NaN temperature", "underflowing temperature",
    "denormal temperature", "top_k 0", "rank 0", "rank 0 fine-tune",
    "absurd steps", "negative steps", "absurd time limit", "huge learning rate", "negative sweep length",
    "absurd sweep length", "infinite sweep length", "infinite trace block", "infinite fine-tune steps",
    "KV heads not dividing", "absurd trace", "negative KV length", "theta below 1",
    "token far out", "layer far out"])
def test_numbers_out_of_range_are_refused_before_anything_runs(monkeypatch, case):
    from explorer import finetune, measure

    call, message = _numbers_cases()[case]
    forbid_model_runs(monkeypatch)
    forbid(monkeypatch, measure, "attention_sweep", "attention_memory", "tiled_trace")
    forbid(monkeypatch, finetune, "count_adapted")
    with pytest.raises(gr.Error, match=message) as info:
        call()
    assert len(info.value.message) > 20  # a sentence, not a code


@pytest.mark.parametrize("temperature", [1e-9, 1e-6, 1e9, 1e12])
def test_extreme_temperatures_draw_finite_probabilities(temperature):
    from explorer.panels.generation import generate

    out = generate("Tom has a red", 4, temperature, None, None, 0, fresh())
    check_finite(out)
    for step in out.view["steps"]:
        probs = step["top_probs"] + step["model_probs"]
        assert all(math.isfinite(p) and 0 <= p <= 1 + 1e-6 for p in probs)
        assert sum(step["top_probs"]) <= 1 + 1e-5


@pytest.mark.parametrize("config", [[], {}, ["SmolLM2-135M"], 3.5])
def test_kv_calculator_with_a_configuration_that_is_not_a_name_gets_a_sentence(config):
    from explorer.panels.generation import kv_calculator

    with pytest.raises(gr.Error, match="unknown configuration .*: choose one from the list"):
        kv_calculator(config, 1024, 1, "float16", fresh())


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), 1e308, 10**400, "1e308"])
def test_layer_and_head_far_out_of_range_get_a_short_sentence(value):
    """JSON Infinity and 1e308 (a whole number of 309 digits) as a layer or head: a short sentence quoting the
    value as it was sent (1e+308), never its 309 digits."""
    from explorer.panels.attention import attention_view
    from explorer.panels.encoder_decoder import encoder_decoder_view

    for call in (lambda: attention_view("Tom has a ball.", value, 0, VIEWS[0], fresh()),
                 lambda: attention_view("Tom has a ball.", 0, value, VIEWS[0], fresh()),
                 lambda: encoder_decoder_view("Tom has a ball.", value, 0, -1, fresh())):
        with pytest.raises(gr.Error, match="(layer|head) must be") as caught:
            call()
        assert len(caught.value.message) < 120 and not re.search(r"\d{16}", caught.value.message), \
            caught.value.message
