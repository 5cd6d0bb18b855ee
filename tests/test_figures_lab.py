"""Figure builders of the memory lab, generation and LoRA tabs, alone: axes, titles, units, provenance, no NaN."""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from explorer.figures import generation as fg
from explorer.figures import lora as fl
from explorer.figures import memory as fm

PROV = {"device": "cpu", "dtype": "float32", "torch": "2.13.0"}


def no_nan(fig) -> None:
    """Every number anywhere in the figure's JSON is finite (None is allowed: a gap)."""
    def walk(x):
        if isinstance(x, float):
            assert math.isfinite(x), x
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
    walk(json.loads(fig.to_json()))
    for trace in fig.data:
        for key in ("x", "y", "z"):
            values = getattr(trace, key, None)
            if values is not None:
                a = np.array(values, dtype=object).ravel()
                assert not any(isinstance(v, float) and not math.isfinite(v) for v in a), (trace.name, key)


def annotations(fig) -> str:
    return " ".join(a.text for a in fig.layout.annotations)


def sweep_rows():
    rows = []
    for T in (128, 256, 512):
        rows.append({"seq_len": T, "impl": "naive", "peak_bytes": 16 * T * T, "predicted_bytes": 16 * T * T,
                     "seconds": 1e-6 * T * T, "max_abs_diff": 0.0, "memory_source": "profiler"})
        rows.append({"seq_len": T, "impl": "sdpa", "peak_bytes": 300 * T, "predicted_bytes": 320 * T,
                     "seconds": 1e-5 * T, "max_abs_diff": 1e-7, "memory_source": "profiler"})
    rows.append({"seq_len": 1024, "impl": "naive", "peak_bytes": None, "predicted_bytes": 16 * 1024 ** 2,
                 "seconds": None, "max_abs_diff": None, "memory_source": None, "refused": "over budget"})
    return rows


def test_memory_sweep_measured_and_predicted_same_units_with_provenance():
    rows = sweep_rows()
    fig = fm.memory_sweep_figure(rows, provenance=PROV, n_heads=8, head_dim=64, n_kv_heads=2)
    no_nan(fig)
    names = [t.name for t in fig.data]
    assert any("naive" in n and "measured" in n for n in names)
    assert any("naive" in n and "predicted" in n and "O(T²)" in n for n in names)
    assert any("SDPA" in n and "predicted" in n and "O(T)" in n for n in names)
    measured = next(t for t in fig.data if t.name.startswith("naive") and "measured" in t.name)
    predicted = next(t for t in fig.data if t.name.startswith("naive") and "predicted" in t.name)
    # same units (MiB) for measured and predicted; the refused size is a gap, not a NaN or zero
    assert list(measured.x) == [128, 256, 512, 1024]
    assert measured.y[0] == pytest.approx(16 * 128 * 128 / 2**20) and measured.y[-1] is None
    assert predicted.y[-1] == pytest.approx(16.0)
    assert predicted.line.dash == "dash"
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert list(fig.layout.xaxis.tickvals) == [128, 256, 512, 1024]
    assert fig.layout.yaxis.title.text == "MiB" and fig.layout.yaxis2.title.text == "ms"
    # decades named with their unit: never Plotly's bare "5" and "2" between them
    assert list(fig.layout.yaxis.ticktext)[:3] == ["0.01 MiB", "0.1 MiB", "1 MiB"]
    assert all(t.endswith(" MiB") for t in fig.layout.yaxis.ticktext)
    assert all(t.endswith(" ms") for t in fig.layout.yaxis2.ticktext)
    prov = fig.layout.title.text
    for word in ("measured", "predicted", "cpu", "float32", "torch 2.13.0"):
        assert word in prov
    assert "8 heads × 64 dims" in fig.layout.title.text and "2 KV heads" in fig.layout.title.text


