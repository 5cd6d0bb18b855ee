"""The memory budget: requests over it are refused before they allocate, in sentences a visitor can act on.

Shared helpers and fixtures: tests/hostile.py.
"""
from __future__ import annotations

import json

import gradio as gr
import pytest

from explorer.state import private_models, session

from tests.hostile import (  # noqa: F401 - fixtures are found by their names here
    VIEWS, forbid, forbid_model_runs, fresh, hub_local_only, served,
)

pytestmark = pytest.mark.usefixtures("served")  # not an argument: hypothesis would print the model


def test_a_sweep_over_the_budget_is_refused_before_it_allocates(monkeypatch):
    from explorer import measure
    from explorer.panels.memory import memory_compare

    forbid(monkeypatch, measure.run, "attention_sweep", "attention_memory")
    with pytest.raises(gr.Error, match="over the memory budget"):
        list(memory_compare(16384, 64, 256, 64, ["naive", "sdpa", "tiled"], False, "float32", lambda *a, **k: None))
    monkeypatch.setattr(measure.units, "MEMORY_BUDGET_BYTES", 2**20)  # a small machine: 1 MiB per request
    with pytest.raises(gr.Error, match="over the memory budget of 1 MiB"):
        list(memory_compare(1024, 8, 64, 8, ["naive"], True, "float32", lambda *a, **k: None))


def test_a_fine_tune_over_the_budget_is_refused_before_copying_the_model(monkeypatch):
    from explorer import finetune, measure
    from explorer.panels.lora import lora_finetune

    model, _ = session.load_default()
    forbid_model_runs(monkeypatch)
    forbid(monkeypatch, finetune, "evaluate_loss")
    monkeypatch.setattr(measure.units, "MEMORY_BUDGET_BYTES", 2**20)
    state = fresh()
    with pytest.raises(gr.Error, match="predicted to need .* over the memory budget of 1 MiB: paste a shorter text"):
        list(lora_finetune(2, 4, ["q_proj"], "Tom has a red ball. " * 100, 2, 1e-2, 5, state, lambda *a, **k: None))
    assert state["model"] is None  # no copy was made
    rows = finetune.make_rows(list(range(300)), 127)
    tokens = finetune.step_tokens(rows)
    assert tokens == 4 * 128  # four overlapping windows of 128 tokens, all in one step of up to 8 rows
    need = finetune.activation_bytes(model.config, tokens)
    assert need > 1.5 * 2 * 128 * model.config.vocab_size * 4  # logits are counted
    assert need > 1.5 * 3 * tokens * model.config.vocab_size * 4  # logits, log-softmax and gradient, every token
    with pytest.raises(ValueError, match="paste a shorter text"):
        finetune.check_step_memory(model.config, rows)  # the same prediction the handler refused with


def test_running_out_of_memory_answers_with_a_sentence(monkeypatch):
    from explorer import probes
    from explorer.panels.attention import attention_view

    def oom(*a, **k):
        raise MemoryError()

    monkeypatch.setattr(probes.patterns, "run_with_cache", oom)  # where the Attention tab's patterns run it
    with pytest.raises(gr.Error, match="ran out of memory .* choose smaller sizes"):
        attention_view("A prompt nobody asked for before 7.", 0, 0, VIEWS[0], fresh())


def test_the_budget_is_configurable(monkeypatch):
    from explorer import measure

    monkeypatch.setenv("EXPLORER_MEMORY_BUDGET", "12GiB")
    assert measure.budget_from_env() == 12 * 2**30
    monkeypatch.delenv("EXPLORER_MEMORY_BUDGET")
    assert measure.budget_from_env() <= 16 * 2**30  # the default fits a 16 GB CPU Space with room to spare
    monkeypatch.setenv("EXPLORER_PRIVATE_MODELS_BUDGET", "2GiB")
    assert private_models._private_budget() == 2 * 2**30
    monkeypatch.setenv("EXPLORER_PRIVATE_MODELS_BUDGET", "lots")
    assert private_models._private_budget() == 4 * 2**30  # a bad setting falls back, the app still starts
    # one measurement, one fine-tune step and every visitor's own models at once still fit 16 GB, with 2 GB spare
    assert 2 * measure.DEFAULT_MEMORY_BUDGET_BYTES + private_models._private_budget() <= 14 * 2**30


def test_memory_lab_refusals_say_what_the_visitor_can_change_not_the_servers_setting(monkeypatch):
    from explorer import measure
    from explorer.panels.memory import memory_compare

    forbid(monkeypatch, measure.run, "attention_sweep", "attention_memory")
    with pytest.raises(gr.Error) as caught:
        list(memory_compare(16384, 64, 256, 64, ["naive", "sdpa", "tiled"], False, "float32", lambda *a, **k: None))
    message = caught.value.message
    assert "EXPLORER_" not in message and "raise the budget" not in message
    assert "choose a sequence length of at most" in message or "fewer heads" in message


def test_the_generation_tabs_per_step_view_is_small_plain_data():
    """The finished generation's per-step view is the one thing the tab keeps in gr.State (its step slider
    reads it): ids, token texts and the probabilities the step chart draws, no figures or tensors, and a few
    tens of KB at the tab's longest run."""
    from explorer.panels.generation import MAX_NEW_TOKENS as MAX_NEW, generate

    out = generate("Tom has a red", MAX_NEW, 0.8, 50, 0.95, 0, fresh())
    text = json.dumps(out.view)  # plain JSON: raises on a figure, a tensor or an array
    assert len(out.view["steps"]) == MAX_NEW
    assert len(text) < 96 * 1024, f"{len(text)} bytes for {MAX_NEW} steps"  # measured: 65 KB for 128 steps
