"""Speed choices kept out of the teaching code: opt-in, named, each with what it buys and why. This file: how a
decoder's weights are laid out in memory for one-token decoding, and when a prepared model may have changed.

Notation: ``in``/``out`` the features of a linear layer (``nn.Linear.weight`` has shape (out, in)).

The models read like the tutorial (plain ``nn.Linear``, contiguous (out, in) weights, a hook point at every
step). The app and the benchmark call ``optimize_for_decode`` once after loading. It changes memory order,
never a weight's value, name or shape, and lets ``models.generate.decode_one`` take
``models.fast_decode.decode_step``: the same one-token computation written as a flat sequence of array operations
(on the CPU, ``models.fast_cpu``: the matrix products in torch or numpy's BLAS, everything between them in numpy
on the same memory). Outputs agree with the modules' up to float rounding (the BLAS may add the products in
another order).
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn.modules import module as _module
from torch.utils.hooks import RemovableHandle

from .attention import Attention
from .layers import SwiGLU

FAST_DECODE = "_fast_decode"  # the attribute optimize_for_decode sets on a decoder it prepared


def optimize_for_decode(model: nn.Module) -> nn.Module:
    """Store every ``nn.Linear`` weight (out, in) with out >= in in (in, out) memory order, the query/key/value
    projections of each attention layer side by side in one (in, q + k + v) matrix and each SwiGLU's gate and
    up projections in one (in, 2 F) matrix, and, for a decoder, let ``models.generate.decode_one`` take
    ``models.fast_decode.decode_step`` (see ``can_decode_fast`` there for when it does); returns ``model`` (changed in place).

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


# Bumped whenever a module, parameter or buffer is registered anywhere in the process (PyTorch's global
# registration hooks: ``setattr`` of a module or parameter, ``add_module``, LoRA or int8 swapping a layer). With
# ``RemovableHandle.next_id`` (every hook registration takes a new id) it tells whether a model's structure or hooks
# may have changed since ``models.fast_decode.can_decode_fast`` or ``models.fast_cpu.weights_plan`` last looked,
# without walking its ~1,000 modules at every step.
_REGISTRATIONS = [0]


def _count_registration(*_) -> None:
    _REGISTRATIONS[0] += 1


_module.register_module_module_registration_hook(_count_registration)
_module.register_module_parameter_registration_hook(_count_registration)
_module.register_module_buffer_registration_hook(_count_registration)


def structure_version(model: nn.Module) -> tuple[int, int, int]:
    return RemovableHandle.next_id, _REGISTRATIONS[0], len(model.blocks._modules)  # deleting a block registers nothing