def test_tiled_step_figure_from_a_real_trace():
    from explorer import measure

    trace = measure.tiled_trace(24, 2, 8, 8, seed=0)
    blocks = trace["blocks"]
    b = blocks[1]
    fig = fm.tiled_step_figure(trace["weights"][1], b["m"][1], b["l"][1], b["out"][1], trace["out"][1],
                               start=b["start"], stop=b["stop"], block=1, n_blocks=len(blocks), head=1,
                               final_m=blocks[-1]["m"][1], final_l=blocks[-1]["l"][1])
    no_nan(fig)
    assert "step 2 of 3" in fig.layout.title.text and "head 1" in fig.layout.title.text
    weights, out = fig.data[0], fig.data[1]
    assert (weights.zmin, weights.zmax) == (0, 1)
    assert out.zmid == 0 and out.zmin == -out.zmax  # diverging, centred on 0
    np.testing.assert_allclose(np.array(out.z, dtype=float), b["out"][1], rtol=1e-6)
    # the last block's output is the final output
    last = blocks[-1]
    fig = fm.tiled_step_figure(trace["weights"][0], last["m"][0], last["l"][0], last["out"][0], trace["out"][0],
                               start=last["start"], stop=last["stop"], block=2, n_blocks=3, head=0)
    assert "max |so far − final| 0.00e+00" in fig.layout.annotations[1].text
    assert fig.layout.yaxis.autorange == "reversed"  # query 0 at the top


def test_tiled_step_figure_turns_fill_values_into_gaps():
    T, D = 4, 2
    m = np.array([-3.4e38, 1.0, 2.0, np.nan])
    fig = fm.tiled_step_figure(np.eye(T), m, np.ones(T), np.zeros((T, D)), np.ones((T, D)), start=0, stop=2,
                               block=0, n_blocks=2, head=0)
    no_nan(fig)
    assert fig.data[2].y[0] is None and fig.data[2].y[3] is None


def test_next_token_figure_probabilities_and_chosen_token():
    fig = fg.next_token_figure(["the", "a", "<b>x</b>"], [0.6, 0.3, 0.1], chosen_index=1, step=3,
                               model_probs=[0.5, 0.3, 0.2], settings="temperature 0.8")
    no_nan(fig)
    bars = fig.data[0]
    assert list(bars.x) == [0.6, 0.3, 0.1]
    assert bars.marker.color[1] == fg.CHOSEN and bars.marker.color[0] == fg.OTHER
    assert "chose “a”" in fig.layout.title.text and "Step 3" in fig.layout.title.text
    assert list(bars.y)[2] == "#3 &lt;b&gt;x&lt;/b&gt;"  # HTML shown as text
    assert fig.layout.xaxis.range == (0, 1.1) and "probability" in fig.layout.xaxis.title.text
    assert fig.layout.yaxis.autorange == "reversed"
    fig = fg.next_token_figure(["a", "a"], [0.5, 0.5], chosen_index=None, step=0, chosen_text="zebra")
    assert len(set(fig.data[0].y)) == 2  # repeated token text keeps two bars
    assert "outside the top 2" in fig.layout.title.text
    with pytest.raises(ValueError, match="NaN"):
        fg.next_token_figure(["a"], [float("nan")], chosen_index=0, step=0)


def test_cache_and_timing_figures():
    fig = fg.cache_growth_figure([5, 6, 7], [1024 * 5, 1024 * 6, 1024 * 7], n_layers=4,
                                 capacity_bytes_per_layer=1024 * 16, provenance=PROV)
    no_nan(fig)
    assert fig.layout.yaxis.title.text == "cache memory (MiB)"
    np.testing.assert_allclose(fig.data[1].y, np.array([5, 6, 7]) * 1024 * 4 / 2**20)
    assert "cpu · float32 · torch 2.13.0" in fig.layout.title.text
    fig = fg.cache_timing_figure([0.01, 0.002], [0.01, 0.02], provenance=PROV, identical=True)
    no_nan(fig)
    assert "same tokens" in fig.layout.title.text and fig.layout.yaxis.title.text == "time per token (ms)"
    assert "measured" in fig.layout.title.text


def test_kv_calculator_figure_is_log_log_and_predicted():
    fig = fg.kv_calculator_figure([1024, 2048], {"X as MHA": [2**20, 2**21], "X as MQA": [2**16, 2**17]},
                                  dtype="float16", batch=2, highlight="X as MQA")
    no_nan(fig)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert list(fig.data[0].y) == [1.0, 2.0]
    assert fig.data[1].line.width == 4
    assert "predicted" in fig.layout.title.text and "float16" in fig.layout.title.text
    assert list(fig.layout.xaxis.ticktext) == ["1k", "2k"]


