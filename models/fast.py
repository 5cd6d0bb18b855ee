"""Speed choices kept out of the teaching code: opt-in, named, each with what it buys and why.

Notation: ``in``/``out`` the features of a linear layer (``nn.Linear.weight`` has shape (out, in)); B batch,
C model dim, H query heads, Hkv key/value heads, g = H / Hkv query heads per KV head, D head dim, S positions
attended (the cache so far), V vocabulary.

The models read like the tutorial (plain ``nn.Linear``, contiguous (out, in) weights, a hook point at every
step). The app and the benchmark call ``optimize_for_decode`` once after loading. It changes memory order,
never a weight's value, name or shape, and lets ``models.generate.decode_one`` take ``decode_step``: the same
one-token computation written as a flat sequence of array operations (on the CPU: the matrix products in torch
or numpy's BLAS, everything between them in numpy on the same memory). Outputs agree with the modules' up to
float rounding (the BLAS may add the products in another order).
"""
from __future__ import annotations

import copy
import math
import os
import time
import weakref
from typing import Callable, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _module
from torch.utils.hooks import RemovableHandle

from .attention import Attention
from .block import PreNormBlock
from .kv_cache import KVCache
from .layers import RMSNorm, SwiGLU

FAST_DECODE = "_fast_decode"  # the attribute optimize_for_decode sets on a decoder it prepared
# Which library computes the CPU step's one-token matrix products: "auto" (measured once per model shape and thread
# count, see cpu_products), "torch" or "numpy". EXPLORER_DECODE_BLAS sets it for the process.
DECODE_BLAS = os.environ.get("EXPLORER_DECODE_BLAS", "auto").strip().lower() or "auto"


def optimize_for_decode(model: nn.Module) -> nn.Module:
    """Store every ``nn.Linear`` weight (out, in) with out >= in in (in, out) memory order, the query/key/value
    projections of each attention layer side by side in one (in, q + k + v) matrix and each SwiGLU's gate and
    up projections in one (in, 2 F) matrix, and, for a decoder, let ``models.generate.decode_one`` take
    ``decode_step`` (see ``can_decode_fast`` for when it does); returns ``model`` (changed in place).

    Same shape, same parameter names, same values: only where the numbers sit in memory changes (each weight
    re-laid is a (out, in) view with ``weight.stride() == (1, n)``, n the width of the matrix it lies in), so
    checkpoints save and load as before. A decode step multiplies one token's vector by every weight;
    the CPU BLAS computes ``x @ W.T`` faster when it streams ``W.T`` along its contiguous dimension. On a
    2-core AVX-512 CPU, fp32, the 49152 x 576 LM head took 3.9 ms in this layout and 6.6-7 ms in the usual
    one, and one cached decode step of the SmolLM2-135M shape (30 layers, random weights) about 31 ms
    against 38 ms (about 1.2x more tokens per second), while prompt-sized matmuls take the same time
    either way. A narrowing matrix (out < in: SwiGLU's down projection, 1536 -> 576; a key or value projection
    not laid side by side, 576 -> 192) is the exception and keeps its (out, in) order: one token times it
    streamed at 13-18 GB/s against 11-12 GB/s in (in, out) (7.3-7.8 against 5.5 for 576 -> 192), and a whole
    step took 4-12 % less time (three interleaved A/B runs, same machine). Side by side,
    ``decode_step`` reads q, k and v with one matmul and gate and up with another (see ``fused``): 4 matmuls
    a layer instead of 7. Measure before relying on it elsewhere (another CPU, a GPU, another dtype): it is a
    layout choice, not an algorithm.

    ``load_state_dict`` (``copy_``) and an in-place update (LoRA's merge) keep the layout. ``copy.deepcopy``
    keeps the (in, out) order of a weight alone but not weights side by side (a parameter's copy is a clone,
    and a clone of a column slice is contiguous): ``prepared_copy`` copies and lays out again. A tied LM head
    and embedding share one tensor, which is re-laid out once. LoRA's frozen base layers are ``nn.Linear`` too.
    Calling it twice changes nothing the second time.
    """
    seen: set[int] = set()
    for module in model.modules():
        groups = [(module.q_proj, module.k_proj, module.v_proj)] if isinstance(module, Attention) else \
            [(module.gate_proj, module.up_proj)] if isinstance(module, SwiGLU) else []
        for group in groups:
            if not all(type(lin) is nn.Linear for lin in group):
                continue  # LoRA, int8: each layer keeps its own layout
            if fused(*group) is None and len({(lin.weight.dtype, lin.weight.device) for lin in group}) == 1:
                side_by_side = torch.cat([lin.weight.detach().t() for lin in group], dim=1)  # (in, sum of outs)
                start = 0
                for lin in group:
                    lin.weight.data = side_by_side[:, start:start + lin.out_features].t()  # (out, in) view
                    start += lin.out_features
            if fused(*group) is not None:
                seen.update(id(lin.weight) for lin in group)
    for module in model.modules():
        if isinstance(module, nn.Linear) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            if module.out_features < module.in_features:
                continue  # a narrowing matrix (the down projection) streams faster in (out, in) order
            w = module.weight.data  # (out, in)
            module.weight.data = w.t().contiguous().t()  # (out, in) -> (in, out) in memory -> viewed (out, in)
    if hasattr(model, "blocks") and hasattr(model, "lm_head"):  # a decoder
        setattr(model, FAST_DECODE, True)
    return model


