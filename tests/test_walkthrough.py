"""The walkthrough ("Inside the model") and the logit lens: values, references, figures and the endpoint.

The walkthrough's arrays are checked three ways: against a separate ``run_with_cache`` of the same prompt
(every step's values are the hooks' tensors), against NumPy float64 written from the formulas (RMSNorm,
RoPE, scores, softmax, weighted sum, SwiGLU, LM head), and against transformers' Llama on the same weights
(hidden states, attention weights, logits).
"""
from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gradio_client.exceptions import AppError

from explorer import probes

from explorer.state import session
from explorer.state.cache import results
from explorer.probes import walkthrough as wt
from explorer.figures import walkthrough as fw
from explorer.figures.common import head_label, token_labels
from explorer.panels import walkthrough as pw
from models import Decoder, ModelConfig
from models.hooks import module_hooked
from tests.llama_pair import llama_pair
from tests.plotly_payload import arr, fig

ROOT = Path(__file__).resolve().parent.parent
IDS = [3, 17, 5, 17, 42, 8, 17, 5, 60, 2, 33]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(transformers Llama, our Decoder) on the same random weights, tied embeddings, 3 layers, GQA 4/2."""
    return llama_pair(tmp_path_factory.mktemp("walk-pair"), tied=True)


@pytest.fixture(scope="module")
def model(pair):
    return pair[1]


def _cache(model, ids):
    _, cache = probes.run_with_cache(model, [ids])
    return {k: v[0].double().numpy() for k, v in cache.items()}


def _rmsnorm(x, g, eps):
    x = np.asarray(x, dtype=np.float64)
    return x / np.sqrt(np.mean(x ** 2) + eps) * np.asarray(g, dtype=np.float64)


def _w(linear) -> np.ndarray:
    return linear.weight.detach().double().numpy()  # (out, in)


# --- the values are the hooks' tensors -------------------------------------------------------------

@pytest.mark.parametrize("position", [0, 4, len(IDS) - 1])
def test_every_step_holds_the_hook_values_of_a_separate_capture(model, position):
    w = wt.walk(model, IDS, position)
    c = _cache(model, IDS)
    p = position
    for layer in range(model.config.n_layers):
        b = f"blocks.{layer}."
        steps = {s.key: s for s in w.steps(layer)}
        expected = {
            "embed": {"x0": c["hook_embed"][p]},
            "norm1": {"x": c[b + "hook_resid_pre"][p], "x̂": c[b + "input_layernorm.hook_normalized"][p]},
            "qkv": {"q": c[b + "attn.hook_q"][:, p], "k": c[b + "attn.hook_k"][:, p], "v": c[b + "attn.hook_v"][:, p]},
            "rope": {"q": c[b + "attn.hook_q"][:, p], "q'": c[b + "attn.hook_rot_q"][:, p],
                     "k": c[b + "attn.hook_k"][:, p], "k'": c[b + "attn.hook_rot_k"][:, p]},
            "scores": {"scores": c[b + "attn.hook_attn_scores"][:, p, :p + 1]},
            "mask": {"scores": c[b + "attn.hook_attn_scores"][:, p]},
            "softmax": {"weights": c[b + "attn.hook_pattern"][:, p]},
            "mix": {"z": c[b + "attn.hook_z"][:, p]},
            "o_proj": {"o": c[b + "hook_attn_out"][p]},
            "resid1": {"x": c[b + "hook_resid_pre"][p], "o": c[b + "hook_attn_out"][p],
                       "x + o": c[b + "hook_resid_mid"][p]},
            "norm2": {"x": c[b + "hook_resid_mid"][p], "x̂": c[b + "post_attention_layernorm.hook_normalized"][p]},
            "swiglu": {"gate": c[b + "mlp.hook_gate"][p], "up": c[b + "mlp.hook_up"][p],
                       "SiLU(gate) · up": c[b + "mlp.hook_post"][p]},
            "down": {"m": c[b + "hook_mlp_out"][p]},
            "resid2": {"x": c[b + "hook_resid_mid"][p], "m": c[b + "hook_mlp_out"][p],
                       "x + m": c[b + "hook_resid_post"][p]},
            "layers": {"stream": np.stack([c["hook_embed"][p]] + [c[f"blocks.{i}.hook_resid_post"][p]
                                                                  for i in range(model.config.n_layers)]),
                       "rms": np.array([c[f"blocks.{i}.input_layernorm.hook_scale"][p, 0]
                                        for i in range(model.config.n_layers)] + [c["norm.hook_scale"][p, 0]])},
            "final_norm": {"x": c[f"blocks.{model.config.n_layers - 1}.hook_resid_post"][p],
                           "x̂": c["norm.hook_normalized"][p]},
        }
        for key, arrays in expected.items():
            assert set(steps[key].arrays) == set(arrays), key
            for name, value in arrays.items():
                np.testing.assert_array_equal(steps[key].arrays[name], value.astype(np.float32), err_msg=f"{key}.{name}")
        assert steps["norm1"].scalars["rms"] == pytest.approx(c[b + "input_layernorm.hook_scale"][p, 0], rel=1e-6)
        assert steps["norm2"].scalars["rms"] == pytest.approx(c[b + "post_attention_layernorm.hook_scale"][p, 0],
                                                              rel=1e-6)
    logits = c["hook_logits"][p]
    np.testing.assert_array_equal(w.logits, logits.astype(np.float32))
    top = w.steps(0)[-2]
    np.testing.assert_array_equal(top.arrays["logits"], logits.astype(np.float32)[w.top_ids])


def test_every_step_names_hooks_that_exist_and_comes_in_tutorial_order(model):
    w = wt.walk(model, IDS, 5)
    names = set(probes.hook_names(model))
    for layer in range(model.config.n_layers):
        steps = w.steps(layer, "5·x")
        assert tuple(s.key for s in steps) == wt.STEP_KEYS
        for s in steps:
            assert s.title and s.sentence and s.formula and s.code and s.hooks, s.key
            assert set(s.hooks) <= names, s.key
            assert (s.layer == layer) == (s.key in wt.LAYER_STEPS)
            if s.key in wt.LAYER_STEPS:
                assert s.title.startswith(f"Layer {layer} · ") and all(f"blocks.{layer}." in h for h in s.hooks)
            for a in s.arrays.values():  # the chosen token's values only, never the whole sequence's
                assert a.size <= max(model.config.d_ff, (model.config.n_layers + 1) * model.config.d_model,
                                     model.config.n_heads * len(IDS))
    steps = {s.key: s for s in w.steps(1, "5·x")}
    c = model.config
    assert f"({c.n_heads}, {c.head_dim})" in steps["qkv"].title and f"({c.n_kv_heads}, {c.head_dim})" in steps["qkv"].title
    assert f"({c.n_heads}, 6)" in steps["scores"].title and "5·x" in steps["scores"].title
    assert f"({c.d_ff},)" in steps["swiglu"].title and f"({c.vocab_size},)" in steps["logits"].title
    assert f"{len(IDS) - 6} masked" in steps["mask"].title
    assert w.step(3, 1).key == "rope" and w.nbytes() > 0


def test_code_references_resolve_to_the_functions_in_models(model):
    w = wt.walk(model, IDS)
    refs = {ref for s in w.steps(0) for ref in s.code}
    assert "models/layers.py: RMSNorm.forward" in refs and "models/rope.py: apply_rope" in refs
    for ref in refs:
        path, qualname = ref.split(": ")
        assert (ROOT / path).is_file(), ref
        module = importlib.import_module(path[:-3].replace("/", "."))
        obj = module
        for part in qualname.split("."):
            obj = getattr(obj, part)
        assert callable(obj), ref
        assert Path(inspect.getsourcefile(obj)).resolve() == (ROOT / path).resolve(), ref  # defined there


# --- the values against independent references ------------------------------------------------------

def test_steps_agree_with_numpy_formulas(model):
    c = model.config
    p = 6
    w = wt.walk(model, IDS, p)
    D, G = c.head_dim, c.n_heads // c.n_kv_heads
    np.testing.assert_allclose(w.embed, model.embed_tokens.weight[IDS[p]].detach().double().numpy(), atol=0)
    for layer, t in enumerate(w.layers):
        block = model.blocks[layer]
        x = t.resid_pre.astype(np.float64)
        assert t.rms1 == pytest.approx(np.sqrt(np.mean(x ** 2) + c.norm_eps), rel=1e-5)
        xn = _rmsnorm(x, block.input_layernorm.weight.detach().double().numpy(), c.norm_eps)
        np.testing.assert_allclose(t.normed1, xn, rtol=1e-5, atol=1e-5)
        att = block.attn
        q = (_w(att.q_proj) @ xn).reshape(c.n_heads, D)
        np.testing.assert_allclose(t.q, q, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(t.k, (_w(att.k_proj) @ xn).reshape(c.n_kv_heads, D), rtol=1e-4, atol=1e-4)
        # RoPE: pair (i, i + D/2) turned by p * theta^(-2i/D)
        angle = p * c.rope_theta ** (-np.arange(0, D, 2) / D)
        cos, sin = np.cos(angle), np.sin(angle)
        a, b = q[:, :D // 2], q[:, D // 2:]
        np.testing.assert_allclose(t.rot_q, np.concatenate([a * cos - b * sin, a * sin + b * cos], 1),
                                   rtol=1e-4, atol=1e-4)
        # the score row against the hooked keys of every position, then the mask and the softmax
        cache = _cache(model, IDS)
        keys = cache[f"blocks.{layer}.attn.hook_rot_k"]  # (Hkv, T, D)
        values = cache[f"blocks.{layer}.attn.hook_v"]
        kv = np.repeat(np.arange(c.n_kv_heads), G)
        scores = np.einsum("hd,hsd->hs", t.rot_q.astype(np.float64), keys[kv]) / np.sqrt(D)
        np.testing.assert_allclose(t.scores[:, :p + 1], scores[:, :p + 1], rtol=1e-4, atol=1e-4)
        assert np.all(np.isneginf(t.scores[:, p + 1:]))
        e = np.exp(scores[:, :p + 1] - scores[:, :p + 1].max(1, keepdims=True))
        weights = e / e.sum(1, keepdims=True)
        np.testing.assert_allclose(t.pattern[:, :p + 1], weights, atol=1e-5)
        assert np.all(t.pattern[:, p + 1:] == 0)
        z = np.einsum("hs,hsd->hd", weights, values[kv][:, :p + 1])
        np.testing.assert_allclose(t.z, z, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(t.attn_out, _w(att.o_proj) @ z.reshape(-1), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(t.resid_mid, x + t.attn_out, rtol=1e-6, atol=1e-6)
        xn2 = _rmsnorm(t.resid_mid, block.post_attention_layernorm.weight.detach().double().numpy(), c.norm_eps)
        mlp = block.mlp
        gate, up = _w(mlp.gate_proj) @ xn2, _w(mlp.up_proj) @ xn2
        np.testing.assert_allclose(t.gate, gate, rtol=1e-4, atol=1e-4)
        h = gate / (1 + np.exp(-gate)) * up
        np.testing.assert_allclose(t.post, h, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(t.mlp_out, _w(mlp.down_proj) @ h, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(t.resid_post, t.resid_mid + t.mlp_out, rtol=1e-6, atol=1e-6)
    final = _rmsnorm(w.layers[-1].resid_post, model.norm.weight.detach().double().numpy(), c.norm_eps)
    np.testing.assert_allclose(w.final_normed, final, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(w.logits, _w(model.lm_head) @ final, rtol=1e-4, atol=1e-4)


def test_stream_attention_and_logits_agree_with_transformers(pair):
    ref, model = pair
    p = 7
    w = wt.walk(model, IDS, p)
    with torch.no_grad():
        out = ref(torch.tensor([IDS]), output_hidden_states=True, output_attentions=True)
    hidden = [h[0, p].double().numpy() for h in out.hidden_states]  # embedding, layers 0..L-2, norm(last)
    np.testing.assert_allclose(w.embed, hidden[0], atol=1e-6)
    for i in range(model.config.n_layers - 1):
        np.testing.assert_allclose(w.layers[i].resid_post, hidden[i + 1], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(w.final_normed, hidden[-1], rtol=1e-4, atol=1e-4)
    for i, t in enumerate(w.layers):
        np.testing.assert_allclose(t.pattern, out.attentions[i][0, :, p].double().numpy(), atol=1e-5)
    np.testing.assert_allclose(w.logits, out.logits[0, p].double().numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("position", [0, 5, len(IDS) - 1])
def test_top_ten_is_the_models_own_softmax(model, position):
    w = wt.walk(model, IDS, position)
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([IDS]))[0, position].float(), dim=-1)
    top = torch.topk(probs, wt.TOP_K)
    assert w.top_ids.tolist() == top.indices.tolist()
    np.testing.assert_allclose(w.top_probs, top.values.numpy(), rtol=1e-6, atol=1e-7)
    last = w.steps(0)[-1]
    assert last.key == "top"
    np.testing.assert_array_equal(last.arrays["probs"], w.top_probs)
    np.testing.assert_array_equal(last.arrays["ids"], w.top_ids)


def test_logit_lens_last_layer_is_the_models_prediction_and_earlier_layers_follow_the_formula(model):
    c = model.config
    p = len(IDS) - 1
    w = wt.walk(model, IDS, p)
    lens = w.lens
    assert lens.rows == ("embedding",) + tuple(f"layer {i}" for i in range(c.n_layers))
    assert lens.ids.shape == lens.probs.shape == (c.n_layers + 1, wt.LENS_K)
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([IDS]))[0, p].float(), dim=-1)
    top = torch.topk(probs, wt.LENS_K)
    assert lens.ids[-1].tolist() == top.indices.tolist()
    np.testing.assert_allclose(lens.probs[-1], top.values.numpy(), rtol=1e-5, atol=1e-7)
    assert lens.final_id == int(top.indices[0])
    np.testing.assert_allclose(lens.final_probs[-1], float(top.values[0]), rtol=1e-5)
    # every other row: NumPy's final norm and (tied) LM head on that layer's output
    W = _w(model.lm_head)
    g = model.norm.weight.detach().double().numpy()
    states = [w.embed] + [t.resid_post for t in w.layers]
    for row, x in enumerate(states):
        logits = W @ _rmsnorm(x, g, c.norm_eps)
        pr = np.exp(logits - logits.max())
        pr /= pr.sum()
        order = np.argsort(-pr)[:wt.LENS_K]
        np.testing.assert_allclose(lens.probs[row], pr[order], rtol=1e-4, atol=1e-7)
        assert lens.ids[row, 0] == order[0]
        np.testing.assert_allclose(lens.final_probs[row], pr[lens.final_id], rtol=1e-4, atol=1e-9)


def test_walk_leaves_no_hooks_and_does_not_change_the_output(model):
    x = torch.tensor([IDS])
    with torch.no_grad():
        before = model(x)
    wt.walk(model, IDS, 3)
    assert not any(module_hooked(m) for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(x), before)


@pytest.mark.parametrize("call, message", [
    (lambda m: wt.walk(m, []), "no tokens"),
    (lambda m: wt.walk(m, IDS, len(IDS)), "token position must be a whole number from 0 to 10"),
    (lambda m: wt.walk(m, IDS, -1), "token position"),
    (lambda m: wt.walk(m, IDS, 1.5), "token position"),
    (lambda m: wt.walk(m, [0, 10_000]), "token ids must lie in"),
    (lambda m: wt.walk(m, list(range(97)) * 2), "context"),
    (lambda m: wt.walk(m, IDS).steps(3), "layer must be a whole number from 0 to 2"),
    (lambda m: wt.walk(m, IDS).steps(-1), "layer"),
    (lambda m: wt.walk(m, IDS).step(len(wt.STEP_KEYS), 0), "step must be a whole number"),
])
def test_bad_input_is_a_sentence(model, call, message):
    with pytest.raises(ValueError, match=message):
        call(model)


# --- the memo ----------------------------------------------------------------------------------------

def test_memo_reuses_the_forward_and_notices_changed_weights(tmp_path):
    torch.manual_seed(0)
    m = Decoder(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                            max_seq_len=32))
    ids = [1, 5, 9, 5]
    first, cached = pw.walk_cached(m, ids, 2)
    assert not cached
    again, cached = pw.walk_cached(m, ids, 2)
    assert cached and again is first
    with torch.no_grad():
        m.blocks[1].mlp.down_proj.weight.mul_(2.0)  # a fine-tune step or a LoRA merge writes in place
    changed, cached = pw.walk_cached(m, ids, 2)
    assert not cached
    assert not np.allclose(changed.layers[1].mlp_out, first.layers[1].mlp_out)
    for pos in range(4):  # bounded: kept in the shared result cache (its bounds: tests/test_one_result_cache.py)
        pw.walk_cached(m, ids, pos)
    stats = results.stats()
    assert stats["entries"] <= results.max_entries and stats["bytes"] <= results.max_bytes


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
        assert f.layout.title.text.startswith(s.title)
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
    assert f["data"][0]["x"] == labels and f["layout"]["title"]["text"] == s.title
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
