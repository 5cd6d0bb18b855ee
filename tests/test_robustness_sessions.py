"""Visitors' own models and results: capped in total, freed when idle, swept, and never changing another's answers.

Shared helpers and fixtures: tests/hostile.py.
"""
from __future__ import annotations

import json

import gradio as gr
import plotly.graph_objects as go
import pytest
import torch

from explorer.state import checkpoints, private_models, session

from tests.hostile import (  # noqa: F401 - fixtures are found by their names here
    VIEWS, forbid, fresh, hub_local_only, load, root, served,
)

pytestmark = pytest.mark.usefixtures("served")  # not an argument: hypothesis would print the model


@pytest.mark.slow
def test_visitors_own_models_are_capped_in_total(monkeypatch, root):
    """Private copies and loaded checkpoints of all sessions together stay under a cap: past it, the next copy or
    load is refused before it allocates; once a session's model is gone, there is room again."""
    import gc

    shared, _ = session.load_default()
    one = private_models.model_bytes(shared)
    gc.collect()
    monkeypatch.setattr(private_models, "PRIVATE_MODELS_BUDGET_BYTES", private_models.private_models_bytes() + int(1.5 * one))
    alice = fresh()
    session.private_model(alice)  # fits
    # now full, whatever the sizes of the default model and the checkpoint below, with no idle model to free
    # (freeing the one idle longest is tested below): the cap refuses
    monkeypatch.setattr(private_models, "_owners", {})
    monkeypatch.setattr(private_models, "PRIVATE_MODELS_BUDGET_BYTES", private_models.private_models_bytes() + 1)
    forbid(monkeypatch, checkpoints, "load_pretrained")
    monkeypatch.setattr(session, "prepared_copy", lambda m: pytest.fail("copied past the cap"))
    with pytest.raises(ValueError, match="visitors' own models already hold"):
        session.private_model(fresh())
    with pytest.raises(gr.Error, match="visitors' own models already hold"):
        load("good")
    monkeypatch.undo()  # the real loader and copy again
    monkeypatch.setattr(private_models, "PRIVATE_MODELS_BUDGET_BYTES", private_models.private_models_bytes() + int(0.5 * one))
    del alice
    bob = fresh()
    session.private_model(bob)  # alice's copy was released: room again
    assert bob["model"] is not None


def _deterministic(out):
    """A handler's answer without what depends on timing (markdown with milliseconds, timing figures)."""
    keep = []
    for item in out if isinstance(out, tuple) else (out,):
        if isinstance(item, go.Figure):
            keep.append(item.to_plotly_json()["data"])
        elif isinstance(item, (list, tuple)) and not isinstance(item, str):
            keep.append(json.dumps(item, default=str))
    return keep


@pytest.mark.slow
def test_another_sessions_model_and_adapter_leave_this_sessions_answers_unchanged(model_root):
    """Alice loads another checkpoint, then fine-tunes an adapter on her copy of the default model; Bob's
    answers on every tab are the same, to the bit, before and after, and the shared model is untouched."""
    from explorer.panels.attention import attention_view
    from explorer.panels.encoder_decoder import encoder_decoder_view
    from explorer.panels.generation import generate
    from explorer.panels.lora import lora_compare, lora_finetune
    from explorer.panels.model import load_model
    from explorer.panels.positions import rope_view

    shared, _ = session.load_default()
    weights = {k: v.clone() for k, v in shared.state_dict().items()}
    bob = fresh()

    def bobs_answers():
        return [
            _deterministic(attention_view("Tom gave the red ball to Anna.", 1, 1, VIEWS[0], bob)[:2]),
            _deterministic(rope_view("Tom gave the red ball to Anna.", 500.0, 5, [0, 1], 1, 0, bob)[:4]),
            _deterministic(encoder_decoder_view("The dog found a ball.", 1, 1, -1, bob)[:4]),
            _deterministic(((g := generate("Tom has a red", 5, 0.7, 20, 0.9, 1, bob))[0], g[3],
                            [row[:6] for row in g[7]])),  # without the milliseconds
            _deterministic(lora_compare("Tom has a red", 0, 1, 5, bob)[:3]),
        ]

    before = bobs_answers()
    alice = fresh()
    load_model("tiny-local", alice, lambda *a, **k: None)
    assert alice["model"] is not None and bob["model"] is None
    assert bobs_answers() == before
    load_model("default", alice, lambda *a, **k: None)
    out = list(lora_finetune(2, 8, ["q_proj", "v_proj"], "Tom has a red ball. Anna has a red ball too.", 3, 1e-2,
                             10, alice, lambda *a, **k: None))
    assert "done" in out[-1].status and alice["model"] is not None
    assert bobs_answers() == before
    for k, v in shared.state_dict().items():
        assert torch.equal(v, weights[k]), k