def fused(*linears: nn.Linear) -> torch.Tensor | None:
    """The (in, sum of outs) matrix whose column slices, in order, are these layers' weights (as
    ``optimize_for_decode`` lays them out), or None where they are not laid out so (a copy, a reassigned
    weight): then ``x @ fused(...)`` is every layer's output side by side, from one matmul."""
    ws = [lin.weight for lin in linears]
    total, first = sum(w.shape[0] for w in ws), ws[0]
    start = first.data_ptr()
    for w in ws:
        if w.dim() != 2 or w.stride() != (1, total) or w.shape[1] != first.shape[1] or w.dtype != first.dtype \
                or w.device != first.device or w.data_ptr() != start:
            return None
        start += w.shape[0] * w.element_size()
    return first.detach().as_strided((first.shape[1], total), (total, 1))  # (in, sum of outs)


def prepared_copy(model: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """``copy.deepcopy(model)``, cast to ``dtype`` when given, then laid out again by ``optimize_for_decode`` when
    ``model`` was (after the cast, which makes new tensors and so would undo the layout)."""
    out = copy.deepcopy(model)
    if dtype is not None:
        out = out.to(dtype)
    return optimize_for_decode(out) if model.__dict__.get(FAST_DECODE) else out


# --- the one-token decode step ---------------------------------------------------------------------------------
#
# Where a step's time goes, SmolLM2-135M shape, fp32, one token after 48 (Intel Xeon with AMX, 2 cores, 2 torch
# threads; perf_counter sums per section over 32 steps): the 211 matrix products take 18.2 of about 21 ms (every
# weight read once at 29-33 GB/s, against 28-32 GB/s for torch.sum over 512 MiB on the same machine) and everything
# else about 90 us a layer. Written as torch operations, that rest was 330 us a layer (30 ms a step). A small torch
# kernel costs 5-10 us to dispatch, a numpy call on a vector of a few thousand numbers about 1 us; but after a
# product has streamed megabytes of weights through the caches, every call finds its code and data cold (the same
# numpy calls took 3-6x longer between products than in a loop of their own), so fewer calls is the lever: the
# CPU step below runs only the products in torch (or numpy's BLAS, see ``cpu_products``) and everything between
# them in numpy on the same memory, writes each result into a buffer made once per step, lets RMSNorm's one scale
# per token ride on the next product (BLAS's alpha) and the attention's 1/sqrt(D) on the queries' rotation.
# Measured and left out: torch's fused F.rms_norm and SDPA between the products (37 and 40 us a layer in the step
# against 19 and 30 in numpy); the GNU OpenMP threads told to sleep between products (OMP_WAIT_POLICY=PASSIVE:
# 39 ms a step, each wake-up costs more than the product it serves); transparent huge pages for the weights
# (THP_MEM_ALLOC_ENABLE=1: the same 30 GB/s).


# Bumped whenever a module, parameter or buffer is registered anywhere in the process (PyTorch's global
# registration hooks: ``setattr`` of a module or parameter, ``add_module``, LoRA or int8 swapping a layer). With
# ``RemovableHandle.next_id`` (every hook registration takes a new id) it tells whether a model's structure or hooks
# may have changed since ``can_decode_fast`` last looked, without walking its ~1,000 modules at every step.
_REGISTRATIONS = [0]


def _count_registration(*_) -> None:
    _REGISTRATIONS[0] += 1


_module.register_module_module_registration_hook(_count_registration)
_module.register_module_parameter_registration_hook(_count_registration)
_module.register_module_buffer_registration_hook(_count_registration)


def _structure_version(model: nn.Module) -> tuple[int, int, int]:
    return RemovableHandle.next_id, _REGISTRATIONS[0], len(model.blocks._modules)  # deleting a block registers nothing


def _check(model: nn.Module) -> bool:
    """Whether ``model`` is exactly the tutorial's fp32 SDPA decoder with no hook attached. LoRA adapters, int8
    layers, another dtype or attention implementation, or a hook on any module (or a global one) take the
    modules' own path."""
    modules = [model, *model._modules.values(), *model.norm._modules.values()]
    ok = model.lm_head.weight.dtype == torch.float32
    for block in model.blocks:
        parts = block._modules
        attn, mlp = parts["attn"], parts["mlp"]
        ok = ok and type(block).forward is PreNormBlock.forward and type(attn) is Attention and type(mlp) is SwiGLU \
            and type(parts["input_layernorm"]) is RMSNorm and type(parts["post_attention_layernorm"]) is RMSNorm \
            and attn.use_rope
        modules.append(block)
        for owner in (block, attn, mlp, parts["input_layernorm"], parts["post_attention_layernorm"]):
            modules += owner._modules.values()
        linears = [attn._modules[n] for n in ("q_proj", "k_proj", "v_proj", "o_proj")] + [
            mlp._modules[n] for n in ("gate_proj", "up_proj", "down_proj")] if ok else []
        ok = ok and all(type(lin) is nn.Linear and lin.bias is None and lin.weight.dtype == torch.float32
                        for lin in linears)
    hooked = any(m._forward_hooks or m._forward_pre_hooks for m in modules)
    return ok and not hooked


def can_decode_fast(model: nn.Module) -> bool:
    """Whether ``decode_step`` runs for ``model`` now: prepared by ``optimize_for_decode``, the tutorial's fp32
    decoder unchanged (plain ``nn.Linear``s, RMSNorm, SwiGLU, SDPA attention: no LoRA, no int8, no bf16), and no
    hook attached anywhere.

    The full check reads ~1,000 modules (about 1 ms, 3 % of a step): a "yes" is kept on the model and reused
    while no hook, module, parameter or buffer has been registered anywhere since (``_structure_version``);
    dtype and attention implementation, which register nothing, are read at every step.
    """
    if not model.__dict__.get(FAST_DECODE) or _module._global_forward_hooks or _module._global_forward_pre_hooks:
        return False
    version = _structure_version(model)
    kept = model.__dict__.get("_fast_check")
    if kept is None or kept[0] != version or not kept[1]:  # a "no" is never reused: a hook may have gone
        kept = (version, _check(model))
        model.__dict__["_fast_check"] = kept
    return kept[1] and model.lm_head.weight.dtype == torch.float32 and all(
        block._modules["attn"].impl == "sdpa" for block in model.blocks)  # set_attn_impl swaps no module


def decode_step(model: nn.Module, token: torch.Tensor, cache: KVCache, pos: int) -> torch.Tensor | None:
    """One new token (B, 1) at position ``pos`` through the decoder as flat array operations; next-token
    logits (B, V), or None when ``can_decode_fast(model)`` is False (the caller then runs the model).

    The same computation as ``Decoder.forward(token, start_pos=pos, cache=cache, last_only=True)``, the same
    cache writes, the modules' own weights read in place. One token on the CPU (the app's and the benchmark's
    case) takes ``_cpu_step``: the products in torch or numpy's BLAS, the rest in numpy; a batch, or a model on
    a GPU, takes ``_torch_step``: the same sequence as torch operations.
    """
    if not can_decode_fast(model):
        return None
    c = model.config
    if token.dim() != 2 or token.shape[1] != 1 or not 0 <= pos < c.max_seq_len:
        return None  # let the model say what is wrong
    if token.shape[0] == 1 and token.is_cpu and cache.k[0].is_cpu and cache.k[0].dtype == torch.float32 \
            and cache.k[0].shape[0] == 1 and pos < cache.max_len:
        token_id = int(token[0, 0])
        plan = _plan(model)
        if plan is not None and 0 <= token_id < c.vocab_size:
            return _run_cpu_step(plan, token_id, cache, pos, cpu_products(model, plan))
    return _torch_step(model, token, cache, pos)


def rope_matrix(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """(D, D) R with ``x @ R == apply_rope(x, cos, sin)`` for vectors ``x`` (..., D) at one position (``cos``,
    ``sin``: (1, D), that position's row of the tables).

    ``apply_rope`` computes ``x * cos + rotate_half(x) * sin``: output ``j < D/2`` is ``x[j] cos[j] - x[j + D/2]
    sin[j]``, output ``j >= D/2`` is ``x[j] cos[j] + x[j - D/2] sin[j]``. R holds those coefficients (two per
    column, zeros elsewhere), so one small matmul does the rotation that takes ``apply_rope`` six kernels. Each
    output is the same two products (the zeros add exact zeros), so the result agrees up to the order of the
    additions."""
    c, s = cos[0], sin[0]
    half = c.shape[0] // 2
    i = torch.arange(half)
    R = torch.diag(c)
    R[i + half, i] = -s[:half]  # into j < D/2: -x[j + D/2] sin[j]
    R[i, i + half] = s[half:]   # into j >= D/2: +x[j - D/2] sin[j]
    return R


# --- on the CPU, one token: products in torch (or numpy's BLAS), everything else in numpy ---------------------
class _Layer(NamedTuple):
    """One block as ``_cpu_step`` reads it: views of the modules' own memory, nothing copied. Each matrix is
    (out, in) as ``nn.Linear`` holds it; ``qkv`` and ``gate_up`` are one matrix when ``optimize_for_decode`` laid
    the projections side by side (else the separate ones, in order)."""
    norm1: np.ndarray  # (C,) input_layernorm.weight
    eps1: float
    qkv: tuple[torch.Tensor, ...]  # ((H + 2 Hkv) D, C), or q (H D, C), k (Hkv D, C), v (Hkv D, C)
    o: torch.Tensor  # (C, H D)
    norm2: np.ndarray  # (C,) post_attention_layernorm.weight
    eps2: float
    gate_up: tuple[torch.Tensor, ...]  # (2 F, C), or gate (F, C), up (F, C)
    down: torch.Tensor  # (C, F)


class _Plan(NamedTuple):
    layers: list[_Layer]
    norm: np.ndarray  # (C,) the final norm's weight
    eps: float
    lm_head: torch.Tensor  # (V, C)
    embed: np.ndarray  # (V, C)
    cos: torch.Tensor  # (T_max, D) RoPE tables
    sin: torch.Tensor
    heads: tuple[int, int, int]  # H, Hkv, D
    version: tuple  # the model's _structure_version when it was made
    viewed: list[torch.Tensor]  # every parameter and buffer viewed above ...
    pointers: list[int]  # ... and where its memory was


_PLANS: "weakref.WeakKeyDictionary[nn.Module, _Plan]" = weakref.WeakKeyDictionary()  # dies with its model


def _plan(model: nn.Module) -> _Plan | None:
    """The model's weights as ``_cpu_step`` reads them, kept beside the model (not on it: a deepcopy would copy
    the views' memory) and made again when any tensor it views was replaced (a new parameter, new storage from
    ``.to()`` or a reassigned ``.data``); values changed in place (``load_state_dict``, LoRA's merge) are seen
    through the views. None for a model whose weights are not on the CPU."""
    kept = _PLANS.get(model)
    version = _structure_version(model)
    if kept is not None and kept.version == version and list(map(torch.Tensor.data_ptr, kept.viewed)) == kept.pointers:
        return kept
    if not model.lm_head.weight.is_cpu:
        return None
    viewed: list[torch.Tensor] = []

    def view(owner: nn.Module, name: str = "weight", *, buffer: bool = False) -> torch.Tensor:
        t = (owner._buffers if buffer else owner._parameters)[name]
        viewed.append(t)
        return t.detach()

    layers = []
    for block in model.blocks:
        attn, mlp = block.attn, block.mlp
        qkv = fused(attn.q_proj, attn.k_proj, attn.v_proj)  # (C, (H + 2 Hkv) D) or None
        gate_up = fused(mlp.gate_proj, mlp.up_proj)  # (C, 2 F) or None
        qkv_views = tuple(view(lin) for lin in (attn.q_proj, attn.k_proj, attn.v_proj))
        gate_up_views = tuple(view(lin) for lin in (mlp.gate_proj, mlp.up_proj))
        layers.append(_Layer(
            view(block.input_layernorm).numpy(), block.input_layernorm.eps,
            qkv_views if qkv is None else (qkv.t(),), view(attn.o_proj),
            view(block.post_attention_layernorm).numpy(), block.post_attention_layernorm.eps,
            gate_up_views if gate_up is None else (gate_up.t(),), view(mlp.down_proj)))
    c = model.config
    plan = _Plan(layers, view(model.norm).numpy(), model.norm.eps, view(model.lm_head),
                 view(model.embed_tokens).numpy(),
                 view(model, "rope_cos", buffer=True), view(model, "rope_sin", buffer=True),
                 (c.n_heads, c.n_kv_heads, c.head_dim), version, viewed, [t.data_ptr() for t in viewed])
    _PLANS[model] = plan
    return plan


class Vec(NamedTuple):
    """One vector as numpy sees it (``a``) and as torch sees it (``t``): the same memory, so a numpy operation
    and a torch product can take turns writing it without a conversion between them."""
    a: np.ndarray
    t: torch.Tensor

    @staticmethod
    def empty(n: int) -> "Vec":
        a = np.empty(n, dtype=np.float32)
        return Vec(a, torch.from_numpy(a))

    def part(self, start: int, stop: int) -> "Vec":
        return Vec(self.a[start:stop], self.t[start:stop])


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


TORCH_PRODUCTS = Products("torch", _torch_mv, _torch_mv_add)
NUMPY_PRODUCTS = Products("numpy", _numpy_mv, _numpy_mv_add)
PRODUCTS = {p.name: p for p in (TORCH_PRODUCTS, NUMPY_PRODUCTS)}


def _normed_mv(mv, ws: tuple[torch.Tensor, ...], outs: tuple[Vec, ...], x: Vec, weight: np.ndarray, eps: float,
               h: Vec) -> None:
    """``out = w @ rms_norm(x)`` for each matrix ``w`` of ``ws`` and its ``out`` (one side-by-side matrix, or
    several writing consecutive parts of one buffer). RMSNorm's 1 / sqrt(mean(x²) + eps) is one number per token,
    so it goes to the product as its scale (BLAS's alpha) instead of costing an operation of its own; ``h``
    receives x * weight."""
    np.multiply(x.a, weight, out=h.a)
    scale = 1.0 / math.sqrt(float(x.a @ x.a) / x.a.shape[0] + eps)
    for w, out in zip(ws, outs):
        mv(w, h, out, scale)


def _parts(buffer: Vec, ws: tuple[torch.Tensor, ...]) -> tuple[Vec, ...]:
    """Where each matrix of ``ws`` writes in ``buffer``: the whole of it for one matrix, else consecutive parts."""
    if len(ws) == 1:
        return (buffer,)
    stops = np.cumsum([w.shape[0] for w in ws]).tolist()
    return tuple(buffer.part(stop - w.shape[0], stop) for w, stop in zip(ws, stops))


def _cpu_step(plan: _Plan, token_id: int, cache: KVCache, pos: int, products: Products) -> torch.Tensor:
    """``decode_step`` for one token on the CPU; logits (1, V). Every vector is a ``Vec``, numpy and torch views
    of one buffer made for this step: numpy computes between the products, torch (or numpy's BLAS) the
    products, and the residual stream ``x`` (C,) is updated in place by the o and down products. Every view the
    layers use is cut before the first product: the loop between products is as few calls as it can be."""
    mv, mv_add = products.mv, products.mv_add
    H, Hkv, D = plan.heads
    g = H // Hkv  # query heads per key/value head: query head h reads key/value head h // g
    C, d_ff = plan.norm.shape[0], plan.layers[0].down.shape[1]
    R = rope_matrix(plan.cos[pos:pos + 1], plan.sin[pos:pos + 1]).numpy()  # (D, D), shared by every layer
    Rq = R * (1.0 / math.sqrt(D))  # the queries' rotation with the attention's 1/sqrt(D) folded in
    x, h, qkv, z = Vec.empty(C), Vec.empty(C), Vec.empty((H + 2 * Hkv) * D), Vec.empty(H * D)
    gate_up, act = Vec.empty(2 * d_ff), np.empty(d_ff, dtype=np.float32)
    a = Vec(act, torch.from_numpy(act))
    x.a[:] = plan.embed[token_id]
    q_new = qkv.a[:H * D].reshape(Hkv, g, D)  # this token's query, key and value, heads apart
    k_new = qkv.a[H * D:(H + Hkv) * D].reshape(Hkv, D)
    v_new = qkv.a[(H + Hkv) * D:].reshape(Hkv, D)
    z_heads = z.a.reshape(Hkv, g, D)
    gate, up = gate_up.a[:d_ff], gate_up.a[d_ff:]  # (F,) each
    views = []  # per layer: where the new key and value go, the keys (transposed) and values attended
    for layer, k, v in zip(plan.layers, cache.k, cache.v):
        keys, values = k.numpy()[0], v.numpy()[0]  # (Hkv, S_max, D) each
        views.append((keys[:, pos], values[:, pos], keys[:, :pos + 1].swapaxes(1, 2), values[:, :pos + 1],
                      _parts(qkv, layer.qkv), _parts(gate_up, layer.gate_up)))
    with np.errstate(over="ignore"):  # exp(-gate) is inf for gate < -88: SiLU's limit there, 0, comes out exact
        for (norm1, eps1, qkv_w, o_w, norm2, eps2, gate_up_w, down_w), (k_at, v_at, keys_t, values, qkv_out,
                                                                         gate_up_out) in zip(plan.layers, views):
            _normed_mv(mv, qkv_w, qkv_out, x, norm1, eps1, h)  # q, k, v side by side: ((H + 2 Hkv) D,)
            np.matmul(k_new, R, out=k_at)  # the cache write: the key RoPE'd, (Hkv, D)
            np.copyto(v_at, v_new)
            w = (q_new @ Rq) @ keys_t  # (Hkv, g, S) scores of the RoPE'd, scaled query against every cached key
            w -= w.max(-1, keepdims=True)
            np.exp(w, out=w)
            w /= w.sum(-1, keepdims=True)  # softmax over the S keys
            np.matmul(w, values, out=z_heads)  # attention output (Hkv, g, D): the heads side by side in z
            mv_add(x, o_w, z)  # x += o_proj(z)
            _normed_mv(mv, gate_up_w, gate_up_out, x, norm2, eps2, h)  # gate and up side by side: (2 F,)
            np.negative(gate, out=act)
            np.exp(act, out=act)
            act += 1
            np.divide(gate, act, out=act)  # silu(gate) = gate / (1 + exp(-gate))
            act *= up
            mv_add(x, down_w, a)  # x += down_proj(silu(gate) * up)
    cache.length = pos + 1
    logits = Vec.empty(plan.lm_head.shape[0])
    _normed_mv(mv, (plan.lm_head,), (logits,), x, plan.norm, plan.eps, h)
    return logits.t[None]  # (1, V)


def _run_cpu_step(plan: _Plan, token_id: int, cache: KVCache, pos: int, products: Products) -> torch.Tensor:
    """``_cpu_step``; with numpy's products, torch on one intra-op thread meanwhile (put back afterwards):
    OpenBLAS brings its own threads, and torch's beside them wait for cores (measured on a 2-core AMD EPYC when
    the step's small operations were torch's: 2.3 tokens/s against 31-38)."""
    if products is TORCH_PRODUCTS:
        return _cpu_step(plan, token_id, cache, pos, products)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _cpu_step(plan, token_id, cache, pos, products)
    finally:
        torch.set_num_threads(threads)


# The library each model shape's products ran faster with, measured here (see cpu_products); a few entries.
_CHOSEN: dict[tuple, Products] = {}
_CHOSEN_MAX = 64


def cpu_products(model: nn.Module, plan: _Plan | None = None) -> Products:
    """The library that computes ``model``'s one-token products on the CPU: EXPLORER_DECODE_BLAS's ("torch" or
    "numpy") when set, else whichever ran the model's step faster when it was first measured in this process
    (``_measure_products``: 8 steps on a scratch cache, once per model shape and torch thread count).

    Which wins is a fact of the machine, not of the code: the one-token product streams a weight at the speed
    its BLAS reads memory. At the SmolLM2-135M shape, a whole step's products took 18-21 ms through numpy's
    OpenBLAS and 32-36 ms through torch's MKL on a 2-core AMD EPYC, and 19.8 against 17.7 ms on a 2-core Intel
    Xeon; for the shipped 1M model the per-call cost decides (numpy's is lower)."""
    if DECODE_BLAS in PRODUCTS:
        return PRODUCTS[DECODE_BLAS]
    c = model.config
    key = (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff, c.vocab_size, torch.get_num_threads())
    chosen = _CHOSEN.get(key)
    if chosen is None:
        chosen = _measure_products(plan if plan is not None else _plan(model))
        if len(_CHOSEN) >= _CHOSEN_MAX:
            _CHOSEN.pop(next(iter(_CHOSEN)))
        _CHOSEN[key] = chosen
    return chosen


def _measure_products(plan: _Plan) -> Products:
    """The library whose step on ``plan`` (one token, a scratch cache) took less time: one warm-up and the median
    of three steps each, torch's first. Not interleaved: OpenBLAS's threads keep spinning for a while after a
    product (on the order of 0.1 s), and a torch step run meanwhile measured 4x slower than alone."""
    H, Hkv, D = plan.heads
    scratch = KVCache(len(plan.layers), 1, Hkv, 1, D)
    seconds = {}
    with torch.inference_mode():
        for products in (TORCH_PRODUCTS, NUMPY_PRODUCTS):
            runs = []
            for _ in range(4):
                t = time.perf_counter()
                _run_cpu_step(plan, 0, scratch, 0, products)
                runs.append(time.perf_counter() - t)
            seconds[products.name] = sorted(runs[1:])[1]
    return PRODUCTS[min(seconds, key=seconds.get)]


def decode_blas(model: nn.Module) -> str:
    """Which library computes ``model``'s one-token decode products (for the provenance of a speed)."""
    if not model.lm_head.weight.is_cpu or not can_decode_fast(model):
        return f"torch {torch.__version__}"
    if cpu_products(model) is TORCH_PRODUCTS:
        return f"torch {torch.__version__}" + (" (MKL)" if torch.backends.mkl.is_available() else "")
    blas = np.show_config(mode="dicts").get("Build Dependencies", {}).get("blas", {})
    return f"numpy {np.__version__} ({blas.get('name', 'its BLAS')} {blas.get('version', '')})".replace(" )", ")")


# --- anywhere else (a batch, a GPU): the same step as torch operations ------------------------------------------
def _torch_step(model: nn.Module, token: torch.Tensor, cache: KVCache, pos: int) -> torch.Tensor:
    """``decode_step`` as torch operations, for any batch on any device: RMSNorm as torch's fused kernel, each
    residual add folded into its product (addmm), q/k/v and gate/up each one product where laid side by side."""
    c = model.config
    B = token.shape[0]
    H, Hkv, D = c.n_heads, c.n_kv_heads, c.head_dim
    R = rope_matrix(model.rope_cos[pos:pos + 1], model.rope_sin[pos:pos + 1])  # (D, D), shared by every layer
    x = F.embedding(token[:, 0], model.embed_tokens.weight)  # (B, C)
    for layer, block in enumerate(model.blocks):
        attn, mlp = block.attn, block.mlp
        h = _torch_rms_norm(x, block.input_layernorm)
        qkv = fused(attn.q_proj, attn.k_proj, attn.v_proj)  # (C, (H + 2 Hkv) D) or None
        if qkv is not None:
            q, k, v = (h @ qkv).split([H * D, Hkv * D, Hkv * D], dim=1)
        else:
            q, k, v = (h @ lin.weight.t() for lin in (attn.q_proj, attn.k_proj, attn.v_proj))
        q = (q.reshape(B * H, D) @ R).view(B, H, 1, D)  # RoPE'd, (B, H, 1, D)
        k = (k.reshape(B * Hkv, D) @ R).view(B, Hkv, 1, D)  # (B, Hkv, 1, D)
        v = v.reshape(B, Hkv, 1, D)
        keys, values = cache.update(layer, pos, k, v)  # (B, Hkv, pos + 1, D) each
        z = F.scaled_dot_product_attention(q, keys, values, enable_gqa=True)  # (B, H, 1, D), no mask: one query
        x = torch.addmm(x, z.reshape(B, H * D), attn.o_proj.weight.t())  # x + o_proj(z), (B, C)
        h = _torch_rms_norm(x, block.post_attention_layernorm)
        gate_up = fused(mlp.gate_proj, mlp.up_proj)  # (C, 2 F) or None
        if gate_up is not None:
            gate, up = (h @ gate_up).chunk(2, dim=1)  # (B, F) each
        else:
            gate, up = h @ mlp.gate_proj.weight.t(), h @ mlp.up_proj.weight.t()
        x = torch.addmm(x, F.silu(gate, inplace=True).mul_(up), mlp.down_proj.weight.t())  # x + down(silu(gate) up)
    return _torch_rms_norm(x, model.norm) @ model.lm_head.weight.t()  # (B, V)


def _torch_rms_norm(x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
    return F.rms_norm(x, norm.weight.shape, norm.weight, norm.eps)  # (B, C): one kernel instead of six
