"""``decode_step``: the one-token path ``models.generate.decode_one`` takes for a decoder prepared by
``models.fast.optimize_for_decode``, when nothing would be skipped (``can_decode_fast``); one token on the CPU goes
to ``models.fast_cpu``, a batch or a GPU to ``_torch_step`` here.

Notation: B batch, C model dim, H query heads, Hkv key/value heads, D head dim, F feed-forward dim, V vocabulary.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _module

from .attention import Attention
from .block import PreNormBlock
from .fast import FAST_DECODE, fused, structure_version
from .fast_cpu import TORCH_PRODUCTS, cpu_products, run_cpu_step, weights_plan
from .kv_cache import KVCache
from .layers import RMSNorm, SwiGLU
from .rope import rope_matrix


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
    while no hook, module, parameter or buffer has been registered anywhere since
    (``models.fast.structure_version``);
    dtype and attention implementation, which register nothing, are read at every step.
    """
    if not model.__dict__.get(FAST_DECODE) or _module._global_forward_hooks or _module._global_forward_pre_hooks:
        return False
    version = structure_version(model)
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
    case) takes ``models.fast_cpu``'s step: the products in torch or numpy's BLAS, the rest in numpy; a batch, or a model on
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
        plan = weights_plan(model)
        if plan is not None and 0 <= token_id < c.vocab_size:
            return run_cpu_step(plan, token_id, cache, pos, cpu_products(model, plan))
    return _torch_step(model, token, cache, pos)


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