@pytest.mark.slow
def test_private_models_expire_when_idle_and_make_room_oldest_idle_first(monkeypatch):
    """A session's own model is freed after the idle time, or when another visitor needs the room (oldest idle
    first); its owner is told on the next action, once, and then sees the shared model."""
    import gc
    import time as clock

    from explorer.state import session

    from explorer.state import private_models

    gc.collect()
    monkeypatch.setattr(private_models, "_owners", {})  # other tests' sessions are not candidates here
    a, b, c = session.new_state(), session.new_state(), session.new_state()
    shared = session.get_model(a)[0]
    one = private_models.model_bytes(shared)
    base = private_models.private_models_bytes()
    monkeypatch.setattr(private_models, "PRIVATE_MODELS_BUDGET_BYTES", base + 2 * one + one // 2)  # two fit

    session.private_model(a)
    clock.sleep(0.01)
    session.private_model(b)
    clock.sleep(0.01)
    session.get_model(a)  # a used again: b is now the one idle longest
    session.private_model(c)  # no room for three: b goes
    assert a["model"] is not None and c["model"] is not None and b["model"] is None
    with pytest.raises(ValueError, match="was freed to make room"):
        session.get_model(b)
    assert session.is_shared(session.get_model(b)[0])  # told once, then the shared model
    gc.collect()
    assert private_models.private_models_bytes() <= base + 2 * one

    assert private_models.expire_idle(now=clock.monotonic() + private_models.IDLE_SECONDS + 1) == 2
    for state in (a, c):
        with pytest.raises(ValueError, match="minutes without use"):
            session.get_model(state)
    gc.collect()
    assert private_models.private_models_bytes() <= base


def test_the_sweep_drops_results_nobody_used_but_keeps_the_opening_examples(monkeypatch):
    """After the idle time, per-prompt results go (a class's prompts leave with the class); the opening
    examples, computed once per model for every visitor, stay."""
    import time as clock

    from explorer.state.cache import ResultCache
    from explorer.state.openings import is_pinned, pin

    cache = ResultCache(2**20)
    cache.put(("opening", "attention", 1, ()), "shared")
    pin(("opening", "attention", 1, ()))
    cache.put(("attention.forward", 1, (5, 6)), "one prompt")
    cache.put(("attention.forward", 1, (7, 8)), "another")
    assert cache.drop_unused(60, keep=is_pinned) == 0  # all used just now
    later = clock.monotonic() + 120
    monkeypatch.setattr("explorer.state.cache.time.monotonic", lambda: later)
    assert cache.get(("attention.forward", 1, (7, 8))) == "another"  # read again "now"
    assert cache.drop_unused(60, keep=is_pinned) == 1
    assert cache.get(("opening", "attention", 1, ())) == "shared"
    assert cache.get(("attention.forward", 1, (5, 6))) is None
    assert cache.stats()["entries"] == 2


@pytest.mark.slow
def test_one_address_rotating_sessions_makes_room_from_its_own_models_only(monkeypatch):
    """Private models are capped per client address as well (issue 31): a script opening fresh sessions from
    one address frees its own models, idle longest first, never another address's; past its share, a sentence."""
    import gc

    from explorer.state import clients, private_models, session

    gc.collect()
    monkeypatch.setattr(private_models, "_owners", {})
    victim, *script = [session.new_state() for _ in range(4)]
    one = private_models.model_bytes(session.get_model(victim)[0])
    base = private_models.private_models_bytes()
    monkeypatch.setattr(private_models, "PRIVATE_MODELS_BUDGET_BYTES", base + 4 * one + one // 2)
    monkeypatch.setattr(private_models, "CLIENT_SHARE", (2 * one + one // 2) / (base + 4 * one + one // 2))

    def as_client(address, state):
        token = clients.CURRENT.set(address)
        try:
            session.private_model(state)
        finally:
            clients.CURRENT.reset(token)

    as_client("10.0.0.2", victim)
    for state in script:
        as_client("10.0.0.1", state)
    assert victim["model"] is not None  # room enough in the cap, but the script's share holds two
    assert [s["model"] is not None for s in script] == [False, True, True]
    with pytest.raises(ValueError, match="network address"):
        session.get_model(script[0])
    monkeypatch.setattr(private_models, "CLIENT_SHARE", 0.5 * one / (base + 4 * one + one // 2))
    with pytest.raises(ValueError, match="one network address may hold"):
        as_client("10.0.0.3", session.new_state())
