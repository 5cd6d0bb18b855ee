"""The one-token decode step on the CPU: the matrix products in torch (or numpy's BLAS), everything between them
in numpy on the same memory. ``models.speed.step.FastStep`` sends one token here when the model and its cache are
on the CPU.

Between two products a step is a few dozen small operations on vectors of a few thousand numbers; a numpy call on
one costs about a microsecond, a torch kernel 5-10, so the rest is written in numpy and the products write into
buffers numpy reads in place (measurements: bench/notes/decode-step.md).

Notation: C model dim, H query heads, Hkv key/value heads, g = H / Hkv query heads per KV head, D head dim,
F feed-forward dim, S positions attended (the cache so far), V vocabulary.
"""
from __future__ import annotations

import math
import operator
import os
import time
from typing import Callable, NamedTuple

import numpy as np
import torch
from torch import nn

from ..kv_cache import KVCache
from ..rope import rope_matrix
from .layout import DecodeLayout, decode_layout, layout_current
from .narrow import Int8Weight, gemv_int8_at, int8_layers_at, unavailable

# Which library computes the CPU step's one-token matrix products: "auto" (measured once per model shape and thread
# count, see cpu_products), "torch" or "numpy". EXPLORER_DECODE_BLAS sets it for the process.
DECODE_BLAS = os.environ.get("EXPLORER_DECODE_BLAS", "auto").strip().lower() or "auto"


class _Layer(NamedTuple):
    """One block as ``_cpu_step`` reads it: the layout's matrices (``models.speed.layout.Layer``) and numpy views of
    the norms' own weights, nothing copied here."""
    norm1: np.ndarray  # (C,) input_layernorm.weight
    eps1: float
    qkv: torch.Tensor  # ((H + 2 Hkv) D, C): q, k, v rows stacked
    o: torch.Tensor  # (C, H D)
    norm2: np.ndarray  # (C,) post_attention_layernorm.weight
    eps2: float
    gate_up: torch.Tensor  # (2 F, C): gate, up rows stacked
    down: torch.Tensor  # (C, F)


class _Plan(NamedTuple):
    layers: list[_Layer]
    norm: np.ndarray  # (C,) the final norm's weight
    eps: float
    lm_head: torch.Tensor | Int8Weight  # (V, C)
    embed: np.ndarray  # (V, C)
    cos: torch.Tensor  # (T_max, D) RoPE tables
    sin: torch.Tensor
    heads: tuple[int, int, int]  # H, Hkv, D
    layout: DecodeLayout  # what the matrices were made from, and when
    # an int8 model's blocks as kernels/layers.c reads them: (layers, 10) int64 addresses, (layers, 2) float64 eps;
    # None where that C step cannot run (fp32 weights, no kernel): then _cpu_step runs
    int8: tuple[np.ndarray, np.ndarray] | None


def weights_plan(model: nn.Module) -> _Plan | None:
    """The model's weights as ``_cpu_step`` reads them: the fast step's layout of its matrices (``decode_layout``,
    made once and kept beside the model) and numpy views of its norms, embedding and rotary tables;
    ``plan_current`` says whether a weight was written or replaced since. None for a model whose weights are not
    on the CPU. The model is read through its attributes, as ``models.speed.step.why_not`` checked it."""
    if not model.embed_tokens.weight.is_cpu:
        return None
    layout = decode_layout(model)
    layers = [_Layer(block.input_layernorm.weight.detach().numpy(), block.input_layernorm.eps, lay.qkv, lay.o,
                     block.post_attention_layernorm.weight.detach().numpy(), block.post_attention_layernorm.eps,
                     lay.gate_up, lay.down) for block, lay in zip(model.blocks, layout.layers)]
    c = model.config
    return _Plan(layers, model.norm.weight.detach().numpy(), model.norm.eps, layout.lm_head,
                 model.embed_tokens.weight.detach().numpy(), model.rope_cos, model.rope_sin,
                 (c.n_heads, c.n_kv_heads, c.head_dim), layout, _int8_table(layers, model.rope_cos, model.rope_sin))


