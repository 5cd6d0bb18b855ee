"""The fast step on an int8 model (models/speed/narrow.py's kernel): its products against float64, its logits and
tokens against the modules' int8 path (``models.quant.Int8Linear``, the readable reference), and when it steps aside.

The kernel is built by the machine's C compiler the first time a process needs it and kept on disk, so only the
test that forces a fresh build is slow; without a compiler these tests skip, saying so."""
import copy
import ctypes
import os
import threading
import time

import pytest
import torch

from models.generate import generate
from models.block import PROJECTIONS
from models.quant import INT8_TARGETS, Int8Linear, quantize_int8
from models.speed import cpu, decode_layout, fast_step, narrow, torch_step, why_not
from models.speed.cpu import weights_plan
from tests.speed_pair import _Counted, _pair, _step_by_step, tiny

pytestmark = pytest.mark.usefixtures("one_thread")
# fp32 additions in another order: the step's logits differ from the modules' by rounding, never by more than this
# fraction of the largest logit (measured: under 2e-6 on these models)
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def kernel():
    reason = narrow.unavailable()
    if reason is not None:
        pytest.skip(reason)


# quantize_int8's default copy of a model with an LM head of its own and of one tied to the embedding (the copy
# unties it: the head int8, the embedding fp32), and a copy quantised without its head (the head fp32, torch's)
HEADS = {"untied": (False, INT8_TARGETS), "tied": (True, INT8_TARGETS), "fp32 head": (True, PROJECTIONS)}


@pytest.fixture(scope="module", params=list(HEADS))
def int8_model(request):
    tie, targets = HEADS[request.param]
    # widths off the kernel's 32-wide loop: its tail runs too
    plain, _ = _pair(tiny(d_model=72, d_ff=136, tie_embeddings=tie), seed=3)
    for p in plain.parameters():
        p.requires_grad_(False)
    return plain, quantize_int8(plain, targets)[0]


@pytest.mark.parametrize("rows,cols", [(5, 7), (64, 96), (33, 200)])
def test_gemv_int8_is_the_dequantised_product(kernel, rows, cols):
    torch.manual_seed(rows)
    w = narrow.Int8Weight(torch.randint(-127, 128, (rows, cols), dtype=torch.int8), torch.rand(rows) + 0.01)
    x, out = torch.randn(cols), torch.randn(rows)
    ref = (w.scale.double()[:, None] * w.q.double()) @ x.double()  # float64, independent of the kernel
    start = out.clone()
    narrow.gemv_int8(w, x, out, 0.5, accumulate=True)
    assert torch.allclose(out.double(), start.double() + 0.5 * ref, rtol=1e-5, atol=1e-5 * ref.abs().max())
    narrow.gemv_int8(w, x, out)
    assert torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max())
    with pytest.raises(ValueError, match="contiguous"):
        narrow.gemv_int8(w, torch.randn(cols + 1), out)


@pytest.fixture
def threads():
    """torch's thread count set to ``n`` inside the test (the kernel's helpers follow it), put back after."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def _large(rows=4000, cols=256, seed=0):
    """A weight over the kernel's sharing threshold (64K weights): its rows are handed out in chunks."""
    torch.manual_seed(seed)
    return narrow.Int8Weight(torch.randint(-127, 128, (rows, cols), dtype=torch.int8), torch.rand(rows) + 0.01)


def test_shared_rows_give_the_same_bits_as_one_thread(kernel, threads):
    w = _large()
    x, start = torch.randn(w.shape[1]), torch.randn(w.shape[0])
    ref = (w.scale.double()[:, None] * w.q.double()) @ x.double()
    threads(1)
    alone, alone_acc = torch.empty(w.shape[0]), start.clone()
    narrow.gemv_int8(w, x, alone, 0.25)
    narrow.gemv_int8(w, x, alone_acc, 0.25, accumulate=True)
    assert torch.allclose(alone.double(), 0.25 * ref, rtol=1e-5, atol=1e-5 * ref.abs().max())
    threads(3)  # two helpers: more threads than this machine may have cores, as on a busy one
    helped, calls = narrow.helped_chunks(), 0
    while calls < 200 or (narrow.helped_chunks() == helped and calls < 20000):  # until a helper took part
        out, acc = torch.full_like(alone, float("nan")), start.clone()
        narrow.gemv_int8(w, x, out, 0.25)
        narrow.gemv_int8(w, x, acc, 0.25, accumulate=True)
        assert torch.equal(out, alone) and torch.equal(acc, alone_acc)
        calls += 1
    assert narrow.helped_chunks() > helped, "no helper thread computed any rows"


