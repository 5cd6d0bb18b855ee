"""models.fast_decode.decode_step: the one-token path ``decode_one`` takes for a model prepared by ``optimize_for_decode``.

Checked against the modules' own forward (the teaching code, independent of the flat step): logits within float
rounding at every step, identical greedy tokens, the same KV cache contents; and never taken where it would skip
something (a hook, LoRA, int8, bf16, another attention implementation)."""
import copy

import numpy as np
import pytest
import torch
from torch import nn

from models import Decoder, generate, optimize_for_decode
from models.fast import FAST_DECODE
from models.fast_decode import can_decode_fast, decode_blas, decode_step
from models.generate import decode_one, prefill
from models.lora import attach_lora
from models.quant import quantize_int8
from tests.tiny_decoder import spread
from tests.tiny_decoder import tiny as tiny_config


def tiny(**kw):
    return tiny_config(**{"vocab_size": 97, "n_layers": 3, "n_heads": 6, **kw})


def _pair(config, seed=0):
    """(plain, prepared): the same weights, one as the tutorial builds it, one through optimize_for_decode."""
    torch.manual_seed(seed)
    plain = spread(Decoder(config), norms=True)
    return plain, optimize_for_decode(copy.deepcopy(plain))


def _step_by_step(model, prompt, n, *, fast: bool):
    """Greedy decoding by hand: logits of each step from decode_step (fast) or the model's forward."""
    cache = model.new_cache(prompt.shape[0], prompt.shape[1] + n)
    logits, steps, tokens = prefill(model, prompt, cache), [], []
    with torch.inference_mode():
        for i in range(n):
            tok = logits.argmax(-1, keepdim=True)  # (B, 1)
            tokens.append(tok)
            pos = prompt.shape[1] + i
            if fast:
                logits = decode_step(model, tok, cache, pos)
                assert logits is not None
            else:
                logits = model(tok, start_pos=pos, cache=cache, last_only=True)[:, -1]
            steps.append(logits)
    return torch.cat(tokens, 1), torch.stack(steps), cache


@pytest.mark.parametrize("batch", [1, 2], ids=["one-token-cpu-step", "batch-torch-step"])
@pytest.mark.parametrize("kw", [dict(), dict(n_kv_heads=6, tie_embeddings=False), dict(n_kv_heads=1)],
                         ids=["gqa-tied", "mha-untied", "mqa"])
def test_decode_step_matches_the_modules_forward(kw, batch):
    plain, fast = _pair(tiny(**kw))
    assert can_decode_fast(fast) and not can_decode_fast(plain)
    prompt = torch.randint(0, 97, (batch, 7), generator=torch.Generator().manual_seed(1))
    ref_tokens, ref_logits, ref_cache = _step_by_step(plain, prompt, 20, fast=False)
    tokens, logits, cache = _step_by_step(fast, prompt, 20, fast=True)
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    assert logits.abs().max() > 1  # logits of a spread model, not a degenerate zero
    for layer in range(plain.config.n_layers):  # the KV-cache views see the same keys and values
        torch.testing.assert_close(cache.k[layer], ref_cache.k[layer], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(cache.v[layer], ref_cache.v[layer], atol=1e-5, rtol=1e-5)
    assert cache.length == ref_cache.length
    assert torch.equal(generate(fast, prompt, 24), generate(plain, prompt, 24))
    assert torch.equal(generate(fast, prompt, 24), generate(fast, prompt, 24, use_cache=False))


@pytest.mark.slow
def test_decode_step_on_the_shipped_default_model():
    from explorer.state import session

    model, tokenizer = session.load_default()  # the app's copy, prepared by optimize_for_decode
    assert can_decode_fast(model)
    plain = copy.deepcopy(model)
    delattr(plain, FAST_DECODE)
    assert not can_decode_fast(plain)
    prompt = torch.tensor([tokenizer("Once upon a time, there was a little girl named Lily.")["input_ids"]])
    ref_tokens, ref_logits, _ = _step_by_step(plain, prompt, 48, fast=False)
    tokens, logits, _ = _step_by_step(model, prompt, 48, fast=True)
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=1e-5)
    assert torch.equal(generate(model, prompt, 48), generate(plain, prompt, 48))


