"""The fast step: one new token through a decoder as a flat sequence of array operations instead of module calls,
for callers that ask for it (``generate(..., step=fast_step)``); by default every token runs through the modules.

It is a second implementation of the same math, written for exactly one decoder: the tutorial's Llama ``Decoder``
in fp32 with SDPA attention, plain ``nn.Linear``s without bias, RMSNorm, SwiGLU, no hook and no edit anywhere -- or
that decoder after ``models.quant.quantize_int8`` (one token on the CPU: the int8 products by
``models.speed.narrow``'s kernel, the same math as ``Int8Linear`` up to the order of the additions).
For anything else (LoRA, bf16, int8 in a batch or without the kernel, another attention implementation, a module or
a config option it does not know) it steps aside: it returns None and ``decode_one`` runs the modules. It cannot see a change to the teaching
code's source (an edited ``RMSNorm.forward``): a caller that shows its tokens says which path made them and checks
them against the modules (the generation tab does).

One token on the CPU goes to ``models.speed.cpu``'s step; a batch, or a model on a GPU, to ``_torch_step`` here.

Notation: B batch, C model dim, H query heads, Hkv key/value heads, D head dim, F feed-forward dim, V vocabulary.
"""
from __future__ import annotations

import dataclasses
import threading
import weakref
from functools import lru_cache
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..attention import Attention
from ..config import FAMILY_SWITCHES
from ..decoder import Decoder, DecoderBlock
from ..hooks import HookPoint, HookWatch, has_global_hooks, module_hooked
from ..kv_cache import KVCache
from ..layers import RMSNorm, SwiGLU
from ..quant import Int8Linear
from ..rope import rope_matrix
from . import narrow
from .cpu import INT8_PRODUCTS, TORCH_PRODUCTS, KVArrays, _Plan, cpu_products, run_cpu_step, weights_plan
from .layout import DecodeLayout, decode_layout, layout_current

# What the step was written for, spelled out rather than read from the model files: a config option, a module, a
# parameter or an attribute that is not listed here (a bias, a QK norm, a sliding window, ...) is something the step
# would skip, so the model runs through its modules until someone teaches the step that option.
KNOWN_CONFIG = frozenset({
    "vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_seq_len", "rope_theta",
    "rope_scaling",  # applied to the rotary tables the step reads (rope_cos, rope_sin)
    "norm_eps", "tie_embeddings", "attn_impl", "tile_size", "bos_token_id", "eos_token_id", "pad_token_id",
    "head_dim", "n_kv_groups"})
KNOWN_MODULES: dict[type, dict] = {  # type -> children (name: type), parameters, buffers, public attributes
    Decoder: dict(children={"embed_tokens": nn.Embedding, "blocks": nn.ModuleList, "norm": RMSNorm,
                            "lm_head": nn.Linear, "hook_embed": HookPoint, "hook_logits": HookPoint},
                  params=(), buffers=("rope_cos", "rope_sin"), attrs={"config", "training"}),
    nn.ModuleList: dict(children={}, params=(), buffers=(), attrs={"training"}),  # the blocks, added by index
    DecoderBlock: dict(children={"input_layernorm": RMSNorm, "attn": Attention, "post_attention_layernorm": RMSNorm,
                                 "mlp": SwiGLU, **{f"hook_{n}": HookPoint for n in (
                                     "resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post")}},
                       params=(), buffers=(), attrs={"sandwich", "training"}),
    Attention: dict(children={**{f"{n}_proj": nn.Linear for n in "qkvo"}, **{f"hook_{n}": HookPoint for n in (
        "q", "k", "v", "rot_q", "rot_k", "attn_scores", "pattern", "z")}}, params=(), buffers=(),
                    attrs={"causal", "head_dim", "impl", "k_norm", "n_heads", "n_kv_heads", "q_norm", "scale",
                           "sliding_window", "tile_size", "training", "use_rope"}),
    RMSNorm: dict(children={"hook_scale": HookPoint, "hook_normalized": HookPoint}, params=("weight",), buffers=(),
                  attrs={"eps", "offset", "training"}),
    SwiGLU: dict(children={**{f"{n}_proj": nn.Linear for n in ("gate", "up", "down")},
                           **{f"hook_{n}": HookPoint for n in ("gate", "up", "post")}},
                 params=(), buffers=(), attrs={"act", "training"}),
    nn.Linear: dict(children={}, params=("weight",), buffers=(), attrs={"in_features", "out_features", "training"}),
    nn.Embedding: dict(children={}, params=("weight",), buffers=(), attrs={
        "embedding_dim", "max_norm", "norm_type", "num_embeddings", "padding_idx", "scale_grad_by_freq", "sparse",
        "training"}),
    HookPoint: dict(children={}, params=(), buffers=(), attrs={"edits", "training"}),
    # weight-only int8 (models.quant): the seven projections of every block and the LM head, products by
    # models.speed.narrow
    Int8Linear: dict(children={}, params=(), buffers=("qweight", "scale"),
                     attrs={"in_features", "out_features", "training"}),
}
PROJECTIONS = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
               "mlp.down_proj")


