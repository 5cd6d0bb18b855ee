"""The training snapshots and the Training tab: every snapshot loads in transformers and in ours with the same logits,
its logged scores are what the snapshot gives, snapshots load as models (``default@step-N``), and the tab shows
numbers equal to a direct recomputation from the snapshot (through gradio_client)."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tests never reach the network

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from explorer.probes import training as probe
from models import load_pretrained

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "assets" / "default-model"
SNAPSHOTS = sorted((SHIPPED / "checkpoints").glob("step-*"))
shipped_snapshots = pytest.mark.skipif(not SNAPSHOTS, reason="the shipped model has no snapshots")


def shipped_log() -> dict:
    return json.loads((SHIPPED / "training_log.json").read_text())


def snapshot_entries() -> dict[int, dict]:
    return {e["step"]: e for e in shipped_log().get("snapshots", [])}


# --- what the tab computes, on synthetic curves (no model) ---------------------------------------------------

def synthetic_curves(prev, ind, half):
    steps = list(range(0, 100 * len(ind), 100))
    def mats(values):
        return np.array([[[0.0, v], [v / 2, 0.0]] for v in values])  # (steps, L=2, H=2), best at L0H1
    return {"steps": steps, "held_out_loss": [5 - i * 0.1 for i in range(len(ind))], "repeated_half_loss": half,
            "span": "32", "previous_token": mats(prev), "induction": mats(ind), "first_token": mats(prev),
            **{f"best_{k}": [probe.best(m) for m in mats(v)] for k, v in
               (("previous_token", prev), ("induction", ind), ("first_token", prev))}}


def test_phase_change_is_where_the_best_induction_score_crosses_its_levels():
    c = synthetic_curves(prev=[0.1, 0.3, 0.6, 0.9, 0.95], ind=[0.05, 0.1, 0.3, 0.85, 1.0],
                         half=[7.0, 6.9, 5.0, 1.0, 0.5])
    phase = probe.phase_change(c)
    assert (phase["start"], phase["end"]) == (200, 300)
    assert phase["start_entry"]["induction"] == 0.3 and phase["end_entry"]["repeated_half_loss"] == 1.0
    # previous-token passes 0.5 at 200, induction at 300, the repeated-half loss falls below 3.5 at 300
    assert [p[0] for p in phase["parts"]] == [200, 300, 300]
    assert phase["parts"][0][1] == "a previous-token head" and phase["parts"][0][2] == "L0H1"
    text = probe.order_sentence(phase)
    assert text.index("previous-token") < text.index("induction head")
    assert "between steps 100 and 200" in text and "between steps 200 and 300" in text
    assert "not measured" in text  # two parts between the same two snapshots: their order is not claimed


def test_no_phase_change_is_claimed_when_the_scores_never_rise():
    c = synthetic_curves(prev=[0.1, 0.1, 0.1], ind=[0.05, 0.1, 0.15], half=[7.0, 7.0, 6.9])
    phase = probe.phase_change(c)
    assert phase["start"] is None and phase["end"] is None and phase["parts"] == []
    assert "No part of the circuit" in probe.order_sentence(phase)


def test_the_tab_measures_what_training_measured():
    from training import evaluate

    assert probe.REFERENCE_SPAN == evaluate.PREVIOUS_TOKEN_SPAN
    assert probe.PROBE_ROWS == evaluate.PROBE_ROWS


def test_mark_step_adds_the_line_and_leaves_the_drawing_alone():
    from explorer.figures.training import mark_step, training_curves

    c = synthetic_curves(prev=[0.1, 0.6, 0.9], ind=[0.1, 0.5, 0.9], half=[7.0, 3.0, 1.0])
    base = training_curves(c, probe.phase_change(c), source="test").to_plotly_json()
    shapes = len(base["layout"].get("shapes", ()))
    marked = mark_step(base, 100)
    assert len(marked["layout"]["shapes"]) == shapes + 2
    assert {s["x0"] for s in marked["layout"]["shapes"][-2:]} == {100}
    assert "step 100 marked" in marked["layout"]["title"]["text"]
    assert "step 100 marked" in marked["layout"]["meta"]["narrow"]["title"]["text"]  # on a phone too
    assert len(base["layout"].get("shapes", ())) == shapes and "marked" not in base["layout"]["title"]["text"]


# --- the snapshots python -m training writes -----------------------------------------------------------------

@pytest.mark.slow
def test_quick_run_saves_snapshots_and_trains_the_same_model_without_them(quick_folder, tmp_path):
    out, _ = quick_folder
    log = json.loads((out / "training_log.json").read_text())
    steps = [e["step"] for e in log["snapshots"]]
    settings = log["settings"]
    assert steps == list(range(0, settings["steps"] + 1, settings["snapshot_every"]))  # fewer than snapshot_min
    assert set(settings["snapshot_steps"]) <= set(steps) and steps[0] == 0
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [f"step-{s:05d}" for s in steps]
    for e in log["snapshots"]:
        folder = out / e["folder"]
        assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
        assert json.loads((folder / "config.json").read_text())["dtype"] == "float16"
        assert e["bytes"] == (folder / "model.safetensors").stat().st_size
    bare = tmp_path / "bare"
    proc = subprocess.run([sys.executable, "-m", "training", "--quick", "--out", str(bare), "--set",
                           "snapshot_steps=999", "--set", "snapshot_every=0"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # saving and measuring snapshots reads no random numbers: the same final weights, byte for byte
    assert (bare / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    assert not (bare / "checkpoints").exists()
    strip = lambda h: [{k: v for k, v in e.items() if k != "minutes"} for e in h]  # noqa: E731
    assert strip(json.loads((bare / "training_log.json").read_text())["history"]) == strip(log["history"])


def test_kept_snapshots_are_dense_across_the_measured_phase_change():
    from training.loop import TrainSettings, kept_snapshots

    def entry(step, ind, prev):
        return {"step": step, "repeated_half_span": 32, "induction": {"32": [[0.0, ind]]},
                "previous_token": [[prev, 0.0]]}

    steps = range(0, 1801, 25)
    # induction rises from under 0.2 (step 950) to 0.8 (step 1050); the previous-token head a little earlier
    entries = [entry(s, 0.1 if s < 975 else 0.5 if s < 1050 else 0.9, 0.1 if s < 925 else 0.9) for s in steps]
    s = TrainSettings()
    kept = [e["step"] for e in kept_snapshots(entries, s)]
    assert set(s.snapshot_steps) <= set(kept) and len(kept) >= s.snapshot_min
    assert set(range(900, 1076, 25)) <= set(kept)  # every candidate across both rises, one more each side
    assert 500 < min(set(kept) - set(s.snapshot_steps)) and max(set(kept) - set(s.snapshot_steps)) < 1300
    flat = [entry(st, 0.1, 0.1) for st in steps]  # no phase change: the fixed steps, widened to the minimum
    assert s.snapshot_min <= len(kept_snapshots(flat, s)) <= s.snapshot_min + 1  # widened one each side


@shipped_snapshots
def test_shipped_snapshots_span_the_run_and_are_in_the_log():
    log = shipped_log()
    steps = [int(p.name.removeprefix("step-")) for p in SNAPSHOTS]
    assert len(steps) >= 24 and steps[0] == 0 and steps[-1] == log["steps_run"]
    assert sorted(snapshot_entries()) == steps
    from training.snapshots import phase_window

    lo, hi = phase_window(log["snapshots"], "induction", probe.REFERENCE_SPAN)
    assert all(b - a <= 25 for a, b in zip(steps, steps[1:]) if lo <= a < hi)  # every 25 steps across the change
    total = sum((p / "model.safetensors").stat().st_size for p in SNAPSHOTS)
    assert total < 60e6, f"{total / 1e6:.1f} MB of snapshots"


@pytest.mark.slow
@shipped_snapshots
def test_every_snapshot_loads_in_transformers_and_ours_with_the_same_logits():
    from transformers import LlamaForCausalLM

    x = torch.randint(3, 1900, (2, 48), generator=torch.Generator().manual_seed(0))
    for folder in SNAPSHOTS:
        hf = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
        ours = load_pretrained(folder)
        with torch.no_grad():
            want, got = hf(x).logits, ours(x)
        rel = float((got - want).abs().max() / want.abs().max())
        assert rel <= 1e-4, f"{folder.name}: relative difference {rel:.2e}"


@pytest.mark.slow
@shipped_snapshots
def test_logged_snapshot_scores_are_the_snapshots_scores():
    """The log's numbers for a snapshot are what its saved weights give, measured again here, held-out loss too."""
    from lens.loss import evaluate_loss
    from tokenizers import Tokenizer
    from training.data import story_rows

    log = shipped_log()
    entries = snapshot_entries()
    tok = Tokenizer.from_file(str(SHIPPED / "tokenizer.json"))
    held = story_rows(tok, log["held_out_seed"], log["settings"]["held_out_rows"], log["settings"]["seq_len"])
    for step in (0, sorted(entries)[len(entries) // 2], max(entries)):
        e = entries[step]
        model = load_pretrained(SHIPPED / e["folder"])
        got = probe.step_scores(model, log["probe_seed"], probe.REFERENCE_SPAN)
        np.testing.assert_allclose(got["previous_token"], e["previous_token"], atol=1e-4)
        np.testing.assert_allclose(got["first_token"], e["first_token"], atol=1e-4)
        np.testing.assert_allclose(got["induction"], e["induction"][str(probe.REFERENCE_SPAN)], atol=1e-4)
        assert got["repeated_half_loss"] == pytest.approx(e["repeated_half_loss"], rel=1e-4)
        assert evaluate_loss(model, held) == pytest.approx(e["held_out_loss"], rel=1e-4)


# --- snapshots as models ---------------------------------------------------------------------------------------

@shipped_snapshots
def test_a_snapshot_loads_by_name_with_the_default_tokenizer(monkeypatch):
    from explorer.state import checkpoints, snapshots

    monkeypatch.setenv("EXPLORER_DEFAULT_MODEL", str(SHIPPED))
    step = snapshots.available_steps()[len(SNAPSHOTS) // 2]
    model, tokenizer, name, source = checkpoints.load_checkpoint(f"default@step-{step}")
    assert name == source == f"default@step-{step}"
    ref = load_pretrained(snapshots.snapshot_folder(step))
    x = torch.tensor([tokenizer("Once upon a time")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(model(x).float().cpu(), ref(x), rtol=1e-4, atol=1e-4)
    # the folder typed as a path under the allowed root is the same snapshot, named the same way
    monkeypatch.setenv("EXPLORER_MODEL_ROOT", str(SHIPPED.parent))
    _, _, by_path, _ = checkpoints.load_checkpoint(f"default-model/checkpoints/step-{step:05d}")
    assert by_path == name
    with pytest.raises(ValueError, match="no snapshot at step 7"):
        checkpoints.load_checkpoint("default@step-7")


# --- the tab through gradio_client -------------------------------------------------------------------------------

def scores_rows(table) -> dict:
    rows = table["data"] if isinstance(table, dict) else table
    return {r[0]: [float(v) for v in r[1:]] for r in rows}


@pytest.mark.slow
@shipped_snapshots
def test_the_tab_shows_what_the_snapshot_gives(client):
    from explorer.panels.training import DEFAULT_PROMPT
    from explorer.state import session, snapshots
    from models import generate

    log = shipped_log()
    step = sorted(snapshot_entries())[len(SNAPSHOTS) // 2]
    curves, pattern, table, summary, text = client.predict(step, "L1H0", DEFAULT_PROMPT, api_name="/training_step")
    model = load_pretrained(SHIPPED / f"checkpoints/step-{step:05d}")
    want = probe.step_scores(model, log["probe_seed"], probe.REFERENCE_SPAN)
    got = scores_rows(table)
    for i, name in enumerate(got):
        layer, head = divmod(i, model.config.n_heads)
        assert name == f"L{layer}H{head}"
        assert got[name][0] == pytest.approx(want["previous_token"][layer, head], abs=1e-4)
        assert got[name][1] == pytest.approx(want["induction"][layer, head], abs=1e-4)
        assert got[name][2] == pytest.approx(want["first_token"][layer, head], abs=1e-4)
    assert f"**{want['repeated_half_loss']:.3f}**" in summary
    assert f"Step {step}" in summary
    # the continuation is the snapshot's own greedy continuation
    tokenizer = session.load_default()[1]
    ids = tokenizer(DEFAULT_PROMPT)["input_ids"]
    new = generate(model, torch.tensor([ids]), 24, stop_tokens=[model.config.eos_token_id])[0, len(ids):].tolist()
    eos = model.config.eos_token_id
    new = new[:new.index(eos)] if eos in new else new
    assert text == tokenizer.decode(new, skip_special_tokens=True)
    assert step in snapshots.available_steps()


@pytest.mark.slow
@shipped_snapshots
def test_a_step_between_snapshots_shows_the_nearest_and_bad_input_gets_a_sentence(client):
    from gradio_client.exceptions import AppError

    steps = sorted(snapshot_entries())
    between = (steps[-2] + steps[-1]) // 2 + 1
    *_, summary, _ = client.predict(between, "L0H0", "Once upon a time", api_name="/training_step")
    assert f"Step {steps[-1]}" in summary and "nearest snapshot" in summary
    with pytest.raises(AppError, match="not one its controls accept"):
        client.predict(steps[0], "L9H9", "Once upon a time", api_name="/training_step")


@pytest.mark.slow
@shipped_snapshots
def test_knock_out_at_a_step_runs_the_experiments_tab_on_that_snapshot(fresh_client):
    """The button's handler loads the snapshot for the session; the Experiments tab then computes on it."""
    from explorer import interventions as iv
    from explorer.panels.experiments import DEFAULT_PROMPT, HOWS, KnockoutView
    from explorer.panels.training import open_in_experiments
    from explorer.state import session
    from tests.api_answer import named
    from tests.plotly_payload import arr, fig

    step = sorted(snapshot_entries())[len(SNAPSHOTS) // 2]
    state = session.new_state()
    name, tabs, status, *_, state = open_in_experiments(step, state, progress=lambda *a, **k: None)
    assert name == f"default@step-{step}" and "default@step" in status
    assert tabs.selected == "experiments"
    assert state["name"] == name
    # the same load through the API, then the Experiments tab's knock-out on the session's model
    fresh_client.predict(name, api_name="/load_model")
    out = named(KnockoutView, fresh_client.predict(DEFAULT_PROMPT, ["1.0"], list(HOWS)[1], api_name="/knockout"))
    model = load_pretrained(SHIPPED / f"checkpoints/step-{step:05d}")
    tokenizer = session.load_default()[1]
    x = torch.tensor([tokenizer(DEFAULT_PROMPT)["input_ids"]])
    before = arr(fig(out.loss)["data"][0]["y"])
    np.testing.assert_allclose(before, iv.per_token_loss(model, x).numpy(), rtol=1e-4, atol=1e-5)


@shipped_snapshots
def test_play_steps_through_the_snapshots_and_stops_at_the_last(monkeypatch):
    from explorer.panels import training as tab
    from explorer.state import snapshots

    monkeypatch.setenv("EXPLORER_DEFAULT_MODEL", str(SHIPPED))
    steps = snapshots.available_steps()
    start, timer, button, playing = tab.toggle_play(steps[-1], False)  # at the end: Play starts from step 0
    assert start == steps[0] and timer.active and playing
    seen, step = [start], start
    while playing:
        step, timer, button, playing = tab.next_step(step)
        seen.append(step)
    assert seen == steps and not timer.active and button.value == "▶ Play"
    assert tab.toggle_play(steps[3], True)[3] is False  # Pause


@shipped_snapshots
def test_play_starts_where_the_run_starts_unless_a_link_set_the_step(monkeypatch):
    """From the page's own opening step (the end of the phase change) Play went on from there and skipped the
    change; from a step a lesson set, it starts there. Each answer carries the step and the figures of that step."""
    from explorer.panels import training as tab
    from explorer.state import snapshots

    monkeypatch.setenv("EXPLORER_DEFAULT_MODEL", str(SHIPPED))
    steps = snapshots.available_steps()
    assert tab.toggle_play(steps[5], False, opening=steps[5])[0] == steps[0]
    assert tab.toggle_play(steps[2], False, opening=steps[5])[0] == steps[2]
    out = tab.playing_view(lambda s, p: tab.next_step(s))(steps[2], True, "L1H0", "apple river apple river")
    assert out[0] == steps[3] and len(out) == 9
    assert out[7].startswith(f"**Step {steps[3]}**")  # the summary of the figures is the slider's step


@shipped_snapshots
@pytest.mark.parametrize("step, head, prompt, message", [
    (1000, "L1H3", "   ", "The prompt is empty"),
    (float("nan"), "L1H3", "Once", "finite number"),
    ("soon", "L1H3", "Once", "must be a number"),
    (1000, "<b>L1H3</b>", "Once", "head must be one of"),
])
def test_bad_input_gets_a_sentence(monkeypatch, step, head, prompt, message):
    from explorer.panels.training import step_view

    monkeypatch.setenv("EXPLORER_DEFAULT_MODEL", str(SHIPPED))
    with pytest.raises(ValueError, match=message):
        step_view(step, head, prompt)
