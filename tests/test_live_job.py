"""Train one live as a job (explorer/jobs/live_training.py): one run per server, its records, Stop, and the model it
leaves loadable as live@final / live@step-N through the header's loader, checked against transformers."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tests never reach the network

import time

import pytest
import torch

from explorer.jobs import live_training as job
from explorer.state import checkpoints, live_models
from training.live import LiveSettings


def tiny() -> LiveSettings:
    return LiveSettings.tiny()


@pytest.fixture
def fresh_root(tmp_path, monkeypatch):
    """Each test's runs under its own root, with no run published before it."""
    monkeypatch.setattr(live_models, "_root", None)
    monkeypatch.setattr(live_models, "_published", None)
    monkeypatch.setenv("EXPLORER_LIVE_ROOT", str(tmp_path))
    yield tmp_path
    run = job.current()
    if run is not None:
        job.stop(run)


def test_a_second_start_joins_the_running_run_and_stop_keeps_what_was_trained(fresh_root):
    run = job.start(60, 3, settings=tiny())
    assert job.start(60, 5, settings=tiny()) is run  # another visitor watches the same curves
    deadline = time.time() + 30
    while len(job.records(run)) < 3 and time.time() < deadline:
        time.sleep(0.05)
    assert job.stop(run) is run and run.finished.is_set() and run.outcome == "stop"
    recs = job.records(run)
    assert recs[0]["step"] == 0 and recs[-1]["step"] > 0
    assert [r["step"] for r in recs] == sorted(r["step"] for r in recs)
    assert job.final_folder() == run.folder and (run.folder / "config.json").is_file()
    assert live_models.names()[:2] == ["live@final", "live@step-0"]
    second = job.start(60, 4, settings=tiny())  # the first has ended: a new run, the old folder kept until it ends
    assert second is not run
    job.stop(second)
    assert not run.folder.exists() and job.final_folder() == second.folder


def test_a_run_ends_on_its_own_time_and_the_updates_end_with_it(fresh_root):
    run = job.start(1.5, 0, settings=tiny())
    seen = list(job.updates(run, every=0.2))
    assert run.outcome == "time" and len(seen) >= 2
    assert seen[-1] == job.records(run) and len(seen[-1]) <= job.MAX_RECORDS


@pytest.mark.parametrize("seconds", [0, -1, job.MAX_SECONDS + 1, float("nan"), "10", True])
def test_a_bad_time_says_what_to_choose(seconds):
    with pytest.raises(ValueError, match="choose a time"):
        job.start(seconds, 0)


def test_live_final_loads_through_the_header_loader_like_transformers(fresh_root):
    with pytest.raises(ValueError, match="press Train one now"):
        checkpoints.load_checkpoint("live@final")
    run = job.start(60, 1, settings=tiny())
    time.sleep(0.5)
    job.stop(run)
    model, tokenizer, name, cleaned = checkpoints.load_checkpoint("live@final")
    assert name == cleaned == "live@final"
    from transformers import AutoModelForCausalLM
    ref = AutoModelForCausalLM.from_pretrained(str(run.folder), dtype=torch.float32).eval()
    ids = torch.tensor([tokenizer.encode("Once upon a time there was a cat")[:12]])
    with torch.no_grad():
        ours = model(ids)
        theirs = ref(ids).logits
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    snap, _, snap_name, _ = checkpoints.load_checkpoint("live@step-0")
    assert snap_name == "live@step-0" and snap is not model
    with pytest.raises(ValueError, match="no snapshot at step 7"):
        checkpoints.load_checkpoint("live@step-7")


def test_a_finished_run_is_deleted_after_the_time_limit(fresh_root):
    run = job.start(60, 2, settings=tiny())
    job.stop(run)
    live_models.expire(time.time() + live_models.KEEP_S + 1)
    assert job.final_folder() is None and not run.folder.exists()