class _Tree(NamedTuple):
    modules: dict[str, type]  # every module path (named_modules) and the exact type the step knows there
    params: frozenset[str]  # every parameter path (a tied LM head included: named_parameters(remove_duplicate=False))
    buffers: frozenset[str]


# The tree depends only on the number of layers and takes ~1,000 string operations to spell out: a few layer counts
# are kept (bounded: 4) so that the check of each generation only compares.
@lru_cache(maxsize=8)
def _known_tree(n_layers: int, int8: bool = False, int8_head: bool = False) -> _Tree:
    """int8: the tree of ``models.quant.quantize_int8``'s copy, every block's projections ``Int8Linear``; int8_head:
    its LM head too (the default), else an fp32 ``nn.Linear`` (a copy quantised without it)."""
    modules, params, buffers = {}, set(), set()

    def add(path: str, kind: type) -> None:
        if int8 and path.split(".", 2)[-1] in PROJECTIONS or int8_head and path == "lm_head":
            kind = Int8Linear
        modules[path] = kind
        spec = KNOWN_MODULES[kind]
        params.update(f"{path}.{n}" if path else n for n in spec["params"])
        buffers.update(f"{path}.{n}" if path else n for n in spec["buffers"])
        children = {**spec["children"], **({str(i): DecoderBlock for i in range(n_layers)} if path == "blocks"
                                           else {})}
        for child, child_kind in children.items():
            add(f"{path}.{child}" if path else child, child_kind)

    add("", Decoder)
    return _Tree(modules, frozenset(params), frozenset(buffers))


def _first_difference(got: dict[str, type], want: dict[str, type]) -> str:
    for path, kind in got.items():
        if want.get(path) is not kind:
            known = f", not the {want[path].__name__} the fast step knows" if path in want else \
                ", a module the fast step does not know"
            return f"{path or 'the model'}: a {kind.__name__}{known}"
    return f"{next(p for p in want if p not in got)} missing"


def why_not(model: nn.Module) -> str | None:
    """None when the fast step computes exactly what ``model``'s modules compute for one cached token; else why
    not, in a few words ("a hook or an edit is attached", "blocks.0.attn.q_proj: a LoRALinear, ..."). Reads the
    model through public APIs only (``named_modules``, ``named_parameters``, ``vars``, attributes): each module's
    exact type, children, parameters, buffers and settings must be the ones the step was written for."""
    return _check(model, [], {})


