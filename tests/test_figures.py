"""Figure builders on their own: arrays in, plotly figures out (no model, no app)."""
import json
import math

import numpy as np
import pytest

from explorer.figures import attention as fa
from explorer.figures import encoder_decoder as fe
from explorer.figures import positions as fp
from explorer.figures.common import (display_token, head_label, heatmap_trace, kv_head_of, parameter_bars,
                                     provenance_text, token_labels, unwrapped)

REPEATED = ["<s>", "the", " the", "the", "cat", "the"]


def _rows(T, seed=0):
    rng = np.random.default_rng(seed)
    w = np.tril(rng.random((T, T)))
    return w / w.sum(axis=1, keepdims=True)


def _serialises(fig):
    json.loads(fig.to_json())


# --- labels -----------------------------------------------------------------------------------------

def test_token_labels_are_unique_for_repeated_tokens():
    labels = token_labels(REPEATED)
    assert len(set(labels)) == len(REPEATED)
    assert labels[1] == "1·the" and labels[3] == "3·the" and labels[0] == "0·&lt;s&gt;"


def test_display_token_shows_whitespace_and_html_as_text():
    assert display_token(" ") == "␣"
    assert display_token("\n") == "↵"
    assert display_token("<b>x</b>") == "&lt;b&gt;x&lt;/b&gt;"
    assert display_token("héllo 🙂") == "héllo 🙂"
    assert len(display_token("x" * 40)) == 16


def test_head_labels_name_the_kv_head():
    assert head_label(3, 8, 2) == "head 3 (KV 0)"
    assert head_label(4, 8, 2) == "head 4 (KV 1)"
    assert head_label(3, 4, 4) == "head 3"
    assert [kv_head_of(h, 6, 3) for h in range(6)] == [0, 0, 1, 1, 2, 2]


def test_provenance_text():
    assert provenance_text("cpu", "float32", "2.13.0", "measured") == "measured · cpu · float32 · torch 2.13.0"


def test_heatmap_trace_rejects_mismatched_labels():
    with pytest.raises(ValueError, match="labels need"):
        heatmap_trace(np.zeros((3, 3)), ["a", "b"], ["a", "b", "c"])


# --- attention ----------------------------------------------------------------------------------------

def test_attention_heatmap_keeps_every_row_of_a_repeated_prompt():
    T = len(REPEATED)
    w = _rows(T)
    labels = token_labels(REPEATED)
    fig = fa.attention_heatmap(w, labels, layer=2, head=3, n_heads=4, n_kv_heads=2)
    tr = fig.data[0]
    assert list(tr.y) == labels and list(tr.x) == labels
    assert np.asarray(tr.z).shape == (T, T)
    np.testing.assert_allclose(np.asarray(tr.z), w)
    assert fig.layout.yaxis.autorange == "reversed"  # query 0 on top
    assert fig.layout.xaxis.type == "category" and fig.layout.yaxis.type == "category"
    assert (tr.zmin, tr.zmax) == (0.0, 1.0)
    assert fig.layout.title.text == "Layer 2 · head 3 (KV 1) · attention weights"
    assert "query" in fig.layout.yaxis.title.text and "key" in fig.layout.xaxis.title.text
    assert tr.colorbar.title.text == "attention weight (0–1)"
    assert "%{z" in tr.hovertemplate and "%{y}" in tr.hovertemplate and "%{x}" in tr.hovertemplate
    _serialises(fig)


def test_attention_heatmap_bidirectional_title():
    fig = fa.attention_heatmap(np.full((2, 2), 0.5), token_labels(["a", "a"]), layer=0, head=0, n_heads=2,
                               n_kv_heads=2, causal=False)
    assert unwrapped(fig.layout.title.text).startswith("Layer 0 · head 0 · attention weights · bidirectional")