def test_a_hook_anywhere_sends_decoding_through_the_modules():
    _, fast = _pair(tiny())
    prompt = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(2))
    for where in (fast.blocks[1].attn.hook_pattern, fast.blocks[2].mlp.hook_post, fast.norm.hook_scale,
                  fast.blocks[0], fast.lm_head, fast):
        seen = []
        handle = where.register_forward_hook(lambda m, i, o: seen.append(1))
        try:
            assert not can_decode_fast(fast)
            cache = fast.new_cache(1, 8)
            prefill(fast, prompt, cache)
            n = len(seen)
            decode_one(fast, prompt[:, :1], cache, 5)
            assert len(seen) > n, f"the decode step skipped the hook on {type(where).__name__}"
        finally:
            handle.remove()
        assert can_decode_fast(fast)
    handle = fast.blocks[0].attn.register_forward_pre_hook(lambda m, a: None)
    assert not can_decode_fast(fast)
    handle.remove()
    handle = nn.modules.module.register_module_forward_hook(lambda m, i, o: None)  # a global hook
    try:
        assert not can_decode_fast(fast)
    finally:
        handle.remove()
    assert can_decode_fast(fast)


def test_lora_int8_bf16_and_other_attention_implementations_take_the_modules_path():
    plain, fast = _pair(tiny())
    prompt = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(3))

    lora = copy.deepcopy(fast)
    assert can_decode_fast(lora)  # a "yes" kept on the model: attaching LoRA afterwards must still be seen
    attach_lora(lora, rank=2)
    assert not can_decode_fast(lora)
    with torch.no_grad():
        for m in lora.modules():
            if hasattr(m, "lora_B"):
                m.lora_B.normal_(0, 0.3)  # a trained adapter: it changes the output
    ref = lora(torch.cat([prompt, generate(lora, prompt, 1)[:, -1:]], 1))[:, -1]
    cache = lora.new_cache(1, 8)
    prefill(lora, prompt, cache)
    torch.testing.assert_close(decode_one(lora, generate(lora, prompt, 1)[:, -1:], cache, 6), ref,
                               atol=1e-5, rtol=1e-5)  # the adapter's contribution is in the decode step

    int8, _ = quantize_int8(fast)
    assert not can_decode_fast(int8)
    assert not can_decode_fast(copy.deepcopy(fast).to(torch.bfloat16))
    for impl in ("naive", "tiled"):
        assert not can_decode_fast(copy.deepcopy(fast).set_attn_impl(impl))
    assert can_decode_fast(copy.deepcopy(fast)) and can_decode_fast(copy.deepcopy(fast).to(torch.float32))
    assert decode_step(fast, prompt[:, :2], fast.new_cache(1, 8), 0) is None  # two tokens: the model's forward


@pytest.mark.parametrize("head_dim", [8, 32, 64])
def test_the_rope_matrix_rotates_as_apply_rope_does(head_dim):
    from models.rope import rope_matrix
    from models.rope import apply_rope, rope_tables

    cos, sin = rope_tables(64, head_dim, 10000.0)
    x = torch.randn(3, 5, 1, head_dim)
    for pos in (0, 1, 7, 63):
        c, s = cos[pos:pos + 1], sin[pos:pos + 1]
        R = rope_matrix(c, s)
        assert R.shape == (head_dim, head_dim) and int((R != 0).sum()) <= 2 * head_dim  # two coefficients a column
        torch.testing.assert_close(x @ R, apply_rope(x, c, s), atol=1e-6, rtol=1e-6)


