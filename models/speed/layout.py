"""How a decoder's weights lie in memory for one-token decoding: the fast step's own copy (``decode_layout``), and
``optimize_for_decode`` for a caller that wants the model itself laid out so.

Notation: ``in``/``out`` the features of a linear layer (``nn.Linear.weight`` has shape (out, in)).

The models read like the tutorial (plain ``nn.Linear``, contiguous (out, in) weights) and the app keeps them so:
the fast step (``models.speed.step``) prepares its own copy of the layout the first time it decodes a model
(q, k, v side by side in one (in, q + k + v) matrix, gate and up in one (in, 2 F) matrix, every widening matrix
(in, out)), held beside the model and made again when a weight changes. ``decode_layout_bytes`` says what that copy
costs. Measurements: bench/notes/decode-step.md.
"""
from __future__ import annotations

import copy
import operator
import threading
import weakref
from typing import NamedTuple

import torch
from torch import nn

from ..attention import Attention
from ..layers import SwiGLU
from ..quant import Int8Linear
from .narrow import Int8Weight, stack_int8

LAID_OUT = "_decode_layout"  # the attribute optimize_for_decode sets on a model it laid out (prepared_copy reads it)


def optimize_for_decode(model: nn.Module) -> nn.Module:
    """For a caller that wants the model itself laid out (the fast step does not need it: ``decode_layout`` makes
    its own copy, and views instead of copying what is laid out already). Store every ``nn.Linear`` weight
    (out, in) with out >= in in (in, out) memory order, the query/key/value
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


# --- the fast step's own copy ----------------------------------------------------------------------------------
class Layer(NamedTuple):
    """One block's matrices as the fast step reads them, each (out, in) as ``nn.Linear`` holds it and (in, out) in
    memory where that streams faster: ``qkv`` and ``gate_up`` one matrix each (their layers' rows stacked), ``down``
    the module's own weight (a narrowing matrix keeps its (out, in) order)."""
    qkv: torch.Tensor | Int8Weight  # ((H + 2 Hkv) D, C)
    o: torch.Tensor | Int8Weight  # (C, H D)
    gate_up: torch.Tensor | Int8Weight  # (2 F, C)
    down: torch.Tensor | Int8Weight  # (C, F)


class DecodeLayout(NamedTuple):
    """The weights of one model laid out for one-token products, and what they were made from."""
    layers: list[Layer]  # an int8 model's (``Int8Linear`` projections): each matrix an ``Int8Weight``
    lm_head: torch.Tensor | Int8Weight  # (V, C): an Int8Weight where the model's head is an ``Int8Linear``
    sources: tuple[torch.Tensor, ...]  # the model's own tensors the step reads (these matrices' and the rest)
    pointers: list[int]  # where each source's memory was when the layout was made ...
    versioned: tuple[torch.Tensor, ...]  # ... and, for each source that counts its writes (not an inference tensor),
    versions: list[int]  # how many in-place writes it had had
    nbytes: int  # bytes of the copies this layout holds (a matrix already laid out in the model is viewed: 0)


# An in-place write (``copy_``, ``+=`` under no_grad, an optimizer step) bumps a tensor's version counter and
# ``.data =`` moves its memory; a write through ``.data`` does neither, as for every cache keyed on the weights.
_VERSION = operator.attrgetter("_version")


def _state(tensors: tuple[torch.Tensor, ...]) -> tuple[list[int], tuple[torch.Tensor, ...], list[int]]:
    versioned = tuple(t for t in tensors if not t.is_inference())
    return list(map(torch.Tensor.data_ptr, tensors)), versioned, list(map(_VERSION, versioned))


def sources(model: nn.Module) -> tuple[torch.Tensor, ...]:
    """Every tensor of ``model`` the fast step reads, in a fixed order (the model as ``why_not`` checked it)."""
    out = []
    for block in model.blocks:
        attn, mlp = block.attn, block.mlp
        out.append(block.input_layernorm.weight)
        for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj):
            out += _weights_of(m)
        out.append(block.post_attention_layernorm.weight)
        for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj):
            out += _weights_of(m)
    return (*out, model.norm.weight, *_weights_of(model.lm_head), model.embed_tokens.weight, model.rope_cos,
            model.rope_sin)


def _weights_of(linear: nn.Module) -> tuple[torch.Tensor, ...]:
    return (linear.qweight, linear.scale) if isinstance(linear, Int8Linear) else (linear.weight,)


def layout_current(layout: DecodeLayout, tensors: tuple[torch.Tensor, ...] | None = None) -> bool:
    """Whether ``tensors`` (default: the ones ``layout`` was made from) are where, and as written, as when it was
    made: two integer reads a tensor, cheap enough for every step."""
    if tensors is None:
        return list(map(torch.Tensor.data_ptr, layout.sources)) == layout.pointers and \
            list(map(_VERSION, layout.versioned)) == layout.versions
    pointers, _, versions = _state(tensors)
    return pointers == layout.pointers and versions == layout.versions


