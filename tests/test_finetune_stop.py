"""Stop inside a LoRA fine-tune's step (issue 31): the step ends where the Stop finds it (forward, backward or
before the update), the adapter is exactly the one after the last completed step, the model's lock is free and
the session's state and screen say which step that was. Steps are made long or cut at a chosen point by hooks,
never by timing."""
from __future__ import annotations

import threading

import pytest
import torch

from explorer import finetune as ft
from explorer.jobs import finetune as finetune_job
from explorer.state.threads import Stopped, stoppable
from models.config import ModelConfig
from models.decoder import Decoder
from models.lora import attach_lora, lora_layers

from tests.hostile import served  # noqa: F401 - the shipped model as the app loads it (no server)


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_adapted(seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=64)
    model = Decoder(cfg).eval()
    attach_lora(model, ("q_proj", "v_proj", "o_proj"), rank=4, alpha=8.0)
    return model


def text_ids(n: int = 40, seed: int = 1) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 50, (n,), generator=g).tolist()


def adapter(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class StepWatch:
    """Counts, per training step (forward in train mode), each block's forward and backward; ``trigger(step,
    where, block)`` runs ``action`` at that point: "forward" (block's forward), "backward" (the gradient reaching
    the block's output) or "lora_grad" (block's first adapter matrix given its gradient: late in the backward)."""

    def __init__(self, model, step: int, where: str, block: int, action):
        self.model, self.step, self.seen = model, 0, []
        self.snapshots = {}  # step k -> the adapter when step k began (after step k - 1)
        model.register_forward_pre_hook(self._begin)
        for i, b in enumerate(model.blocks):
            b.register_forward_hook(lambda mod, args, out, i=i: self._forward(i, out))
        self.at, self.action = (step, where, block), action
        layer = lora_layers(model.blocks[block])[0]
        layer.lora_A.register_hook(lambda g: self._fire("lora_grad", block) or None)

    def _begin(self, module, args):
        if module.training and torch.is_grad_enabled():
            self.step += 1
            self.snapshots[self.step] = adapter(module)

    def _fire(self, where: str, block: int) -> None:
        if self.model.training:
            self.seen.append((self.step, where, block))
            if (self.step, where, block) == self.at:
                self.action()

    def _forward(self, i: int, out):
        self._fire("forward", i)
        if self.model.training and out.requires_grad:
            out.register_hook(lambda g: self._fire("backward", i) or None)


@pytest.mark.parametrize("where, block, after", [
    ("forward", 0, {("forward", 1), ("forward", 2), ("backward", 0)}),  # nothing after block 0's forward ran
    ("backward", 2, {("backward", 1), ("backward", 0), ("lora_grad", 0)}),  # the backward ended at the top block
    ("lora_grad", 0, set()),  # the backward had finished: the update is what the Stop skips
])
def test_a_stop_inside_a_step_ends_it_there_and_keeps_the_last_completed_adapter(where, block, after):
    model = tiny_adapted()
    stop = threading.Event()
    watch = StepWatch(model, 3, where, block, stop.set)
    done = []
    with stoppable(stop), pytest.raises(Stopped):
        for record in ft.iter_finetune(model, text_ids(), steps=10, lr=1e-2):
            done.append((record["step"], adapter(model)))
    assert [s for s, _ in done] == [1, 2]  # step 3 never completed
    assert same(adapter(model), done[-1][1])  # the adapter after step 2, to the bit
    assert same(adapter(model), watch.snapshots[3])
    assert not same(watch.snapshots[3], watch.snapshots[2])  # (steps did change it)
    later = {(w, b) for s, w, b in watch.seen[watch.seen.index((3, where, block)) + 1:] if s == 3}
    assert not later & after, later  # the step went no further than the Stop
    assert watch.step == 3 and not model.training
    assert all(p.grad is None for p in ft.trainable_parameters(model))


def test_the_stop_checks_change_no_number():
    """Under ``stoppable`` (no Stop), the losses and the adapter are the same, to the bit, as without it."""
    plain, checked = tiny_adapted(), tiny_adapted()
    losses = [r["loss"] for r in ft.iter_finetune(plain, text_ids(), steps=4, lr=1e-2)]
    with stoppable(threading.Event()):
        checked_losses = [r["loss"] for r in ft.iter_finetune(checked, text_ids(), steps=4, lr=1e-2)]
    assert losses == checked_losses
    assert same(adapter(plain), adapter(checked))


# --- the LoRA tab: its worker, Gradio's cancel and the Stop button's request --------------------------------

def _own_model(state):
    from explorer.state import session

    model, _, _ = session.private_model(state)  # made here so hooks can go on it; the handler reuses it
    return model


def _quiet(*a, **k):
    return None


def test_the_stop_button_ends_the_tabs_fine_tune_inside_a_step_and_says_after_which(served):  # noqa: F811
    from explorer.panels import lora as panel
    from explorer.state import session
    from lens.hooks import model_lock

    state = session.new_state()
    model = _own_model(state)
    watch = []

    def begin(module, args):
        if module.training and torch.is_grad_enabled():
            watch.append(adapter(module))
            if len(watch) == 3:  # inside step 3's forward: what the Stop button's request does
                finetune_job.find(state).stop.set()

    model.register_forward_pre_hook(begin)
    updates = list(panel.lora_finetune(4, 8, ["q_proj", "v_proj"], panel.DEFAULT_TEXT, 20, 1e-2, 30, state,
                                       progress=_quiet))
    assert "Stopped after step 2" in updates[-1].status
    assert state["lora"]["trained_steps"] == 2
    assert same(adapter(model), watch[2])  # the adapter when step 3 began: after step 2
    assert len(watch) == 3 and not model.training
    lock = model_lock(model)
    assert lock.acquire(blocking=False)  # the worker let go of the model
    lock.release()
    assert "Stopped after step 2" in panel.lora_stop(state)  # a Stop arriving late says the same
    # a finished run's Stop changes nothing on screen
    done = list(panel.lora_finetune(4, 8, ["q_proj"], panel.DEFAULT_TEXT, 2, 1e-2, 30, state, progress=_quiet))
    assert "done" in done[-1].status and state["lora"]["trained_steps"] == 2
    assert panel.lora_stop(state) == panel.gr.skip()
    assert panel.lora_stop(session.new_state()) == panel.gr.skip()  # nothing ever ran there


def test_gradios_cancel_ends_a_long_step_before_it_finishes(served):  # noqa: F811
    """Gradio's cancel closes the handler's stream while the worker is held inside step 2's forward (a slow
    hook); once let go, the worker does no further operation of that step, and the adapter is the one after
    step 1."""
    from explorer.panels import lora as panel
    from explorer.state import session
    from lens.hooks import model_lock

    state = session.new_state()
    model = _own_model(state)
    entered, release, snapshots, after_release = threading.Event(), threading.Event(), [], []

    def begin(module, args):
        if module.training and torch.is_grad_enabled():
            snapshots.append(adapter(module))

    def slow(module, args):  # block 0's forward in step 2 takes as long as the test wants
        if module.training and len(snapshots) == 2 and not entered.is_set():
            entered.set()
            release.wait(60)
        elif release.is_set() and module.training:
            after_release.append(module)

    model.register_forward_pre_hook(begin)
    for b in model.blocks:
        b.register_forward_pre_hook(slow)
    run = panel.lora_finetune(4, 8, ["q_proj", "v_proj"], panel.DEFAULT_TEXT, 20, 1e-2, 30, state,
                              progress=_quiet)
    for _ in run:  # the stream keeps answering while the step is held
        if entered.is_set():
            break
    assert entered.is_set()
    run.close()  # what Gradio's cancel does (SyncToAsyncIterator.aclose)
    record = finetune_job.find(state)
    release.set()
    assert record.finished.wait(60)
    assert record.outcome == "stopped" and record.steps == 1 and state["lora"]["trained_steps"] == 1
    assert not after_release  # no later block's forward in step 2 ran
    assert len(snapshots) == 2 and same(adapter(model), snapshots[1])
    lock = model_lock(model)
    assert lock.acquire(blocking=False)
    lock.release()
    assert "Stopped after step 1" in panel.lora_stop(state)


def test_a_run_too_long_for_its_time_limit_ends_before_it_and_says_how_many_fit(served, monkeypatch):  # noqa: F811
    """The default 40 steps at 2.1 s a step (a SmolLM2-135M-shape model on 2 cores) cannot fit 30 s: the run ends
    after the last step that fits, its adapter the one after that step, and the screen says so in a sentence.
    The pace comes from a fake clock (4 s a step), never from this machine's speed."""
    import functools

    from explorer.panels import lora as panel
    from explorer.state import session
    from tests.test_finetune import FakeClock

    monkeypatch.setattr(ft, "iter_finetune", functools.partial(ft.iter_finetune, clock=FakeClock(4.0)))
    state = session.new_state()
    model = _own_model(state)
    updates = list(panel.lora_finetune(4, 8, ["q_proj", "v_proj"], panel.DEFAULT_TEXT, 40, 1e-2, 30, state,
                                       progress=_quiet))
    last = updates[-1].status
    assert "stopped at the time limit" in last and "7 of 40 steps in 28.0 s" in last, last
    assert "40 steps would take ~160 s here (4.0 s a step); 7 fit the 30 s limit" in last, last
    assert "the adapter is the one after step 7" in last and state["lora"]["trained_steps"] == 7
    assert any("7 steps fit the 30 s limit, so the run ends after step 7" in u.status for u in updates[:-1]
               if isinstance(u.status, str))
    assert lora_layers(model) and not model.training
