"""Speed choices kept out of the teaching code: opt-in, named, each with what it buys and why.

Notation: ``in``/``out`` the features of a linear layer (``nn.Linear.weight`` has shape (out, in)); B batch,
C model dim, H query heads, Hkv key/value heads, g = H / Hkv query heads per KV head, D head dim, S positions
attended (the cache so far), V vocabulary.

The models read like the tutorial (plain ``nn.Linear``, contiguous (out, in) weights, a hook point at every
step). The app and the benchmark call ``optimize_for_decode`` once after loading. It changes memory order,
never a weight's value, name or shape, and lets ``models.generate.decode_one`` take ``decode_step``: the same
one-token computation written as a flat sequence of tensor operations. Outputs agree with the modules' up to
float rounding (the BLAS may add the products in another order).
"""
from __future__ import annotations

import copy
import os

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
# decode_step's products on the CPU through numpy's BLAS (see numpy_matmul); EXPLORER_DECODE_BLAS=torch keeps torch's
DECODE_WITH_NUMPY = os.environ.get("EXPLORER_DECODE_BLAS", "numpy") != "torch"


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
# Profile of one cached decode step, SmolLM2-135M shape, fp32, random weights (torch.profiler, self time per step,
# measured on this project's 2-core machine while other jobs loaded it to 4-16): on one thread, the 211 one-token
# matmuls took 77 of 96 ms (81 %; about 25 ms on an idle machine, the floor of an eager step) and the 30 SDPA calls
# 3 ms; on two threads, the same SDPA calls took 134-202 ms of a 290-330 ms step, as each call's two threads waited
# for each other on the busy cores; the rest is ~50 small kernels and ~16 module calls per layer (RMSNorm in six
# kernels, RoPE, residual adds, hook-point checks). Every kernel that splits its work over threads pays that wait
# on a shared machine, so fewer kernels is the lever: decode_step keeps the matmuls and the SDPA call and drops
# the rest where it can (RMSNorm as torch's fused kernel, each residual add folded into its matmul: addmm, or on
# the CPU an add in numpy; no module calls) and q/k/v and gate/up each as one matmul where optimize_for_decode laid
# them side by side (``fused``; 4 matmul calls a layer instead of 7). Measured and left out: one query's attention
# as two batched matmuls and a softmax (three threaded kernels instead of one: slower on a busy machine).


def _check(model: nn.Module) -> tuple[bool, list]:
    """(whether ``model`` is exactly the tutorial's fp32 SDPA decoder with no hook attached, the (parent's
    children, name, child) links that check relied on). LoRA adapters, int8 layers, another dtype or attention
    implementation, or a hook on any module (or a global one) take the modules' own path."""
    links: list = [(model._modules, name, m) for name, m in model._modules.items()]
    links += [(model.blocks._modules, name, m) for name, m in model.blocks._modules.items()]
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
            links += [(owner._modules, name, m) for name, m in owner._modules.items()]
            modules += owner._modules.values()
        linears = [attn._modules[n] for n in ("q_proj", "k_proj", "v_proj", "o_proj")] + [
            mlp._modules[n] for n in ("gate_proj", "up_proj", "down_proj")] if ok else []
        ok = ok and all(type(lin) is nn.Linear and lin.bias is None and lin.weight.dtype == torch.float32
                        for lin in linears)
    hooked = any(m._forward_hooks or m._forward_pre_hooks for m in modules)
    return ok and not hooked, links


def can_decode_fast(model: nn.Module) -> bool:
    """Whether ``decode_step`` runs for ``model`` now: prepared by ``optimize_for_decode``, the tutorial's fp32
    decoder unchanged (plain ``nn.Linear``s, RMSNorm, SwiGLU, SDPA attention: no LoRA, no int8, no bf16), and no
    hook attached anywhere.

    The full check reads ~1,000 modules (about 1 ms, 3 % of a step): a "yes" is kept on the model and reused
    while no hook has been registered anywhere since (every registration takes a new ``RemovableHandle`` id)
    and no module has been swapped for another (the links it read still hold); dtype and attention
    implementation, which change no module, are read at every step.
    """
    if not model.__dict__.get(FAST_DECODE) or _module._global_forward_hooks or _module._global_forward_pre_hooks:
        return False
    kept = model.__dict__.get("_fast_check")
    if kept is None or kept[0] != RemovableHandle.next_id or not kept[1] \
            or not all(d.get(n) is m for d, n, m in kept[2]):  # a "no" is never reused: a hook may have gone
        kept = (RemovableHandle.next_id, *_check(model))
        model.__dict__["_fast_check"] = kept
    return kept[1] and model.lm_head.weight.dtype == torch.float32 and all(
        block._modules["attn"].impl == "sdpa" for block in model.blocks)  # set_attn_impl swaps no module


