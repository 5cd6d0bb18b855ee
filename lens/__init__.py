"""Reading a model without a UI: what the app and ``python -m training`` both use.

Reading order (each file uses only the ones above it and ``models``):
    device.py    where tensors live: one device and default dtype per process
    machine.py   the machine a number comes from (CPU, cores, versions)
    hooks.py     run_with_cache and run_with_hooks over the models' hook points; one lock per model
    heads.py     head scores: previous-token, first-token (sink), induction, duplicate-token
    loss.py      next-token loss, per token and averaged
    heldout.py   the encoder's held-out evaluation: which positions are masked, and accuracy

Nothing here imports ``explorer`` or gradio.
"""