def test_attention_grid_tiles_every_layer_and_head():
    L, H, T = 3, 4, 5
    p = np.stack([np.stack([_rows(T, seed=10 * l + h) for h in range(H)]) for l in range(L)])
    labels = token_labels(["a", "b", "a", "c", "a"])
    fig = fa.attention_grid(p, labels, n_kv_heads=2)
    tr = fig.data[0]
    z = np.asarray(tr.z, dtype=float)
    step = T + 1
    assert z.shape == (L * step - 1, H * step - 1)
    for l in range(L):
        for h in range(H):
            np.testing.assert_allclose(z[l * step:l * step + T, h * step:h * step + T], p[l, h])
    assert np.isnan(z[T, 0]) and np.isnan(z[0, T])  # blank gaps between maps
    assert (tr.zmin, tr.zmax) == (0.0, 1.0)
    assert list(fig.layout.xaxis.ticktext) == [head_label(h, H, 2) for h in range(H)]
    assert list(fig.layout.yaxis.ticktext) == [f"layer {l}" for l in range(L)]
    assert fig.layout.yaxis.autorange == "reversed"
    # hover names layer, head and both tokens from the axes' labels, one per row and column, not one per cell
    assert tr.y[1 * step + 2] == f"layer 1 · query {labels[2]}" and tr.x[2 * step] == f"head 2 (KV 1) · key {labels[0]}"
    assert len(set(tr.x)) == len(tr.x) == z.shape[1] and len(set(tr.y)) == len(tr.y) == z.shape[0]
    assert tr.hovertemplate.startswith("%{y}<br>%{x}<br>weight %{z:.4f}") and tr.customdata is None
    assert fig.layout.xaxis.type == fig.layout.yaxis.type == "category"
    _serialises(fig)


def test_a_short_last_grid_page_stays_small():
    """Gemma-3-270m's last page (layers 16-17 of 18) × 4 heads × 64 tokens: 32,768 weights, under the 2 MB an
    Attention update may send, hover included."""
    p = np.stack([np.stack([_rows(64, seed=4 * l + h) for h in range(4)]) for l in range(2)])
    fig = fa.attention_grid(p, token_labels(["token"] * 64), n_kv_heads=1, layer_names=[16, 17], n_layers=18)
    assert len(fig.to_json()) < 1_000_000
    assert fig.data[0].y[-1] == "layer 17 · query 63·token" and fig.data[0].hovertemplate.startswith("%{y}<br>%{x}")


def test_attention_grid_rejects_wrong_shapes():
    with pytest.raises(ValueError):
        fa.attention_grid(np.zeros((2, 2, 3, 3)), ["a", "b"], n_kv_heads=2)


def test_head_scores_figure_fixed_range_and_selection():
    scores = {"previous_token": np.array([[0.1, 0.9], [0.2, 0.3]]), "induction": np.zeros((2, 2)),
              "first_token": np.ones((2, 2))}
    fig = fa.head_scores_figure(scores, n_kv_heads=1, selected=(1, 0))
    heat = [t for t in fig.data if t.type == "heatmap"]
    marks = [t for t in fig.data if t.type == "scatter"]
    assert len(heat) == 3 and len(marks) == 3
    np.testing.assert_allclose(np.asarray(heat[0].z), scores["previous_token"])
    assert (fig.layout.coloraxis.cmin, fig.layout.coloraxis.cmax) == (0, 1)
    assert list(heat[0].x) == ["head 0 (KV 0)", "head 1 (KV 0)"]
    assert marks[0].x == ("head 0 (KV 0)",) and marks[0].y == ("layer 1",)
    assert [a.text for a in fig.layout.annotations][:3] == ["previous-token", "induction", "sink (first token)"]
    _serialises(fig)


def test_gqa_figure_links_each_query_head_to_its_kv_head():
    fig = fa.gqa_figure(8, 2)
    lines = [t for t in fig.data if t.mode == "lines"]
    assert len(lines) == 8
    assert lines[3].x[1] == lines[0].x[1] != lines[4].x[1]  # heads 0-3 meet at KV 0, head 4 at KV 1
    assert "4 query heads share each K/V head" in unwrapped(fig.layout.title.text)


# --- positions ------------------------------------------------------------------------------------------

def test_rope_circle_points_sit_on_the_unit_circle_at_the_angle():
    angles = np.outer(np.arange(10), [1.0, 0.1])
    fig = fp.rope_circle_figure(angles, [0, 1], 7, head_dim=4, theta=100.0)
    arrows = [t for t in fig.data if t.mode == "lines+markers" and len(t.x) == 2]
    assert len(arrows) == 2
    assert math.isclose(arrows[0].x[1], math.cos(7.0)) and math.isclose(arrows[0].y[1], math.sin(7.0))
    assert math.isclose(arrows[1].x[1], math.cos(0.7))
    assert fig.layout.yaxis.scaleanchor == "x"
    with pytest.raises(ValueError):
        fp.rope_circle_figure(angles, [0], 10, head_dim=4, theta=100.0)


