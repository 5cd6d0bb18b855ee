"""A bounded LoRA fine-tune on text a person pastes: AdamW on the adapter parameters, next-token loss.

Notation: N rows, T tokens per row (the model sees T, predicts the T targets shifted by one), V vocabulary.

Nothing here knows about the UI. ``iter_finetune`` is a generator yielding one ``dict`` per step (so a
Gradio generator handler can redraw a live loss curve); ``finetune`` runs it to the end and calls an optional
callback per step (return ``False`` from it to stop early). Run under ``explorer.state.threads.stoppable``, a
Stop ends a step inside its forward or backward pass, never inside the optimiser's update.
Steps and wall time are capped (``MAX_STEPS``, ``MAX_SECONDS``): the job always ends, no step is begun that the
pace so far says would end past the time limit, and a run whose loss goes non-finite or climbs past
``DIVERGE_RATIO`` times its first step's stops there (``stopped="diverged"``).
"""
from __future__ import annotations

import math
import time
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from lens.loss import evaluate_loss, next_token_loss  # noqa: F401 (the fine-tune's loss)
from models.lora import lora_layers

from explorer import measure
from explorer.state.threads import check_stop, stop_between_ops, stop_in_backward

MAX_STEPS = 200
MAX_SECONDS = 60.0
MIN_TOKENS = 4  # at least a few next-token targets, or there is nothing to learn
LR_RANGE = (1e-5, 1e-1)
DEFAULT_BATCH = 8  # rows per step
DIVERGE_RATIO = 1.5  # a step loss this many times the first step's ends the run as diverged
# default_lr's two anchors. 1e-2 at width 128: the default model fell from 2.43 to 0.16 nats/token in 20 steps
# (3e-2 spiked to 6.0 and ended at 3.06). 1e-3 at width 576: SmolLM2-135M went 1.68 -> 2.30 (a spike near 6) at
# 1e-2 and trained at 1e-3 (issue 12); a random width-576 model still learns at 1e-3 (7.86 -> 5.27 in 20 steps).
LR_ANCHOR = (128, 1e-2)
LR_EXPONENT = 1.53  # log(10) / log(576 / 128): the power law through both anchors


def default_lr(d_model: int) -> float:
    """The learning rate a fine-tune starts from for a model of width ``d_model``: 1e-2 · (128 / d_model)^1.53,
    within ``LR_RANGE``, rounded to two significant digits (1e-2 at 128, 1e-3 at 576, 4.5e-4 at 960)."""
    width, lr = LR_ANCHOR
    value = min(max(lr * (width / d_model) ** LR_EXPONENT, LR_RANGE[0]), LR_RANGE[1])
    return float(f"{value:.2g}")


def check_settings(steps: int, lr: float, max_seconds: float, seq_len: int, batch: int) -> None:
    """Raise ValueError, saying what to change, for settings outside the caps."""
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must be a whole number from 1 to {MAX_STEPS}, got {steps!r}.")
    if not isinstance(lr, (int, float)) or not math.isfinite(lr) or not LR_RANGE[0] <= lr <= LR_RANGE[1]:
        raise ValueError(f"learning rate must lie in [{LR_RANGE[0]:g}, {LR_RANGE[1]:g}], got {lr!r}.")
    if not isinstance(max_seconds, (int, float)) or not math.isfinite(max_seconds) or not 0 < max_seconds <= MAX_SECONDS:
        raise ValueError(f"the time limit must lie in (0, {MAX_SECONDS:g}] seconds, got {max_seconds!r}.")
    if not isinstance(seq_len, int) or seq_len < 2:
        raise ValueError(f"seq_len must be an integer of at least 2, got {seq_len!r}.")
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}.")


