"""The walkthrough ("Inside the model") and the logit lens: values, references and the memo (the figures and the
endpoint: tests/test_walkthrough_views.py).

The walkthrough's arrays are checked three ways: against a separate ``run_with_cache`` of the same prompt
(every step's values are the hooks' tensors), against NumPy float64 written from the formulas (RMSNorm,
RoPE, scores, softmax, weighted sum, SwiGLU, LM head), and against transformers' Llama on the same weights
(hidden states, attention weights, logits).
"""
from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import numpy as np
import pytest
import torch

from explorer import probes

from explorer.state.cache import results
from explorer.probes import walkthrough as wt
from explorer.panels import walkthrough as pw
from models import Decoder, ModelConfig
from models.hooks import module_hooked
from tests.walk_pair import IDS, model, pair  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parent.parent


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
