"""models.speed's weight layout and CPU step: the RoPE matrix, q/k/v and gate/up side by side, each matrix library's
products on the same memory, the library measured once per shape, the step's views of the weights and the cache,
what the step remembers, and the torch step's reads; checked against the modules' own forward, as in
tests/test_speed.py."""
import copy
import gc

import numpy as np
import pytest
import torch
from torch import nn

from models import Decoder, generate
from models.generate import decode_one, prefill
from models.lora import attach_lora
from models.quant import quantize_int8
from models.speed import decode_blas, fast_step, optimize_for_decode, torch_step, why_not
from models.speed.layout import LAID_OUT
from tests.speed_pair import _Counted, _pair, _step_by_step, tiny
from tests.tiny_decoder import spread


@pytest.mark.parametrize("head_dim", [8, 32, 64])
def test_the_rope_matrix_rotates_as_apply_rope_does(head_dim):
    from models.rope import apply_rope, rope_matrix, rope_tables

    cos, sin = rope_tables(64, head_dim, 10000.0)
    x = torch.randn(3, 5, 1, head_dim)
    for pos in (0, 1, 7, 63):
        c, s = cos[pos:pos + 1], sin[pos:pos + 1]
        R = rope_matrix(c, s)
        assert R.shape == (head_dim, head_dim) and int((R != 0).sum()) <= 2 * head_dim  # two coefficients a column
        torch.testing.assert_close(x @ R, apply_rope(x, c, s), atol=1e-6, rtol=1e-6)


def test_qkv_and_gate_up_lie_side_by_side_and_a_copy_is_laid_out_again():
    from models.speed import fused, prepared_copy

    plain, prepared = _pair(tiny())
    attn, mlp = prepared.blocks[0].attn, prepared.blocks[0].mlp
    qkv = fused(attn.q_proj, attn.k_proj, attn.v_proj)
    assert qkv is not None and fused(mlp.gate_proj, mlp.up_proj) is not None
    # the side-by-side matrix is the three weights' transposes, in order, and the weights kept their values
    want = torch.cat([lin.weight.t() for lin in (attn.q_proj, attn.k_proj, attn.v_proj)], 1)
    assert torch.equal(qkv, want)
    assert torch.equal(attn.q_proj.weight, plain.blocks[0].attn.q_proj.weight)
    # a deepcopy clones each parameter (contiguous): no longer side by side, and the fast step still agrees
    copied = copy.deepcopy(prepared)
    assert fused(copied.blocks[0].attn.q_proj, copied.blocks[0].attn.k_proj, copied.blocks[0].attn.v_proj) is None
    prompt = torch.tensor([[1, 5, 9, 2]])
    a = _step_by_step(copied, prompt, 4, step=fast_step)[1]
    b = _step_by_step(prepared, prompt, 4, step=fast_step)[1]
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
    assert getattr(again, LAID_OUT) and not hasattr(plain, LAID_OUT)
    assert not hasattr(prepared_copy(plain), LAID_OUT)  # a copy of a plain model stays plain


def test_optimize_for_decode_leaves_int8_and_lora_layers_as_they_are():
    plain, _ = _pair(tiny())
    q = quantize_int8(copy.deepcopy(plain))[0]
    assert optimize_for_decode(q) is q
    lora = copy.deepcopy(plain)
    attach_lora(lora, rank=2)
    assert optimize_for_decode(lora) is lora