def test_rope_angle_heatmap_wraps_to_two_pi():
    angles = np.outer(np.arange(8), [3.0, 0.01])
    fig = fp.rope_angle_heatmap(angles, theta=10000.0)
    z = np.asarray(fig.data[0].z)
    assert z.min() >= 0 and z.max() < 2 * math.pi
    assert (fig.data[0].zmin, fig.data[0].zmax) == (0, 2 * math.pi)
    assert fig.layout.yaxis.autorange == "reversed"
    assert "angle" in fig.data[0].colorbar.title.text


def test_rope_distance_and_sinusoidal_figures():
    fig = fp.rope_distance_figure({"θ = 100": np.ones(5), "θ = 10,000 (trained)": np.zeros(5)},
                                  highlight="θ = 10,000 (trained)")
    assert len(fig.data) == 2 and fig.data[1].line.width == 3
    assert "distance" in fig.layout.xaxis.title.text
    table = np.sin(np.arange(12).reshape(4, 3))
    fig = fp.sinusoidal_heatmap(table)
    assert (fig.data[0].zmin, fig.data[0].zmax, fig.data[0].zmid) == (-1, 1, 0)
    assert fig.layout.yaxis.autorange == "reversed"


# --- encoder vs decoder ---------------------------------------------------------------------------------

def test_side_by_side_maps_share_one_colour_range():
    labels = token_labels(["a", "a", "b"])
    fig = fe.side_by_side_maps(_rows(3), np.full((3, 3), 1 / 3), labels, left_title="L", right_title="R",
                               title="t")
    assert [t.coloraxis for t in fig.data] == ["coloraxis", "coloraxis"]
    assert (fig.layout.coloraxis.cmin, fig.layout.coloraxis.cmax) == (0, 1)
    assert list(fig.data[0].y) == labels and list(fig.data[1].y) == labels
    assert fig.layout.yaxis.autorange == "reversed" and fig.layout.yaxis2.autorange == "reversed"
    _serialises(fig)


def test_norm_and_activation_figures():
    x = np.linspace(-2, 3, 16)
    rms = x / np.sqrt((x ** 2).mean())
    ln = (x - x.mean()) / x.std()
    fig = fe.norm_figure(x, rms, ln, token="3·cat", eps=1e-5)
    assert "RMSNorm" in fig.data[2].name and "LayerNorm" in fig.data[4].name
    np.testing.assert_allclose(fig.data[2].y, rms)
    for line, hist, values in ((0, 1, x), (2, 3, rms), (4, 5, ln)):  # each curve beside its own histogram
        np.testing.assert_allclose(fig.data[line].y, values)
        np.testing.assert_allclose(fig.data[hist].x, values)
    g = np.linspace(-6, 6, 11)
    u = np.array([-1.0, 0.5])
    # seven distinct arrays, so a swapped argument lands in the wrong trace and is seen
    silu_g, gelu_g = g / (1 + np.exp(-g)), g + 100.0
    silu_u, gelu_u, swiglu = np.array([-0.27, 0.31]), np.array([-0.16, 0.35]), np.array([7.0, 8.0, 9.0])
    fig = fe.activation_figure(g, silu_g, gelu_g, u, silu_u, gelu_u, swiglu, token="3·cat")
    assert len(fig.data) == 6
    expected = [("SiLU(u)", g, silu_g), ("GELU(u) = ", g, gelu_g), ("real u through SiLU", u, silu_u),
                ("real u through GELU", u, gelu_u)]
    for trace, (name, xs, ys) in zip(fig.data[:4], expected):
        assert trace.name.startswith(name)
        np.testing.assert_array_equal(trace.x, xs)
        np.testing.assert_array_equal(trace.y, ys)
    assert fig.data[4].name == "GELU(u)" and fig.data[5].name.startswith("SwiGLU")
    np.testing.assert_array_equal(fig.data[4].x, gelu_u)
    np.testing.assert_array_equal(fig.data[5].x, swiglu)
    _serialises(fig)


def test_parameter_bars():
    fig = parameter_bars({"embedding": 30, "attention": 70}, title="t", total=100)
    assert list(fig.data[0].x) == [30, 70] and fig.data[0].text[1] == "70 (70.0%)"


# --- properties ------------------------------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@pytest.mark.slow
@settings(max_examples=2 * settings().max_examples, deadline=None)  # twice the profile's (tests/conftest.py)
@given(st.lists(st.text(max_size=6), min_size=1, max_size=30))
def test_any_token_list_gets_one_unique_row_each(tokens):
    labels = token_labels(tokens)
    assert len(labels) == len(set(labels)) == len(tokens)
    fig = fa.attention_heatmap(np.eye(len(tokens)), labels, layer=0, head=0, n_heads=1, n_kv_heads=1)
    assert list(fig.data[0].y) == labels
    assert all("<" not in lab.replace("&lt;", "") for lab in labels)  # no raw markup reaches plotly


