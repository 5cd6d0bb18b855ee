"""Decoder, encoder, RoPE, KV cache, generation and config: behaviour and every ValueError path."""
import copy
import importlib
import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from models import Decoder, Encoder, KVCache, ModelConfig, check_tokens, generate
from models.speed import fused, optimize_for_decode, prepared_copy
from models.attention import build_mask
from models.generate import decode_one, prefill, sampling_probs
from models.rope import apply_rope, rope_angles, rope_tables, sinusoidal_table
from tests.tiny_decoder import spread as _spread
from tests.tiny_decoder import tiny

decoder_module = importlib.import_module("models.decoder")
generate_module = importlib.import_module("models.generate")  # ``models.generate`` is the function


# --- RoPE -------------------------------------------------------------------------------------------
def test_rope_relative_property_scores_depend_only_on_distance():
    D, theta = 16, 10000.0
    cos, sin = rope_tables(40, D, theta)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(D, generator=g, dtype=torch.float64), torch.randn(D, generator=g, dtype=torch.float64)

    def rot(x, pos):
        return apply_rope(x[None, None, None], cos[pos:pos + 1].double(), sin[pos:pos + 1].double())[0, 0, 0]

    for delta in (0, 1, 5, 17):
        scores = [float(rot(q, m) @ rot(k, m - delta)) for m in range(delta, 40, 7)]
        np.testing.assert_allclose(scores, scores[0], rtol=1e-6)  # fp32 angle tables
    assert abs(float(rot(q, 9) @ rot(k, 3)) - float(rot(q, 9) @ rot(k, 4))) > 1e-6