def _check(model: nn.Module, seen: list, params: dict) -> str | None:
    """``why_not``, filling ``seen`` with every module it walked (the list a ``HookWatch`` then watches) and
    ``params`` with the model's parameters by path."""
    if type(model) is not Decoder:
        return f"a {type(model).__name__}, not the tutorial's Decoder"
    c = model.config
    unknown = sorted({f.name for f in dataclasses.fields(c)} - KNOWN_CONFIG - set(FAMILY_SWITCHES) - {"family"})
    if unknown:
        return f"config options the fast step does not know ({', '.join(unknown)})"
    if c.differences_from_llama():  # the step computes Llama's block only
        return f"not Llama's block ({', '.join(c.differences_from_llama())})"
    hooked = "a hook or an edit is attached"
    if has_global_hooks():
        return hooked
    if len(model.blocks) != c.n_layers:
        return "blocks added or removed without the config"
    int8 = len(model.blocks) > 0 and type(model.blocks[0].attn.q_proj) is Int8Linear
    if int8 and narrow.unavailable() is not None:
        return f"int8 weights, and {narrow.unavailable()}"
    tree = _known_tree(c.n_layers, int8, int8 and type(model.lm_head) is Int8Linear)
    got = {}
    for path, m in model.named_modules(remove_duplicate=False):  # one walk: hooks, types, settings
        seen.append(m)
        if module_hooked(m):
            return hooked
        got[path] = type(m)
        if type(m) in KNOWN_MODULES and {k for k in vars(m) if k[0] != "_"} != KNOWN_MODULES[type(m)]["attrs"]:
            return f"{path or 'the model'}: settings the fast step does not know"
    if got != tree.modules:
        return _first_difference(got, tree.modules)
    params.update(model.named_parameters(remove_duplicate=False))
    if params.keys() != tree.params or {n for n, _ in model.named_buffers(remove_duplicate=False)} != tree.buffers:
        return "parameters or buffers the fast step does not know (a bias?)"
    if any(p.dtype != torch.float32 for p in params.values()):
        return "weights not in float32"
    if len({p.device for p in params.values()} | {model.rope_cos.device}) != 1:
        return "weights on more than one device"
    if int8 and any(m.qweight.dtype != torch.int8 or m.scale.dtype != torch.float32 or not m.qweight.is_cpu
                    for m in model.modules() if isinstance(m, Int8Linear)):
        return "int8 weights off the CPU or not stored as models.quant stores them"
    C, V, H, Hkv, D = c.d_model, c.vocab_size, c.n_heads, c.n_kv_heads, c.head_dim
    for block in model.blocks:
        attn, mlp = block.attn, block.mlp
        if attn.impl != "sdpa":
            return f"{attn.impl} attention (the fast step is SDPA's math)"
        if not (attn.causal and attn.use_rope and (attn.n_heads, attn.n_kv_heads, attn.head_dim) == (H, Hkv, D)):
            return "an attention layer set up otherwise than the config says"
        if block.sandwich or attn.q_norm is not None or attn.k_norm is not None or attn.scale is not None or \
                attn.sliding_window is not None or mlp.act != "silu" or \
                any(n.offset != 0.0 for n in (block.input_layernorm, block.post_attention_layernorm, model.norm)):
            return "a layer switched to another family's block (see ModelConfig's FAMILY_SWITCHES)"
        shapes = [(attn.q_proj, (H * D, C)), (attn.k_proj, (Hkv * D, C)), (attn.v_proj, (Hkv * D, C)),
                  (attn.o_proj, (C, H * D)), (mlp.gate_proj, (c.d_ff, C)), (mlp.up_proj, (c.d_ff, C)),
                  (mlp.down_proj, (C, c.d_ff)), (block.input_layernorm, (C,)), (block.post_attention_layernorm, (C,))]
        if any(tuple(_shape(m)) != shape for m, shape in shapes):
            return "weights shaped otherwise than the config says"
    if tuple(_shape(model.lm_head)) != (V, C) or tuple(model.embed_tokens.weight.shape) != (V, C) or \
            model.embed_tokens.max_norm is not None or tuple(model.norm.weight.shape) != (C,) or \
            model.rope_cos.dtype != torch.float32 or tuple(model.rope_cos.shape) != (c.max_seq_len, D):
        return "weights shaped otherwise than the config says"
    return None


def _shape(m: nn.Module) -> torch.Size:
    return m.qweight.shape if isinstance(m, Int8Linear) else m.weight.shape