def test_each_librarys_products_are_the_same_products_on_the_same_memory():
    from models.speed.cpu import NUMPY_PRODUCTS, TORCH_PRODUCTS, Vec

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
    import models.speed.cpu as cpu

    plain, prepared = _pair(tiny())
    prompt = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(2))
    monkeypatch.setattr(cpu, "DECODE_BLAS", library)
    threads = torch.get_num_threads()
    seen, real = [], cpu._cpu_step
    monkeypatch.setattr(cpu, "_cpu_step", lambda *a: seen.append((a[-1].name, torch.get_num_threads())) or real(*a))
    tokens, logits, cache = _step_by_step(prepared, prompt, 12, step=fast_step)
    assert {name for name, _ in seen} == {library} and len(seen) == 12
    assert {n for _, n in seen} == ({1} if library == "numpy" else {threads})  # OpenBLAS brings its own threads
    assert torch.get_num_threads() == threads
    ref_tokens, ref_logits, ref_cache = _step_by_step(plain, prompt, 12)
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    for layer in range(plain.config.n_layers):
        torch.testing.assert_close(cache.k[layer], ref_cache.k[layer], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(cache.v[layer], ref_cache.v[layer], atol=1e-5, rtol=1e-5)
    assert cache.length == ref_cache.length
    assert decode_blas(prepared).startswith(library)
    seen.clear()
    _step_by_step(prepared, prompt, 3, step=torch_step)  # the torch step never takes the numpy one
    assert seen == []


def test_the_library_is_measured_once_per_model_shape_and_the_memo_is_bounded(monkeypatch):
    import models.speed.cpu as cpu

    monkeypatch.setattr(cpu, "DECODE_BLAS", "auto")
    monkeypatch.setattr(cpu, "_CHOSEN", {})
    calls = []
    real = cpu._measure_products
    monkeypatch.setattr(cpu, "_measure_products", lambda plan: calls.append(plan) or real(plan))
    _, a = _pair(tiny())
    _, b = _pair(tiny(), seed=1)  # the same shape
    _, c = _pair(tiny(n_layers=2))
    chosen = cpu.cpu_products(a)
    assert chosen in (cpu.TORCH_PRODUCTS, cpu.NUMPY_PRODUCTS)
    assert cpu.cpu_products(b) is chosen and cpu.cpu_products(a) is chosen
    cpu.cpu_products(c)
    assert len(calls) == 2
    monkeypatch.setattr(cpu, "DECODE_BLAS", "numpy")  # EXPLORER_DECODE_BLAS decides without measuring
    assert cpu.cpu_products(a) is cpu.NUMPY_PRODUCTS and len(calls) == 2
    monkeypatch.setattr(cpu, "DECODE_BLAS", "auto")
    monkeypatch.setattr(cpu, "_measure_products", lambda plan: cpu.TORCH_PRODUCTS)
    for vocab in range(100, 100 + 2 * cpu._CHOSEN_MAX):
        cpu.cpu_products(Decoder(tiny(vocab_size=vocab, n_layers=1)))
    assert len(cpu._CHOSEN) == cpu._CHOSEN_MAX


def test_the_cpu_steps_views_follow_the_weights():
    """The CPU step reads the modules' memory through views made once per generation: values changed in place are
    seen at once, replaced storage (``.data =``, a new parameter) is seen at the next generation (and ``.data =``
    at the next step), a deepcopy gets its own."""
    plain, prepared = _pair(tiny())
    prompt = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(4))

    def agree():
        a = _step_by_step(prepared, prompt, 3, step=fast_step)[1]
        b = _step_by_step(plain, prompt, 3)[1]
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)

    other = spread(Decoder(plain.config), norms=True)
    agree()
    plain.load_state_dict(other.state_dict())
    prepared.load_state_dict(other.state_dict())  # copy_ into the same memory: the views see it
    agree()
    with torch.no_grad():
        for model in (plain, prepared):
            model.blocks[1].mlp.down_proj.weight.data = model.blocks[1].mlp.down_proj.weight.data * 1.5
            model.blocks[0].input_layernorm.weight = nn.Parameter(model.blocks[0].input_layernorm.weight * -2)
    agree()
    copied = copy.deepcopy(prepared)
    torch.testing.assert_close(_step_by_step(copied, prompt, 3, step=fast_step)[1],
                               _step_by_step(plain, prompt, 3)[1], atol=1e-5, rtol=1e-5)
    # .data replaced during a generation: the step makes its views again before the next token
    cache = prepared.new_cache(1, 10)
    ref_cache = plain.new_cache(1, 10)
    with torch.inference_mode():
        prefill(prepared, prompt, cache), prefill(plain, prompt, ref_cache)
        fast_step(prepared, prompt[:, :1], cache, 6)
        plain(prompt[:, :1], start_pos=6, cache=ref_cache)
        for model in (plain, prepared):
            model.blocks[2].attn.o_proj.weight.data = model.blocks[2].attn.o_proj.weight.data * 0.25
        got = fast_step(prepared, prompt[:, 1:2], cache, 7)
        want = plain(prompt[:, 1:2], start_pos=7, cache=ref_cache, last_only=True)[:, -1]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_the_cpu_step_reads_the_caches_own_tensors_even_when_one_is_replaced():
    """The CPU step keeps numpy arrays of a cache's tensors for the whole generation; a layer's keys or values
    replaced by a new tensor (its contents changed) are read from the new tensor at the next step."""
    plain, prepared = _pair(tiny())
    prompt = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(9))
    cache, ref_cache = prepared.new_cache(1, 10), plain.new_cache(1, 10)
    with torch.inference_mode():
        prefill(prepared, prompt, cache), prefill(plain, prompt, ref_cache)
        for pos, replace in ((6, False), (7, True), (8, False)):
            if replace:
                for c in (cache, ref_cache):
                    c.k[1], c.v[2] = c.k[1] * 0.5, c.v[2].flip(2).contiguous()
            got = fast_step(prepared, prompt[:, pos - 6:pos - 5], cache, pos)
            want = plain(prompt[:, pos - 6:pos - 5], start_pos=pos, cache=ref_cache, last_only=True)[:, -1]
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for layer in range(3):
        torch.testing.assert_close(cache.k[layer], ref_cache.k[layer], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(cache.v[layer], ref_cache.v[layer], atol=1e-5, rtol=1e-5)


def test_a_swapped_or_removed_module_is_seen():
    _, prepared = _pair(tiny())
    assert why_not(prepared) is None
    with torch.no_grad():
        old = prepared.blocks[2].attn.o_proj
        prepared.blocks[2].attn.o_proj = nn.Linear(old.in_features, old.out_features, bias=True)
    assert why_not(prepared) is not None  # a bias the flat step would skip
    prepared.blocks[2].attn.o_proj = old
    assert why_not(prepared) is None
    del prepared.blocks[2]
    assert why_not(prepared) is not None  # two blocks, a config of three
    prepared.config.n_layers = 2  # keep the model consistent: two blocks now
    assert why_not(prepared) is None
    prompt = torch.randint(0, 97, (1, 4), generator=torch.Generator().manual_seed(7))
    counted = _Counted(fast_step)
    assert torch.equal(generate(prepared, prompt, 6, step=counted), generate(prepared, prompt, 6))
    assert counted.ran == 5


def test_the_step_remembers_a_bounded_number_of_generations():
    _, model = _pair(tiny())
    prompt = torch.randint(0, 97, (1, 4), generator=torch.Generator().manual_seed(8))
    caches = []
    for _ in range(fast_step._MAX_RUNS + 10):  # caches kept alive: the memo still stays bounded
        cache = model.new_cache(1, 6)
        with torch.inference_mode():
            prefill(model, prompt, cache)
            assert fast_step(model, prompt[:, :1], cache, 4) is not None
        caches.append(cache)
    assert len(fast_step._runs) <= fast_step._MAX_RUNS
    caches.clear()
    del cache
    gc.collect()
    assert len(fast_step._runs) == 0  # a generation's entry goes with its cache


def test_the_torch_step_reads_nothing_from_the_device_and_autograd_runs_the_modules():
    from tests.test_models import _HostReads

    _, model = _pair(tiny())
    prompt = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(9))
    cache = model.new_cache(2, 8)
    with torch.inference_mode():
        prefill(model, prompt, cache)
        fast_step(model, prompt[:, :1], cache, 5)  # the first step of a generation checks the model
        with _HostReads() as mode:
            assert fast_step(model, prompt[:, :1], cache, 6) is not None  # a batch: the torch step
    assert mode.count == 0
    trainable = copy.deepcopy(model)  # parameters that require grad, autograd on: the modules record the graph
    cache = trainable.new_cache(1, 8)
    with torch.no_grad():
        prefill(trainable, prompt[:1], cache)
    logits = decode_one(trainable, prompt[:1, :1], cache, 5, fast_step)
    assert logits.requires_grad
    with torch.no_grad():
        assert fast_step(trainable, prompt[:1, :1], cache, 6) is not None
