"""Hook points, ``run_with_cache`` (record what the model computes) and ``run_with_hooks`` (change it).

Notation: ``B`` batch, ``T`` queries, ``S`` keys, ``H`` query heads, ``D`` head dim, ``V`` vocabulary.

Hooks are registered on the model's modules, which the app shares between users, so each hooked run holds
``locks.model_lock(model)`` and each hook records only calls made on the thread that registered it: two users'
captures can never mix, and a plain forward on another thread is never captured. Edits
(``run_with_hooks``) likewise change only the forward of the thread that registered them.
"""
from __future__ import annotations

import threading
import weakref
from typing import Callable

import numpy as np
import torch

from lens import device as dev
from torch import nn

from models.attention import Attention
from models.config import check_attn_impl
from models.decoder import check_tokens
from models.hooks import HookPoint


_MODEL_LOCKS: "weakref.WeakKeyDictionary[nn.Module, threading.RLock]" = weakref.WeakKeyDictionary()
_MODEL_LOCKS_GUARD = threading.Lock()


def model_lock(model: nn.Module) -> threading.RLock:
    """The lock every hooked run on ``model``, and every change to it, holds (one per model object).

    Re-entrant, so a probe that calls another probe on the same thread does not deadlock.
    """
    with _MODEL_LOCKS_GUARD:
        lock = _MODEL_LOCKS.get(model)
        if lock is None:
            lock = _MODEL_LOCKS[model] = threading.RLock()
        return lock


def _hook_points(model: nn.Module) -> list[tuple[str, HookPoint]]:
    """(name, hook point) for every hook point a forward can reach (an attention without RoPE, as in
    the encoder, never calls its hook_rot_q / hook_rot_k, so they are left out)."""
    modules = list(model.named_modules())
    silent = {f"{name}.hook_rot_{x}" if name else f"hook_rot_{x}"
              for name, m in modules if isinstance(m, Attention) and not m.use_rope for x in ("q", "k")}
    return [(name, m) for name, m in modules if isinstance(m, HookPoint) and name not in silent]


# Where each part of a pre-norm block runs, so names list in the order the forward reaches them
# (named_modules would list a block's own hooks after its submodules').
_BLOCK_ORDER = {"hook_resid_pre": 0, "input_layernorm": 1, "attn": 2, "hook_attn_out": 3, "hook_resid_mid": 4,
                "post_attention_layernorm": 5, "mlp": 6, "hook_mlp_out": 7, "hook_resid_post": 8}
# With sandwich norms (Gemma) post_attention_layernorm normalises the attention's output, and two more norms wrap
# the MLP.
_SANDWICH_ORDER = {"hook_resid_pre": 0, "input_layernorm": 1, "attn": 2, "post_attention_layernorm": 3,
                   "hook_attn_out": 4, "hook_resid_mid": 5, "pre_feedforward_layernorm": 6, "mlp": 7,
                   "post_feedforward_layernorm": 8, "hook_mlp_out": 9, "hook_resid_post": 10}


def _forward_rank(name: str, order: dict[str, int] = _BLOCK_ORDER) -> tuple[int, int, int]:
    parts = name.split(".")
    if parts[0] == "blocks" and len(parts) > 2 and parts[1].isdigit():
        return (1, int(parts[1]), order.get(parts[2], len(order)))
    if name == "hook_embed":
        return (0, 0, 0)
    return (3, 0, 0) if name == "hook_logits" else (2, 0, 0)


def hook_names(model: nn.Module) -> list[str]:
    """Every hook point of ``model`` by module path, in the order a forward reaches them.

    Decoder: ``hook_embed``, then per block ``blocks.{i}.hook_resid_pre``,
    ``blocks.{i}.input_layernorm.hook_scale`` / ``hook_normalized``, ``blocks.{i}.attn.hook_q`` ... ``hook_pattern``,
    ``hook_z``, ``blocks.{i}.hook_attn_out``, ``hook_resid_mid``, ``post_attention_layernorm.*``,
    ``blocks.{i}.mlp.hook_gate`` / ``hook_up`` / ``hook_post``, ``hook_mlp_out``, ``hook_resid_post``; then
    ``norm.hook_scale``, ``norm.hook_normalized``, ``hook_logits``. The encoder has no ``hook_logits`` and its
    MLP hooks are ``mlp.hook_pre`` / ``mlp.hook_post``.
    """
    sandwich = any(getattr(block, "sandwich", False) for block in getattr(model, "blocks", ()))
    order = _SANDWICH_ORDER if sandwich else _BLOCK_ORDER
    return sorted((name for name, _ in _hook_points(model)), key=lambda name: _forward_rank(name, order))