def test_qkv_and_gate_up_lie_side_by_side_and_a_copy_is_laid_out_again():
    from models.fast import fused, prepared_copy

    plain, prepared = _pair(tiny())
    attn, mlp = prepared.blocks[0].attn, prepared.blocks[0].mlp
    qkv = fused(attn.q_proj, attn.k_proj, attn.v_proj)
    assert qkv is not None and fused(mlp.gate_proj, mlp.up_proj) is not None
    # the side-by-side matrix is the three weights' transposes, in order, and the weights kept their values
    want = torch.cat([lin.weight.t() for lin in (attn.q_proj, attn.k_proj, attn.v_proj)], 1)
    assert torch.equal(qkv, want)
    assert torch.equal(attn.q_proj.weight, plain.blocks[0].attn.q_proj.weight)
    # a deepcopy clones each parameter (contiguous): no longer side by side, and decode_step still agrees
    copied = copy.deepcopy(prepared)
    assert fused(copied.blocks[0].attn.q_proj, copied.blocks[0].attn.k_proj, copied.blocks[0].attn.v_proj) is None
    prompt = torch.tensor([[1, 5, 9, 2]])
    a = _step_by_step(copied, prompt, 4, fast=True)[1]
    b = _step_by_step(prepared, prompt, 4, fast=True)[1]
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    again = prepared_copy(prepared)
    assert fused(again.blocks[0].attn.q_proj, again.blocks[0].attn.k_proj, again.blocks[0].attn.v_proj) is not None
    assert fused(plain.blocks[0].mlp.gate_proj, plain.blocks[0].mlp.up_proj) is None  # plain: never laid out
    assert optimize_for_decode(again) is again and fused(again.blocks[0].mlp.gate_proj,
                                                         again.blocks[0].mlp.up_proj) is not None
    cast = prepared_copy(prepared, torch.bfloat16)  # laid out after the cast, which alone would undo it
    assert cast.blocks[0].attn.q_proj.weight.dtype == torch.bfloat16
    assert fused(cast.blocks[0].attn.q_proj, cast.blocks[0].attn.k_proj, cast.blocks[0].attn.v_proj) is not None
    assert torch.equal(cast.blocks[0].mlp.up_proj.weight, prepared.blocks[0].mlp.up_proj.weight.bfloat16())
    assert prepared.blocks[0].attn.q_proj.weight.dtype == torch.float32  # the original untouched


def test_optimize_for_decode_leaves_int8_and_lora_layers_as_they_are():
    plain, _ = _pair(tiny())
    q = quantize_int8(copy.deepcopy(plain))[0]
    assert optimize_for_decode(q) is q
    lora = copy.deepcopy(plain)
    attach_lora(lora, rank=2)
    assert optimize_for_decode(lora) is lora