def test_rope_pairs_dimension_i_with_i_plus_half():
    # transformers' rotate_half layout: pair (i, i + D/2) turns by position * theta^(-2i/D)
    D, pos = 8, 3
    cos, sin = rope_tables(8, D, 100.0)
    x = torch.zeros(1, 1, 1, D)
    x[..., 1] = 1.0  # unit vector on the first coordinate of pair 1
    y = apply_rope(x, cos[pos:pos + 1], sin[pos:pos + 1])[0, 0, 0]
    angle = pos * 100.0 ** (-2 * 1 / D)
    expected = torch.zeros(D)
    expected[1], expected[1 + D // 2] = math.cos(angle), math.sin(angle)
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(rope_angles(8, D, 100.0)[pos, 1], torch.tensor(angle))


def test_sinusoidal_table_matches_the_paper_formula():
    table = sinusoidal_table(50, 16).numpy()
    pos, i = np.arange(50)[:, None], np.arange(8)[None, :]
    np.testing.assert_allclose(table[:, 0::2], np.sin(pos / 10000 ** (2 * i / 16)), atol=1e-5)
    np.testing.assert_allclose(table[:, 1::2], np.cos(pos / 10000 ** (2 * i / 16)), atol=1e-5)
    with pytest.raises(ValueError, match="even"):
        sinusoidal_table(4, 7)


# --- decoder and KV cache ---------------------------------------------------------------------------
@pytest.mark.parametrize("impl", ["naive", "sdpa", "tiled"])
def test_cached_decoding_equals_full_forward_at_every_step(impl):
    torch.manual_seed(0)
    model = _spread(Decoder(tiny()))
    tokens = torch.randint(0, 61, (2, 20))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache(2, 20)
        got = [model(tokens[:, :6], cache=cache, attn_impl=impl)]  # prefill 6
        for pos in range(6, 20):
            got.append(model(tokens[:, pos:pos + 1], start_pos=pos, cache=cache, attn_impl=impl))
    torch.testing.assert_close(torch.cat(got, 1), full, atol=1e-5, rtol=1e-5)
    assert cache.length == 20


def test_cache_reports_bytes_fill_and_resets_and_refuses_overflow():
    cfg = tiny()
    cache = KVCache.for_model(cfg, batch=3, max_len=10)
    per_layer = 2 * 3 * cfg.n_kv_heads * 10 * cfg.head_dim * 4
    assert cache.nbytes == cfg.n_layers * per_layer and cache.bytes_per_layer() == per_layer
    model = Decoder(cfg).eval()
    with torch.no_grad():
        model(torch.zeros(3, 4, dtype=torch.long), cache=cache)
    assert cache.length == 4 and cache.bytes_used == cache.nbytes * 4 // 10
    assert cache.k[0][:, :, :4].abs().sum() > 0 and cache.k[0][:, :, 4:].abs().sum() == 0
    cache.reset()
    assert cache.length == 0 and all(t.abs().sum() == 0 for t in cache.k + cache.v)
    with pytest.raises(ValueError, match="do not fit a KV cache"):
        with torch.no_grad():
            model(torch.zeros(3, 11, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="context"):
        KVCache.for_model(cfg, batch=1, max_len=cfg.max_seq_len + 1)
    with pytest.raises(ValueError, match="positive"):
        KVCache(1, 0, 1, 4, 4)


def test_decode_step_writes_in_place_without_growing_the_cache():
    model = Decoder(tiny()).eval()
    cache = model.new_cache(1, 16)
    ptrs = [t.data_ptr() for t in cache.k]
    with torch.no_grad():
        generate_tokens = torch.zeros(1, 3, dtype=torch.long)
        model(generate_tokens, cache=cache)
        model(torch.ones(1, 1, dtype=torch.long), start_pos=3, cache=cache)
    assert [t.data_ptr() for t in cache.k] == ptrs and cache.k[0].shape[2] == 16


def test_tied_embeddings_share_one_tensor_and_count_once():
    model = Decoder(tiny(tie_embeddings=True))
    assert model.lm_head.weight is model.embed_tokens.weight
    untied = Decoder(tiny())
    assert untied.num_parameters() - model.num_parameters() == 61 * 48


def test_bidirectional_view_differs_from_causal_and_last_only_matches():
    torch.manual_seed(1)
    model = _spread(Decoder(tiny(n_layers=1)))  # one layer: the last token's inputs are the same either way
    tokens = torch.randint(0, 61, (1, 9))
    with torch.no_grad():
        causal, bidir = model(tokens), model(tokens, causal=False)
        torch.testing.assert_close(model(tokens, last_only=True), causal[:, -1:])
    torch.testing.assert_close(causal[:, -1], bidir[:, -1], atol=1e-5, rtol=1e-5)  # it sees every token anyway
    assert (causal[:, 0] - bidir[:, 0]).abs().max() > 1e-3


@pytest.mark.parametrize("tokens,message", [
    (torch.zeros(5, dtype=torch.long), "shape"),
    (torch.zeros(1, 0, dtype=torch.long), "empty"),
    (torch.zeros(1, 65, dtype=torch.long), "context"),
    (torch.full((1, 3), 61), "token ids"),
    (torch.full((1, 3), -1), "token ids"),
    (torch.zeros(1, 3), "integer"),
])
def test_bad_tokens_are_refused_where_they_come_in(tokens, message):
    cfg = tiny()
    model = Decoder(cfg)
    with pytest.raises(ValueError, match=message):
        check_tokens(tokens, cfg)
    with pytest.raises(ValueError, match=message):
        generate(model, tokens, 1)
    if message != "token ids":  # shape, dtype and positions need no device read: the forward checks them too
        with pytest.raises(ValueError, match=message):
            model(tokens)


def test_check_tokens_counts_positions_from_start_pos():
    cfg = tiny()
    check_tokens(torch.zeros(1, 4, dtype=torch.int32), cfg, start_pos=60)  # positions 60..63 fit a context of 64
    with pytest.raises(ValueError, match="positions 61..64 exceed the model's context of 64"):
        check_tokens(torch.zeros(1, 4, dtype=torch.long), cfg, start_pos=61)
    with pytest.raises(ValueError, match="context"):
        Decoder(cfg)(torch.zeros(1, 4, dtype=torch.long), start_pos=61)


class _HostReads(TorchDispatchMode):
    """Counts the ops that copy a tensor's value to Python (``int(t)``, ``t.item()``): on a GPU each waits."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default):
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_generate_checks_the_prompt_once_and_no_decode_step_reads_the_device(monkeypatch):
    torch.manual_seed(4)
    model = _spread(Decoder(tiny()))
    prompt = torch.randint(0, 61, (2, 5))
    calls = []
    monkeypatch.setattr(generate_module, "check_tokens", lambda *a: calls.append(a) or check_tokens(*a))
    monkeypatch.setattr(decoder_module, "check_tokens", lambda *a: pytest.fail("the forward validated the ids"))
    generate(model, prompt, 6, temperature=1.0, top_k=10, top_p=0.9, seed=0)
    assert len(calls) == 1
    reads = {}
    for n in (2, 12):
        with _HostReads() as mode:
            generate(model, prompt, n, temperature=1.0, top_k=10, top_p=0.9, seed=0)
        reads[n] = mode.count
    assert reads[2] == reads[12] > 0  # the prompt check reads min and max once, whatever the length
    cache = model.new_cache(2, 8)
    with torch.inference_mode():
        prefill(model, prompt, cache)
        with _HostReads() as mode:
            decode_one(model, prompt[:, :1], cache, 5)
    assert mode.count == 0


# --- rotary tables for another theta, this call only -------------------------------------------------
def test_rope_theta_override_equals_a_model_built_with_that_theta_and_changes_nothing():
    torch.manual_seed(5)
    model = _spread(Decoder(tiny()))
    other = Decoder(tiny(rope_theta=100.0)).eval()
    other.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 61, (2, 12))
    cos = model.rope_cos.clone()
    with torch.no_grad():
        own = model(tokens)
        torch.testing.assert_close(model(tokens, rope_theta=100.0), other(tokens), atol=0, rtol=0)
        assert torch.equal(model(tokens, rope_theta=model.config.rope_theta), own)
        assert (model(tokens, rope_theta=100.0) - own).abs().max() > 1e-3
        cache = model.new_cache(2, 12)  # the override with a cache: positions still count from start_pos
        steps = [model(tokens[:, :7], cache=cache, rope_theta=100.0)]
        steps += [model(tokens[:, p:p + 1], start_pos=p, cache=cache, rope_theta=100.0) for p in range(7, 12)]
        torch.testing.assert_close(torch.cat(steps, 1), other(tokens), atol=1e-5, rtol=1e-5)
        assert torch.equal(model(tokens), own)
    assert torch.equal(model.rope_cos, cos) and model.config.rope_theta == 10000.0


def test_rope_theta_tables_built_under_inference_mode_still_train():
    model = _spread(Decoder(tiny(n_layers=1)))
    tokens = torch.randint(0, 61, (1, 6))
    with torch.inference_mode():
        model(tokens, rope_theta=321.0)
    model(tokens, rope_theta=321.0).sum().backward()  # the cached tables must not be inference tensors
    assert model.blocks[0].attn.q_proj.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("theta", [1.0, 0.5, float("nan"), float("inf"), True, "100"])
def test_rope_theta_override_refuses_what_cannot_rotate(theta):
    with pytest.raises(ValueError, match="rope_theta must be a finite number greater than 1"):
        Decoder(tiny())(torch.zeros(1, 3, dtype=torch.long), rope_theta=theta)


# --- the opt-in decode layout ------------------------------------------------------------------------
def test_the_decoder_keeps_plain_weights_and_optimize_for_decode_only_changes_memory_order(tmp_path):
    torch.manual_seed(6)
    model = _spread(Decoder(tiny(tie_embeddings=True)))
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert all(m.weight.is_contiguous() for m in linears)  # the tutorial's (out, in) layout
    tokens = torch.randint(0, 61, (2, 10))
    with torch.no_grad():
        before, state = model(tokens), copy.deepcopy(model.state_dict())
    shapes = [m.weight.shape for m in linears]
    assert optimize_for_decode(model) is model
    assert [m.weight.shape for m in linears] == shapes
    widths = {}  # each weight is a column slice of the (in, n) matrix it lies in: q|k|v, gate|up, or itself
    for block in model.blocks:
        for group in ((block.attn.q_proj, block.attn.k_proj, block.attn.v_proj),
                      (block.mlp.gate_proj, block.mlp.up_proj)):
            assert fused(*group) is not None
            widths.update({id(m): sum(g.out_features for g in group) for m in group})

    def laid_out(m):  # side by side, widening or square: (in, n) in memory; else (the down projection) kept
        if id(m) in widths:
            return m.weight.stride() == (1, widths[id(m)])
        return m.weight.stride() == ((m.in_features, 1) if m.out_features < m.in_features else (1, m.out_features))

    assert all(laid_out(m) for m in linears)
    assert any(m.out_features < m.in_features for m in linears)  # the tiny model has a narrowing one
    assert model.lm_head.weight is model.embed_tokens.weight
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    ptrs = [m.weight.data_ptr() for m in linears]
    optimize_for_decode(model)
    assert [m.weight.data_ptr() for m in linears] == ptrs  # a second call copies nothing
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), before, atol=1e-5, rtol=1e-5)
    fresh = Decoder(tiny(tie_embeddings=True))
    optimize_for_decode(fresh).load_state_dict(state)
    assert all(fused(b.attn.q_proj, b.attn.k_proj, b.attn.v_proj) is not None for b in fresh.blocks)  # loading
    # keeps all of it; copying and casting keep each weight's (in, out) order, prepared_copy the rest
    for kept in (fresh, copy.deepcopy(model), prepared_copy(model), model.to(torch.float64)):
        assert all(m.weight.stride()[1 if m is b.mlp.down_proj else 0] == 1
                   for b in kept.blocks for m in b.modules() if isinstance(m, nn.Linear))
    assert all(fused(b.mlp.gate_proj, b.mlp.up_proj) is not None for b in prepared_copy(model).blocks)


def test_unknown_attention_impl_is_refused():
    model = Decoder(tiny())
    with pytest.raises(ValueError, match="must be one of"):
        model.set_attn_impl("flash")
    with pytest.raises(ValueError, match="must be one of"):
        model(torch.zeros(1, 2, dtype=torch.long), attn_impl="flash")
    model.set_attn_impl("tiled")
    assert all(b.attn.impl == "tiled" for b in model.blocks)


# --- generation -------------------------------------------------------------------------------------
def test_generation_is_seedable_and_cache_independent():
    torch.manual_seed(2)
    model = _spread(Decoder(tiny()), std=0.2)
    prompt = torch.randint(0, 61, (2, 5))
    a = generate(model, prompt, 20, temperature=1.0, top_k=20, top_p=0.9, seed=7)
    b = generate(model, prompt, 20, temperature=1.0, top_k=20, top_p=0.9, seed=7)
    c = generate(model, prompt, 20, temperature=1.0, top_k=20, top_p=0.9, seed=7, use_cache=False)
    assert torch.equal(a, b) and torch.equal(a, c)
    assert torch.equal(a[:, :5], prompt) and a.shape == (2, 25)
    assert torch.equal(generate(model, prompt, 12), generate(model, prompt, 12, use_cache=False))
    assert generate(model, prompt, 0).shape == (2, 5)


def _greedy_reference(model, prompt, n, stop):
    """Greedy decoding written out: the whole sequence through the model each step, no cache, stop at ``stop``."""
    seq = prompt[0].tolist()
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(torch.tensor([seq]))[0, -1].argmax())
            seq.append(nxt)
            if nxt in stop:
                break
    return seq


def test_generate_stops_at_stop_tokens():
    torch.manual_seed(3)
    model = _spread(Decoder(tiny()), std=0.2)
    prompt = torch.randint(0, 61, (1, 4))
    free = _greedy_reference(model, prompt, 12, stop=())
    stop_id = free[4 + 3]  # the greedy 4th new token: generation must end there (or earlier if it came sooner)
    want = _greedy_reference(model, prompt, 12, stop={stop_id, 60})
    for use_cache in (True, False):
        got = generate(model, prompt, 12, stop_tokens=[stop_id, 60], use_cache=use_cache)[0].tolist()
        assert got == want and got[-1] in (stop_id, 60) and len(got) <= 4 + 4
    assert generate(model, prompt, 12, stop_tokens=[]).shape == (1, 16)  # no stop tokens: all 12
    # a batch ends when every row has stopped; a row that stopped first repeats its stop token
    batch = torch.cat([prompt, torch.randint(0, 61, (1, 4))])
    out = generate(model, batch, 12, stop_tokens=[stop_id])
    for row in out.tolist():
        ref = _greedy_reference(model, torch.tensor([row[:4]]), 12, stop={stop_id})
        assert row[:len(ref)] == ref and all(t == stop_id for t in row[len(ref):])


def test_sampling_distribution_top_k_top_p_and_extreme_temperatures():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    p = sampling_probs(logits, temperature=1.0)
    torch.testing.assert_close(p, torch.softmax(logits, -1))
    p = sampling_probs(logits, temperature=1.0, top_k=2)
    assert torch.all(p[0, 2:] == 0) and math.isclose(p.sum().item(), 1.0, rel_tol=1e-6)
    soft = torch.softmax(logits, -1)[0]
    p = sampling_probs(logits, temperature=1.0, top_p=0.7)  # 0.636 < 0.7: the second token is needed too
    assert (p[0] > 0).tolist() == [True, True, False, False, False]
    torch.testing.assert_close(p[0, :2], soft[:2] / soft[:2].sum())
    for tiny_t in (1e-30, 1e-300, 5e-324):  # the last two are 0 in fp32
        assert torch.equal(sampling_probs(logits, temperature=tiny_t), torch.tensor([[1.0, 0, 0, 0, 0]]))
    flat = sampling_probs(logits, temperature=1e30)
    assert torch.isfinite(flat).all()
    torch.testing.assert_close(flat, torch.full((1, 5), 0.2))


@pytest.mark.parametrize("kwargs,message", [
    (dict(temperature=-1.0), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "finite"),
    (dict(temperature=1.0, top_k=0), "top-k"),
    (dict(temperature=1.0, top_p=0.0), "top-p"),
    (dict(temperature=1.0, top_p=1.5), "top-p"),
])
def test_generate_rejects_bad_sampling_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(Decoder(tiny()), torch.zeros(1, 2, dtype=torch.long), 3, **kwargs)


def test_generate_rejects_bad_lengths():
    model = Decoder(tiny())
    with pytest.raises(ValueError, match="at most 54 new tokens"):
        generate(model, torch.zeros(1, 10, dtype=torch.long), 60)
    with pytest.raises(ValueError, match="non-negative"):
        generate(model, torch.zeros(1, 10, dtype=torch.long), -1)


# --- encoder ----------------------------------------------------------------------------------------
def test_encoder_shape_check_of_the_classic_tutorial():
    enc = Encoder(ModelConfig(vocab_size=32000, d_model=256, n_heads=4, n_layers=4, d_ff=1024)).eval()
    with torch.no_grad():
        out = enc(torch.randint(0, 32000, (2, 64)))
    assert out.shape == (2, 64, 256)


def test_encoder_padding_keeps_attention_off_pads_and_leaves_real_tokens_unchanged():
    torch.manual_seed(3)
    enc = _spread(Encoder(tiny(n_kv_heads=4)))
    tokens = torch.randint(0, 61, (1, 7))
    padded = torch.cat([tokens, torch.zeros(1, 3, dtype=torch.long)], 1)  # (1, 10): 3 pads on the right
    keep = torch.tensor([[True] * 7 + [False] * 3])
    patterns = []
    handle = enc.blocks[0].attn.hook_pattern.register_forward_hook(lambda m, i, o: patterns.append(i[0]))
    with torch.no_grad():
        alone = enc(tokens)
        with_pads = enc(padded, key_padding=keep)
    handle.remove()
    torch.testing.assert_close(with_pads[:, :7], alone, atol=1e-5, rtol=1e-5)
    assert torch.all(patterns[0][..., 7:] == 0)
    assert torch.all(patterns[0][..., :7] > 0)  # bidirectional: every real token sees every real token


def test_encoder_is_bidirectional_by_default():
    mask = build_mask(4, 4, causal=False)
    assert mask is None
    enc = _spread(Encoder(tiny(n_kv_heads=4)))
    tokens = torch.randint(0, 61, (1, 6))
    with torch.no_grad():
        a = enc(tokens)
        changed = tokens.clone()
        changed[0, 5] = (changed[0, 5] + 1) % 61
        b = enc(changed)
    assert (a[0, 0] - b[0, 0]).abs().max() > 1e-4  # the first token sees the last one


# --- config -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,message", [
    (dict(d_model=50, n_heads=4), "divisible by n_heads"),
    (dict(n_heads=4, n_kv_heads=3), "divisible by n_kv_heads"),
    (dict(d_model=36, n_heads=12), "must be even"),
    (dict(vocab_size=0), "vocab_size must be a positive integer"),
    (dict(n_layers=-1), "n_layers"),
    (dict(n_kv_heads=0), "n_kv_heads"),
    (dict(d_ff=0), "d_ff"),
    (dict(rope_theta=1.0), "rope_theta"),
    (dict(norm_eps=0.0), "norm_eps"),
    (dict(attn_impl="flash"), "must be one of"),
    (dict(max_seq_len=2.5), "max_seq_len"),
])
def test_config_errors_say_what_to_change(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**kwargs)


def test_config_derived_fields_and_round_trips():
    cfg = ModelConfig(d_model=576, n_heads=9, n_kv_heads=3, d_ff=1536)
    assert cfg.head_dim == 64 and cfg.n_kv_groups == 3
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert ModelConfig.from_hf(cfg.to_hf()).to_dict() == {**cfg.to_dict(), "attn_impl": "sdpa", "tile_size": 64}
    assert ModelConfig(d_model=256).d_ff == 704  # 8/3 · 256 rounded up to a multiple of 64
    with pytest.raises(ValueError, match="Llama-family"):
        ModelConfig.from_hf({"model_type": "gpt2"})
    with pytest.raises(ValueError, match="RoPE scaling"):
        ModelConfig.from_hf({**cfg.to_hf(), "rope_parameters": {"rope_type": "yarn", "rope_theta": 5e5}})
