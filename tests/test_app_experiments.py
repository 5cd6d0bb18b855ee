"""The Experiments tab through gradio_client: its numbers equal explorer.interventions' on the served model, and
bad input gets a sentence."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gradio_client.exceptions import AppError

from explorer import interventions as iv
from explorer.panels.experiments import CLEAN, CORRUPT, HOWS, KnockoutView, PatchView, default_heads
from explorer.state import session
from lens.heads import repeated_suffix_len
from tests.api_answer import named
from tests.plotly_payload import arr, fig

from explorer.panels.experiments import BAD, DEFAULT_PROMPT as PROMPT, GOOD
ZERO, MEAN = list(HOWS)


def served():
    model, tokenizer, _ = session.get_model(None)
    return model, tokenizer


def test_knockout_equals_the_api(client):
    model, tokenizer = served()
    ids = tokenizer(PROMPT)["input_ids"]
    out = named(KnockoutView, client.predict(PROMPT, ["1.0"], MEAN, api_name="/knockout"))
    traces = fig(out.loss)["data"]
    before, after = arr(traces[0]["y"]), arr(traces[1]["y"])
    x = torch.tensor([ids])
    logits = iv.ablate_heads(model, x, [(1, 0)], how="mean")
    want_after = iv.token_losses(logits, x)[0].numpy()
    np.testing.assert_allclose(before, iv.per_token_loss(model, x).numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(after, want_after, rtol=1e-4, atol=1e-5)
    p = torch.softmax(logits[0, -1].double(), -1)
    assert out.top["data"][0][4] == pytest.approx(float(p.max()), abs=1e-4)
    assert "nats per token" in out.summary and "repeated part" in out.summary


def test_knockout_of_the_induction_head_raises_the_loss_on_the_repeat(client):
    model, tokenizer = served()
    ids = tokenizer(PROMPT)["input_ids"]
    n = repeated_suffix_len(ids)
    assert n > 0
    # the served model's best induction head (the tab opens on it), wherever training put it
    out = named(KnockoutView, client.predict(PROMPT, default_heads(model), ZERO, api_name="/knockout"))
    traces = fig(out.loss)["data"]
    before, after = arr(traces[0]["y"]), arr(traces[1]["y"])
    assert after[-n:].mean() > before[-n:].mean() + 0.5


def test_sweep_and_patch_equal_the_api(client):
    model, tokenizer = served()
    sweep_fig, text = client.predict(PROMPT, ZERO, api_name="/experiment_sweep")
    ids = tokenizer(PROMPT)["input_ids"]
    n = repeated_suffix_len(ids)
    r = iv.knockout_sweep(model, [ids])
    want = (r["knocked"][..., -n:] - r["base"][-n:]).mean(-1).numpy()
    np.testing.assert_allclose(arr(fig(sweep_fig)["data"][0]["z"]), want, rtol=1e-4, atol=1e-4)
    assert "knock-outs, one head at a time" in text

    out = named(PatchView, client.predict(CLEAN, CORRUPT, GOOD, BAD, api_name="/experiment_patch"))
    c, x = tokenizer(CLEAN)["input_ids"], tokenizer(CORRUPT)["input_ids"]
    answer = (tokenizer.encode(GOOD, add_special_tokens=False)[0], tokenizer.encode(BAD, add_special_tokens=False)[0])
    np.testing.assert_allclose(arr(fig(out.resid)["data"][0]["z"]), iv.patch(model, [c], [x], "resid_pre", answer).numpy(),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(arr(fig(out.head)["data"][0]["z"]), iv.patch(model, [c], [x], "head", answer).numpy(),
                               rtol=1e-4, atol=1e-4)


def test_circuit_reports_four_losses(client):
    figure, text = client.predict(api_name="/experiment_circuit")
    bars = fig(figure)["data"][0]
    assert len(arr(bars["y"])) == 4
    assert "induction head" in text and "previous-token head" in text


@pytest.mark.parametrize("args, api, message", [
    ((PROMPT, ["9.0"], ZERO), "/knockout", "layer must be between"),
    ((PROMPT, ["0.9"], ZERO), "/knockout", "head must be between"),
    ((PROMPT, ["x"], ZERO), "/knockout", "layer.head"),
    ((PROMPT, [], ZERO), "/knockout", "at least one head"),
    ((CLEAN, "apple river", GOOD, BAD), "/experiment_patch", "tokens and the corrupted one"),
    ((CLEAN, CORRUPT, " chair lamp", BAD), "/experiment_patch", "patching compares two single tokens"),
])
def test_bad_input_gets_a_sentence(client, args, api, message):
    with pytest.raises(AppError, match=message):
        client.predict(*args, api_name=api)
