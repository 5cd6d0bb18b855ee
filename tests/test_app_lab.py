"""The memory lab, KV cache & generation and LoRA tabs, called through gradio_client on the app launched
in-process (tests/conftest.py). Figure data is checked against what the code computes independently here:
the served model's own forward pass, explorer.measure's predictions, models.lora's counts."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from gradio_client.exceptions import AppError

from explorer import measure

from explorer.state import session
from models.generate import generate as generate_tokens
from models.lora import attach_lora, count_parameters, lora_layers
from explorer.panels.generation import GenerationView
from tests.api_answer import named
from tests.plotly_payload import arr, fig

MIB = 2**20
PROMPT = "Once upon a time there was a little girl"


def all_numbers_finite(figure: dict) -> bool:
    def walk(x):
        if isinstance(x, float):
            return math.isfinite(x)
        if isinstance(x, dict):
            if "bdata" in x:
                return bool(np.all(np.isfinite(arr(x).astype(float))))
            return all(walk(v) for v in x.values())
        if isinstance(x, list):
            return all(walk(v) for v in x)
        return True
    return walk(figure)


@pytest.fixture(scope="module")
def served(client):
    return session.load_default()


# --- Memory lab ----------------------------------------------------------------------------------------

def test_memory_compare_measured_beside_predicted(client):
    plot, summary, table = client.predict(256, 2, 16, 1, ["naive", "sdpa", "tiled"], True, "float32",
                                          api_name="/memory_compare")
    f = fig(plot)
    assert all_numbers_finite(f)
    rows = table["data"]
    assert [(r[0], r[1]) for r in rows] == [(T, i) for T in (128, 256) for i in ("naive", "sdpa", "tiled")]
    for impl in ("naive", "sdpa", "tiled"):
        mine = [r for r in rows if r[1] == impl]
        meas = next(t for t in f["data"] if t["name"].lower().startswith(impl) and "measured" in t["name"])
        pred = next(t for t in f["data"] if t["name"].lower().startswith(impl) and "predicted" in t["name"])
        np.testing.assert_allclose(arr(meas["y"]), [r[2] / MIB for r in mine])
        expected = [measure.predict_attention_bytes(impl, T, 2, 16, n_kv_heads=1, causal=True) for T in (128, 256)]
        assert [r[3] for r in mine] == expected
        np.testing.assert_allclose(arr(pred["y"]), np.array(expected) / MIB)
    naive = [r for r in rows if r[1] == "naive"]
    sdpa = [r for r in rows if r[1] == "sdpa"]
    assert naive[-1][2] / naive[0][2] > 3  # O(T²): doubling T roughly quadruples the peak
    assert sdpa[-1][2] < naive[-1][2]
    text = f["layout"]["title"]["text"]
    assert f"torch {torch.__version__}" in text and "float32" in text and "measured" in text and "predicted" in text
    assert "At T = 256" in summary


def test_memory_compare_refuses_over_budget_before_allocating(client):
    import time

    t0 = time.perf_counter()
    with pytest.raises(AppError, match=r"over the memory budget .*choose a sequence length of at most"):
        client.predict(16384, 64, 128, 64, ["naive", "sdpa", "tiled"], True, "float32", api_name="/memory_compare")
    assert time.perf_counter() - t0 < 10  # refused from the prediction, nothing measured


def test_memory_budget_hint_is_the_prediction(client):
    md = client.predict(8, 64, 8, ["naive", "sdpa"], True, "float32", api_name="/memory_budget")
    kw = dict(n_kv_heads=8, dtype="float32", causal=True, device="cuda" if torch.cuda.is_available() else "cpu")
    naive = measure.largest_fitting_seq_len(measure.MEMORY_BUDGET_BYTES, 8, 64, impls=("naive",), **kw)
    both = measure.largest_fitting_seq_len(measure.MEMORY_BUDGET_BYTES, 8, 64, impls=("naive", "sdpa"), **kw)
    assert f"naive up to T = {naive:,}" in md and f"together up to T = **{both:,}**" in md
    # the sweep right at that limit is accepted by the budget check, one past it is refused
    measure.check_budget(both, 8, 64, impls=("naive", "sdpa"), **kw)
    with pytest.raises(ValueError, match="over the memory budget"):
        measure.check_budget(both + 1, 8, 64, impls=("naive", "sdpa"), **kw)


@pytest.mark.parametrize("args, message", [
    ((1024, 8, 64, 3, ["naive"], True, "float32"), r"KV heads \(3\) must divide the 8 query heads"),
    ((1024, 8, 64, 8, [], True, "float32"), "Tick at least one implementation"),
])
def test_memory_compare_refuses_bad_settings(client, args, message):
    with pytest.raises(AppError, match=message):
        client.predict(*args, api_name="/memory_compare")


def test_memory_trace_steps_through_the_blocks(client):
    slider, plot, info = client.predict(32, 8, True, 1, api_name="/memory_trace")
    trace = measure.tiled_trace(32, 2, 16, 8, seed=0, causal=True)
    assert slider["maximum"] == len(trace["blocks"]) - 1 == 3
    np.testing.assert_allclose(arr(fig(plot)["data"][1]["z"]), trace["blocks"][0]["out"][1], rtol=1e-5, atol=1e-6)
    step = client.predict(2, 1, api_name="/memory_trace_step")
    f = fig(step)
    np.testing.assert_allclose(arr(f["data"][1]["z"]), trace["blocks"][2]["out"][1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(arr(f["data"][2]["y"]), trace["blocks"][2]["m"][1], rtol=1e-5)
    assert "step 3 of 4" in f["layout"]["title"]["text"]
    assert f"{trace['max_abs_diff']:.2e}" in info
    with pytest.raises(AppError, match="greater than maximum value 3|key block must be a whole number from 0 to 3"):
        client.predict(9, 1, api_name="/memory_trace_step")


# --- KV cache and generation ---------------------------------------------------------------------------

def _ids(tokenizer, text):
    return session.encode(tokenizer, text, 10_000)[0]


def test_a_short_answer_gets_no_cache_verdict(client):
    """One or two decode steps timed both ways once told a class "the cache was 1.4x slower"."""
    out = named(GenerationView, client.predict(PROMPT, 2, 0.0, None, 1.0, 7, api_name="/generate"), state=("view",))
    assert "too short to compare (1 decode step(s) measured both ways" in out.summary
    assert "slower" not in out.summary and "faster**" not in out.summary


def test_generate_bars_are_the_softmax_of_the_models_logits(client, served):
    model, tokenizer = served
    out = named(GenerationView, client.predict(PROMPT, 6, 1.0, None, 1.0, 7, api_name="/generate"), state=("view",))
    text, probs, cache_plot, timing_plot, summary, table = out.text, out.probs, out.cache, out.timing, out.summary, \
        out.table
    ids = _ids(tokenizer, PROMPT)
    new = [row[2] for row in table["data"]]
    expected = generate_tokens(model, torch.tensor([ids]), 6, temperature=1.0, seed=7)[0, len(ids):].tolist()
    assert new == expected  # the same sampler, prompt and seed
    assert "identical tokens" in summary
    for step in (0, 3):
        f = fig(probs) if step == 0 else fig(client.predict(step, api_name="/generate_step"))
        with torch.no_grad():
            logits = model(torch.tensor([ids + new[:step]]))[0, -1].double()
        p = torch.softmax(logits, -1)
        top = torch.topk(logits, 10).indices
        np.testing.assert_allclose(arr(f["data"][0]["x"]), p[top].numpy(), atol=1e-5)
        assert f"Step {step}" in f["layout"]["title"]["text"]
        chosen = f["data"][0]["marker"]["color"]
        if new[step] in top.tolist():
            assert chosen[top.tolist().index(new[step])] == "#d62728"
    c = model.config
    cache = fig(cache_plot)
    per_layer = 2 * c.n_kv_heads * c.head_dim * 4  # bytes per position per layer, K and V, fp32
    xs = arr(cache["data"][0]["x"])
    np.testing.assert_allclose(xs, len(ids) + np.arange(6))
    np.testing.assert_allclose(arr(cache["data"][0]["y"]), xs * per_layer / MIB)
    timing = fig(timing_plot)
    assert len(arr(timing["data"][0]["y"])) == len(arr(timing["data"][1]["y"])) == 6
    assert text[-1]["token"].strip() and text[-1]["class_or_confidence"] == "generated"


@pytest.mark.parametrize("temperature", [1e-9, 1e9])
def test_generate_extreme_temperatures_never_draw_nan(client, served, temperature):
    model, tokenizer = served
    out = named(GenerationView, client.predict(PROMPT, 4, temperature, None, 1.0, 0, api_name="/generate"),
                state=("view",))
    for plot in (out.probs, out.cache, out.timing):
        assert all_numbers_finite(fig(plot))
    bars = arr(fig(out.probs)["data"][0]["x"])
    ids = _ids(tokenizer, PROMPT)
    if temperature < 1:
        greedy = generate_tokens(model, torch.tensor([ids]), 4, temperature=0.0)[0, len(ids):].tolist()
        assert [r[2] for r in out.table["data"]] == greedy
        assert bars[0] == pytest.approx(1.0)
    else:
        np.testing.assert_allclose(bars, 1.0 / model.config.vocab_size, rtol=1e-3)


@pytest.mark.parametrize("args, message", [
    (("hello", 4, -0.5, None, 1.0, 0), "temperature must be 0 .greedy. or positive"),
    (("hello", 4, 1.0, 0, 1.0, 0), "top-k must be a whole number of at least 1"),
    (("hello", 4, 1.0, None, 0.0, 0), r"top-p must lie in \(0, 1\]"),
    (("hello", 4, 1.0, None, 1.5, 0), r"top-p must lie in \(0, 1\]"),
    (("hello", 10_000, 1.0, None, 1.0, 0), "maximum value|new tokens must be"),
    (("   ", 4, 1.0, None, 1.0, 0), "The prompt is empty"),
])
def test_generate_refuses_bad_settings(client, args, message):
    with pytest.raises(AppError, match=message):
        client.predict(*args, api_name="/generate")


def test_generate_accepts_emoji_and_html(client):
    out = named(GenerationView, client.predict("<b>bold</b> 🙂 ünïcode", 3, 0.0, None, 1.0, 0, api_name="/generate"),
                state=("view",))
    prompt = [seg["token"] for seg in out.text if seg["class_or_confidence"] is None]
    assert prompt[0].startswith("<b>bold</b>")


def test_kv_calculator_matches_the_formula(client, served):
    plot, table, md = client.predict("Llama-2-70B", 4096, 2, "float16", api_name="/kv_calculator")
    row = next(r for r in table["data"] if r[0] == "Llama-2-70B")
    assert row[1:6] == [80, 64, 8, 128, "GQA (8 per group)"]
    assert row[6] == 80 * 2 * 8 * 128 * 2 and row[8] == row[6] * 4096 * 2
    f = fig(plot)
    own = next(t for t in f["data"] if "(its own)" in t["name"])
    mqa = next(t for t in f["data"] if "as MQA" in t["name"])
    assert arr(own["x"])[-1] == 4096
    assert arr(own["y"])[-1] == pytest.approx(row[8] / MIB)
    assert arr(mqa["y"])[-1] == pytest.approx(row[8] / 8 / MIB)
    this = next(r for r in table["data"] if r[0] == "this app's model")
    c = served[0].config
    assert this[3] == c.n_kv_heads and this[6] == c.n_layers * 2 * c.n_kv_heads * c.head_dim * 2
    with pytest.raises(AppError, match="unknown configuration|not in the list of choices"):
        client.predict("GPT-9", 4096, 1, "float16", api_name="/kv_calculator")


# --- LoRA ----------------------------------------------------------------------------------------------

def test_lora_trainable_count_is_count_parameters(client, served):
    model, _ = served
    plot, table, md = client.predict(4, 8, ["q_proj", "v_proj", "down_proj"], api_name="/lora")
    copy_ = copy.deepcopy(model)
    attach_lora(copy_, ("q_proj", "v_proj", "down_proj"), rank=4, alpha=8.0)
    counts = count_parameters(copy_)
    bars = fig(plot)["data"][0]
    assert arr(bars["y"]).tolist() == [counts["trainable"], counts["trainable"], counts["frozen"]]
    assert sum(r[5] for r in table["data"]) == counts["trainable"]
    assert f"{counts['trainable']:,} trainable" in md and "(equal)" in md
    assert not lora_layers(model)  # counting never touched the served model


@pytest.mark.parametrize("args, message", [
    ((4, 8, []), "Tick at least one projection"),
    ((4, -1, ["q_proj"]), "alpha must be a positive number"),
    ((10_000, 8, ["q_proj"]), "maximum value|rank must be"),
])
def test_lora_refuses_bad_settings(client, args, message):
    with pytest.raises(AppError, match=message):
        client.predict(*args, api_name="/lora")


@pytest.mark.slow
def test_one_sessions_adapter_leaves_other_sessions_unchanged(app_url, served):
    from tests.loopback import loopback_client

    model, _ = served
    before = {k: v.clone() for k, v in model.state_dict().items()}
    a, b = loopback_client(app_url), loopback_client(app_url)
    greedy = ("Tom has a red", 8, 0.0, None, 1.0, 0)
    base_b = b.predict(*greedy, api_name="/generate")[6]["data"]
    base_a = a.predict(*greedy, api_name="/generate")[6]["data"]
    assert [r[2] for r in base_a] == [r[2] for r in base_b]

    with pytest.raises(AppError, match="Fine-tune first"):
        a.predict("off", api_name="/lora_adapter")
    plot, left, right, md = a.predict("Tom has a red", 0, 1, 8, api_name="/lora_compare")  # no adapter yet
    assert left[1]["token"] == right[1]["token"] and "No adapter yet" in md
    f = fig(plot)
    np.testing.assert_array_equal(arr(f["data"][0]["z"]), arr(f["data"][1]["z"]))
    with pytest.raises(AppError, match="paste at least a sentence|The prompt is empty"):
        a.predict(8, 16, ["q_proj"], "  ", 3, 1e-2, 10, api_name="/lora_finetune")
    with pytest.raises(AppError, match="steps must be|less than minimum value 1"):
        a.predict(8, 16, ["q_proj"], "Tom has a red ball.", 0, 1e-2, 10, api_name="/lora_finetune")

    text = "Tom has a red ball. Tom has a red ball. Tom has a red ball. Anna has a red ball too."
    loss_plot, status, *_ = a.predict(8, 16, ["q_proj", "v_proj", "o_proj", "down_proj"], text, 12, 1e-2, 30,
                                      api_name="/lora_finetune")
    losses = arr(fig(loss_plot)["data"][0]["y"])
    assert len(losses) == 13 and losses[-1] < losses[0]
    assert "done" in status

    tuned_a = a.predict(*greedy, api_name="/generate")
    after_b = b.predict(*greedy, api_name="/generate")[6]["data"]
    assert after_b == base_b or [r[2] for r in after_b] == [r[2] for r in base_b]
    assert [r[2] for r in tuned_a[6]["data"]] != [r[2] for r in base_a] or \
        [r[4] for r in tuned_a[6]["data"]] != [r[4] for r in base_a]  # A's model changed
    for k, v in model.state_dict().items():  # the shared model is untouched
        assert torch.equal(v, before[k]), k
    assert not lora_layers(model)

    # the comparison: the left side is the base model, exactly
    plot, before_text, after_text, md = a.predict("Tom has a red", 0, 1, 8, api_name="/lora_compare")
    base_text = a.predict(*greedy, api_name="/generate")[0]  # adapter still on: A's model
    start = next(k for k, seg in enumerate(base_text) if seg["token"].strip() == "Tom has a red")  # after the marked <s>
    assert after_text[1]["token"].strip() == "".join(seg["token"] for seg in base_text[start + 1:]).strip()
    f = fig(plot)
    ids = _ids(served[1], "Tom has a red")
    from explorer import probes

    np.testing.assert_allclose(arr(f["data"][0]["z"]), probes.attention_pattern(model, ids, 0, 1), atol=1e-6)

    # adapter off: A generates exactly what the base model generates
    a.predict("off", api_name="/lora_adapter")
    off_a = a.predict(*greedy, api_name="/generate")[6]["data"]
    assert [r[2] for r in off_a] == [r[2] for r in base_a]
    assert [r[4] for r in off_a] == [r[4] for r in base_a]
    # merged: the same tokens as the adapter on
    a.predict("merged", api_name="/lora_adapter")
    merged_a = a.predict(*greedy, api_name="/generate")[6]["data"]
    assert [r[2] for r in merged_a] == [r[2] for r in tuned_a[6]["data"]]
    _, _, after_merged, md = a.predict("Tom has a red", 0, 1, 8, api_name="/lora_compare")
    assert "Merged vs unmerged" in md and after_merged[1]["class_or_confidence"] == "adapter merged"


@pytest.mark.slow
def test_finetune_is_cancellable_and_stops_training(app_url):
    import time

    from tests.loopback import loopback_client
    from gradio_client.utils import Status

    a = loopback_client(app_url)
    t0 = time.perf_counter()
    job = a.submit(4, 8, ["q_proj", "v_proj"], "Tom has a red ball. " * 30, 200, 1e-3, 60,
                   api_name="/lora_finetune")
    while len(job.outputs()) < 2 and time.perf_counter() - t0 < 60:
        time.sleep(0.1)
    assert len(job.outputs()) >= 2, "no live update of the loss curve arrived"
    job.cancel()
    while not job.done() and time.perf_counter() - t0 < 60:
        time.sleep(0.1)
    assert job.status().code == Status.CANCELLED
    first = a.predict("Tom has a red", 0, 0, 4, api_name="/lora_compare")[3]
    time.sleep(1.0)
    second = a.predict("Tom has a red", 0, 0, 4, api_name="/lora_compare")[3]
    assert first == second  # nothing is training any more: the adapter stands still
    assert time.perf_counter() - t0 < 30


def test_a_diverging_fine_tune_removes_the_adapter(served, monkeypatch):
    """Called directly (no client): a NaN loss ends the run with a message and leaves the base model."""
    import gradio as gr

    from explorer import finetune
    from explorer.panels import lora as panel

    def diverging(model, ids, **kw):
        yield {"step": 1, "loss": 2.0, "seconds": 0.1, "stopped": None, "step_seconds": 0.1,
               "projected_seconds": 4.0, "fit_steps": 40}
        yield {"step": 2, "loss": float("nan"), "seconds": 0.2, "stopped": None, "step_seconds": 0.1,
               "projected_seconds": 4.0, "fit_steps": 40}

    monkeypatch.setattr(finetune, "iter_finetune", diverging)
    state = session.new_state()
    run = panel.lora_finetune(4, 8, ["q_proj"], "Tom has a red ball. Anna has a red ball.", 5, 1e-2, 10, state,
                              progress=lambda *a, **k: None)
    with pytest.raises(gr.Error, match="lower the learning rate"):
        for _ in run:
            pass
    own, _, _ = session.get_model(state)
    assert own is not served[0] and not lora_layers(own)
    ids = _ids(served[1], PROMPT)
    with torch.no_grad():
        assert torch.equal(own(torch.tensor([ids])), served[0](torch.tensor([ids])))


def test_a_climbing_loss_is_reported_as_diverged_on_screen(served):
    """The real guard on the default model at the largest learning rate: the summary says it diverged, and the
    user's copy is the base model again."""
    from explorer import finetune
    from explorer.panels import lora as panel

    state = session.new_state()
    updates = list(panel.lora_finetune(8, 16, ["q_proj", "v_proj"], panel.DEFAULT_TEXT, 60, finetune.LR_RANGE[1],
                                       30, state, progress=lambda *a, **k: None))
    assert "Diverged, stopped at step" in updates[-1].status and "adapter was removed" in updates[-1].status
    own, _, _ = session.get_model(state)
    assert not lora_layers(own) and "lora" not in state


def test_trace_play_steps_through_every_block():
    from explorer.panels import memory as panel

    trace = measure.tiled_trace(16, 2, 16, 8, seed=0)
    frames = list(panel.memory_trace_play({"seq_len": 16, "tile_size": 8, "causal": True}, 1))
    assert [block for block, _ in frames] == [0, 1]
    last = frames[-1][1]
    np.testing.assert_allclose(np.array(last.data[1].z, dtype=float), trace["out"][1], rtol=1e-5, atol=1e-6)
