"""The cap on visitors' own models.

Every visitor's own model (a copy to attach LoRA to, or a loaded checkpoint) lives in their session state until
Gradio drops it (tab closed; API clients' sessions linger). Their total is capped, so many sessions cannot add up
to more memory than the machine has: over the cap, a new copy or load is refused first. 4 GiB: with one 4 GiB
measurement and one 4 GiB fine-tune step at once, a 16 GB CPU Space keeps room to spare.
"""
from __future__ import annotations

import gc
import os
import threading
import weakref

import torch

from .measure import format_bytes, module_bytes, parse_bytes

DEFAULT_BUDGET_BYTES = 4 * 2**30


def _private_budget() -> int:
    raw = os.environ.get("EXPLORER_PRIVATE_MODELS_BUDGET")
    try:
        return parse_bytes(raw) if raw else DEFAULT_BUDGET_BYTES
    except ValueError:  # a bad setting must not stop the app from starting
        return DEFAULT_BUDGET_BYTES


PRIVATE_MODELS_BUDGET_BYTES = _private_budget()
_private_models: "weakref.WeakSet" = weakref.WeakSet()

#: Held from the budget check until the new model is registered, so two copies or loads cannot both pass it.
PRIVATE_LOCK = threading.Lock()


def model_bytes(model: torch.nn.Module) -> int:
    """Bytes of a model's parameters and buffers."""
    return sum(module_bytes(model).values())


def private_models_bytes() -> int:
    """Bytes held by every visitor's own models that are still alive."""
    return sum(model_bytes(m) for m in list(_private_models))


def reserve_private(nbytes: int, what: str) -> None:
    """Raise ValueError, before anything is allocated, when ``nbytes`` more of private models would pass the cap.

    Call it holding ``PRIVATE_LOCK`` and register the model made with ``add_private`` before releasing it.
    """
    held = private_models_bytes()
    if held + nbytes > PRIVATE_MODELS_BUDGET_BYTES:
        gc.collect()  # sessions Gradio has dropped may still wait for the collector
        held = private_models_bytes()
    if held + nbytes > PRIVATE_MODELS_BUDGET_BYTES:
        raise ValueError(f"{what} needs {format_bytes(nbytes)}, and visitors' own models already hold "
                         f"{format_bytes(held)} of the {format_bytes(PRIVATE_MODELS_BUDGET_BYTES)} this server keeps "
                         "for them: try again in a while, or keep using the shared default model.")


def add_private(model: torch.nn.Module) -> None:
    """Count ``model`` against the cap for as long as it lives."""
    _private_models.add(model)
