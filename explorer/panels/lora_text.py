"""The LoRA tab's sentences about a fine-tune: how it is going, and how it ended."""
from __future__ import annotations

from explorer import finetune, glossary


def fit_sentence(record: dict, steps: int, max_seconds: float) -> str:
    """What the pace so far says, when not every step fits the time limit: "40 steps would take ~84 s here; 14
    steps fit the 30 s limit" (empty when they all fit)."""
    fit = record.get("fit_steps", steps)
    if fit >= steps:
        return ""
    return (f" At {record['step_seconds']:.1f} s a step, {steps} steps would take ~{record['projected_seconds']:.0f} s "
            f"here; {fit} step{'s' if fit != 1 else ''} fit the {max_seconds:g} s limit, so the run ends after step "
            f"{fit}.")


def stopped_status(head: str, steps: int, name: str) -> str:
    if steps == 0:
        return (f"{head}**Stopped after step 0**, before any update: the adapter is still the fresh one (B = 0), so "
                f"your copy of {name} computes exactly the base model.")
    return (f"{head}**Stopped after step {steps}**: the adapter in your copy of {name} is exactly the one after step "
            f"{steps} (a step cut short by Stop changes nothing), and it is **on**.")


def diverged_status(head: str, record: dict, first_loss: float, lr: float, name: str, d_model: int) -> str:
    return (f"{head}**Diverged, stopped at step {record['step']}**: the loss rose to {record['loss']:.3f}, "
            f"over {finetune.DIVERGE_RATIO:g}× the first step's {first_loss:.3f} nats/token, at learning rate "
            f"{lr:g}. The adapter was removed, so your copy of {name} is the base model again. Try a lower "
            f"learning rate (the default for this model's width {d_model} is {finetune.default_lr(d_model):g}).")


def finished_status(head: str, record: dict | None, done: int, steps: int, max_seconds: float, lr: float,
                    start_loss: float, end_loss: float, name: str) -> tuple[str, str]:
    """(the curve's label, the status) of a run that ended on its own: all its steps, or the time limit."""
    timed_out = bool(record and record["stopped"] == "time")
    why = "stopped at the time limit" if timed_out else "done"
    limit = ""
    if timed_out:
        limit = (f" {steps} steps would take ~{record['projected_seconds']:.0f} s here "
                 f"({record['step_seconds']:.1f} s a step); {record['step']} fit the {max_seconds:g} s limit, so the "
                 f"run ended before a step that would pass it, and the adapter is the one after step "
                 f"{record['step']}. For a run that finishes, set steps to {record['step']} or raise the time limit "
                 f"(up to {finetune.MAX_SECONDS:g} s).")
    seconds = record["seconds"] if record else 0.0
    status = (f"{head}**{why}**: {done} of {steps} steps in {seconds:.1f} s at learning rate {lr:g}.{limit} "
              f"Loss on your text {start_loss:.3f} → **{end_loss:.3f}** {glossary.term('nats/token')}. The adapter "
              f"is **on** in your copy of {name}; other tabs now show your adapted model, other visitors still see the "
              "original.")
    return why, status
