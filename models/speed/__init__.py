"""Speed, kept out of the teaching files and chosen at the call site: nothing in ``models`` imports this package,
and a caller that wants it passes it (as gpt-fast wraps its ``decode_one`` in ``torch.compile`` where it calls it).

    layout.py  the step's own copy of the weights in the memory order of one-token products (decode_layout,
               decode_layout_bytes); optimize_for_decode for a caller that wants the model itself laid out so
    cpu.py     the one-token step on the CPU: the products in torch or numpy's BLAS, the rest in numpy
    step.py    fast_step / torch_step: what ``generate(..., step=fast_step)`` takes, and when it steps aside

    from models.speed import fast_step
    tokens = generate(model, prompt, 64, step=fast_step)  # the model's own weights are never re-laid

Measurements behind each choice: bench/notes/decode-step.md.
"""
from .layout import decode_layout, decode_layout_bytes, fused, optimize_for_decode, prepared_copy
from .step import FastStep, decode_blas, fast_step, torch_step, why_not

__all__ = ["FastStep", "decode_blas", "decode_layout", "decode_layout_bytes", "fast_step", "fused",
           "optimize_for_decode", "prepared_copy", "torch_step", "why_not"]
