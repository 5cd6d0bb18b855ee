"""The bounded LoRA fine-tune (explorer.finetune) on a tiny random model, without any UI."""
from __future__ import annotations

import copy

import pytest
import torch

from explorer import finetune as ft
from models.config import ModelConfig
from models.decoder import Decoder
from models.block import PROJECTIONS
from models.lora import attach_lora, count_parameters, lora_layers, merge_lora, set_lora_enabled


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_model(seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=64)
    return Decoder(cfg).eval()


def text_ids(n: int = 40, seed: int = 1) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 50, (n,), generator=g).tolist()


@pytest.fixture()
def adapted():
    model = tiny_model()
    base = copy.deepcopy(model)
    attach_lora(model, ("q_proj", "v_proj", "o_proj"), rank=4, alpha=8.0)
    return model, base


def test_loss_falls_on_the_pasted_text():
    model = tiny_model()
    attach_lora(model, PROJECTIONS, rank=4, alpha=8.0)
    ids = text_ids()
    rows = ft.make_rows(ids, 63)
    before = ft.evaluate_loss(model, rows)
    result = ft.finetune(model, ids, steps=30, lr=1e-2)
    after = ft.evaluate_loss(model, rows)
    assert result["steps"] == 30 and result["stopped"] is None
    assert after < before - 0.3, (before, after)
    assert result["losses"][-1] < result["losses"][0]
    assert not model.training


def test_base_weights_are_unchanged(adapted):
    model, base = adapted
    ft.finetune(model, text_ids(), steps=10, lr=1e-2)
    base_state = base.state_dict()
    for name, tensor in model.state_dict().items():
        if "lora_" in name:
            continue
        plain = name.replace(".base.", ".")
        assert torch.equal(tensor, base_state[plain]), name


def test_disabling_the_adapter_restores_the_original_logits_exactly(adapted):
    model, base = adapted
    tokens = torch.tensor([text_ids(20, seed=7)])
    with torch.no_grad():
        original = base(tokens)
    ft.finetune(model, text_ids(), steps=10, lr=1e-2)
    with torch.no_grad():
        tuned = model(tokens)
        assert not torch.allclose(tuned, original, atol=1e-4)  # the adapter learned something
        set_lora_enabled(model, False)
        assert torch.equal(model(tokens), original)
        set_lora_enabled(model, True)
        assert torch.allclose(model(tokens), tuned, atol=1e-6)
        merge_lora(model)
        assert torch.allclose(model(tokens), tuned, atol=1e-4)
        set_lora_enabled(model, False)  # unmerges: W0 comes back up to float rounding
        assert torch.allclose(model(tokens), original, atol=1e-5)


def test_only_adapter_parameters_are_trained(adapted):
    model, _ = adapted
    counts = count_parameters(model)
    expected = sum(layer.lora_A.numel() + layer.lora_B.numel() for layer in lora_layers(model))
    assert counts["trainable"] == expected
    with pytest.raises(ValueError, match="attach a LoRA"):
        next(ft.iter_finetune(tiny_model(), text_ids(), steps=1))
    merge_lora(model)
    with pytest.raises(ValueError, match="merged"):
        next(ft.iter_finetune(model, text_ids(), steps=1))


def test_callback_stops_and_generator_can_be_closed(adapted):
    model, _ = adapted
    seen = []
    result = ft.finetune(model, text_ids(), steps=50, on_step=lambda r: seen.append(r["step"]) or r["step"] < 3)
    assert result["steps"] == 3 and result["stopped"] == "callback" and seen == [1, 2, 3]
    gen = ft.iter_finetune(model, text_ids(), steps=50)
    next(gen)
    gen.close()  # what a cancelled UI job does
    assert not model.training


def test_time_cap_ends_the_run(adapted):
    model, _ = adapted
    result = ft.finetune(model, text_ids(), steps=200, max_seconds=1e-6)
    assert result["steps"] == 1 and result["stopped"] == "time"


class FakeClock:
    """A clock that says each step took ``seconds[i]`` (the last value repeated): the time limit is tested on the
    steps' count, never on how fast this machine is."""

    def __init__(self, *seconds: float) -> None:
        self.seconds, self.now, self.calls = list(seconds), 0.0, 0

    def __call__(self) -> float:
        if self.calls:  # the first reading is the run's start; each later one ends a step
            self.now += self.seconds[min(self.calls - 1, len(self.seconds) - 1)]
        self.calls += 1
        return self.now


def test_no_step_is_begun_that_would_end_past_the_time_limit(adapted):
    model, _ = adapted
    records = list(ft.iter_finetune(model, text_ids(), steps=40, max_seconds=30, clock=FakeClock(4.0)))
    # 4 s a step: 7 steps end at 28 s; an 8th would end at 32 s, past the 30 s limit, so it is not begun
    assert [r["step"] for r in records] == list(range(1, 8))
    assert records[-1]["stopped"] == "time" and records[-1]["seconds"] == 28.0
    assert all(r["stopped"] is None for r in records[:-1])
    assert records[0]["projected_seconds"] == 160.0 and records[0]["fit_steps"] == 7
    assert not model.training