def _int8_table(layers: list[_Layer], cos: torch.Tensor, sin: torch.Tensor) -> tuple[np.ndarray, np.ndarray] | None:
    """``_Plan.int8``: each block's norms and int8 matrices by address, in kernels/layers.c's order."""
    tables_fit = all(t.dtype == torch.float32 and t.is_contiguous() for t in (cos, sin))
    if not isinstance(layers[0].qkv, Int8Weight) or unavailable() is not None or not tables_fit:
        return None
    rows = [[layer.norm1.ctypes.data, layer.qkv.q.data_ptr(), layer.qkv.scale.data_ptr(), layer.o.q.data_ptr(),
             layer.o.scale.data_ptr(), layer.norm2.ctypes.data, layer.gate_up.q.data_ptr(),
             layer.gate_up.scale.data_ptr(), layer.down.q.data_ptr(), layer.down.scale.data_ptr()] for layer in layers]
    if any(not (lay.norm1.flags.c_contiguous and lay.norm2.flags.c_contiguous) for lay in layers):
        return None
    return np.array(rows, dtype=np.int64), np.array([[lay.eps1, lay.eps2] for lay in layers], dtype=np.float64)


def plan_current(plan: _Plan) -> bool:
    """Whether every weight ``plan`` reads is where, and as written, as when the plan was made (an in-place write
    or a reassigned ``.data`` changes that)."""
    return layout_current(plan.layout)


class Vec(NamedTuple):
    """One vector as numpy sees it (``a``) and as torch sees it (``t``): the same memory, so a numpy operation
    and a torch product can take turns writing it without a conversion between them."""
    a: np.ndarray
    t: torch.Tensor
    p: int  # its address, for the int8 kernel's calls

    @staticmethod
    def empty(n: int) -> "Vec":
        a = np.empty(n, dtype=np.float32)
        return Vec(a, torch.from_numpy(a), a.ctypes.data)

    def part(self, start: int, stop: int) -> "Vec":
        return Vec(self.a[start:stop], self.t[start:stop], self.p + start * self.a.itemsize)


class Products(NamedTuple):
    """One library's one-token products for ``_cpu_step``. ``mv(w, h, out, scale)`` writes ``scale * (w @ h)``
    into ``out``, for a (out, in) matrix ``w`` (a torch view of a weight) and vectors ``h`` (in,), ``out``
    (out,); ``mv_add(x, w, h)`` adds ``w @ h`` into ``x`` (the residual stream)."""
    name: str
    mv: Callable[[torch.Tensor, Vec, Vec, float], None]
    mv_add: Callable[[Vec, torch.Tensor, Vec], None]


def _torch_mv(w: torch.Tensor, h: Vec, out: Vec, scale: float = 1.0) -> None:
    torch.addmv(out.t, w, h.t, beta=0, alpha=scale, out=out.t)  # beta=0: out's old contents are never read


def _torch_mv_add(x: Vec, w: torch.Tensor, h: Vec) -> None:
    x.t.addmv_(w, h.t)  # one kernel: x + w @ h, written into x


def _numpy_mv(w: torch.Tensor, h: Vec, out: Vec, scale: float = 1.0) -> None:
    np.matmul(w.numpy(), h.a, out=out.a)  # the weight's own memory, no copy
    if scale != 1.0:
        np.multiply(out.a, scale, out=out.a)


def _numpy_mv_add(x: Vec, w: torch.Tensor, h: Vec) -> None:
    np.add(x.a, w.numpy() @ h.a, out=x.a)


def _int8_mv(w: torch.Tensor | Int8Weight, h: Vec, out: Vec, scale: float = 1.0) -> None:
    if isinstance(w, Int8Weight):
        gemv_int8_at(w, h.p, out.p, scale, False)
    else:  # the fp32 LM head of a model quantised without it
        _torch_mv(w, h, out, scale)


