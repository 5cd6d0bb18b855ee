"""The walkthrough's figures and its endpoint: every step's figure shows that step's values, the logit lens writes
its tokens and probabilities, a 30-layer model's payload stays small, and the app answers, steps and refuses bad
input with a sentence."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from gradio_client.exceptions import AppError

from explorer.state import session
from explorer.probes import walkthrough as wt
from explorer.figures import walkthrough as fw
from explorer.figures.common import head_label, token_labels, unwrapped
from explorer.panels import walkthrough as pw
from models import Decoder, ModelConfig
from tests.plotly_payload import arr, fig
from tests.walk_pair import IDS, model, pair  # noqa: F401 (fixtures)


# --- figures ------------------------------------------------------------------------------------------

def _figure_inputs(model, w, labels):
    c = model.config
    heads = [head_label(h, c.n_heads, c.n_kv_heads) for h in range(c.n_heads)]
    kv = [f"KV {j}" for j in range(c.n_kv_heads)]
    return dict(keys=labels, heads=heads, kv_heads=kv, stream_rows=w.lens.rows)


def _z(trace) -> np.ndarray:
    return np.asarray(trace.z, dtype=np.float64)


@pytest.mark.slow
def test_every_step_figure_shows_the_steps_values(model):
    labels = token_labels(["<s>", "the", "cat", "the", "<b>x</b>", "a", "the", "cat", "sat", ".", "the"])
    p = 4
    w = wt.walk(model, IDS, p)
    kw = _figure_inputs(model, w, labels)
    for s in w.steps(2, labels[p]):
        tokens = [f"tok{i}" for i in s.arrays.get("ids", [])]
        f = fw.step_figure(s.key, s.arrays, title=s.title, next_tokens=tokens, expanded=2, **kw)
        json.loads(f.to_json())
        assert unwrapped(f.layout.title.text).startswith(s.title)  # on lines that fit the column
        heat = [t for t in f.data if t.type == "heatmap"]
        if s.key in ("logits", "top"):
            values = s.arrays["logits" if s.key == "logits" else "probs"]
            np.testing.assert_array_equal(np.asarray(f.data[0].x, dtype=np.float32), values)
            assert list(f.data[0].y) == [f"tok{int(j)} · id {int(j)}" for j in s.arrays["ids"]]
            assert f.layout.yaxis.autorange == "reversed"  # most likely on top
            if s.key == "top":
                assert tuple(f.layout.xaxis.range) == (0, 1) and f.data[0].marker.cmin == 0 and f.data[0].marker.cmax == 1
            continue
        if s.key == "layers":
            np.testing.assert_array_equal(_z(heat[0]), s.arrays["stream"])
            np.testing.assert_array_equal(np.asarray(f.data[1].x, dtype=np.float32), s.arrays["rms"])
            assert list(heat[0].y) == list(w.lens.rows) and f.layout.shapes  # the expanded layer outlined
            continue
        shown = np.concatenate([_z(t).reshape(-1) for t in heat])
        expected = np.concatenate([np.where(np.isfinite(a), a, np.nan).reshape(-1) for a in s.arrays.values()])
        np.testing.assert_array_equal(shown, expected.astype(np.float32), err_msg=s.key)
        for i, t in enumerate(heat):
            axis = f.layout[f"coloraxis{i + 1 if i else ''}"]
            if s.key == "softmax":
                assert (axis.cmin, axis.cmax) == (0, 1)
            else:  # signed values: diverging and centred on 0
                assert axis.cmin == -axis.cmax and axis.cmid == 0
            assert f.layout[f"yaxis{i + 1 if i else ''}"].autorange == "reversed"
            assert "%{z" in t.hovertemplate or "%{customdata}" in t.hovertemplate
        if s.key in ("scores", "mask", "softmax"):
            assert list(heat[0].x) == labels[:heat[0].z.shape[1]]  # the project's token labels, "3·the"
            assert "&lt;b&gt;" in "".join(heat[0].x) or s.key == "scores"
            assert list(heat[0].y)[0] == kw["heads"][0]  # head 0 on top
        if s.key == "mask":
            masked = [row for row in heat[0].customdata.reshape(-1) if row == fw.MASKED_TEXT]
            assert len(masked) == model.config.n_heads * (len(IDS) - p - 1)


def test_lens_figure_writes_tokens_and_probabilities():
    probs = np.array([[0.5, 0.2], [0.9, 0.05], [0.7, 0.1]], dtype=np.float32)
    ids = np.array([[1, 2], [3, 1], [3, 4]])
    tokens = [["a", "<b>"], ["c", "a"], ["c", "d"]]
    f = fw.lens_figure(("embedding", "layer 0", "layer 1"), tokens, ids, probs, "c", np.array([0.0, 0.9, 0.7]),
                       title="lens")
    np.testing.assert_array_equal(_z(f.data[0]), probs)
    assert f.data[0].text[0][1] == "&lt;b&gt;"  # HTML shown as text
    assert list(f.data[0].y) == ["embedding", "layer 0", "layer 1"] and f.layout.yaxis.autorange == "reversed"
    assert (f.layout.coloraxis.cmin, f.layout.coloraxis.cmax) == (0, 1)
    np.testing.assert_allclose(_z(f.data[1])[:, 0], [0.0, 0.9, 0.7], rtol=1e-7)
    with pytest.raises(ValueError, match="rows"):
        fw.lens_figure(("embedding",), tokens, ids, probs, "c", np.zeros(3), title="lens")


def test_lens_cells_write_short_tokens_in_a_size_the_projector_can_enlarge():
    probs = np.array([[0.5, 0.2]], dtype=np.float32)
    tokens = [[" extraordinarily", "<b>"]]
    f = fw.lens_figure(("embedding",), tokens, np.array([[1, 2]]), probs, "c", np.array([0.1]), title="lens")
    assert list(f.data[0].text[0]) == ["extraordinarily"[:fw.LENS_CHARS - 1] + "…", "&lt;b&gt;"]
    assert len(f.data[0].text[0][0]) == fw.LENS_CHARS
    assert "extraordinarily" in f.data[0].customdata[0][0]  # hover keeps the whole token
    assert f.data[0].textfont.size == f.data[1].textfont.size == fw.LENS_TEXT


def test_unknown_step_and_mismatched_panels_are_refused():
    with pytest.raises(ValueError, match="unknown walkthrough step"):
        fw.step_figure("teleport", {}, title="x", keys=[], heads=[], kv_heads=[])
    with pytest.raises(ValueError, match="labels need"):
        fw.stacked_heatmaps([fw.Panel("p", np.zeros((2, 3)), ["a"])], title="x")


@pytest.mark.slow
def test_a_30_layer_49k_vocabulary_model_keeps_the_payload_small():
    """SmolLM2-135M's depth and vocabulary (narrow, to stay quick): the lens has 31 rows, and the logits step
    sends its top tokens, never the 49,152 logits."""
    torch.manual_seed(0)
    m = Decoder(ModelConfig(vocab_size=49152, d_model=64, n_layers=30, n_heads=4, n_kv_heads=2, d_ff=128,
                            tie_embeddings=True, max_seq_len=64))
    ids = list(range(100, 140))
    w = wt.walk(m, ids)
    assert w.lens.ids.shape == (31, wt.LENS_K) and w.nbytes() < 2_000_000
    with torch.no_grad():
        probs = torch.softmax(m(torch.tensor([ids]))[0, -1], -1)
    assert w.lens.ids[-1].tolist() == torch.topk(probs, wt.LENS_K).indices.tolist()
    labels = token_labels([str(i) for i in ids])
    kw = _figure_inputs(m, w, labels)
    sizes = {}
    for s in w.steps(29, labels[-1]):
        tokens = [str(i) for i in s.arrays.get("ids", [])]
        sizes[s.key] = len(fw.step_figure(s.key, s.arrays, title=s.title, next_tokens=tokens, **kw).to_json())
    assert max(sizes.values()) < 200_000, sizes


# --- the endpoint -------------------------------------------------------------------------------------

PROMPT = "Once upon a time, there was a little girl. The girl"


@pytest.fixture(scope="module")
def served(client):
    return session.load_default()


def test_endpoint_answers_with_the_computation(client, served):
    model, tokenizer = served
    position, layer, step = 3, model.config.n_layers - 1, wt.STEP_KEYS.index("softmax")
    out = client.predict(PROMPT, position, layer, step, api_name="/walkthrough")
    step_fig, step_md, lens_fig, info, token, layer_menu, slider = out
    ids, labels = session.encode(tokenizer, PROMPT, pw.MAX_TOKENS)
    with session.threads_for(model):  # the thread count the handler runs with: the same sums, to the bit
        w = wt.walk(model, ids, position)
    s = w.step(step, layer, labels[position])
    f = fig(step_fig)
    np.testing.assert_array_equal(arr(f["data"][0]["z"]).astype(np.float32), s.arrays["weights"])
    assert f["data"][0]["x"] == labels and unwrapped(f["layout"]["title"]["text"]) == s.title
    assert s.formula in step_md and "models/attention.py: attention_weights" in step_md
    assert f"Step {step} of {len(wt.STEP_KEYS) - 1}" in step_md
    lens = fig(lens_fig)
    np.testing.assert_array_equal(arr(lens["data"][0]["z"]).astype(np.float32), w.lens.probs)
    assert lens["data"][0]["y"] == list(w.lens.rows)
    assert token["value"] == position and [c[1] for c in token["choices"]] == list(range(len(ids)))
    assert token["choices"][0][0] == f"0·{session.token_strings(tokenizer, ids[:1])[0]}"  # "<s>" as text, no entities
    assert layer_menu["value"] == layer and slider["value"] == step
    top = session.token_strings(tokenizer, [int(w.top_ids[0])])[0]
    assert f"{100 * float(w.top_probs[0]):.1f}%" in info and top.strip() in info


def test_step_prev_next_and_last_token(client, served):
    model, tokenizer = served
    ids, labels = session.encode(tokenizer, PROMPT, pw.MAX_TOKENS)
    with session.threads_for(model):  # the thread count the handler runs with: the same sums, to the bit
        w = wt.walk(model, ids)  # the last token
    first = client.predict(PROMPT, None, 0, 0, api_name="/walkthrough")
    assert first[4]["value"] == len(ids) - 1
    top_index = wt.STEP_KEYS.index("top")
    f, md, slider = client.predict(PROMPT, None, 0, top_index, api_name="/walkthrough_step")
    bars = fig(f)["data"][0]
    np.testing.assert_array_equal(arr(bars["x"]).astype(np.float32), w.top_probs)
    with torch.no_grad(), session.threads_for(model):  # the model's own forward, summed on the same threads
        probs = torch.softmax(model(torch.tensor([ids]))[0, -1].float(), -1)
    np.testing.assert_allclose(arr(bars["x"]), torch.topk(probs, wt.TOP_K).values.numpy(), rtol=1e-5)
    assert slider["value"] == top_index
    f, md, slider = client.predict(PROMPT, None, 0, top_index, api_name="/walkthrough_next")
    assert slider["value"] == top_index  # the last step stays the last
    f, md, slider = client.predict(PROMPT, "", 1, 0, api_name="/walkthrough_prev")
    assert slider["value"] == 0
    f, md, slider = client.predict(PROMPT, None, 1, 0, api_name="/walkthrough_next")
    assert slider["value"] == 1
    np.testing.assert_array_equal(arr(fig(f)["data"][0]["z"]).astype(np.float32)[0], w.layers[1].resid_pre)
    assert "Layer 1 · RMSNorm" in md


@pytest.mark.parametrize("args, message", [
    (("", None, 0, 0), "empty"),
    (("   ", None, 0, 0), "empty"),
    ((PROMPT, 999, 0, 0), "token position must be a whole number from 0 to"),
    ((PROMPT, -1, 0, 0), "token position"),
    ((PROMPT, 1.5, 0, 0), "token position"),
    ((PROMPT, None, 99, 0), "layer must be between 0 and"),
    ((PROMPT, None, -1, 0), "layer must be between 0 and"),
])
def test_endpoint_refuses_bad_input_with_a_sentence(client, args, message):
    with pytest.raises(AppError, match=message):
        client.predict(*args, api_name="/walkthrough")
    with pytest.raises(AppError, match=message):
        client.predict(*args, api_name="/walkthrough_step")
