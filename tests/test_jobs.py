"""The jobs layer on its own (no panel, no Gradio): the fine-tune's registry, worker and Stop, and the generation
stream's steps, warm-up and release of the model."""
from __future__ import annotations

import copy
import threading
import time

import pytest
import torch

from explorer import finetune, jobs, measure, probes
from explorer.jobs import finetune as finetune_job
from explorer.jobs import generation as generation_job
from lens.hooks import model_lock
from models import Decoder
from models.lora import attach_lora
from models.speed import optimize_for_decode
from tests.test_jobs_generate import plain_loop
from tests.tiny_decoder import spread, tiny

pytestmark = pytest.mark.usefixtures("one_thread")

SETTINGS = dict(steps=4, lr=1e-2, max_seconds=30, seq_len=16, batch=2)


def _model(seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    return spread(Decoder(tiny(vocab_size=61, max_seq_len=64)), std=0.2, norms=True)


def _text(n: int = 40) -> list[int]:
    return torch.randint(0, 61, (n,), generator=torch.Generator().manual_seed(2)).tolist()


def _start(state, model, **settings):
    ids = _text()
    torch.manual_seed(5)  # the adapter's A is drawn when the worker attaches it
    return finetune_job.start(state, model, rows=finetune.make_rows(ids, 16), ids=ids, targets=("q_proj", "v_proj"),
                              rank=2, alpha=4.0, settings={**SETTINGS, **settings})


def _lock_is_free(model) -> bool:
    """Whether another thread can take the model's lock now (the lock is re-entrant: this thread always could)."""
    got = []

    def probe():
        lock = model_lock(model)
        got.append(lock.acquire(blocking=False))
        if got[0]:
            lock.release()

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return got[0]


# --- the fine-tune ------------------------------------------------------------------------------------------------

def test_a_fine_tune_job_trains_as_iter_finetune_does_and_says_so_in_its_run_and_the_state():
    model, state = _model(), {}
    run, updates = _start(state, model)
    items = [item for item in updates if item is not jobs.STILL_RUNNING]
    kinds = [kind for kind, _ in items]
    assert kinds == ["start", "step", "step", "step", "step", "end"]
    assert run.outcome == "done" and run.finished.is_set() and run.steps == 4
    assert state["lora"] == {"rank": 2, "alpha": 4.0, "targets": ["q_proj", "v_proj"], "mode": "on",
                             "trained_steps": 4}
    assert finetune_job.find(state) is run and finetune_job.stop(state) is None  # ended: nothing to stop
    # the same training run directly, on the same weights, adapter drawn from the same seed
    ref = _model()
    torch.manual_seed(5)
    attach_lora(ref, ("q_proj", "v_proj"), rank=2, alpha=4.0)
    rows = finetune.make_rows(_text(), 16)
    start = finetune.evaluate_loss(ref, rows)
    losses = [r["loss"] for r in finetune.iter_finetune(ref, _text(), **SETTINGS)]
    assert items[0][1] == pytest.approx(start, abs=1e-6)
    assert [r["loss"] for kind, r in items if kind == "step"] == pytest.approx(losses, abs=1e-5)
    assert items[-1][1] == pytest.approx(finetune.evaluate_loss(ref, rows), abs=1e-5)
    assert _lock_is_free(model)


def test_stop_settles_a_running_fine_tune_within_a_second_and_frees_the_model():
    model, state = _model(), {}
    slow = model.blocks[0].register_forward_pre_hook(lambda m, a: time.sleep(0.02) if m.training else None)
    run, updates = _start(state, model, steps=200, max_seconds=60)
    reader = threading.Thread(target=lambda: [None for _ in updates])  # a panel reading the updates
    reader.start()
    deadline = time.time() + 60
    while run.steps < 2 and time.time() < deadline:
        time.sleep(0.01)
    t0 = time.perf_counter()
    assert finetune_job.stop(state) is run
    settled = time.perf_counter() - t0
    reader.join(10)
    slow.remove()
    assert run.finished.is_set() and run.outcome == "stopped" and settled < 1.0, settled
    assert 2 <= run.steps < 200 and state["lora"]["trained_steps"] == run.steps
    assert _lock_is_free(model)
    assert finetune_job.stop({}) is None and finetune_job.find(None) is None


def test_closing_the_updates_stops_the_worker_as_a_cancel_does():
    model, state = _model(), {}
    run, updates = _start(state, model, steps=200, max_seconds=60)
    for item in updates:
        if item is not jobs.STILL_RUNNING and item[0] == "step":
            break
    updates.close()
    assert run.finished.wait(10) and run.outcome == "stopped" and run.steps >= 1
    assert _lock_is_free(model)


# --- the generation stream ----------------------------------------------------------------------------------------

def _stream(model, decode=probes.generation.MODULES, **kw):
    settings = dict(max_new_tokens=12, temperature=0.0, top_k=None, top_p=None, seed=0, decode=decode, stops=[],
                    top=5)
    return generation_job.stream(model, _text(6), **{**settings, **kw})


def test_the_generation_job_yields_after_every_token_then_once_done_with_the_plain_loops_tokens(monkeypatch):
    model = _model()
    calls = []
    trace = probes.generation_trace
    monkeypatch.setattr(probes, "generation_trace", lambda *a, **k: calls.append(k["use_cache"]) or trace(*a, **k))
    runs = [(len(run.steps), run.done) for run in _stream(model)]
    assert runs == [(n, False) for n in range(1, 13)] + [(12, True)]
    assert calls == [True, False]  # the warm-up: once with and once without the cache
    last = list(_stream(model, temperature=0.9, top_k=20, top_p=0.95, seed=3))[-1]
    assert calls == [True, False]  # not again for the same model and path
    want = plain_loop(model, torch.tensor([_text(6)]), 12, temperature=0.9, top_k=20, top_p=0.95, seed=3)[0]
    assert [st["token"] for st in last.steps] == want
    assert last.check is None and last.stood_aside is None and last.schedule == probes.uncached_schedule(12)
    stop = want[4]
    ended = list(_stream(model, temperature=0.9, top_k=20, top_p=0.95, seed=3, stops=[stop]))[-1]
    assert [st["token"] for st in ended.steps] == want[:want.index(stop) + 1] and ended.done


def test_the_fast_steps_tokens_are_checked_against_the_modules():
    model = optimize_for_decode(copy.deepcopy(_model()))
    run = list(_stream(model, decode=probes.generation.FAST))[-1]
    assert [st["fast_step"] for st in run.steps] == [False] + [True] * 11
    assert run.check is not None and all(run.check["same_greedy"])
    assert [st["token"] for st in run.steps] == plain_loop(_model(), torch.tensor([_text(6)]), 12)[0]


def test_a_generation_left_between_two_tokens_holds_no_lock():
    model = _model()
    stream = _stream(model, max_new_tokens=40)
    for run in stream:
        assert _lock_is_free(model)  # the caller holds the run, not the model
        if len(run.steps) == 3:
            break
    stream.close()  # Stop: the stream is closed between two tokens
    assert _lock_is_free(model)


def test_the_fast_step_on_a_loaded_model_keeps_its_own_copy_and_the_tab_says_its_size():
    from explorer.panels.generation_text import path_text
    from models.speed import decode_layout_bytes

    model = _model()  # as load_pretrained made it: the fast step lays out a copy of its own
    before = {name: p.data_ptr() for name, p in model.named_parameters()}
    run = list(_stream(model, decode=probes.generation.FAST))[-1]
    assert {name: p.data_ptr() for name, p in model.named_parameters()} == before  # the modules' tensors untouched
    assert run.layout_bytes == decode_layout_bytes(model) > 0
    text = path_text(run, {"decode": probes.generation.FAST, "temperature": 0.0})
    assert f"own fused copy of the weights ({measure.format_bytes(run.layout_bytes)}" in text