def test_attention_grid_stays_under_two_megabytes_for_a_30_layer_model():
    # SmolLM2-135M's 30 layers × 9 heads at 64 tokens: one byte per weight, gaps white, hover off
    L, H, T = 30, 9, 64
    rng = np.random.default_rng(0)
    p = rng.random((L, H, T, T))
    p /= p.sum(-1, keepdims=True)
    fig = fa.attention_grid(p, token_labels([f"w{i}" for i in range(T)]), n_kv_heads=3)
    assert len(fig.to_json()) < 2_000_000
    z = np.asarray(fig.data[0].z)
    np.testing.assert_array_equal(z[:T, :T], 1 + np.rint(p[0, 0] * 254))
    assert np.all(z[T, :] == 0) and fig.layout.title.text.endswith("pick a head for exact values")
    # a mid-size grid (the shipped model: 4 × 4 heads) keeps exact float32 weights and stays light
    q = p[:4, :4]
    fig = fa.attention_grid(q, token_labels([f"w{i}" for i in range(T)]), n_kv_heads=2)
    np.testing.assert_allclose(np.asarray(fig.data[0].z, dtype=float)[:T, :T], q[0, 0], atol=1e-7)
    assert len(fig.to_json()) < 1_000_000


def test_attention_grid_pages_a_deep_model_and_labels_the_sink_option():
    rng = np.random.default_rng(0)
    p = rng.random((30, 3, 4, 4))
    labels = token_labels(["a", "b", "a", "b"])
    page = fa.grid_page(17, 30)
    assert list(page) == list(range(16, 24))
    fig = fa.attention_grid(p[page.start:page.stop], labels, n_kv_heads=3, layer_names=page, n_layers=30)
    assert "Layers 16–23 of 30" in fig.layout.title.text
    assert list(fig.layout.yaxis.ticktext) == [f"layer {i}" for i in range(16, 24)]
    z = np.asarray(fig.data[0].z, dtype=float)
    np.testing.assert_allclose(z[5 * 5:5 * 5 + 4, 2 * 5:2 * 5 + 4], p[21, 2], atol=1e-6)  # layer 21, head 2
    assert fa.grid_page(29, 30) == range(24, 30)
    hidden = fa.attention_grid(p[:2, :, :, 1:], labels, n_kv_heads=3, sink_hidden=True)
    assert "sink hidden" in hidden.layout.title.text
    assert "not on key 0" in hidden.data[0].colorbar.title.text


# --- readability: tick thinning, colour bars, margins (the lecturer's "hard to read from the back" issue) ----

def test_every_heatmap_colour_bar_titles_on_the_side_with_a_pad():
    figs = [fa.attention_heatmap(_rows(4), token_labels("abcd"), layer=0, head=0, n_heads=1, n_kv_heads=1),
            fa.attention_grid(np.stack([np.stack([_rows(3)] * 2)] * 2), token_labels("abc"), n_kv_heads=1),
            fa.head_scores_figure({"induction": np.zeros((2, 2))}, n_kv_heads=1)]
    bars = [figs[0].data[0].colorbar, figs[1].data[0].colorbar, figs[2].layout.coloraxis.colorbar]
    for bar in bars:
        assert bar.title.side == "right" and bar.xpad >= 14 and bar.title.text


@pytest.mark.parametrize("n,length,font", [(64, 300, 16), (40, 420, 9), (17, 210, 16), (5, 400, 12), (64, 980, 9)])
def test_tick_step_keeps_labels_apart_and_drops_no_more_than_it_must(n, length, font):
    from explorer.figures.common import tick_step

    k = tick_step(n, length, font)
    per_tick = length / n  # pixels between neighbouring categories
    assert k * per_tick >= 1.2 * font
    assert k == 1 or (k - 1) * per_tick < 1.2 * font