def test_a_slow_first_step_is_not_taken_for_the_pace(adapted):
    model, _ = adapted
    records = list(ft.iter_finetune(model, text_ids(), steps=40, max_seconds=30, clock=FakeClock(10.0, 2.0)))
    assert records[0]["fit_steps"] == 3  # after the warm-up step alone: 10 s a step
    assert records[1]["fit_steps"] == 11  # then 2 s a step: 10 + 10 * 2 = 30 s
    assert len(records) == 11 and records[-1]["seconds"] == 30.0 and records[-1]["stopped"] == "time"


def test_a_run_that_fits_its_limit_runs_every_step(adapted):
    model, _ = adapted
    records = list(ft.iter_finetune(model, text_ids(), steps=40, max_seconds=30, clock=FakeClock(0.5)))
    assert len(records) == 40 and records[-1]["stopped"] is None
    assert all(r["fit_steps"] == 40 for r in records)


def test_pace_counts_the_steps_that_fit():
    assert ft.pace(4.0, 4.0, 1, 40, 30.0) == (160.0, 7)
    assert ft.pace(31.0, 4.0, 8, 40, 30.0) == (31.0 + 32 * 4.0, 8)  # already past the limit: no more
    assert ft.pace(1.0, 0.0, 1, 40, 30.0) == (1.0, 40)


@pytest.mark.parametrize("kwargs, message", [
    ({"steps": 0}, "steps"), ({"steps": ft.MAX_STEPS + 1}, "steps"), ({"lr": -1.0}, "learning rate"),
    ({"lr": float("nan")}, "learning rate"), ({"max_seconds": ft.MAX_SECONDS + 1}, "time limit"),
])
def test_settings_outside_the_caps_are_refused(adapted, kwargs, message):
    model, _ = adapted
    with pytest.raises(ValueError, match=message):
        next(ft.iter_finetune(model, text_ids(), **kwargs))


def test_rows_cover_long_text():
    ids = list(range(100))
    rows = ft.make_rows(ids, 15)
    assert rows.shape[1] == 16
    assert rows[0, 0] == 0 and rows[-1, -1] == 99
    covered = {int(t) for r in rows for t in r[1:]}
    assert covered == set(range(1, 100))
    with pytest.raises(ValueError, match="paste at least"):
        ft.make_rows([1, 2], 15)


def _default_model_and_text():
    from explorer.panels.lora import DEFAULT_TEXT
    from models import load_pretrained
    from models.loading import load_tokenizer

    model = load_pretrained("assets/default-model")
    attach_lora(model, ("q_proj", "v_proj"), rank=8, alpha=16.0)
    return model, load_tokenizer("assets/default-model")(DEFAULT_TEXT)["input_ids"]


def test_the_default_learning_rate_lowers_the_loss_on_the_default_model():
    model, ids = _default_model_and_text()
    rows = ft.make_rows(ids, 127)
    before = ft.evaluate_loss(model, rows)
    result = ft.finetune(model, ids, steps=20, seq_len=127)  # lr left to default_lr(width)
    after = ft.evaluate_loss(model, rows)
    assert result["stopped"] is None and result["steps"] == 20
    assert after < 0.5 * before, (before, after)


def test_the_guard_stops_a_run_whose_loss_climbs_and_says_so():
    model, ids = _default_model_and_text()
    records = list(ft.iter_finetune(model, ids, steps=60, lr=ft.LR_RANGE[1], seq_len=127))
    last = records[-1]
    assert last["stopped"] == "diverged" and len(records) < 60
    assert last["loss"] > ft.DIVERGE_RATIO * records[0]["loss"]
    assert all(r["stopped"] is None and r["loss"] <= ft.DIVERGE_RATIO * records[0]["loss"] for r in records[:-1])
    fresh_model, _ = _default_model_and_text()  # the run above has trained `model`'s adapter: start again
    assert ft.finetune(fresh_model, ids, steps=60, lr=ft.LR_RANGE[1], seq_len=127)["stopped"] == "diverged"


def test_a_non_finite_loss_stops_the_run_at_once():
    model = tiny_model()
    attach_lora(model, ("q_proj",), rank=2, alpha=4.0)
    with torch.no_grad():
        model.lm_head.weight[0, 0] = float("nan")
    records = list(ft.iter_finetune(model, text_ids(), steps=10, lr=1e-2))
    assert len(records) == 1 and records[0]["stopped"] == "diverged"


def test_default_lr_follows_the_width_through_its_two_anchors():
    assert ft.default_lr(128) == 1e-2 and ft.default_lr(576) == 1e-3
    assert ft.default_lr(960) < ft.default_lr(576) < ft.default_lr(256) < ft.default_lr(128)
    assert ft.default_lr(8) == ft.LR_RANGE[1] and ft.default_lr(10**6) == ft.LR_RANGE[0]