def make_rows(ids: list[int] | torch.Tensor, seq_len: int) -> torch.Tensor:
    """Cut the token ids into rows of ``seq_len + 1`` (inputs plus the shifted target), (N, seq_len + 1).

    Text shorter than one row gives a single row of its own length; longer text gives overlapping
    windows (stride seq_len // 2) so that every token is a target at least once and the last window
    ends at the last token.
    """
    ids = torch.as_tensor(ids, dtype=torch.long).flatten()
    n = ids.numel()
    if n < MIN_TOKENS:
        raise ValueError(f"the text gives only {n} tokens: paste at least a sentence to fine-tune on.")
    width = seq_len + 1
    if n <= width:
        return ids[None]  # (1, n)
    stride = max(1, seq_len // 2)
    starts = list(range(0, n - width + 1, stride))
    if starts[-1] != n - width:
        starts.append(n - width)
    return torch.stack([ids[s:s + width] for s in starts])  # (N, seq_len + 1)


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The adapters' A and B matrices that still require gradients (never a base weight)."""
    layers = lora_layers(model)
    if not layers:
        raise ValueError("the model has no LoRA adapter: attach a LoRA adapter first.")
    if any(layer.merged or layer.disabled for layer in layers):
        raise ValueError("the adapter is merged or switched off: switch it on (unmerged) before training.")
    return [p for layer in layers for p in (layer.lora_A, layer.lora_B) if p.requires_grad]


def iter_finetune(
    model: nn.Module,
    ids: list[int] | torch.Tensor,
    *,
    steps: int = 50,
    lr: float | None = None,
    max_seconds: float = MAX_SECONDS,
    seq_len: int | None = None,
    batch: int = DEFAULT_BATCH,
    seed: int = 0,
    weight_decay: float = 0.0,
    grad_clip: float = 1.0,
    clock: Callable[[], float] = time.perf_counter,
) -> Iterator[dict]:
    """Train the model's trainable parameters (the LoRA adapters) on ``ids``; yield after every step.

    lr: None picks ``default_lr(d_model)``. clock: a function returning seconds, read for the time limit;
    ``time.perf_counter`` unless a test passes a fake one.

    Each yielded dict: ``step`` (1-based), ``loss`` (this step's batch, nats/token), ``seconds`` since the
    start, ``step_seconds`` (this step's), ``lr``, ``rows`` (how many windows the text gave), ``tokens`` (target
    tokens per step), ``projected_seconds`` (all ``steps`` at this pace: ``pace``), ``fit_steps`` (how many of
    them end within ``max_seconds`` at this pace) and ``stopped``: None, or on the last step "time" (the next
    step would end past ``max_seconds``: the run ends before it, within the limit) or "diverged" (the loss was
    not finite or above ``DIVERGE_RATIO`` times the first step's; that step's update is not applied). The
    model is left in eval mode. Frozen parameters are never touched (they have no gradient and are not given
    to the optimiser). Under ``stoppable``, a Stop raises ``Stopped`` out of here within one operation, with the
    adapter exactly as after the last yielded step (an update is either applied whole or not begun).
    """
    lr = default_lr(model.config.d_model) if lr is None else lr
    seq_len = model.config.max_seq_len - 1 if seq_len is None else min(seq_len, model.config.max_seq_len - 1)
    check_settings(steps, lr, max_seconds, seq_len, batch)
    params = trainable_parameters(model)
    rows = make_rows(ids, seq_len)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    model.train()
    t0 = last = clock()
    first = None
    try:
        for step in range(1, steps + 1):
            if rows.shape[0] <= batch:
                chunk = rows
            else:
                chunk = rows[torch.randperm(rows.shape[0], generator=gen)[:batch]]
            check_stop()
            # a Stop ends the forward before its next operation and the backward before its next node; the
            # gradients it leaves are dropped, so the adapter stays the one after the last completed step
            with stop_between_ops(), stop_in_backward():
                loss = next_token_loss(model, chunk)
                value = float(loss.detach())
                first = value if first is None else first
                diverged = not math.isfinite(value) or value > DIVERGE_RATIO * first
                if not diverged:
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    if grad_clip:
                        torch.nn.utils.clip_grad_norm_(params, grad_clip)
                del loss  # the graph goes now, not when this frame ends
            if not diverged:
                check_stop()  # the update's last chance to be skipped: once begun it completes (outside the checks)
                opt.step()
            now = clock()
            elapsed, step_seconds, last = now - t0, now - last, now
            projected, fit = pace(elapsed, step_seconds, step, steps, max_seconds)
            out_of_time = fit <= step < steps  # the next step would end past the limit: it is not begun
            model.eval()
            yield {"step": step, "loss": value, "seconds": elapsed, "step_seconds": step_seconds, "lr": lr,
                   "rows": int(rows.shape[0]), "tokens": int(chunk[:, 1:].numel()),
                   "projected_seconds": projected, "fit_steps": fit,
                   "stopped": "diverged" if diverged else "time" if out_of_time else None}
            model.train()
            if diverged or out_of_time:
                break
    finally:
        model.eval()
        opt.zero_grad(set_to_none=True)


def pace(elapsed: float, step_seconds: float, done: int, steps: int, max_seconds: float) -> tuple[float, int]:
    """(seconds all ``steps`` would take, how many of them end within ``max_seconds``) after ``done`` steps took
    ``elapsed`` seconds, the last of them ``step_seconds``: the steps left are predicted at the last one's pace
    (the first step also warms up, so the prediction after it errs towards fewer steps)."""
    projected = elapsed + (steps - done) * step_seconds
    if elapsed >= max_seconds:
        return projected, done
    more = steps - done if step_seconds <= 0 else min(steps - done, int((max_seconds - elapsed) / step_seconds))
    return projected, done + more


def finetune(
    model: nn.Module,
    ids: list[int] | torch.Tensor,
    *,
    on_step: Callable[[dict], bool | None] | None = None,
    **settings,
) -> dict:
    """Run ``iter_finetune`` to its end; ``on_step(record)`` after each step, returning False stops.

    Returns ``{"steps", "losses", "seconds", "stopped"}`` with ``stopped`` None, "time", "diverged" or
    "callback".
    """
    losses: list[float] = []
    record: dict = {"seconds": 0.0, "stopped": None}
    stopped = None
    for record in iter_finetune(model, ids, **settings):
        losses.append(record["loss"])
        stopped = record["stopped"]
        if on_step is not None and on_step(record) is False:
            stopped = "callback"
            break
    return {"steps": len(losses), "losses": losses, "seconds": record["seconds"], "stopped": stopped}


def count_adapted(config, targets, *, rank: int, alpha: float) -> dict[str, int]:
    """Trainable / frozen / total parameters of ``config``'s decoder with LoRA attached, counted on a copy of
    the structure built on the ``meta`` device (shapes only: nothing is allocated, no weights are copied)."""
    from models.decoder import Decoder
    from models.lora import attach_lora, count_parameters

    with torch.device("meta"):
        skeleton = Decoder(config)
        attach_lora(skeleton, tuple(targets), rank=rank, alpha=alpha)
    return count_parameters(skeleton)


def training_memory(trainable: int, frozen: int, *, bytes_per_value: int = 4) -> dict[str, dict[str, int]]:
    """Bytes held while training, LoRA vs full fine-tuning, by part (activations left out: they depend on
    the batch and sequence length, and are the same for both).

    LoRA: frozen weights + adapter weights + adapter gradients + AdamW's two moments per adapter parameter.
    Full: every weight, its gradient and AdamW's two moments.
    """
    total = trainable + frozen
    b = bytes_per_value
    return {
        "LoRA": {"frozen weights": frozen * b, "trainable weights": trainable * b, "gradients": trainable * b,
                 "AdamW moments": 2 * trainable * b},
        "full fine-tune": {"frozen weights": 0, "trainable weights": total * b, "gradients": total * b,
                           "AdamW moments": 2 * total * b},
    }


def activation_bytes(config, tokens: int, *, bytes_per_value: int = 4) -> int:
    """Predicted peak bytes of one training step beyond the weights, for ``tokens`` tokens per step.

    Per token and layer the backward pass keeps about 8 model-width and 5 feed-forward-width vectors
    (norm inputs, q/k/v, attention output, SwiGLU gate/up/product); the logits, their log-softmax and its
    gradient add 3 vocabulary-width vectors per token. Half again as a margin. (Estimated from what the
    decoder's forward saves for backward, not measured; the margin covers autograd's temporaries.)
    """
    b = bytes_per_value
    per_token = config.n_layers * (8 * config.d_model + 5 * config.d_ff) * b + 3 * config.vocab_size * b
    return int(1.5 * tokens * per_token)


def step_tokens(rows: torch.Tensor, batch: int = DEFAULT_BATCH) -> int:
    """Tokens one step of ``iter_finetune`` feeds the model: ``batch`` rows (or all, if fewer) of ``rows``."""
    return min(int(rows.shape[0]), batch) * int(rows.shape[1])


def check_step_memory(config, rows: torch.Tensor, *, batch: int = DEFAULT_BATCH,
                      budget_bytes: int | None = None) -> int:
    """Raise ValueError, before anything is copied or allocated, when one float32 training step on ``rows`` is
    predicted to pass the memory budget (default ``measure.MEMORY_BUDGET_BYTES``). Returns the predicted bytes."""
    tokens = step_tokens(rows, batch)
    need = activation_bytes(config, tokens)
    budget = measure.resolve_budget(budget_bytes)
    if need > budget:
        raise ValueError(f"Fine-tuning this model on {tokens:,} tokens per step is predicted to need "
                         f"{measure.format_bytes(need)}, over the memory budget of {measure.format_bytes(budget)}: "
                         "paste a shorter text.")
    return need