class _Run(NamedTuple):
    """What one generation (one KV cache) checked once, at its first step, and what each step re-checks cheaply."""
    model: "weakref.ref[nn.Module]"
    reason: str | None  # why the step stands aside for this generation (None: it runs)
    watch: HookWatch | None  # hooks and edits on every module checked, seen at each step
    attentions: tuple  # each layer's Attention: set_attn_impl swaps no module, so impl is read at each step
    requires_grad: bool  # under autograd the modules, which record a graph, run instead
    layout: DecodeLayout | None  # the step's own layout of the weights (None where it stands aside)
    plan: _Plan | None  # the CPU step's view of that layout and of the norms (None: not on the CPU)
    kv: list  # [KVArrays] once the CPU step has run on this cache: its arrays, made once per generation


class FastStep:
    """A one-token path to pass as ``generate(..., step=...)`` / ``decode_one(..., step=...)``: called as
    ``step(model, token (B, 1), cache, pos)``, it returns next-token logits (B, V), the same as
    ``Decoder.forward(token, start_pos=pos, cache=cache, last_only=True)[:, -1]`` up to float rounding (the same
    cache writes too), or None to let the modules run that step.

    The full check (``why_not``, a few ms) runs once per generation, at the first step with a new ``cache``; every
    step re-checks what can change between two tokens in microseconds: a hook or an edit on any module checked
    (``models.hooks.HookWatch``), a process-wide hook, the attention implementation, autograd, and whether any
    weight was written or replaced since the step's own layout of them was made (``models.speed.layout``: then the
    model is checked and laid out again). A "no" holds for the rest of that generation.

    ``cpu=False`` (``torch_step``) always takes the torch step, never the numpy one.
    """

    _MAX_RUNS = 32  # generations remembered at once (one per KV cache alive; the app runs a few at a time)

    def __init__(self, name: str, *, cpu: bool = True) -> None:
        self.name, self.host_step = name, cpu
        # One entry per generation in progress, dropped with its cache (weak keys); bounded by _MAX_RUNS so that a
        # caller who keeps many caches alive cannot grow it: the oldest is forgotten and checked again if it returns.
        self._runs: "weakref.WeakKeyDictionary[KVCache, _Run]" = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<{self.name}>"

    def why_not(self, model: nn.Module) -> str | None:
        """Why this step would stand aside for ``model`` now (None: it would run)."""
        return why_not(model)

    def _run_for(self, model: nn.Module, cache: KVCache) -> _Run:
        run = self._runs.get(cache)
        if run is not None and run.model() is model:
            return run
        mods, params = [], {}
        reason = _check(model, mods, params)
        if reason is None and not self.host_step and type(model.blocks[0].attn.q_proj) is Int8Linear:
            reason = "int8 weights: their product is the CPU step's (models.speed.narrow)"
        plan = weights_plan(model) if reason is None and self.host_step else None
        run = _Run(weakref.ref(model), reason, HookWatch(mods) if reason is None else None,
                   tuple(b.attn for b in model.blocks) if reason is None else (),
                   reason is None and any(p.requires_grad for p in params.values()),
                   plan.layout if plan is not None else decode_layout(model) if reason is None else None, plan, [])
        with self._lock:
            self._runs.pop(cache, None)
            while len(self._runs) >= self._MAX_RUNS:
                self._runs.pop(next(iter(self._runs)), None)
            self._runs[cache] = run
        return run

    def __call__(self, model: nn.Module, token: torch.Tensor, cache: KVCache, pos: int) -> torch.Tensor | None:
        run = self._run_for(model, cache)
        if run.reason is not None or run.watch.hooked() or (run.requires_grad and torch.is_grad_enabled()) \
                or any(a.impl != "sdpa" for a in run.attentions):
            return None
        c = model.config
        if token.dim() != 2 or token.shape[1] != 1 or not 0 <= pos < min(c.max_seq_len, cache.max_len):
            return None  # let the model say what is wrong
        if not layout_current(run.layout):  # a weight written or replaced mid-generation: check the model again
            self._runs.pop(cache, None)
            return self(model, token, cache, pos)
        if run.plan is not None and token.shape[0] == 1 and token.is_cpu and cache.k[0].is_cpu \
                and cache.k[0].dtype == torch.float32 and cache.k[0].shape[0] == 1:
            token_id = int(token[0, 0])
            if not 0 <= token_id < c.vocab_size:
                return None
            if not (run.kv and run.kv[0].of(cache)):
                run.kv[:] = [KVArrays.make(cache)]
            return run_cpu_step(run.plan, token_id, cache, pos, cpu_products(model, run.plan), run.kv[0])
        if isinstance(run.layout.layers[0].qkv, narrow.Int8Weight):
            return None  # int8's kernel takes one row on the CPU: a batch runs through the modules
        return _torch_step(model, run.layout, token, cache, pos)