def _int8_mv_add(x: Vec, w: torch.Tensor | Int8Weight, h: Vec) -> None:
    if isinstance(w, Int8Weight):
        gemv_int8_at(w, h.p, x.p, 1.0, True)
    else:
        _torch_mv_add(x, w, h)


TORCH_PRODUCTS = Products("torch", _torch_mv, _torch_mv_add)
NUMPY_PRODUCTS = Products("numpy", _numpy_mv, _numpy_mv_add)
PRODUCTS = {p.name: p for p in (TORCH_PRODUCTS, NUMPY_PRODUCTS)}
# an int8 model's products: its int8 matrices (the LM head's too) through models.speed.narrow's kernel; an fp32 head
# (a model quantised without it) through torch
INT8_PRODUCTS = Products("int8 kernel", _int8_mv, _int8_mv_add)


def _normed_mv(mv, w: torch.Tensor, out: Vec, x: Vec, weight: np.ndarray, eps: float, h: Vec) -> None:
    """``out = w @ rms_norm(x)``. RMSNorm's 1 / sqrt(mean(x²) + eps) is one number per token, so it goes to the
    product as its scale (BLAS's alpha) instead of costing an operation of its own; ``h`` receives x * weight."""
    np.multiply(x.a, weight, out=h.a)
    mv(w, h, out, 1.0 / math.sqrt(float(x.a @ x.a) / x.a.shape[0] + eps))


class KVArrays(NamedTuple):
    """A cache's keys and values as ``_cpu_step`` reads them: each layer's (Hkv, S_max, D) of batch row 0, numpy
    arrays on the cache's own memory. Made once per generation (``Tensor.numpy`` costs about 2 us, and a step
    would call it twice a layer); ``of`` says whether they still are ``cache``'s tensors."""
    k: tuple[torch.Tensor, ...]
    v: tuple[torch.Tensor, ...]
    arrays: list[tuple[np.ndarray, np.ndarray]]
    addresses: np.ndarray  # (layers, 3) int64: keys, values, S_max, as kernels/layers.c reads them
    # (layers, Hkv, S_max, D) where every array is contiguous and of one shape: the bounds kernels/layers.c writes
    # within (numpy checks its own); None (a ring layer's shorter cache, a strided array): _cpu_step runs instead
    shape: tuple[int, int, int, int] | None

    @staticmethod
    def make(cache: KVCache) -> "KVArrays":
        arrays = [(k.numpy()[0], v.numpy()[0]) for k, v in zip(cache.k, cache.v)]
        addresses = np.array([[k.ctypes.data, v.ctypes.data, k.shape[1]] for k, v in arrays], dtype=np.int64)
        fit = all(a.flags.c_contiguous and a.ndim == 3 and a.shape == arrays[0][0].shape for kv in arrays for a in kv)
        shape = (len(arrays), *arrays[0][0].shape) if fit else None
        return KVArrays(tuple(cache.k), tuple(cache.v), arrays, addresses, shape)

    def of(self, cache: KVCache) -> bool:
        return all(map(operator.is_, cache.k, self.k)) and all(map(operator.is_, cache.v, self.v))