def test_attention_heatmap_labels_every_k_th_token_that_stands_apart_at_projector_size():
    from explorer.figures.common import thinned
    from tests.figure_overlap import overlaps

    labels = token_labels([f"w{i}" for i in range(40)])
    fig = fa.attention_heatmap(_rows(40), labels, layer=0, head=0, n_heads=1, n_kv_heads=1)
    squeezed = fa.go.Figure(fig)
    squeezed.update_layout(fa._every_token_part(labels, labels, height=400))  # the height a projector's window leaves
    for f in (fig, squeezed):
        for axis in (f.layout.xaxis, f.layout.yaxis):
            ticks = list(axis.tickvals)
            assert ticks == list(axis.ticktext) and ticks[0] == labels[0] and len(ticks) > 1
            assert ticks == thinned(labels, labels.index(ticks[1]))  # every k-th, hover names the rest
        assert overlaps(f, width=fa.HEATMAP_WIDTH) == []
    assert len(squeezed.layout.yaxis.tickvals) < len(fig.layout.yaxis.tickvals)  # a shorter map labels fewer
    assert fig.layout.xaxis.tickangle == -90


def test_head_scores_number_the_heads_and_fold_panels_into_rows_where_the_width_ends():
    scores = {"previous_token": np.zeros((3, 4)), "induction": np.zeros((3, 4)), "first_token": np.zeros((3, 4))}
    fig = fa.head_scores_figure(scores, n_kv_heads=2)
    assert fig.layout.yaxis.automargin
    assert list(fig.layout.xaxis.tickvals) == [head_label(h, 4, 2) for h in range(4)]  # hover names the KV head
    assert list(fig.layout.xaxis.ticktext) == ["0", "1", "2", "3"]
    tops = lambda layout: sorted({round(layout[f"yaxis{s}"]["domain"][1], 3) for s in ("", "2", "3")})  # noqa: E731
    assert len(tops(fig.layout.to_plotly_json())) == 1  # 720 px: the three panels side by side
    narrow = fig.layout.meta["narrow"]
    assert len(tops(narrow)) == 3  # a phone: one a row
    assert [narrow[f"yaxis{s}"]["showticklabels"] for s in ("", "2", "3")] == [True, True, True]
    assert len(tops(fa.head_scores_figure(scores, n_kv_heads=2, width=600).layout.to_plotly_json())) == 2


def test_figure_of_builds_what_the_same_parts_give_applied_one_update_at_a_time():
    from explorer.figures.common import base_layout, base_parts, figure_of, merged

    parts = [{"margin": {"t": 90}, "title": {"y": 1, "yanchor": "top"}},
             {"xaxis": {"title": {"text": "key"}, "tickvals": ["a"]}, "annotations": [{"text": "one"}]},
             {"xaxis": {"tickvals": ["a", "b"]}, "annotations": [{"text": "two"}], "meta": {"narrow": {"height": 9}}}]
    trace = fa.go.Heatmap(z=[[0.1, 0.2]], x=["a", "b"], y=["q"])
    stepwise = base_layout(fa.go.Figure(trace), "Title", height=300)
    for part in parts:
        stepwise.update_layout(part)
    once = figure_of([trace], base_parts("Title", height=300), *parts)
    assert once.to_plotly_json() == stepwise.to_plotly_json()
    assert once.layout.xaxis.tickvals == ("a", "b") and [a.text for a in once.layout.annotations] == ["two"]
    assert parts[1]["xaxis"]["tickvals"] == ["a"]  # the parts themselves are left as they were
    assert merged({"a": {"b": 1}}, {"a": {"c": 2}}) == {"a": {"b": 1, "c": 2}}


def test_the_template_is_plotly_whites_for_every_trace_type_the_figures_draw():
    import re
    from pathlib import Path

    import plotly.graph_objects as go
    import plotly.io as pio

    from explorer.figures import common

    drawn = {name.lower() for path in Path("explorer").rglob("*.py")
             for name in re.findall(r"\bgo\.([A-Z][A-Za-z]+)\(", path.read_text())} - {"figure"}
    assert drawn and drawn <= set(common.DRAWN_TRACES), f"add {sorted(drawn - set(common.DRAWN_TRACES))}"
    white, ours = pio.templates["plotly_white"].to_plotly_json(), pio.templates[common.TEMPLATE].to_plotly_json()
    assert {k: white["data"][k] for k in common.DRAWN_TRACES} == ours["data"]
    assert {k: v for k, v in white["layout"].items() if k in ours["layout"]} == ours["layout"]
    assert set(white["layout"]) - set(ours["layout"]) == {"polar", "ternary", "scene", "geo"}
    fig = fa.attention_heatmap(_rows(4), token_labels(["a", "b", "c", "d"]), layer=0, head=0, n_heads=1, n_kv_heads=1)
    assert fig.layout.template.to_plotly_json() == ours
    assert len(json.dumps(go.Figure().to_plotly_json()["layout"])) < 3000