def _stacked(ws: list[torch.Tensor]) -> tuple[torch.Tensor, int]:
    """(sum of outs, in) rows of ``ws`` stacked, lying (in, sum of outs) in memory, and the bytes copied (0 when
    ``optimize_for_decode`` already laid them out so in the model, or for a narrowing matrix, read as it is)."""
    total = sum(w.shape[0] for w in ws)
    first = ws[0]
    if all(w.stride() == (1, total) for w in ws) and \
            [w.data_ptr() for w in ws] == [first.data_ptr() + sum(v.shape[0] for v in ws[:i]) * first.element_size()
                                           for i in range(len(ws))]:
        return first.detach().as_strided((total, first.shape[1]), (1, total)), 0
    if len(ws) == 1 and first.shape[0] < first.shape[1]:
        return first.detach(), 0  # a narrowing matrix streams faster in (out, in) order: the module's own
    side_by_side = torch.empty((first.shape[1], total), dtype=first.dtype, device=first.device)  # (in, sum of outs)
    start = 0
    for w in ws:
        side_by_side[:, start:start + w.shape[0]].copy_(w.detach().t())  # copy_ transposes faster than cat
        start += w.shape[0]
    return side_by_side.t(), side_by_side.numel() * side_by_side.element_size()


def _make_layout(model: nn.Module) -> DecodeLayout:
    tensors = sources(model)
    pointers, versioned, versions = _state(tensors)
    layers, nbytes = [], 0
    with torch.inference_mode(False), torch.no_grad():  # plain tensors, whatever mode the first decode runs in
        for block in model.blocks:
            attn, mlp = block.attn, block.mlp
            if isinstance(attn.q_proj, Int8Linear):  # an int8 model: every projection is (the fast step checked)
                parts = [stack_int8([attn.q_proj, attn.k_proj, attn.v_proj]), stack_int8([attn.o_proj]),
                         stack_int8([mlp.gate_proj, mlp.up_proj]), stack_int8([mlp.down_proj])]
                layers.append(Layer(*(m for m, _ in parts)))
                nbytes += sum(n for _, n in parts)
                continue
            parts = [_stacked([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]),
                     _stacked([attn.o_proj.weight]), _stacked([mlp.gate_proj.weight, mlp.up_proj.weight]),
                     (mlp.down_proj.weight.detach(), 0)]
            layers.append(Layer(*(m for m, _ in parts)))
            nbytes += sum(n for _, n in parts)
        # an int8 LM head is read as it is (one layer: nothing copied), shared between threads by the kernel
        lm_head, n = stack_int8([model.lm_head]) if isinstance(model.lm_head, Int8Linear) else \
            _stacked([model.lm_head.weight])
    return DecodeLayout(layers, lm_head, tensors, pointers, versioned, versions, nbytes + n)


class _Layouts:
    """The fast step's copies, one per model (weak keys: a copy goes when its model goes), made again when the
    model's weights change; at most ``max_models`` at once and ``max_bytes`` of copies (the copy being used always
    kept), the least recently decoded forgotten first (made again if it decodes again)."""

    def __init__(self, max_models: int = 4, max_bytes: int = 2**30) -> None:
        self.max_models, self.max_bytes = max_models, max_bytes
        self._held: "weakref.WeakKeyDictionary[nn.Module, DecodeLayout]" = weakref.WeakKeyDictionary()
        self._guard = threading.Lock()  # held while a copy is made: two first decodes of one model make one copy

    def get(self, model: nn.Module) -> DecodeLayout:
        with self._guard:
            layout = self._held.pop(model, None)
            if layout is None or not layout_current(layout, sources(model)):
                layout = None  # the old copy is dropped before the new one is made
                layout = _make_layout(model)
            while self._held and (len(self._held) >= self.max_models or
                                  sum(held.nbytes for held in self._held.values()) + layout.nbytes > self.max_bytes):
                self._held.pop(next(iter(self._held)), None)
            self._held[model] = layout  # last in: the most recently decoded
            return layout

    def nbytes(self, model: nn.Module) -> int:
        with self._guard:
            layout = self._held.get(model)
            return 0 if layout is None else layout.nbytes

    def clear(self) -> None:
        with self._guard:
            self._held.clear()


_layouts = _Layouts()


def decode_layout(model: nn.Module) -> DecodeLayout:
    """The fast step's layout of ``model``'s weights: made on the first call (a copy of every matrix the model does
    not already hold so), kept beside the model, made again after its weights change. The model itself is never
    changed: the weights the tutorial shows stay plain contiguous (out, in) tensors. Call only on a model
    ``why_not`` accepts."""
    return _layouts.get(model)


def decode_layout_bytes(model: nn.Module) -> int:
    """Bytes the fast step's copy of ``model``'s weights holds now (0 before its first fast decode, or after the
    copy was dropped)."""
    return _layouts.nbytes(model)