def _cpu_step(plan: _Plan, token_id: int, cache: KVCache, pos: int, kv: KVArrays, products: Products) -> torch.Tensor:
    """``decode_step`` for one token on the CPU; logits (1, V). Every vector is a ``Vec``, numpy and torch views
    of one buffer made for this step: numpy computes between the products, torch (or numpy's BLAS) the
    products, and the residual stream ``x`` (C,) is updated in place by the o and down products. Every view the
    layers use is cut before the first product: the loop between products is as few calls as it can be.
    ``kv``: ``cache``'s arrays (``KVArrays.make(cache)``)."""
    mv, mv_add = products.mv, products.mv_add
    H, Hkv, D = plan.heads
    g = H // Hkv  # query heads per key/value head: query head h reads key/value head h // g
    C, d_ff = plan.norm.shape[0], plan.layers[0].down.shape[1]
    R = rope_matrix(plan.cos[pos:pos + 1], plan.sin[pos:pos + 1]).numpy()  # (D, D), shared by every layer
    Rq = R * (1.0 / math.sqrt(D))  # the queries' rotation with the attention's 1/sqrt(D) folded in
    x, h, qkv, z = Vec.empty(C), Vec.empty(C), Vec.empty((H + 2 * Hkv) * D), Vec.empty(H * D)
    gate_up, a = Vec.empty(2 * d_ff), Vec.empty(d_ff)
    x.a[:] = plan.embed[token_id]
    q_new = qkv.a[:H * D].reshape(Hkv, g, D)  # this token's query, key and value, heads apart
    k_new = qkv.a[H * D:(H + Hkv) * D].reshape(Hkv, D)
    v_new = qkv.a[(H + Hkv) * D:].reshape(Hkv, D)
    z_heads = z.a.reshape(Hkv, g, D)
    gate, up, act = gate_up.a[:d_ff], gate_up.a[d_ff:], a.a  # (F,) each; act is silu(gate) * up
    views = []  # per layer: where the new key and value go, the keys (transposed) and values attended
    for keys, values in kv.arrays:  # (Hkv, S_max, D) each
        views.append((keys[:, pos], values[:, pos], keys[:, :pos + 1].swapaxes(1, 2), values[:, :pos + 1]))
    with np.errstate(over="ignore"):  # exp(-gate) is inf for gate < -88: SiLU's limit there, 0, comes out exact
        for (norm1, eps1, qkv_w, o_w, norm2, eps2, gate_up_w, down_w), (k_at, v_at, keys_t, values) in zip(
                plan.layers, views):
            _normed_mv(mv, qkv_w, qkv, x, norm1, eps1, h)  # q, k, v side by side: ((H + 2 Hkv) D,)
            np.matmul(k_new, R, out=k_at)  # the cache write: the key RoPE'd, (Hkv, D)
            np.copyto(v_at, v_new)
            w = (q_new @ Rq) @ keys_t  # (Hkv, g, S) scores of the RoPE'd, scaled query against every cached key
            w -= w.max(-1, keepdims=True)
            np.exp(w, out=w)
            w /= w.sum(-1, keepdims=True)  # softmax over the S keys
            np.matmul(w, values, out=z_heads)  # attention output (Hkv, g, D): the heads side by side in z
            mv_add(x, o_w, z)  # x += o_proj(z)
            _normed_mv(mv, gate_up_w, gate_up, x, norm2, eps2, h)  # gate and up side by side: (2 F,)
            np.negative(gate, out=act)
            np.exp(act, out=act)
            act += 1
            np.divide(gate, act, out=act)  # silu(gate) = gate / (1 + exp(-gate))
            act *= up
            mv_add(x, down_w, a)  # x += down_proj(silu(gate) * up)
    cache.length = pos + 1
    logits = Vec.empty(plan.lm_head.shape[0])
    _normed_mv(mv, plan.lm_head, logits, x, plan.norm, plan.eps, h)
    return logits.t[None]  # (1, V)


def _int8_step(plan: _Plan, token_id: int, cache: KVCache, pos: int, kv: KVArrays) -> torch.Tensor:
    """``_cpu_step`` for an int8 model with every block in one C call (kernels/layers.c): the ~25 numpy calls a
    layer between its products took a sixth of the step on a quiet 2-core AMD EPYC and more on a busy one
    (bench/notes/int8.md). The final norm and the LM head stay here: one product, through the same kernel (or
    torch, for an fp32 head)."""
    weights, eps = plan.int8
    H, Hkv, D = plan.heads
    C, F = plan.norm.shape[0], plan.layers[0].down.shape[1]
    x, h = Vec.empty(C), Vec.empty(C)
    x.a[:] = plan.embed[token_id]
    scratch = np.empty(C + (H + 2 * Hkv) * D + H * D + 3 * F + pos + 1, dtype=np.float32)
    row = pos * D * plan.cos.element_size()  # this position's row of the RoPE tables
    int8_layers_at(x.p, weights.ctypes.data, kv.addresses.ctypes.data, eps.ctypes.data, len(plan.layers), pos,
                   plan.cos.data_ptr() + row, plan.sin.data_ptr() + row, (C, H, Hkv, D, F), scratch.ctypes.data)
    cache.length = pos + 1
    logits = Vec.empty(plan.lm_head.shape[0])
    _normed_mv(_int8_mv, plan.lm_head, logits, x, plan.norm, plan.eps, h)
    return logits.t[None]  # (1, V)