def _rms_norm(x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
    return F.rms_norm(x, norm.weight.shape, norm.weight, norm.eps)  # (B, C): one kernel instead of six


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


def torch_matmul(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ w``, or ``residual + x @ w`` as one kernel (addmm): ``decode_step``'s products off the CPU (or with
    EXPLORER_DECODE_BLAS=torch)."""
    return x @ w if residual is None else torch.addmm(residual, x, w)


def numpy_matmul(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ w`` (plus ``residual`` when given, added in numpy) for CPU fp32 tensors, computed by numpy's BLAS (the
    OpenBLAS its wheels ship) on the same memory.

    One token's vector times a weight matrix reads the whole matrix once for 2 flops a number: it runs at
    the speed the BLAS streams memory. On this project's 2-core AVX-512 CPU, one step's matrix products at the
    SmolLM2-135M shape (30 layers and the LM head, 538 MB of fp32 weights, all from DRAM) took 18-21 ms through
    numpy's OpenBLAS and 32-36 ms through torch's (MKL), in this layout or the other. Nothing is copied:
    ``Tensor.numpy()`` and ``torch.from_numpy`` share the memory."""
    y = np.matmul(x.numpy(), w.detach().numpy())
    if residual is not None:
        y += residual.numpy()
    return torch.from_numpy(y)


def decode_blas(on: torch.Tensor) -> str:
    """Which library computes ``decode_step``'s matrix products for tensors where ``on`` is (a weight, a token),
    for the provenance of a speed."""
    if not on.is_cpu or not DECODE_WITH_NUMPY:
        return f"torch {torch.__version__}"
    blas = np.show_config(mode="dicts").get("Build Dependencies", {}).get("blas", {})
    return f"numpy {np.__version__} ({blas.get('name', 'its BLAS')} {blas.get('version', '')})".replace(" )", ")")


def decode_step(model: nn.Module, token: torch.Tensor, cache: KVCache, pos: int) -> torch.Tensor | None:
    """One new token (B, 1) at position ``pos`` through the decoder as flat tensor operations; next-token
    logits (B, V), or None when ``can_decode_fast(model)`` is False (the caller then runs the model).

    The same computation as ``Decoder.forward(token, start_pos=pos, cache=cache, last_only=True)``, the same
    cache writes (``KVCache.update``), the modules' own weights read in place, the same attention kernel (SDPA;
    one query sees every cached key, so there is no mask).

    On the CPU the matrix products go through ``numpy_matmul`` (``DECODE_WITH_NUMPY``), and this thread's torch
    operations run on one intra-op thread for the step, then the count is put back: OpenBLAS brings its own
    threads, and while they wait for the next product (spinning) torch's threads wait for cores. Measured at the
    SmolLM2-135M shape on 2 cores: 2.3 tokens/s with torch on 2 threads beside them, 31-38 on 1, 21-27 for the
    step through torch alone.
    """
    if not can_decode_fast(model):
        return None
    c = model.config
    if token.dim() != 2 or token.shape[1] != 1 or not 0 <= pos < c.max_seq_len:
        return None  # let the model say what is wrong
    if not token.is_cpu or not DECODE_WITH_NUMPY:
        return _decode_step(model, token, cache, pos, torch_matmul)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _decode_step(model, token, cache, pos, numpy_matmul)
    finally:
        torch.set_num_threads(threads)


def _decode_step(model: nn.Module, token: torch.Tensor, cache: KVCache, pos: int, matmul) -> torch.Tensor:
    """``decode_step``'s body; ``matmul(x, w, residual=None)`` is ``x @ w`` (+ ``residual``) for (B, in) x (in, out)
    (``torch_matmul`` or ``numpy_matmul``)."""
    c = model.config
    B = token.shape[0]
    H, Hkv, D = c.n_heads, c.n_kv_heads, c.head_dim
    R = rope_matrix(model.rope_cos[pos:pos + 1], model.rope_sin[pos:pos + 1])  # (D, D), shared by every layer
    x = F.embedding(token[:, 0], model.embed_tokens.weight)  # (B, C)
    for layer, block in enumerate(model.blocks):
        attn, mlp = block.attn, block.mlp
        h = _rms_norm(x, block.input_layernorm)
        qkv = fused(attn.q_proj, attn.k_proj, attn.v_proj)  # (C, (H + 2 Hkv) D) or None
        if qkv is not None:
            q, k, v = matmul(h, qkv).split([H * D, Hkv * D, Hkv * D], dim=1)
        else:
            q, k, v = (matmul(h, lin.weight.t()) for lin in (attn.q_proj, attn.k_proj, attn.v_proj))
        q = (q.reshape(B * H, D) @ R).view(B, H, 1, D)  # RoPE'd, (B, H, 1, D)
        k = (k.reshape(B * Hkv, D) @ R).view(B, Hkv, 1, D)  # (B, Hkv, 1, D)
        v = v.reshape(B, Hkv, 1, D)
        keys, values = cache.update(layer, pos, k, v)  # (B, Hkv, pos + 1, D) each
        z = F.scaled_dot_product_attention(q, keys, values, enable_gqa=True)  # (B, H, 1, D), no mask: one query
        x = matmul(z.reshape(B, H * D), attn.o_proj.weight.t(), x)  # x + o_proj(z), (B, C)
        h = _rms_norm(x, block.post_attention_layernorm)
        gate_up = fused(mlp.gate_proj, mlp.up_proj)  # (C, 2 F) or None
        if gate_up is not None:
            gate, up = matmul(h, gate_up).chunk(2, dim=1)  # (B, F) each
        else:
            gate, up = matmul(h, mlp.gate_proj.weight.t()), matmul(h, mlp.up_proj.weight.t())
        x = matmul(F.silu(gate, inplace=True).mul_(up), mlp.down_proj.weight.t(), x)  # x + down(silu(gate) up)
    return matmul(_rms_norm(x, model.norm), model.lm_head.weight.t())  # (B, V)
