"""Weight-only int8: each output row of a linear layer stored as int8 with one fp32 scale.

``W ≈ scale[:, None] · Q`` with ``Q = round(W / scale)`` in [-127, 127] and ``scale = max|W_row| / 127``.
Activations stay in floating point. Where torch has a CPU kernel that reads the int8 weight directly
(``torch.ops.aten._weight_int8pack_mm``: x (N, in) fp32/bf16, Q (out, in) int8, scale (out,)), a decode
step's one row uses it; elsewhere (several rows, a GPU, fp16, an old torch) the weight is dequantised on the
fly, ``x @ Q.T`` then the per-row scale. ``Int8Linear.kernel_for(x)`` says which one a call takes.

Notation: ``in``/``out`` the features of the quantised linear; ``x`` is (..., in), the output (..., out).
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from .layers import replace_linears
from .block import PROJECTIONS

# None where this torch build has no such operator (then every call dequantises).
_INT8_MM = getattr(torch.ops.aten, "_weight_int8pack_mm", None) if hasattr(torch.ops, "aten") else None
# torch's CPU int8 kernel works one input row at a time, so a prompt's many rows go through a dense matmul
INT8_MM_MAX_ROWS = 1
# The LM head too: it is the largest matrix a token reads (SmolLM2-135M: 113 MB in fp32, against 106 MB for every
# block's projections in int8), so leaving it fp32 would cap int8's decoding at 2.45x fp32 (bench/notes/int8.md).
INT8_TARGETS = PROJECTIONS + ("lm_head",)


class Int8Linear(nn.Module):
    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.register_buffer("qweight", qweight)  # (out, in) int8
        self.register_buffer("scale", scale)  # (out,) fp32
        self.register_buffer("bias", bias)
        self.in_features, self.out_features = qweight.shape[1], qweight.shape[0]

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Int8Linear":
        w = linear.weight.detach().float()  # (out, in)
        scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12)  # (out,)
        # contiguous (out, in): the int8 kernel reads rows; a weight laid out by optimize_for_decode is not
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()  # (out, in) / (out, 1)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(q, scale, bias)

    def kernel_for(self, x: torch.Tensor) -> str:
        """"int8pack_mm" when torch's int8-weight kernel serves this input, else "dequantize"."""
        rows = x.numel() // max(x.shape[-1], 1)
        if (_INT8_MM is not None and x.is_cpu and x.dtype in (torch.float32, torch.bfloat16)
                and rows <= INT8_MM_MAX_ROWS):
            return "int8pack_mm"
        return "dequantize"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel_for(x) == "int8pack_mm":
            y = _INT8_MM(x.reshape(-1, self.in_features), self.qweight, self.scale.to(x.dtype))  # (N, out)
            y = y.reshape(*x.shape[:-1], self.out_features)  # (..., out)
        else:
            y = F.linear(x, self.qweight.to(x.dtype)) * self.scale.to(x.dtype)  # per-output-channel rescale
        return y if self.bias is None else y + self.bias

    @property
    def nbytes(self) -> int:
        return self.qweight.numel() + self.scale.numel() * self.scale.element_size()


@torch.no_grad()
def quantize_int8(model: nn.Module, targets=INT8_TARGETS, *, tokens: torch.Tensor | None = None):
    """A copy of ``model`` with the target linears (default: every block's projections and the LM head) in int8;
    the original is untouched. A tied LM head becomes its own int8 module, and the embedding keeps its fp32 table.

    Returns (quantized_model, report) with report: layers, bytes_before and bytes_after of those
    weights, bytes_saved, and, when ``tokens`` (B, T) is given, max_abs_logit_error and
    relative_logit_error (max |Δlogit| / max |logit|) on them.
    """
    qmodel = copy.deepcopy(model)
    before = sum(m.weight.numel() * m.weight.element_size()
                 for name, m in qmodel.named_modules() if type(m) is nn.Linear and name.split(".")[-1] in targets)
    swapped = replace_linears(qmodel, targets, Int8Linear.from_linear)
    if not swapped:
        raise ValueError(f"no linear layer named {list(targets)} to quantize.")
    after = sum(m.nbytes for m in qmodel.modules() if isinstance(m, Int8Linear))
    report = {"layers": len(swapped), "bytes_before": before, "bytes_after": after, "bytes_saved": before - after}
    if tokens is not None:
        ref, got = model(tokens).float(), qmodel(tokens).float()
        err = (ref - got).abs().max().item()
        report["max_abs_logit_error"] = err
        report["relative_logit_error"] = err / ref.abs().max().item()
    return qmodel, report