def effective_impl(model: nn.Module, attn_impl: str | None) -> str:
    if attn_impl is not None:
        return check_attn_impl(attn_impl)
    impls = {b.attn.impl for b in getattr(model, "blocks", [])}
    if len(impls) == 1:
        return impls.pop()
    return "mixed" if impls else model.config.attn_impl


_IMPL_WORDS = {
    "sdpa": "PyTorch's fused scaled_dot_product_attention",
    "tiled": "the tiled online-softmax (flash) loop",
}


def _pattern_source(impl: str, rotary: bool) -> str:
    qk = "rotated q and k" if rotary else "q and k"
    if impl == "naive":
        return ("naive softmax(q·kᵀ/√D + mask) computed by the model: these are the very weights that "
                "produced the output")
    if impl == "mixed":
        return (f"layers run different implementations; where a layer runs naive attention these are the "
                f"weights it used, elsewhere they are recomputed with the naive formula from the captured {qk}")
    return (f"recomputed with the naive formula from the captured {qk}; the output came from {impl} "
            f"({_IMPL_WORDS.get(impl, impl)}), which never forms the weights")


class ActivationCache(dict):
    """``name -> tensor`` (detached clones), plus where the attention weights came from.

    attn_impl: the attention implementation that produced the output ("naive", "sdpa", "tiled" or
        "mixed" when layers differ).
    pattern_source: one sentence for the UI saying how ``*.attn.hook_pattern`` was obtained.
    n_layers: layers of the model, so ``stack`` knows what to expect.
    """

    def __init__(self, *args, attn_impl: str = "", pattern_source: str = "", n_layers: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.attn_impl = attn_impl
        self.pattern_source = pattern_source
        self.n_layers = n_layers

    def stack(self, suffix: str) -> torch.Tensor:
        """``blocks.{i}.<suffix>`` for every layer, stacked: e.g. ``stack("attn.hook_pattern")`` -> (L, B, H, T, S)."""
        names = [f"blocks.{i}.{suffix}" for i in range(self.n_layers)]
        missing = [n for n in names if n not in self]
        if missing:
            raise ValueError(f"the cache lacks {missing[0]}: run run_with_cache with names that include it.")
        return torch.stack([self[n] for n in names])


def _named_point(model: nn.Module, name: str) -> HookPoint | None:
    """The hook point ``name`` names (as ``_hook_points`` lists it), found by its path: a sweep registers a few
    hooks per call, and listing every module of a 30-layer model each time cost more than the hooks."""
    try:
        point = model.get_submodule(name)
    except AttributeError:
        return None
    if not isinstance(point, HookPoint):
        return None
    parent, _, leaf = name.rpartition(".")
    if leaf in ("hook_rot_q", "hook_rot_k"):
        owner = model.get_submodule(parent) if parent else model
        if isinstance(owner, Attention) and not owner.use_rope:
            return None
    return point


def _select(model: nn.Module, names) -> list[tuple[str, HookPoint]]:
    if names is None:
        return _hook_points(model)
    if callable(names):
        return [(n, m) for n, m in _hook_points(model) if names(n)]
    if isinstance(names, str):
        names = [names]
    wanted = list(names)
    found = [(n, _named_point(model, n)) for n in dict.fromkeys(wanted)]
    if all(point is not None for _, point in found):
        return found
    known = dict(_hook_points(model))
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not a hook point of this model; hook_names(model) lists the "
                         f"{len(known)} there are (e.g. {next(iter(known), '')!r}).")
    return [(n, known[n]) for n in dict.fromkeys(wanted)]


def _device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else dev.device()


def as_tokens(model: nn.Module, tokens, start_pos: int = 0) -> torch.Tensor:
    """Token ids as a (B, T) int64 tensor on the model's device; a flat list or (T,) becomes one row.

    The probes' API edge: ids outside the vocabulary, or positions past the context, are refused here with
    ``check_tokens``'s sentence, before a hook is registered or the model runs.
    """
    if isinstance(tokens, torch.Tensor):
        t = tokens
    else:
        try:
            t = torch.as_tensor(np.asarray(tokens))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"tokens must be a list of integer ids or an integer tensor ({exc}).") from exc
    if t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex():
        raise ValueError(f"tokens must be integer ids, got {t.dtype}.")
    if t.dim() == 1:
        t = t[None]
    if t.dim() != 2:
        raise ValueError(f"tokens must have shape (length,) or (batch, length), got {tuple(t.shape)}.")
    t = t.to(device=_device(model), dtype=torch.long)
    if getattr(model, "config", None) is not None:
        check_tokens(t, model.config, start_pos)
    return t


