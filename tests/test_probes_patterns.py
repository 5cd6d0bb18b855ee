"""explorer.probes against independent references: transformers' eager attention weights, NumPy float64
rotations, a model whose heads were wired by hand, and plain forwards of the same model."""
import math

import numpy as np
import pytest
import torch

from explorer import probes

from models import Decoder, Encoder, ModelConfig, generate
from tests.llama_pair import llama_pair
from tests.probe_models import IMPLS, _small_decoder, _tokens


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------

def _hf_pair(tmp_path, *, n_heads=4, n_kv_heads=2, layers=2, seed=0):
    """A random transformers Llama (eager attention) and the same weights in our Decoder."""
    return llama_pair(tmp_path, vocab_size=61, hidden_size=48, intermediate_size=80, layers=layers,
                      n_heads=n_heads, n_kv_heads=n_kv_heads, max_positions=64, seed=seed)


# --------------------------------------------------------------------------------------------------
# attention weights against transformers, whichever implementation runs
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("impl", IMPLS)
def test_pattern_equals_transformers_output_attentions(impl, tmp_path):
    ref, ours = _hf_pair(tmp_path)
    for block in ours.blocks:
        block.attn.tile_size = 5  # several key blocks for the tiled path
    tokens = _tokens(17, vocab=61, n=2)
    with torch.no_grad():
        hf = ref(tokens, output_attentions=True)
    logits, cache = probes.run_with_cache(ours, tokens, attn_impl=impl)
    assert cache.attn_impl == impl
    assert (impl == "naive") == ("recomputed" not in cache.pattern_source)
    assert impl in cache.pattern_source
    # the output really came from this implementation and matches transformers
    torch.testing.assert_close(logits, hf.logits, rtol=1e-4, atol=1e-4 * hf.logits.abs().max().item())
    pats = cache.stack("attn.hook_pattern")  # (L, B, H, T, T)
    assert len(hf.attentions) == pats.shape[0] == 2
    T = tokens.shape[1]
    upper = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    for layer, expected in enumerate(hf.attentions):
        torch.testing.assert_close(pats[layer], expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(pats[layer].sum(-1), torch.ones(2, 4, T), rtol=0, atol=1e-5)
        assert (pats[layer][..., upper] == 0).all()
    # the conveniences read the same weights
    allp = probes.all_patterns(ours, tokens[:1], attn_impl=impl)
    assert allp.shape == (2, 4, T, T)
    np.testing.assert_allclose(allp[1], hf.attentions[1][0].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(probes.attention_pattern(ours, tokens[:1], 1, 3, attn_impl=impl),
                               hf.attentions[1][0, 3].numpy(), rtol=1e-5, atol=1e-6)


def test_model_default_impl_is_reported(tmp_path):
    model = _small_decoder()
    model.set_attn_impl("tiled")
    _, cache = probes.run_with_cache(model, _tokens(6), "blocks.0.attn.hook_pattern")
    assert cache.attn_impl == "tiled" and "tiled" in cache.pattern_source
    model.blocks[0].attn.impl = "naive"
    _, cache = probes.run_with_cache(model, _tokens(6), "blocks.0.attn.hook_pattern")
    assert cache.attn_impl == "mixed"


def test_compare_impls_is_small_against_transformers_model(tmp_path):
    _, ours = _hf_pair(tmp_path)
    diffs = probes.compare_impls(ours, _tokens(20, vocab=61))
    assert set(diffs) == set(IMPLS) and diffs["naive"] == 0.0
    assert max(diffs.values()) < 1e-4


def test_encoder_patterns_are_bidirectional_and_named():
    torch.manual_seed(0)
    enc = Encoder(ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, max_seq_len=32)).eval()
    with torch.no_grad():
        for name, p in enc.named_parameters():
            if "norm" not in name and p.dim() > 1:
                p.normal_(0.0, 0.3)
    tok = _tokens(7, vocab=40)
    names = probes.hook_names(enc)
    assert "blocks.1.mlp.hook_pre" in names and "hook_logits" not in names and names[0] == "hook_embed"
    for impl in IMPLS:
        hidden, cache = probes.run_with_cache(enc, tok, attn_impl=impl)
        assert hidden.shape == (1, 7, 32) and set(cache) == set(names)
        assert "rotated" not in cache.pattern_source
        p = cache["blocks.0.attn.hook_pattern"]
        torch.testing.assert_close(p.sum(-1), torch.ones(1, 4, 7))
        assert (p[..., torch.triu(torch.ones(7, 7, dtype=torch.bool), 1)] > 0).all()
        # independent reference: softmax(q kᵀ/√D) of the captured q and k, in float64 NumPy
        q = cache["blocks.0.attn.hook_q"][0].double().numpy()
        k = cache["blocks.0.attn.hook_k"][0].double().numpy()
        s = q @ k.transpose(0, 2, 1) / math.sqrt(8)
        w = np.exp(s - s.max(-1, keepdims=True))
        np.testing.assert_allclose(p[0].numpy(), w / w.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    assert probes.attention_pattern(enc, tok, 0).shape == (4, 7, 7)
    causal = probes.attention_pattern(enc, tok, 0, 1, causal=True)
    assert np.allclose(np.triu(causal, 1), 0.0)
    with pytest.raises(ValueError, match="sinusoidal_probe"):
        probes.rope_probe(enc)


def test_layer_and_head_are_checked():
    model = _small_decoder()
    with pytest.raises(ValueError, match="layer must be between 0 and 1"):
        probes.attention_pattern(model, _tokens(4), 2)
    with pytest.raises(ValueError, match="head must be between 0 and 3"):
        probes.attention_pattern(model, _tokens(4), 0, 4)
    with pytest.raises(ValueError, match="integer ids"):
        probes.run_with_cache(model, torch.tensor([[0.5, 1.0]]))


# --------------------------------------------------------------------------------------------------
# head scores on a model wired by hand
# --------------------------------------------------------------------------------------------------

def _wired_induction_model():
    """A 2-layer decoder whose weights were set by hand (no training):

    layer 0 head 0 is a previous-token head made with RoPE alone: q and k read a constant residual
    direction, and k is k = q turned by one position's angle on the fastest pairs, so
    rot(q, m) · rot(k, n) peaks at n = m - 1. It copies the previous token's one-hot into a slot.
    Layer 1 head 0 is an induction head: its query is the current token, its key the previous-token
    slot, both on the slowest pairs where RoPE barely turns (theta = 1e6), so query j attends to the key
    whose previous token equals token j: the token after this token's earlier occurrence.
    All other heads and both MLPs are zero. Residual layout: dim 0 constant 1; dims 1..16 token one-hot;
    dims 17..32 previous-token slot.
    """
    V, C, H, D = 16, 64, 2, 32
    cfg = ModelConfig(vocab_size=V, d_model=C, n_layers=2, n_heads=H, n_kv_heads=H, d_ff=32, max_seq_len=64,
                      rope_theta=1e6, bos_token_id=0, attn_impl="sdpa")
    model = Decoder(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(1.0) if "norm" in name else p.zero_()
        emb = model.embed_tokens.weight
        emb[:, 0] = 1.0
        emb[torch.arange(V), 1 + torch.arange(V)] = 1.0
        n0 = 1.0 / math.sqrt(2.0 / C)  # RMSNorm gain on layer 0's input (every row has norm √2)
        n1 = 1.0 / math.sqrt(3.0 / C)  # on layer 1's input: constant + token + copied previous token
        omega = cfg.rope_theta ** (-2.0 * torch.arange(D // 2).double() / D)
        a = 15.0
        a0 = model.blocks[0].attn
        for i in range(4):  # the fastest pairs separate distance 1 from its neighbours
            a0.q_proj.weight[i, 0] = a / n0
            a0.k_proj.weight[i, 0] = a * math.cos(omega[i]) / n0
            a0.k_proj.weight[i + D // 2, 0] = a * math.sin(omega[i]) / n0
        for t in range(V):
            a0.v_proj.weight[t, 1 + t] = 1.0 / n0
            a0.o_proj.weight[17 + t, t] = 1.0
        b = 12.0
        slow = list(range(8, 16)) + list(range(24, 32))  # both coordinates of pairs 8..15
        a1 = model.blocks[1].attn
        for t in range(V):
            a1.q_proj.weight[slow[t], 1 + t] = b / n1
            a1.k_proj.weight[slow[t], 17 + t] = b / n1
    return model


def test_head_scores_find_hand_wired_previous_token_and_induction_heads():
    model = _wired_induction_model()
    span = 8
    scores = probes.head_scores(model, span_len=span, batch=4, seed=3)
    assert list(scores) == ["previous_token", "first_token", "induction", "duplicate_token"]
    for v in scores.values():
        assert v.shape == (2, 2) and v.dtype == np.float32
    prev, ind = scores["previous_token"], scores["induction"]
    assert prev[0, 0] > 0.99
    assert prev[0, 1] < 0.5 and prev[1, 1] < 0.5  # the zero heads attend uniformly
    assert np.unravel_index(np.argmax(ind), ind.shape) == (1, 0)  # ranked first
    assert ind[1, 0] > 0.95
    assert np.delete(ind.ravel(), 2).max() < 0.3
    # the pattern itself, read independently of the scorer: each second-copy query's strongest key
    tok = torch.cat((torch.tensor([0]), torch.tensor([5, 3, 9, 1, 14, 7, 2, 11]).repeat(2)))  # BOS + r + r
    pat = probes.attention_pattern(model, tok, 1, 0)
    T = tok.shape[0]
    for j in range(T - span, T):
        assert pat[j].argmax() == j - span + 1
    prev_pat = probes.attention_pattern(model, tok, 0, 0, attn_impl="tiled")
    assert all(prev_pat[t].argmax() == t - 1 for t in range(1, T))


def test_head_scores_on_given_tokens_and_validation():
    model = _wired_induction_model()
    tok = [0, 4, 4, 4, 9, 4]
    scores = probes.head_scores(model, tokens=tok, span_len=6, batch=2)
    assert scores["previous_token"][0, 0] > 0.99
    # duplicate token on these tokens, against a NumPy count on the captured pattern
    p = probes.attention_pattern(model, tok, 0)  # (H, T, T)
    t = np.array(tok)
    rows = [j for j in range(len(t)) if (t[:j] == t[j]).any()]
    expected = np.mean([[p[h, j, :j][t[:j] == t[j]].sum() for j in rows] for h in range(2)], axis=1)
    np.testing.assert_allclose(scores["duplicate_token"][0], expected, rtol=1e-5)
    with pytest.raises(ValueError, match="span_len"):
        probes.head_scores(model, span_len=40)


# --------------------------------------------------------------------------------------------------
# generation trace
# --------------------------------------------------------------------------------------------------

def test_generation_trace_matches_generate_and_plain_forwards():
    model = _small_decoder()
    prompt = _tokens(5)
    n = 6
    tr = probes.generation_trace(model, prompt, n, temperature=0.8, top_k=20, seed=7, top=5)
    assert tr["new_tokens"] == generate(model, prompt, n, temperature=0.8, top_k=20, seed=7)[0, 5:].tolist()
    assert tr["prompt"] == prompt[0].tolist() and len(tr["steps"]) == n
    cfg = model.config
    per_layer = 2 * cfg.n_kv_heads * (5 + n) * cfg.head_dim * 4  # keys + values, fp32
    seq = tr["tokens"]
    for s, step in enumerate(tr["steps"]):
        assert step["token"] == seq[5 + s] and step["position"] == 5 + s
        assert step["cache_length"] == 5 + s
        assert step["cache_bytes_allocated_per_layer"] == per_layer
        assert step["cache_bytes_used_per_layer"] == per_layer * (5 + s) // (5 + n)
        assert step["positions_computed"] == (5 if s == 0 else 1)
        assert step["seconds"] > 0
        # independent reference: a plain forward of the sequence so far, softmax in float64
        with torch.no_grad():
            logits = model(torch.tensor([seq[:5 + s]]))[0, -1].double().numpy()
        order = np.argsort(-logits)[:5]
        assert step["top_ids"] == order.tolist()
        z = np.exp((logits - logits.max()) / 0.8)
        kth = np.sort(logits)[-20]
        z[logits < kth] = 0.0
        z /= z.sum()
        plain = np.exp(logits - logits.max())
        plain /= plain.sum()
        np.testing.assert_allclose(step["top_probs"], z[order], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(step["model_probs"], plain[order], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(step["chosen_prob"], z[step["token"]], rtol=1e-4, atol=1e-6)
        assert step["chosen_rank"] == int((logits > logits[step["token"]]).sum())
    tot = tr["totals"]
    assert tot["new_tokens"] == n and tot["cache_bytes_allocated"] == per_layer * cfg.n_layers
    assert tot["seconds"] == pytest.approx(sum(s["seconds"] for s in tr["steps"]))
    assert tr["provenance"]["device"] == "cpu" and tr["provenance"]["dtype"] == "float32"


def test_compare_cache_gives_identical_greedy_tokens():
    model = _small_decoder(max_seq_len=128)
    out = probes.compare_cache(model, _tokens(7), 40, seed=0)
    assert out["identical"] and out["first_difference"] is None
    on, off = out["with_cache"], out["without_cache"]
    assert on["new_tokens"] == off["new_tokens"] == generate(model, _tokens(7), 40)[0, 7:].tolist()
    assert all(s["top_probs"][0] == 1.0 for s in on["steps"])  # greedy samples from a one-hot
    assert [s["positions_computed"] for s in off["steps"]] == [7 + s for s in range(40)]
    assert off["totals"]["cache_bytes_allocated"] == 0 and all(s["cache_length"] == 0 for s in off["steps"])
    assert out["speedup"] > 0


def test_generation_trace_validates():
    model = _small_decoder()
    with pytest.raises(ValueError, match="one prompt"):
        probes.generation_trace(model, _tokens(4, n=2), 3)
    with pytest.raises(ValueError, match="temperature"):
        probes.generation_trace(model, _tokens(4), 3, temperature=-1)
    with pytest.raises(ValueError, match="context"):
        probes.generation_trace(model, _tokens(4), 100)


# --------------------------------------------------------------------------------------------------
# positions
# --------------------------------------------------------------------------------------------------

def _np_rope(x, positions, theta):
    """NumPy float64 RoPE in transformers' rotate_half layout: pair i = dims (i, i + D/2)."""
    x = np.asarray(x, dtype=np.float64)
    D = x.shape[-1]
    ang = np.asarray(positions, dtype=np.float64)[:, None] * theta ** (-np.arange(0, D, 2) / D)[None]  # (T, D/2)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    c, s = np.cos(ang), np.sin(ang)
    return np.concatenate((x1 * c - x2 * s, x2 * c + x1 * s), axis=-1)


def test_rope_probe_scores_depend_only_on_relative_distance():
    cfg = ModelConfig(vocab_size=50, d_model=64, n_layers=1, n_heads=4, max_seq_len=64, rope_theta=500.0)
    T, D = 24, cfg.head_dim
    r = probes.rope_probe(cfg, positions=T, thetas=[50.0, 1e5], seed=4)
    assert r["theta"] == 500.0 and r["captured"] is None
    np.testing.assert_allclose(r["angles"], np.arange(T)[:, None] * 500.0 ** (-np.arange(0, D, 2) / D)[None],
                               rtol=1e-6)
    np.testing.assert_allclose(r["wavelengths"], 2 * np.pi * 500.0 ** (np.arange(0, D, 2) / D), rtol=1e-9)
    s = r["relative"]["scores"]
    assert s.shape == (T, T)
    for d in range(-(T - 1), T):  # every diagonal is constant: only m - n matters
        diag = np.diagonal(s, offset=-d)
        assert np.ptp(diag) < 1e-9 * np.abs(s).max()
        assert r["relative"]["by_distance"][d + T - 1] == pytest.approx(diag[0], abs=1e-12)
    assert r["relative"]["max_deviation"] < 1e-9
    # against NumPy on the same vectors
    g = torch.Generator().manual_seed(4)
    q, k = (torch.randn(D, generator=g, dtype=torch.float64).numpy() for _ in range(2))
    ref = _np_rope(np.tile(q, (T, 1)), range(T), 500.0) @ _np_rope(np.tile(k, (T, 1)), range(T), 500.0).T / math.sqrt(D)
    np.testing.assert_allclose(s, ref, rtol=1e-9, atol=1e-12)
    assert set(r["theta_sweep"]) == {50.0, 500.0, 1e5}
    for theta, v in r["theta_sweep"].items():
        ref_t = _np_rope(np.tile(q, (T, 1)), range(T), theta) @ _np_rope(k[None], [0], theta).T / math.sqrt(D)
        np.testing.assert_allclose(v["by_distance"], ref_t[:, 0], rtol=1e-9, atol=1e-12)
    # a larger theta turns the slow pairs slower: scores drift less from their value at distance 0
    drift = {t: abs(v["by_distance"][1:] - v["by_distance"][0]).mean() for t, v in r["theta_sweep"].items()}
    assert drift[1e5] < drift[50.0]


def test_rope_probe_captures_q_and_k_before_and_after_rotation():
    model = _small_decoder(d_model=64, n_heads=4, n_kv_heads=2)
    tok = _tokens(10)
    r = probes.rope_probe(model, tokens=tok, layer=1, head=3, positions=16, pairs=[0, 7])
    c = r["captured"]
    assert c["kv_head"] == 1 and c["q"].shape == (10, 16) and c["k"].shape == (10, 16)
    _, cache = probes.run_with_cache(model, tok, ["blocks.1.attn.hook_q", "blocks.1.attn.hook_k"])
    np.testing.assert_allclose(c["q"], cache["blocks.1.attn.hook_q"][0, 3].numpy(), rtol=1e-6)
    np.testing.assert_allclose(c["rot_q"], _np_rope(c["q"], range(10), model.config.rope_theta), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c["rot_k"], _np_rope(c["k"], range(10), model.config.rope_theta), rtol=1e-5, atol=1e-6)
    assert c["norm_change"] < 1e-5
    assert c["q_pairs"].shape == (10, 2, 2)
    np.testing.assert_allclose(c["rot_q_pairs"][:, 1], c["rot_q"][:, [7, 15]])
    # the captured scores are the model's attention scores before masking
    _, cache = probes.run_with_cache(model, tok, ["blocks.1.attn.hook_attn_scores"])
    sc = cache["blocks.1.attn.hook_attn_scores"][0, 3].numpy()
    lower = np.tril(np.ones((10, 10), dtype=bool))
    np.testing.assert_allclose(c["scores"][lower], sc[lower], rtol=1e-4, atol=1e-5)
    assert "captured q" in r["relative"]["vectors"] and r["relative"]["max_deviation"] < 1e-9
    with pytest.raises(ValueError, match="pairs must lie"):
        probes.rope_probe(model, pairs=[8])
    with pytest.raises(ValueError, match="positions"):
        probes.rope_probe(model, positions=0)


def test_sinusoidal_probe_matches_the_formula():
    T, C = 20, 16
    s = probes.sinusoidal_probe(T, C)
    pos = np.arange(T)[:, None]
    inv = 10000.0 ** (-np.arange(0, C, 2) / C)
    ref = np.zeros((T, C))
    ref[:, 0::2], ref[:, 1::2] = np.sin(pos * inv), np.cos(pos * inv)
    np.testing.assert_allclose(s["table"], ref, atol=1e-6)
    sim = s["similarity"]
    for d in range(T):  # a position's code · another's depends only on their distance
        assert np.ptp(np.diagonal(sim, offset=d)) < 1e-5
    np.testing.assert_allclose(s["by_distance"], np.cos(np.arange(T)[:, None] * inv).sum(1), atol=1e-5)
    with pytest.raises(ValueError, match="even"):
        probes.sinusoidal_probe(4, 7)


def test_token_ids_are_checked_at_the_probes_edge():
    model = _small_decoder()  # vocabulary 50, context 64

    def must_not_run(*args, **kwargs):
        raise AssertionError("the model ran on ids it cannot read")

    model.forward = must_not_run
    calls = {"run_with_cache": lambda t: probes.run_with_cache(model, t),
             "all_patterns": lambda t: probes.all_patterns(model, t),
             "compare_impls": lambda t: probes.compare_impls(model, t),
             "head_scores": lambda t: probes.head_scores(model, tokens=t),
             "generation_trace": lambda t: probes.generation_trace(model, t, 2)}
    for name, call in calls.items():
        with pytest.raises(ValueError, match="token ids must lie in 0..49"):
            call([[1, 2, 50]])
        with pytest.raises(ValueError, match="exceed the model's context of 64"):
            call([[1] * 65])