def test_parameter_figure_counts_and_memory():
    counted = {"trainable": 1792, "frozen": 105024, "total": 106816}
    memory = {"LoRA": {"frozen weights": 420096, "gradients": 7168}, "full fine-tune": {"gradients": 427264}}
    fig = fl.parameter_figure(counted, 1792, memory, rank=4, alpha=8, targets=["q_proj", "v_proj"])
    no_nan(fig)
    assert list(fig.data[0].y) == [1792, 1792, 105024]
    assert fig.layout.yaxis.type == "log"
    grads = next(t for t in fig.data if t.name == "gradients")
    np.testing.assert_allclose(grads.y, [7168 / 2**20, 427264 / 2**20])
    assert "1.68%" in fig.layout.title.text
    assert "formula" in fig.layout.title.text


def test_loss_curve_figure():
    empty = fl.loss_curve_figure([], [], max_steps=10)
    no_nan(empty)
    assert "press Fine-tune" in annotations(empty)
    fig = fl.loss_curve_figure([0, 1, 2], [3.0, 2.5, 2.0], max_steps=10, status="done", provenance=PROV)
    assert list(fig.data[0].y) == [3.0, 2.5, 2.0] and "nats" in fig.layout.yaxis.title.text
    with pytest.raises(ValueError, match="learning rate"):
        fl.loss_curve_figure([0], [float("nan")], max_steps=1)


def test_attention_before_after_shares_the_colour_range():
    labels = ["0·a", "1·b", "2·a"]
    a = np.tril(np.ones((3, 3))) / np.arange(1, 4)[:, None]
    b = np.eye(3)
    fig = fl.attention_before_after_figure(a, b, labels, layer=1, head_name="head 2 (KV 1)")
    no_nan(fig)
    assert fig.data[0].zmin == fig.data[1].zmin == 0 and fig.data[0].zmax == fig.data[1].zmax == 1
    assert list(fig.data[0].y) == labels and fig.layout.yaxis.autorange == "reversed"
    assert "Layer 1 · head 2 (KV 1) · attention weights" in fig.layout.title.text
    assert f"{np.abs(a - b).max():.4f}" in fig.layout.title.text
    with pytest.raises(ValueError):
        fl.attention_before_after_figure(a, np.eye(2), labels, layer=0, head_name="head 0")


@pytest.mark.parametrize("values,vals,text", [
    ([0.3, 66, 3.1], [0.1, 1, 10, 100], ["0.1 MiB", "1 MiB", "10 MiB", "100 MiB"]),
    ([0.72, 1770], [0.1, 1, 10, 100, 1000, 10000], ["0.1 MiB", "1 MiB", "10 MiB", "100 MiB", "1,000 MiB", "10,000 MiB"]),
    ([3, 8, None, float("nan")], [1, 2, 5, 10, 20, 50], ["1 MiB", "2 MiB", "5 MiB", "10 MiB", "20 MiB", "50 MiB"]),
    ([None, 0], [], []),
])
def test_log_ticks_name_decades_with_their_unit(values, vals, text):
    from explorer.figures.common import log_ticks

    got_vals, got_text = log_ticks(values, "MiB")
    np.testing.assert_allclose(got_vals, vals)
    assert got_text == text


def test_memory_sweep_on_a_phone_stacks_memory_above_time_each_chart_the_full_width():
    fig = fm.memory_sweep_figure(sweep_rows(), provenance=PROV, n_heads=8, head_dim=64, n_kv_heads=2)
    narrow = fig.layout.meta["narrow"]  # app.py's page script merges it in under 640 px
    assert narrow["xaxis"]["domain"] == narrow["xaxis2"]["domain"] == [0, 1]
    top, bottom = narrow["yaxis"]["domain"], narrow["yaxis2"]["domain"]
    assert bottom[1] < top[0]  # time below memory, apart
    memory, time = narrow["annotations"]
    assert (memory["text"], time["text"]) == tuple(a.text for a in fig.layout.annotations)
    assert memory["y"] == top[1] and time["y"] == bottom[1]  # each title on its own chart
    lines = narrow["title"]["text"].split("<br>")
    assert lines[0] == "Naive vs flash attention" and all(len(re.sub("<[^>]+>", "", x)) <= 45 for x in lines)
    assert narrow["margin"]["t"] >= 22 * len(lines)