def test_each_librarys_products_are_the_same_products_on_the_same_memory():
    from models.fast_cpu import NUMPY_PRODUCTS, TORCH_PRODUCTS, Vec

    g = torch.Generator().manual_seed(3)
    h = Vec.empty(24)
    h.t.copy_(torch.randn(24, generator=g))
    w = torch.randn(40, 24, generator=g, requires_grad=True)  # (out, in), as nn.Linear holds it
    want = (w.detach().double() @ h.t.double()).float()  # float64 reference
    for layout in (w.detach(), w.detach().t().contiguous().t()):  # (out, in) memory, and (in, out) memory viewed
        for products in (TORCH_PRODUCTS, NUMPY_PRODUCTS):
            out = Vec.empty(40)
            out.a[:] = np.nan  # never read: the product overwrites it
            products.mv(layout, h, out, 1.0)
            torch.testing.assert_close(out.t, want, atol=1e-5, rtol=1e-5)
            products.mv(layout, h, out, -0.5)  # the scale RMSNorm passes in
            torch.testing.assert_close(out.t, -0.5 * want, atol=1e-5, rtol=1e-5)
            x = Vec.empty(40)
            x.t.copy_(torch.randn(40, generator=g))
            before = x.t.clone()
            assert products.mv_add(x, layout, h) is None
            torch.testing.assert_close(x.t, before + want, atol=1e-5, rtol=1e-5)  # the residual, in place
            assert np.shares_memory(x.a, x.t.numpy())
    side = torch.randn(60, 24, generator=g)
    for products in (TORCH_PRODUCTS, NUMPY_PRODUCTS):  # a slice of a side-by-side matrix, read in place; a slice of out
        out = Vec.empty(50)
        products.mv(side[10:30], h, out.part(5, 25), 2.0)
        torch.testing.assert_close(out.t[5:25], 2.0 * (side[10:30] @ h.t), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("library", ["torch", "numpy"])
def test_the_cpu_step_agrees_with_the_modules_with_either_library_and_puts_the_thread_count_back(monkeypatch,
                                                                                                  library):
    import models.fast_cpu as fast_cpu

    plain, prepared = _pair(tiny())
    prompt = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(2))
    monkeypatch.setattr(fast_cpu, "DECODE_BLAS", library)
    threads = torch.get_num_threads()
    seen, real = [], fast_cpu._cpu_step
    monkeypatch.setattr(fast_cpu, "_cpu_step", lambda *a: seen.append((a[-1].name, torch.get_num_threads())) or real(*a))
    tokens, logits, cache = _step_by_step(prepared, prompt, 12, fast=True)
    assert {name for name, _ in seen} == {library} and len(seen) == 12
    assert {n for _, n in seen} == ({1} if library == "numpy" else {threads})  # OpenBLAS brings its own threads
    assert torch.get_num_threads() == threads
    ref_tokens, ref_logits, ref_cache = _step_by_step(plain, prompt, 12, fast=False)
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    for layer in range(plain.config.n_layers):
        torch.testing.assert_close(cache.k[layer], ref_cache.k[layer], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(cache.v[layer], ref_cache.v[layer], atol=1e-5, rtol=1e-5)
    assert cache.length == ref_cache.length
    assert decode_blas(prepared).startswith(library)


def test_the_library_is_measured_once_per_model_shape(monkeypatch):
    import models.fast_cpu as fast_cpu

    monkeypatch.setattr(fast_cpu, "DECODE_BLAS", "auto")
    monkeypatch.setattr(fast_cpu, "_CHOSEN", {})
    calls = []
    real = fast_cpu._measure_products
    monkeypatch.setattr(fast_cpu, "_measure_products", lambda plan: calls.append(plan) or real(plan))
    _, a = _pair(tiny())
    _, b = _pair(tiny(), seed=1)  # the same shape
    _, c = _pair(tiny(n_layers=2))
    chosen = fast_cpu.cpu_products(a)
    assert chosen in (fast_cpu.TORCH_PRODUCTS, fast_cpu.NUMPY_PRODUCTS)
    assert fast_cpu.cpu_products(b) is chosen and fast_cpu.cpu_products(a) is chosen
    fast_cpu.cpu_products(c)
    assert len(calls) == 2
    monkeypatch.setattr(fast_cpu, "DECODE_BLAS", "numpy")  # EXPLORER_DECODE_BLAS decides without measuring
    assert fast_cpu.cpu_products(a) is fast_cpu.NUMPY_PRODUCTS and len(calls) == 2


def test_the_cpu_steps_views_follow_the_weights():
    """The CPU step reads the modules' memory through views kept beside the model: values changed in place are
    seen at once, replaced storage (``.data =``, a new parameter) makes the views again, a deepcopy gets its own."""
    import models.fast_cpu as fast_cpu

    plain, prepared = _pair(tiny())
    prompt = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(4))

    def agree():
        a = _step_by_step(prepared, prompt, 3, fast=True)[1]
        b = _step_by_step(plain, prompt, 3, fast=False)[1]
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)

    other = spread(Decoder(plain.config), norms=True)  # built first: building registers modules, which redoes a plan
    agree()
    plan = fast_cpu.weights_plan(prepared)
    assert fast_cpu.weights_plan(prepared) is plan  # kept while nothing changed
    plain.load_state_dict(other.state_dict())
    prepared.load_state_dict(other.state_dict())  # copy_ into the same memory: the views see it
    assert fast_cpu.weights_plan(prepared) is plan
    agree()
    with torch.no_grad():
        for model in (plain, prepared):
            model.blocks[1].mlp.down_proj.weight.data = model.blocks[1].mlp.down_proj.weight.data * 1.5
            model.blocks[0].input_layernorm.weight = nn.Parameter(model.blocks[0].input_layernorm.weight * -2)
    assert fast_cpu.weights_plan(prepared) is not plan
    agree()
    copied = copy.deepcopy(prepared)
    assert copied not in fast_cpu._PLANS  # views are not copied with the model
    torch.testing.assert_close(_step_by_step(copied, prompt, 3, fast=True)[1],
                               _step_by_step(plain, prompt, 3, fast=False)[1], atol=1e-5, rtol=1e-5)


def test_a_swapped_or_removed_module_is_seen_without_walking_the_model():
    import models.fast_cpu as fast_cpu

    _, prepared = _pair(tiny())
    assert can_decode_fast(prepared)
    with torch.no_grad():
        old = prepared.blocks[2].attn.o_proj
        prepared.blocks[2].attn.o_proj = nn.Linear(old.in_features, old.out_features, bias=True)
    assert not can_decode_fast(prepared)  # a bias the flat step would skip
    prepared.blocks[2].attn.o_proj = old
    assert can_decode_fast(prepared)
    del prepared.blocks[2]
    prepared.config.n_layers = 2  # keep the model consistent: two blocks now
    assert can_decode_fast(prepared)
    assert len(fast_cpu.weights_plan(prepared).layers) == 2