fast_step = FastStep("fast step")  # one token on the CPU: models.speed.cpu's numpy step; else the torch step
torch_step = FastStep("torch step", cpu=False)  # the same sequence as torch operations everywhere


def decode_blas(model: nn.Module) -> str:
    """Which library computes ``fast_step``'s one-token products for ``model`` (for the provenance of a speed)."""
    if not model.embed_tokens.weight.is_cpu or why_not(model) is not None:
        return f"torch {torch.__version__}"
    if cpu_products(model) is INT8_PRODUCTS:
        kind = "AVX2" if narrow.simd() else "portable C"
        return f"int8 kernel ({kind}, models/speed/kernels/gemv.c, layers.c) + torch {torch.__version__}"
    if cpu_products(model) is TORCH_PRODUCTS:
        return f"torch {torch.__version__}" + (" (MKL)" if torch.backends.mkl.is_available() else "")
    blas = np.show_config(mode="dicts").get("Build Dependencies", {}).get("blas", {})
    return f"numpy {np.__version__} ({blas.get('name', 'its BLAS')} {blas.get('version', '')})".replace(" )", ")")


# --- anywhere else (a batch, a GPU): the same step as torch operations ------------------------------------------
def _torch_step(model: nn.Module, layout: DecodeLayout, token: torch.Tensor, cache: KVCache,
                pos: int) -> torch.Tensor:
    """The fast step as torch operations, for any batch on any device: RMSNorm as torch's fused kernel, each
    residual add folded into its product (addmm), q/k/v and gate/up each one product (``layout``'s matrices)."""
    c = model.config
    B = token.shape[0]
    H, Hkv, D = c.n_heads, c.n_kv_heads, c.head_dim
    R = rope_matrix(model.rope_cos[pos:pos + 1], model.rope_sin[pos:pos + 1])  # (D, D), shared by every layer
    x = F.embedding(token[:, 0], model.embed_tokens.weight)  # (B, C)
    for layer, (block, lay) in enumerate(zip(model.blocks, layout.layers)):
        h = _torch_rms_norm(x, block.input_layernorm)
        q, k, v = (h @ lay.qkv.t()).split([H * D, Hkv * D, Hkv * D], dim=1)  # (B, H D), (B, Hkv D) twice
        q = (q.reshape(B * H, D) @ R).view(B, H, 1, D)  # RoPE'd, (B, H, 1, D)
        k = (k.reshape(B * Hkv, D) @ R).view(B, Hkv, 1, D)  # (B, Hkv, 1, D)
        v = v.reshape(B, Hkv, 1, D)
        keys, values = cache.update(layer, pos, k, v)  # (B, Hkv, pos + 1, D) each
        z = F.scaled_dot_product_attention(q, keys, values, enable_gqa=True)  # (B, H, 1, D), no mask: one query
        x = torch.addmm(x, z.reshape(B, H * D), lay.o.t())  # x + o_proj(z), (B, C)
        h = _torch_rms_norm(x, block.post_attention_layernorm)
        gate, up = (h @ lay.gate_up.t()).chunk(2, dim=1)  # (B, F) each
        x = torch.addmm(x, F.silu(gate, inplace=True).mul_(up), lay.down.t())  # x + down(silu(gate) up)
    return _torch_rms_norm(x, model.norm) @ layout.lm_head.t()  # (B, V)


def _torch_rms_norm(x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
    return F.rms_norm(x, norm.weight.shape, norm.weight, norm.eps)  # (B, C): one kernel instead of six
