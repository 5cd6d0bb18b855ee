"""Figures at the sizes a lecture meets: a 30-layer model (SmolLM2-135M's shape: 9 heads, 3 KV heads), prompts of
64 tokens, a 49k-token vocabulary; at the width each figure gets in a 1280 px window with projector mode's 16 px
labels, and on a 390 px phone (its ``layout.meta.narrow``). Text collisions are estimated from the figure objects
(tests/figure_overlap.py: character widths at the font size); no browser. The tiny model's figures keep their
data and titles (wrapped titles read the same with their line breaks taken as spaces)."""
import numpy as np
import pytest

from explorer.figures import attention as fa
from explorer.figures import encoder_decoder as fe
from explorer.figures import experiments as fx
from explorer.figures import positions as fp
from explorer.figures import training as ft
from explorer.figures import walkthrough as fw
from explorer.figures.common import PAGE_WIDTH, PHONE_WIDTH, head_label, token_labels, unwrapped
from tests.figure_overlap import overlaps

L, H, KV, T = 30, 9, 3, 64
WORDS = ["the", " cat", " sat", " on", " mat", " because", " it", " was", " warm", ".", " probably", "Ġinteresting"]
VOCAB = 49152


def _rows(n, seed=0):
    w = np.tril(np.random.default_rng(seed).random((n, n)))
    return w / w.sum(axis=1, keepdims=True)


def _labels(n):
    return token_labels([WORDS[i % len(WORDS)] for i in range(n)])


def _deep():
    """(name, figure, the width it gets at 1280 px) for every figure whose size grows with layers or tokens."""
    rng = np.random.default_rng(1)
    labels = _labels(T)
    scores = {k: rng.random((L, H)) for k in ("previous_token", "induction", "first_token")}
    lens_rows = ["embedding"] + [f"layer {i}" for i in range(L)]
    tokens = [[WORDS[(r + j) % len(WORDS)] for j in range(5)] for r in range(L + 1)]
    return [
        ("attention map", fa.attention_heatmap(_rows(T), labels, layer=3, head=2, n_heads=H, n_kv_heads=KV),
         fa.HEATMAP_WIDTH),
        ("head scores", fa.head_scores_figure(scores, n_kv_heads=KV, selected=(18, 6),
                                              subtitle="previous-token and sink on your prompt (causal); induction "
                                                       "on repeated random tokens at spans 8, 32 and 100"),
         fa.SCORES_WIDTH),
        ("GQA 9 -> 3", fa.gqa_figure(H, KV), fa.GQA_WIDTH),
        ("GQA 4 -> 2", fa.gqa_figure(4, 2), fa.GQA_WIDTH),
        ("logit lens", fw.lens_figure(lens_rows, tokens, rng.integers(0, VOCAB, (L + 1, 5)), rng.random((L + 1, 5)),
                                      " mat", rng.random(L + 1),
                                      title="Logit lens · 63·. · each layer's stream through the final norm and LM "
                                            "head"), PAGE_WIDTH),
        ("residual stream", fw.stream_figure(rng.normal(size=(L + 1, 576)), rng.random(L + 1), lens_rows,
                                             title="The residual stream after each layer", expanded=3),
         fw.STEP_WIDTH),
        ("scores against 64 keys", fw.key_row_figure(rng.normal(size=(H, T)), labels,
                                                     [head_label(h, H, KV) for h in range(H)],
                                                     title="Layer 3 · scores of 63·. against every key"),
         fw.STEP_WIDTH),
        ("loss per token", fx.loss_per_token_figure(labels[1:], rng.random(T - 1), rng.random(T - 1),
                                                    title="Loss per token with layer 18 · head 6 knocked out",
                                                    repeated_from=32, provenance="measured · cpu · float32"),
         fx.LOSS_WIDTH),
        ("knock-out sweep", fx.knockout_sweep_figure(rng.normal(size=(L, H)),
                                                     {"induction": scores["induction"],
                                                      "previous-token": scores["previous_token"]},
                                                     n_kv_heads=KV, subtitle="each head knocked out in turn"),
         PAGE_WIDTH),
        ("patching", fx.patching_figure(rng.random((L, T)), labels, title="Residual stream patched in",
                                        x_title="position"), PAGE_WIDTH),
        ("training pattern", ft.pattern_at_step(_rows(25), ["<s>"] + [f"tok{i}" for i in range(12)] * 2, step=800,
                                                head="L1H0", span=12, source="the shipped model's training log"),
         ft.PATTERN_WIDTH),
        ("encoder masks", fe.side_by_side_maps(np.tril(np.ones((T, T))), np.ones((T, T)), labels,
                                               left_title="decoder · causal mask", right_title="encoder · no mask",
                                               title="Which keys each query may see (1 = visible, 0 = hidden)",
                                               colorbar_title="visible (1) / hidden (0)", value_name="visible"),
         PAGE_WIDTH),
        ("another theta", fp.theta_attention_figure(_rows(T), _rows(T, 2), labels, theta_before=10000,
                                                    theta_after=100, layer=3, head_text="head 2 (KV 0)"),
         PAGE_WIDTH),
    ]


