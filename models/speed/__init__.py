"""Speed, kept out of the teaching files and chosen at the call site: nothing in ``models`` imports this package,
and a caller that wants it passes it (as gpt-fast wraps its ``decode_one`` in ``torch.compile`` where it calls it).

    layout.py  optimize_for_decode: the weights' memory order for one-token products (values, names, shapes kept)
    cpu.py     the one-token step on the CPU: the products in torch or numpy's BLAS, the rest in numpy
    step.py    fast_step / torch_step: what ``generate(..., step=fast_step)`` takes, and when it steps aside

    from models.speed import fast_step, optimize_for_decode
    tokens = generate(optimize_for_decode(model), prompt, 64, step=fast_step)

Measurements behind each choice: bench/notes/decode-step.md.
"""
from .layout import fused, optimize_for_decode, prepared_copy
from .step import FastStep, decode_blas, fast_step, torch_step, why_not

__all__ = ["FastStep", "decode_blas", "fast_step", "fused", "optimize_for_decode", "prepared_copy", "torch_step",
           "why_not"]