def run_with_cache(model: nn.Module, tokens, names=None, *, attn_impl: str | None = None,
                   reduce: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
                   **forward_kwargs) -> tuple[torch.Tensor, ActivationCache]:
    """Run ``model(tokens, ...)`` once, recording hook points. Returns (output, cache).

    output: the model's return value (decoder logits (B, T, V), encoder hidden states (B, T, C)).
    names: None (every hook point), a list of hook names, one name, or a predicate ``name -> bool``.
    attn_impl: this call's attention implementation (default: the model's own).
    reduce: ``reduce(name, x)`` is what the cache keeps of each recorded ``x`` instead of a clone of it (a score
    computed as soon as the activation exists: memory for one layer's activation at a time, not every layer's).
    forward_kwargs: passed to the model (``causal``, ``key_padding``, ``start_pos``, ``cache``...).
    The cached tensors are detached clones made under inference mode: read them (``.numpy()``, slicing,
    arithmetic), don't modify them in place.

    Hooks are removed afterwards, also when selecting names or the forward raises. Runs under
    ``torch.inference_mode`` holding ``model_lock(model)``; each hook records only the calling thread's
    forward, so a concurrent plain forward on the shared model is never captured.
    """
    tokens = as_tokens(model, tokens, forward_kwargs.get("start_pos", 0))
    impl = effective_impl(model, attn_impl)
    cache = ActivationCache(attn_impl=impl, pattern_source=_pattern_source(impl, hasattr(model, "rope_cos")),
                            n_layers=len(getattr(model, "blocks", [])))
    owner = threading.get_ident()

    def make_hook(name: str):
        def hook(module, inputs, output):
            if threading.get_ident() == owner:
                cache[name] = output.detach().clone() if reduce is None else reduce(name, output.detach())
        return hook

    kwargs = dict(forward_kwargs)
    if attn_impl is not None:
        kwargs["attn_impl"] = attn_impl
    handles = []
    with model_lock(model):
        try:
            for name, point in _select(model, names):
                handles.append(point.register_forward_hook(make_hook(name)))
            with torch.inference_mode():
                out = model(tokens, **kwargs)
        finally:
            for h in handles:
                h.remove()
    return out, cache



Edit = Callable[[torch.Tensor, HookPoint], torch.Tensor]


def run_with_hooks(model: nn.Module, tokens, edits: list[tuple[str, Edit]], **forward_kwargs) -> torch.Tensor:
    """Run ``model(tokens, ...)`` once with ``edits`` in place; returns the model's output.

    edits: (hook name, fn) pairs; ``fn(x, point)`` returns what the model goes on with instead of ``x`` (same
    shape), TransformerLens' convention. The edits are registered for this call only, on this thread only
    (another user's forward on the shared model is never changed), under ``torch.inference_mode`` holding
    ``model_lock(model)``, and removed afterwards, also when the forward raises. While they are registered,
    ``models.hooks.has_hooks(model)`` is True, so no speed path skips them.
    """
    tokens = as_tokens(model, tokens, forward_kwargs.get("start_pos", 0))
    named = dict(edits)
    if len(named) != len(edits):
        raise ValueError("give each hook name at most one edit; combine what it should do into one function.")
    points = dict(_select(model, list(named)))
    owner = threading.get_ident()

    def thread_scoped(fn: Edit) -> Edit:
        def edit(x: torch.Tensor, point: HookPoint) -> torch.Tensor:
            if threading.get_ident() != owner:
                return x
            out = fn(x, point)
            if not isinstance(out, torch.Tensor) or out.shape != x.shape:
                got = type(out).__name__ if not isinstance(out, torch.Tensor) else tuple(out.shape)
                raise ValueError(f"an edit must return a tensor of the activation's shape {tuple(x.shape)}, "
                                 f"got {got}.")
            return out
        return edit

    handles = []
    with model_lock(model):
        try:
            for name, fn in edits:
                handles.append(points[name].add_edit(thread_scoped(fn)))
            with torch.inference_mode():
                return model(tokens, **forward_kwargs)
        finally:
            for h in handles:
                h.remove()


def check_layer(model: nn.Module, layer: int) -> None:
    L = len(model.blocks)
    if not isinstance(layer, int) or not 0 <= layer < L:
        raise ValueError(f"layer must be between 0 and {L - 1}, got {layer!r}.")


def check_head(model: nn.Module, head: int) -> None:
    H = model.config.n_heads
    if not isinstance(head, int) or not 0 <= head < H:
        raise ValueError(f"head must be between 0 and {H - 1}, got {head!r}.")