def _others():
    """Figures of other sizes that stand side by side or carry long titles, on a phone."""
    from explorer.figures import live as fl_live
    from explorer.figures import lora as fl

    rng = np.random.default_rng(2)
    x = rng.normal(size=576)
    u = rng.normal(size=1536)
    grid = np.linspace(-4, 4, 81)
    labels = _labels(T)
    counted = {"trainable": 1792, "frozen": 105024, "total": 106816}
    memory = {"LoRA": {"frozen weights": 420096, "gradients": 7168}, "full fine-tune": {"gradients": 427264}}
    return [
        ("fill in the blank", fe.fill_in_blank_figure(["red", "big"], [0.5, 0.3], ["small", "red"], [0.6, 0.2],
                                                      hidden="red", left_title="encoder (trained, masked LM)",
                                                      right_title="decoder (sees only the words before)")),
        ("norms", fe.norm_figure(x, x / np.sqrt((x ** 2).mean()), (x - x.mean()) / x.std(), token="3·cat",
                                 eps=1e-5)),
        ("activations", fe.activation_figure(grid, grid, grid, u, u, u, u, token="3·cat")),
        ("LoRA parameters", fl.parameter_figure(counted, 1792, memory, rank=4, alpha=8,
                                                targets=["q_proj", "v_proj"])),
        ("LoRA attention", fl.attention_before_after_figure(_rows(T), _rows(T, 3), labels, layer=1,
                                                            head_name="head 2 (KV 1)")),
        ("live curves", fl_live.live_curves([0, 10, 20], [None, 4.0, 2.0], [5.0, 4.0, 1.0], [0.1, 0.3, 0.7],
                                            [0.2, 0.5, 0.9], phase_step=10, source="a 2-layer model on 2 cores")),
    ]


DEEP = _deep()
OTHERS = _others()


@pytest.mark.parametrize("name,fig,width", DEEP, ids=[d[0] for d in DEEP])
def test_no_text_collides_at_1280_in_projector_mode(name, fig, width):
    assert overlaps(fig, width=width) == []


@pytest.mark.parametrize("name,fig,width", DEEP, ids=[d[0] for d in DEEP])
def test_no_text_collides_on_a_phone(name, fig, width):
    assert fig.layout.meta and "narrow" in fig.layout.meta, "no phone layout"
    assert overlaps(fig, width=PHONE_WIDTH, phone=True) == []


@pytest.mark.parametrize("name,fig", OTHERS, ids=[d[0] for d in OTHERS])
def test_side_by_side_figures_have_a_phone_layout_without_collisions(name, fig):
    assert fig.layout.meta and "narrow" in fig.layout.meta, "no phone layout"
    assert overlaps(fig, width=PHONE_WIDTH, phone=True) == []
    assert overlaps(fig, width=PAGE_WIDTH) == []


def test_the_estimate_finds_what_slanted_token_labels_did():
    """The estimate is not blind: 64 slanted labels on the loss figure's axis, as it drew them before, collide."""
    fig = fx.loss_per_token_figure(_labels(T)[1:], np.ones(T - 1), np.ones(T - 1), title="t")
    fig.update_xaxes(tickmode="auto", tickvals=None, ticktext=None, tickangle=-45)
    assert len(overlaps(fig, width=fx.LOSS_WIDTH)) > 10


def test_a_deep_lens_stands_in_two_columns_of_layers_and_keeps_its_rows():
    rows = ["embedding"] + [f"layer {i}" for i in range(L)]
    probs = np.random.default_rng(0).random((L + 1, 5))
    tokens = [[f"t{r}"] * 5 for r in range(L + 1)]
    fig = fw.lens_figure(rows, tokens, np.zeros((L + 1, 5), int), probs, "a", probs[:, 0], title="lens")
    later, later_p, earlier, earlier_p = fig.data
    # the data as before, split: the later half (the left column) then the earlier; row i is after layer i - 1
    assert list(earlier.y) + list(later.y) == rows and list(later_p.y) == list(later.y)
    np.testing.assert_array_equal(np.vstack([earlier.z, later.z]), probs.astype(np.float32))
    np.testing.assert_array_equal(np.concatenate([np.ravel(earlier_p.z), np.ravel(later_p.z)]),
                                  probs[:, 0].astype(np.float32))
    assert [row[0] for row in list(earlier.text) + list(later.text)] == [f"t{r}" for r in range(L + 1)]
    assert fig.layout.yaxis.autorange is None and fig.layout.yaxis2.autorange is None  # the last layer on top
    assert "last layer on top" in fig.layout.yaxis.title.text
    assert fig.layout.xaxis.domain[1] < fig.layout.xaxis3.domain[0]  # side by side, the later layers on the left
    narrow = fig.layout.meta["narrow"]
    assert narrow["yaxis"]["domain"][0] > narrow["yaxis2"]["domain"][1]  # a phone: stacked, the later half above
    assert [p["text"][0][0] for p in fig.layout.meta["narrow_traces"][::2]] == [f"t{L // 2}", "t0"]
    shallow = fw.lens_figure(rows[:5], tokens[:5], np.zeros((5, 5), int), probs[:5], "a", probs[:5, 0], title="x")
    assert shallow.layout.yaxis.autorange == "reversed"
    assert fig.layout.height < 600  # 16 rows of 20 px: room for 16 px cell text, in less than the old 956 px