def test_two_callers_at_once_are_both_right(kernel, threads):
    threads(2)
    q = _large(seed=2)
    expected = torch.empty(q.shape[0])
    narrow.gemv_int8(q, torch.ones(q.shape[1]), expected)
    failures = []

    def caller(seed):  # ctypes lets go of the GIL: the two callers run the kernel at the same time
        xs = torch.ones(q.shape[1])
        for _ in range(100):
            got = torch.empty(q.shape[0])
            narrow.gemv_int8(q, xs, got)
            failures.extend([seed] if not torch.equal(got, expected) else [])

    workers = [threading.Thread(target=caller, args=(i,)) for i in range(2)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert failures == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this system")
def test_a_forked_child_computes_without_its_parents_helpers(kernel, threads):
    w = _large(seed=4)
    x = torch.randn(w.shape[1])
    threads(2)
    want = torch.empty(w.shape[0])
    narrow.gemv_int8(w, x, want)  # the parent's helper thread exists from here on
    pid = os.fork()
    if pid == 0:  # the child: the same product, which would hang if it waited for a helper it does not have
        got = torch.empty(w.shape[0])
        narrow.gemv_int8(w, x, got)
        os._exit(0 if torch.equal(got, want) else 1)
    for _ in range(3000):  # at most 30 s: a child that hangs fails the test instead of stopping the suite
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child did not finish its product")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_fast_step_on_int8_equals_the_modules(kernel, int8_model):
    plain, q = int8_model
    assert why_not(q) is None and isinstance(q.blocks[0].attn.q_proj, Int8Linear)
    int8_head = isinstance(q.lm_head, Int8Linear)
    assert isinstance(decode_layout(q).lm_head, narrow.Int8Weight) == int8_head  # the head's product: the kernel's
    # the embedding's lookups read its own fp32 table, the one the fp32 model holds
    table = q.embed_tokens.weight
    assert table.dtype == torch.float32 and torch.equal(table, plain.embed_tokens.weight)
    prompt = torch.tensor([[1, 5, 9, 2, 7]])
    counted = _Counted(fast_step)
    tokens, logits, cache = _step_by_step(q, prompt, 12, step=counted)
    ref_tokens, ref_logits, ref_cache = _step_by_step(q, prompt, 12)
    assert counted.ran == 12 and counted.aside == 0
    assert torch.equal(tokens, ref_tokens)
    assert (logits - ref_logits).abs().max() <= TOLERANCE * ref_logits.abs().max()
    assert torch.allclose(cache.k[0], ref_cache.k[0], atol=1e-5) and cache.length == ref_cache.length
    assert torch.equal(generate(q, prompt, 12, step=fast_step), generate(q, prompt, 12))


# kernels/layers.c's one call for every block, on grouped-query (6 query heads, 2 key/value heads) and multi-head
# attention, a head tied to the embedding and one of its own; d_model 120 (head dim 20) and d_ff 136 are off the
# kernels' 16- and 32-wide loops, so their tails run too
SHAPES = {"gqa tied": dict(n_kv_heads=2, tie_embeddings=True), "gqa untied": dict(n_kv_heads=2, tie_embeddings=False),
          "mha tied": dict(n_kv_heads=6, tie_embeddings=True), "mha untied": dict(n_kv_heads=6, tie_embeddings=False)}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_c_layers_equal_the_modules(kernel, shape, monkeypatch):
    plain, _ = _pair(tiny(d_model=120, d_ff=136, **SHAPES[shape]), seed=5)
    q = quantize_int8(plain, INT8_TARGETS)[0]
    assert weights_plan(q).int8 is not None  # the C step is the one that runs here, not _cpu_step's numpy
    calls = []
    monkeypatch.setattr(cpu, "int8_layers_at", lambda *a: calls.append(a) or narrow.int8_layers_at(*a))
    prompt = torch.tensor([[1, 5, 9, 2, 7, 7, 3]])
    tokens, logits, cache = _step_by_step(q, prompt, 16, step=fast_step)
    ref_tokens, ref_logits, ref_cache = _step_by_step(q, prompt, 16)
    assert len(calls) == 16 and torch.equal(tokens, ref_tokens)
    assert (logits - ref_logits).abs().max() <= TOLERANCE * ref_logits.abs().max()
    assert cache.length == ref_cache.length
    for got, want in zip(cache.k + cache.v, ref_cache.k + ref_cache.v):  # every layer's keys and values
        assert (got - want).abs().max() <= TOLERANCE * want.abs().max()


def test_without_the_c_layers_the_numpy_step_runs(kernel, int8_model, monkeypatch):
    """Where kernels/layers.c cannot run (``_Plan.int8`` None) the int8 step is _cpu_step's numpy between products."""
    _, q = int8_model
    q = copy.deepcopy(q)  # a model of its own: its plan is made here, with the table left out
    monkeypatch.setattr(cpu, "_int8_table", lambda *a: None)
    monkeypatch.setattr(cpu, "int8_layers_at", None)  # would fail if called
    prompt = torch.tensor([[4, 8, 1]])
    tokens, logits, _ = _step_by_step(q, prompt, 6, step=fast_step)
    ref_tokens, ref_logits, _ = _step_by_step(q, prompt, 6)
    assert torch.equal(tokens, ref_tokens)
    assert (logits - ref_logits).abs().max() <= TOLERANCE * ref_logits.abs().max()


def test_a_cache_the_c_layers_cannot_address_goes_to_numpy(kernel, int8_model, monkeypatch):
    """kernels/layers.c writes by address: a strided cache, or a position past its end, is left to numpy's step."""
    _, q = int8_model
    plan = weights_plan(q)
    calls = []
    monkeypatch.setattr(cpu, "int8_layers_at", lambda *a: calls.append(a) or narrow.int8_layers_at(*a))
    strided = q.new_cache(1, 8)  # the same shape, each head's positions apart in memory
    strided.k, strided.v = ([t.transpose(2, 3).contiguous().transpose(2, 3) for t in ts]
                            for ts in (strided.k, strided.v))
    cache = q.new_cache(1, 8)
    with torch.inference_mode():
        for pos, token in enumerate([3, 1, 4, 1]):
            got = cpu.run_cpu_step(plan, token, cache, pos, cpu.INT8_PRODUCTS)
            want = cpu.run_cpu_step(plan, token, strided, pos, cpu.INT8_PRODUCTS)
            assert (got - want).abs().max() <= TOLERANCE * want.abs().max()
        assert len(calls) == 4  # the contiguous cache's steps only
        with pytest.raises(IndexError):
            cpu.run_cpu_step(plan, 0, cache, 8, cpu.INT8_PRODUCTS)
    assert len(calls) == 4


def test_int8_steps_aside_for_a_batch_and_the_torch_step(kernel, int8_model):
    _, q = int8_model
    prompt = torch.tensor([[1, 5, 9], [4, 4, 2]])
    counted = _Counted(fast_step)
    assert torch.equal(generate(q, prompt, 4, step=counted), generate(q, prompt, 4))
    assert counted.ran == 0 and counted.aside > 0
    counted = _Counted(torch_step)
    assert torch.equal(generate(q, prompt[:1], 4, step=counted), generate(q, prompt[:1], 4))
    assert counted.ran == 0


def test_an_int8_write_is_seen_and_a_bias_is_refused(kernel, int8_model):
    plain, q = int8_model
    q = copy.deepcopy(q)
    prompt = torch.tensor([[3, 1, 4]])
    before = generate(q, prompt, 6, step=fast_step)
    with torch.no_grad():
        q.blocks[0].mlp.down_proj.qweight.mul_(-1)  # an in-place write the step's stacked copy must notice
        q.blocks[0].attn.q_proj.scale.mul_(3)
    after = generate(q, prompt, 6, step=fast_step)
    assert torch.equal(after, generate(q, prompt, 6)) and not torch.equal(before, after)
    if isinstance(q.lm_head, Int8Linear):  # a replaced head (new memory, not a write) is seen too
        q.lm_head.qweight = q.lm_head.qweight.flip(0).contiguous()  # (V, C): every token's row moved
        again = generate(q, prompt, 6, step=fast_step)
        assert torch.equal(again, generate(q, prompt, 6)) and not torch.equal(again, after)
    biased = copy.deepcopy(q)
    layer = biased.blocks[1].attn.v_proj
    layer.bias = torch.zeros(layer.out_features)
    assert "bias" in why_not(biased)


def test_without_the_kernel_int8_runs_through_the_modules(int8_model, monkeypatch):
    _, q = int8_model
    monkeypatch.setattr(narrow, "_loaded", [(None, "EXPLORER_NARROW_KERNELS=off")])
    reason = why_not(q)
    assert reason is not None and "EXPLORER_NARROW_KERNELS=off" in reason
    counted = _Counted(fast_step)
    prompt = torch.tensor([[2, 7, 1]])
    assert torch.equal(generate(q, prompt, 4, step=counted), generate(q, prompt, 4)) and counted.ran == 0


@pytest.mark.slow
def test_the_kernel_builds_from_its_source(tmp_path, monkeypatch):
    """A fresh build into an empty cache folder (the C compiler runs as a second process)."""
    if narrow.unavailable() is not None:
        pytest.skip(narrow.unavailable())
    monkeypatch.setenv("EXPLORER_KERNEL_CACHE", str(tmp_path))
    lib, reason = narrow._build()
    assert reason is None and isinstance(lib, ctypes.CDLL)
    assert [p.suffix for p in tmp_path.iterdir()] == [".so"]
    w = narrow.Int8Weight(torch.tensor([[1, -2, 3]], dtype=torch.int8), torch.tensor([0.5]))
    x, out = torch.tensor([1.0, 1.0, 2.0]), torch.zeros(1)
    lib.gemv_i8(x.data_ptr(), w.q.data_ptr(), w.scale.data_ptr(), out.data_ptr(), 1, 3,
                1.0, 0, 1)
    assert out.item() == 2.5  # 0.5 * (1 - 2 + 6)
