"""The Training tab's "Train one now": its figures (titled, scores on a fixed 0-1 axis, the phase change marked once
it happened) and its handlers on a tiny run."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tests never reach the network

import time

import numpy as np
import pytest

from explorer.figures import live as figs
from explorer.jobs import live_training as job
from explorer.panels import training_live as tab
from explorer.state import live_models
from training.live import LiveSettings


def test_the_curves_mark_the_phase_change_and_keep_scores_on_0_to_1():
    fig = figs.live_curves([0, 10, 20], [None, 4.0, 2.0], [5.0, 4.0, 1.0], [0.1, 0.3, 0.7], [0.2, 0.5, 0.9],
                           phase_step=20, source="test")
    assert "Training now, live" in fig.layout.title.text
    assert list(fig.layout.yaxis2.range) == [0, 1.05] and fig.layout.xaxis2.title.text == "training step"
    assert [s.x0 for s in fig.layout.shapes] == [20, 20]
    before = figs.live_curves([0], [None], [5.0], [0.1], [0.2], phase_step=None, source="test")
    assert not before.layout.shapes
    with pytest.raises(ValueError, match="one value of each curve per step"):
        figs.live_curves([0, 1], [None], [5.0], [0.1], [0.2], phase_step=None, source="test")


def test_the_heatmap_has_a_fixed_range_and_one_cell_per_head():
    fig = figs.induction_now(np.array([[0.1, 0.2], [0.9, 0.05]]), step=7, span=120)
    trace = fig.data[0]
    assert (trace.zmin, trace.zmax) == (0.0, 1.0) and np.asarray(trace.z).shape == (2, 2)
    assert "step 7" in fig.layout.title.text and fig.layout.xaxis.title.text == "head"


@pytest.fixture
def tiny_jobs(tmp_path, monkeypatch):
    monkeypatch.setattr(live_models, "_root", None)
    monkeypatch.setattr(live_models, "_published", None)
    monkeypatch.setenv("EXPLORER_LIVE_ROOT", str(tmp_path))
    real = job.start
    monkeypatch.setattr(job, "start", lambda seconds, seed, owner=None: real(seconds, seed, owner=owner,
                                                                           settings=LiveSettings.tiny()))
    yield
    if job.current() is not None:
        job.stop(job.current())


def test_train_now_streams_and_stop_names_what_to_load(tiny_jobs):
    stream = tab.train_now(60, 0)
    first = next(stream)
    assert len(first) == 3
    deadline = time.time() + 30
    while not job.records(job.current()) and time.time() < deadline:
        time.sleep(0.05)
    curves, heat, status = next(stream)
    assert curves is not None and heat is not None and status.startswith(("⏳ Training: step", "✅"))
    said = tab.stop_now()
    assert "live@final" in said and "Ended (stopped)" in said
    *_, last = list(stream)
    assert "live@final" in last[2]
    assert tab.stop_now().startswith("✅ Ended")  # nothing running: the last run's status again


@pytest.mark.parametrize("seed", [-1, 1.5, None, True])
def test_a_bad_seed_says_what_to_type(seed):
    with pytest.raises(ValueError, match="whole number from 0"):
        tab.check_seed(seed)


def test_only_the_page_that_started_the_run_can_stop_it(tiny_jobs):
    from types import SimpleNamespace

    lecturer, student = SimpleNamespace(session_hash="lecturer"), SimpleNamespace(session_hash="student")
    stream = tab.train_now(60, 0, lecturer)
    next(stream)
    with pytest.raises(ValueError, match="Only the page that started this live run can stop it"):
        tab.stop_now(student)
    assert not job.current().finished.is_set()  # the student's Stop changed nothing
    assert "Ended (stopped)" in tab.stop_now(lecturer)
    stream.close()