# --- the tiny model's figures keep their data and their titles --------------------------------------------

def _titles(fig, narrow=False):
    layout = fig.layout.to_plotly_json()
    if narrow:
        layout = {**layout, **{k: v for k, v in layout["meta"]["narrow"].items() if k in ("title", "annotations")}}
    return (unwrapped(layout["title"]["text"]), [unwrapped(a["text"]) for a in layout.get("annotations", [])])


@pytest.mark.parametrize("narrow", [False, True])
def test_tiny_figures_keep_their_data_and_titles(narrow):
    labels = token_labels(["<s>", "Tom", " ran", ".", " Tom", " ran"])
    scores = {"previous_token": np.arange(8).reshape(2, 4) / 8, "induction": np.zeros((2, 4)),
              "first_token": np.ones((2, 4))}
    heads = [head_label(h, 4, 2) for h in range(4)]
    f = fa.head_scores_figure(scores, n_kv_heads=2, selected=(1, 2), subtitle="on your prompt")
    heat = [t for t in f.data if t.type == "heatmap"]
    for t, z in zip(heat, scores.values()):
        np.testing.assert_array_equal(np.asarray(t.z), z)
        assert list(t.x) == heads and list(t.y) == ["layer 0", "layer 1"]
    assert _titles(f, narrow) == ("Head scores · mean attention weight where each head type looks "
                                  "<sup>on your prompt</sup>", ["previous-token", "induction", "sink (first token)"])

    g = fa.gqa_figure(4, 2)
    assert _titles(g, narrow)[0] == ("4 query heads → 2 key/value heads · grouped-query: 2 query heads share each "
                                     "K/V head")

    m = fe.side_by_side_maps(np.tril(np.ones((6, 6))), np.ones((6, 6)), labels, left_title="decoder · causal mask",
                             right_title="encoder · no mask", title="Which keys each query may see (1 = visible, 0 = "
                                                                    "hidden)")
    assert [list(t.x) for t in m.data] == [labels, labels] and [list(t.y) for t in m.data] == [labels, labels]
    np.testing.assert_array_equal(np.asarray(m.data[0].z), np.tril(np.ones((6, 6))))
    assert _titles(m, narrow) == ("Which keys each query may see (1 = visible, 0 = hidden)",
                                  ["decoder · causal mask", "encoder · no mask"])
    for axis in ("xaxis", "yaxis", "xaxis2", "yaxis2"):  # six tokens: every one labelled, wherever it is drawn
        layout = m.layout.meta["narrow"] if narrow else m.layout.to_plotly_json()
        assert list(layout[axis]["tickvals"]) == labels

    loss = fx.loss_per_token_figure(labels[1:], np.arange(5.0), np.arange(5.0) + 1, title="Loss per token with L1H0 "
                                    "knocked out", provenance="measured · cpu")
    assert [list(t.x) for t in loss.data[:2]] == [labels[1:]] * 2
    np.testing.assert_array_equal(np.asarray(loss.data[1].y), np.arange(5.0) + 1)
    assert _titles(loss, narrow)[0] == "Loss per token with L1H0 knocked out <sup>measured · cpu</sup>"

    p = ft.pattern_at_step(_rows(6), ["<s>", "a", "b", "c", "a", "b"], step=5, head="L1H0", span=2, source="log")
    np.testing.assert_array_equal(np.asarray(p.data[0].z), _rows(6))
    assert _titles(p, narrow)[0] == "L1H0 at step 5 · random tokens, repeated (span 2) <sup>log</sup>"

    sweep = fx.knockout_sweep_figure(np.ones((2, 4)), {"induction": scores["induction"]}, n_kv_heads=2)
    np.testing.assert_array_equal(np.asarray(sweep.data[0].z), np.ones((2, 4)))
    assert _titles(sweep, narrow) == ("What each head does vs what it looks like",
                                      ["Δ loss when knocked out (nats/token)", "induction"])

    stream = fw.stream_figure(np.ones((3, 4)), np.ones(3), ["embedding", "layer 0", "layer 1"], title="Stream")
    assert _titles(stream, narrow) == ("Stream", ["3 states × 4 dimensions", "RMS of the state"])
