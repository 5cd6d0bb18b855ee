"""The Experiments tab's long actions stop (issue 43): a Stop ends a sweep inside a layer, before its next torch
operation; the time cap ends it with the layers it completed, and the tab says so. Steps are made long by bounded
loops of torch operations, never by timing asserts (the seconds are the benchmark's: bench/notes)."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from explorer import interventions as iv
from explorer.jobs import experiments as job
from explorer.measure.run import STILL_RUNNING

from tests.hostile import served  # noqa: F401 - the shipped model as the app loads it (no server)

pytestmark = pytest.mark.usefixtures("one_thread")

OPS = 2_000_000  # a step's torch operations: minutes of work, so only a Stop between them ends it in time


def _long_steps(started: threading.Event, worker: list, quick_first: bool = False):
    def steps():
        worker.append(threading.current_thread())
        x = torch.ones(8, 8)
        if quick_first:
            yield 1, 3, "first layer"
        started.set()
        for _ in range(OPS):
            x = torch.tanh(x)
        yield 2, 3, "never reached"
    return steps


def test_a_stop_ends_the_work_inside_a_step_before_its_next_torch_operation():
    started, worker = threading.Event(), []
    updates = job.capped(torch.nn.Linear(2, 2), _long_steps(started, worker), cap_s=600)
    assert next(updates) is STILL_RUNNING  # starts the worker; its first step never ends on its own
    assert started.wait(10)
    updates.close()  # what Gradio's cancel does to the handler's generator when Stop is pressed
    worker[0].join(10)
    assert not worker[0].is_alive()


def test_the_time_cap_ends_the_work_with_the_steps_it_completed():
    started, worker = threading.Event(), []
    got = [u for u in job.capped(torch.nn.Linear(2, 2), _long_steps(started, worker, quick_first=True), cap_s=0.3)
           if u is not STILL_RUNNING]
    assert [(u.done, u.result, u.capped, u.finished) for u in got] == [(1, "first layer", False, False),
                                                                       (1, "first layer", True, False)]
    worker[0].join(10)
    assert not worker[0].is_alive()


def test_the_capped_sweep_equals_the_whole_sweep_when_it_finishes(served):
    model, tokenizer = served
    ids = tokenizer.encode("apple river green chair apple river green chair", add_special_tokens=False)
    got = [u for u in job.capped(model, lambda: iv.iter_knockout_sweep(model, [ids])) if u is not STILL_RUNNING]
    assert [u.done for u in got] == list(range(1, len(model.blocks) + 1)) and got[-1].finished
    whole = iv.knockout_sweep(model, [ids])
    assert torch.equal(got[-1].result["knocked"], whole["knocked"])


def test_the_tab_shows_the_layers_done_and_says_the_cap_ended_it(served, monkeypatch):
    from explorer.panels import experiments as tab

    model, _ = served
    real = iv.iter_knockout_sweep

    def slow_after_the_first_layer(*args, **kwargs):
        for n, (done, total, result) in enumerate(real(*args, **kwargs)):
            yield done, total, result
            if n == 0:
                x = torch.ones(8, 8)
                for _ in range(OPS):  # the cap ends this, between two operations
                    x = torch.tanh(x)
    monkeypatch.setattr(iv, "iter_knockout_sweep", slow_after_the_first_layer)
    monkeypatch.setattr(job, "EXPERIMENT_SECONDS", 0.5)
    fig, text = tab.sweep_view("one two three four one two three four", list(tab.HOWS)[0], None)
    L = len(model.blocks)
    assert f"⏱️ Stopped at the 0.5 s limit after 1 of {L} layers" in text
    z = np.asarray(fig.data[0].z, dtype=float)
    assert np.isfinite(z[0]).all() and np.isnan(z[1:]).all()


@pytest.mark.parametrize("action", ["experiment_sweep", "experiment_patch"])
def test_each_long_action_has_a_stop_button_that_cancels_it(app_url, action):
    import json
    import urllib.request

    with urllib.request.urlopen(app_url + "config", timeout=30) as r:
        deps = json.load(r)["dependencies"]
    run = next(d for d in deps if d.get("api_name") == action)
    stop = next(d for d in deps if d.get("api_name") == action + "_stop")
    cancelling = [d for d in deps if run["id"] in d["cancels"]]  # Gradio adds the cancel as its own event
    assert any(d["targets"] == stop["targets"] for d in cancelling) and not stop["backend_fn"]


def test_the_induction_probe_at_a_long_span_ends_at_its_time_cap_with_a_sentence(served, monkeypatch):
    from explorer.panels import attention as tab
    from lens import heads
    from explorer.state.cache import weights_key

    model, _ = served
    ran = []

    def long_probe(model, span_len):
        x = torch.ones(8, 8)
        for _ in range(OPS):  # minutes of operations: only the cap, checked between them, ends this
            x = torch.tanh(x)
        ran.append("to the end")
        return x
    monkeypatch.setattr(heads, "induction_scores", long_probe)
    monkeypatch.setattr(job, "EXPERIMENT_SECONDS", 0.3)
    span = tab.span_choices(model.config)[-2]
    with pytest.raises(ValueError, match=f"induction scores at span {span} ran past the 0.3 s limit"):
        tab._induction(model, [1, 2, 3], span, ("a key no other test uses", weights_key(model)))
    assert not ran


def test_the_estimate_counts_each_layers_rows_from_that_layer_to_the_last():
    # 30 layers: layer l's rows run 30 - l blocks; the first 10 layers are 255 of the 465 block-rows
    u = job.Update(done=10, total=30, result=None, elapsed=5.1)
    assert job.seconds_left(u, 30) == pytest.approx(5.1 * 210 / 255)
    both = job.Update(done=30, total=60, result=None, elapsed=8.0)  # patching: the resid_pre site done, the heads' next
    assert job.seconds_left(both, 30) == pytest.approx(8.0)
    assert job.seconds_left(job.Update(0, 30, None, 1.0), 30) != job.seconds_left(job.Update(0, 30, None, 1.0), 30)
    assert job.progress_text("Patching", u, 30) == "Patching: layer 10 of 30 done (5 s, about 4 s left)."