def run_cpu_step(plan: _Plan, token_id: int, cache: KVCache, pos: int, products: Products,
                 kv: KVArrays | None = None) -> torch.Tensor:
    """``_cpu_step`` (``kv``: ``cache``'s arrays, made here when not given), or ``_int8_step`` for an int8 model
    where the C step runs; with numpy's products, torch on one intra-op thread meanwhile (put back afterwards):
    OpenBLAS brings its own threads, and torch's spinning beside them would take the cores they need."""
    kv = KVArrays.make(cache) if kv is None else kv
    if products is INT8_PRODUCTS and plan.int8 is not None and kv.shape is not None:
        layers, Hkv, s_max, D = kv.shape
        if (layers, Hkv, D) == (len(plan.layers), *plan.heads[1:]) and pos < s_max:
            return _int8_step(plan, token_id, cache, pos, kv)
    if products is not NUMPY_PRODUCTS:
        return _cpu_step(plan, token_id, cache, pos, kv, products)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _cpu_step(plan, token_id, cache, pos, kv, products)
    finally:
        torch.set_num_threads(threads)


# A table of machine facts, not a result cache: which library is faster depends only on the machine, the model's
# shape and the thread count, and measuring it takes 8 steps, so each answer is kept (at most 16, oldest out first).
_CHOSEN: dict[tuple, Products] = {}
_CHOSEN_MAX = 16


def cpu_products(model: nn.Module, plan: _Plan | None = None) -> Products:
    """The library that computes ``model``'s one-token products on the CPU: EXPLORER_DECODE_BLAS's ("torch" or
    "numpy") when set, else whichever ran the model's step faster when it was first measured in this process
    (``_measure_products``: 8 steps on a scratch cache, once per model shape and torch thread count).

    Which wins is a fact of the machine, not of the code: the one-token product streams a weight at the speed
    its BLAS reads memory, and the two libraries differ by up to 2x between CPUs (bench/notes/decode-step.md)."""
    if isinstance((plan.layout if plan is not None else decode_layout(model)).layers[0].qkv, Int8Weight):
        return INT8_PRODUCTS
    if DECODE_BLAS in PRODUCTS:
        return PRODUCTS[DECODE_BLAS]
    c = model.config
    key = (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff, c.vocab_size, torch.get_num_threads())
    chosen = _CHOSEN.get(key)
    if chosen is None:
        chosen = _measure_products(plan if plan is not None else weights_plan(model))
        if len(_CHOSEN) >= _CHOSEN_MAX:
            _CHOSEN.pop(next(iter(_CHOSEN)))
        _CHOSEN[key] = chosen
    return chosen


def _measure_products(plan: _Plan) -> Products:
    """The library whose step on ``plan`` (one token, a scratch cache) took less time: one warm-up and the median
    of three steps each, torch's first. Not interleaved: OpenBLAS's threads keep spinning for a while after a
    product and slow a torch step run meanwhile (bench/notes/decode-step.md)."""
    H, Hkv, D = plan.heads
    scratch = KVCache(len(plan.layers), 1, Hkv, 1, D)
    seconds = {}
    with torch.inference_mode():
        for products in (TORCH_PRODUCTS, NUMPY_PRODUCTS):
            runs = []
            for _ in range(4):
                t = time.perf_counter()
                run_cpu_step(plan, 0, scratch, 0, products)
                runs.append(time.perf_counter() - t)
            seconds[products.name] = sorted(runs[1:])[1]
    return PRODUCTS[min(seconds, key=seconds.get)]
