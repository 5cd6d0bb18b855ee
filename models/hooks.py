"""Hook points: identity modules that name a place in the model (TransformerLens' idea).

A hook point's path in the module tree is its name (``blocks.3.attn.hook_pattern``). The model passes every
activation it names through its hook point, ``x = self.hook_z(x)``, which returns ``x`` itself unless
something is registered there. Two kinds of hook:

- observers, ``point.register_forward_hook(fn)`` (PyTorch's own): ``fn(point, (x,), x)`` sees the value; what it
  returns is ignored, so an observer can never change what the model computes;
- edits, ``point.add_edit(fn)``: ``fn(x, point)`` returns the tensor the model goes on with (same shape).
  Editing is explicit and named so that a reader, and any speed path, can tell: ``has_hooks(model)`` is True
  while one is present.

With nothing registered, a hook point costs one list check and one dict check.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.nn.modules import module as torch_module

# The one place the project reads PyTorch's private hook registries (``Module._forward_hooks`` and
# ``_forward_pre_hooks``, and the process-wide ``_global_forward_*hooks``): a hook point would otherwise pay a full
# ``Module.__call__`` for every activation. Checked against the versions this was tested with, at import.
TESTED_TORCH = ("2.13",)
PRIVATE_HOOK_ATTRIBUTES = ("_forward_hooks", "_forward_pre_hooks")
PRIVATE_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks")


def check_torch_internals() -> None:
    """Raise RuntimeError, naming what changed, when this torch lacks the private hook registries read here."""
    probe = nn.Module()
    missing = [a for a in PRIVATE_HOOK_ATTRIBUTES if not isinstance(probe.__dict__.get(a), dict)]
    missing += [a for a in PRIVATE_GLOBAL_HOOKS if not isinstance(getattr(torch_module, a, None), dict)]
    if missing:
        raise RuntimeError(f"torch {torch.__version__} has no {', '.join(missing)}: models/hooks.py reads them "
                           f"(tested on torch {', '.join(TESTED_TORCH)}); update it for this version.")


check_torch_internals()


class HookPoint(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.edits: list[Callable[[torch.Tensor, "HookPoint"], torch.Tensor]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` after the edits (in the order they were added), shown to the observers; ``x`` itself when none."""
        for edit in self.edits:
            x = edit(x, self)
        if self._forward_hooks or self._forward_pre_hooks:
            super().__call__(x)  # observers see the value the model goes on with; their return is ignored
        return x

    @property
    def active(self) -> bool:
        """True when an observer or an edit is registered here (the model then computes what only hooks read)."""
        return bool(self.edits or self._forward_hooks)

    def add_edit(self, fn: Callable[[torch.Tensor, "HookPoint"], torch.Tensor]) -> "EditHandle":
        """Register ``fn(x, point) -> replacement``; returns a handle whose ``remove()`` takes it away."""
        self.edits.append(fn)
        return EditHandle(self, fn)


class EditHandle:
    def __init__(self, point: HookPoint, fn) -> None:
        self.point, self.fn = point, fn

    def remove(self) -> None:
        if self.fn in self.point.edits:
            self.point.edits.remove(self.fn)


def module_hooked(module: nn.Module) -> bool:
    """Whether ``module`` itself has a PyTorch forward hook or pre-hook (or an edit, for a hook point)."""
    # isinstance, not getattr(module, "edits", None): nn.Module's __getattr__ builds an exception for every miss
    return bool(module._forward_hooks or module._forward_pre_hooks or (isinstance(module, HookPoint) and module.edits))


def has_global_hooks() -> bool:
    """Whether a process-wide forward hook or pre-hook (``register_module_forward_hook``) is registered."""
    return any(getattr(torch_module, name) for name in PRIVATE_GLOBAL_HOOKS)


def has_hooks(model: nn.Module) -> bool:
    """Whether anything would see or change ``model``'s forward: a hook or edit on any of its modules, or a
    process-wide forward hook. A speed path that skips the modules runs only when this is False."""
    return has_global_hooks() or any(module_hooked(m) for m in model.modules())


class HookWatch:
    """``has_hooks`` for a fixed list of modules, in microseconds instead of milliseconds (a 30-layer decoder has
    ~970 modules): for a speed path that checked a model's structure once and must step aside the moment a hook
    or an edit appears on any of them. Sees hooks added or removed after it was made; a module swapped into the
    model afterwards is not in its list (check the structure again for that)."""

    def __init__(self, modules) -> None:
        modules = list(modules)
        self._registries = [r for m in modules for r in (m._forward_hooks, m._forward_pre_hooks)]
        self._edits = [m.edits for m in modules if isinstance(m, HookPoint)]

    def hooked(self) -> bool:
        return any(self._registries) or any(self._edits) or has_global_hooks()
