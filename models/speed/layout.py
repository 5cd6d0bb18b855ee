"""How a decoder's weights lie in memory for one-token decoding: ``optimize_for_decode`` and what depends on it.

Notation: ``in``/``out`` the features of a linear layer (``nn.Linear.weight`` has shape (out, in)).

The models read like the tutorial (plain ``nn.Linear``, contiguous (out, in) weights). The app and the benchmark
call ``optimize_for_decode`` once after loading: it changes memory order, never a weight's value, name or shape, so
the modules compute what they computed before (up to the BLAS adding products in another order) and the fast step
(``models.speed.step``) reads q, k, v and gate, up with one product each. Measurements: bench/notes/decode-step.md.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from ..attention import Attention
from ..layers import SwiGLU

LAID_OUT = "_decode_layout"  # the attribute optimize_for_decode sets on a model it laid out (prepared_copy reads it)


def optimize_for_decode(model: nn.Module) -> nn.Module:
    """Store every ``nn.Linear`` weight (out, in) with out >= in in (in, out) memory order, the query/key/value
    projections of each attention layer side by side in one (in, q + k + v) matrix and each SwiGLU's gate and
    up projections in one (in, 2 F) matrix; returns ``model`` (changed in place).

    Same shape, same parameter names, same values: only where the numbers sit in memory changes (each weight
    re-laid is a (out, in) view with ``weight.stride() == (1, n)``, n the width of the matrix it lies in), so
    checkpoints save and load as before. One token times a weight streams the weight; the CPU BLAS streams it
    faster along its contiguous dimension, except for a narrowing matrix (out < in: SwiGLU's down projection),
    which keeps its (out, in) order. A layout choice measured on two CPUs, not an algorithm: measure before relying
    on it elsewhere.

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
    setattr(model, LAID_OUT, True)
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
    return optimize_for_decode(out) if getattr(model, LAID_OUT, False) else out
