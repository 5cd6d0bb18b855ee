"""The cap on visitors' own models, and the registry that frees them.

Every visitor's own model is registered here by the session state that holds it, with the time it was last
used. A model idle for ``EXPLORER_SESSION_IDLE_MINUTES`` (default 30) is freed, and when a new copy or load
would pass the cap the models idle longest are freed first, to make room: the registry clears the model out of
its session's state (the same dict Gradio keeps), so the memory comes back even while Gradio keeps the session,
and the visitor's next action is answered with a sentence saying what happened. A new copy or load makes room
only from models opened from its own network address: another visitor's model goes only by its own idle time.

Every visitor's own model (a copy to attach LoRA to, or a loaded checkpoint) lives in their session state until
Gradio drops it (tab closed; API clients' sessions linger). Their total is capped, so many sessions cannot add up
to more memory than the machine has: over the cap, a new copy or load is refused first. 4 GiB: with one 4 GiB
measurement and one 4 GiB fine-tune step at once, a 16 GB CPU Space keeps room to spare.
"""
from __future__ import annotations

import gc
import os
import threading
import time
import weakref

import torch

from .sizes import bytes_setting, format_bytes, module_bytes

DEFAULT_BUDGET_BYTES = 4 * 2**30


def _private_budget() -> int:
    return bytes_setting("EXPLORER_PRIVATE_MODELS_BUDGET", DEFAULT_BUDGET_BYTES)


PRIVATE_MODELS_BUDGET_BYTES = _private_budget()


def _client_share() -> float:
    try:
        return min(1.0, max(0.05, float(os.environ.get("EXPLORER_CLIENT_PRIVATE_SHARE", "") or 0.5)))
    except ValueError:
        return 0.5


#: The share of the cap one client address's models may hold (``explorer.state.clients``): a script rotating
#: session ids makes room from its own models, never from everyone else's.
CLIENT_SHARE = _client_share()


def _idle_seconds() -> float:
    try:
        return max(0.0, float(os.environ.get("EXPLORER_SESSION_IDLE_MINUTES", "") or 30)) * 60
    except ValueError:
        return 30 * 60.0


IDLE_SECONDS = _idle_seconds()
# id(state) -> [state, last used (monotonic s), client address]; the state dict is Gradio's own, shared with the
# session.
_owners: "dict[int, list]" = {}
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

    Room is made only from the requesting address's own models (idle longest first): another visitor's model is
    never freed for it, only by its own idle time (``expire_idle``).

    Call it holding ``PRIVATE_LOCK`` and register the model made with ``add_private`` before releasing it.
    """
    from explorer.state.clients import current

    expire_idle()
    _within_client_share(nbytes, what)
    held = private_models_bytes()
    if held + nbytes > PRIVATE_MODELS_BUDGET_BYTES:
        gc.collect()  # sessions Gradio has dropped may still wait for the collector
        held = private_models_bytes()
    client = current()
    while held + nbytes > PRIVATE_MODELS_BUDGET_BYTES:  # room from this address's own models, idle longest first
        mine = [e for e in _owners.values() if len(e) > 2 and e[2] == client]
        if not mine:
            break
        _evict(min(mine, key=lambda entry: entry[1])[0],
               "to make room for another model opened from your network address, after it was idle longest")
        gc.collect()
        held = private_models_bytes()
    if held + nbytes > PRIVATE_MODELS_BUDGET_BYTES:
        soonest = min((e[1] for e in _owners.values()), default=None)
        wait = "" if soonest is None else (
            f" (the one idle longest is freed in {max(1, round((soonest + IDLE_SECONDS - time.monotonic()) / 60))} "
            "min unless its visitor comes back)")
        raise ValueError(f"{what} needs {format_bytes(nbytes)}, and other visitors' own models already hold "
                         f"{format_bytes(held)} of the {format_bytes(PRIVATE_MODELS_BUDGET_BYTES)} this server keeps "
                         f"for them{wait}: try again then, or keep using the shared default model.")


def _client_bytes(client: str) -> int:
    held = {id(e[0]["model"]): e[0]["model"] for e in list(_owners.values())
            if len(e) > 2 and e[2] == client and e[0].get("model") is not None}  # a shared load counts once
    return sum(model_bytes(m) for m in held.values())


def _within_client_share(nbytes: int, what: str) -> None:
    """Make room within the requesting client's share from that client's own models, idle longest first; a
    sentence (ValueError) when the model alone is larger than the share."""
    from explorer.state.clients import current

    client, share = current(), int(CLIENT_SHARE * PRIVATE_MODELS_BUDGET_BYTES)
    if client == "local":  # no network client (start-up, the benchmark, tests calling handlers): the cap alone
        return
    while _client_bytes(client) + nbytes > share:
        mine = [e for e in _owners.values() if len(e) > 2 and e[2] == client and e[0].get("model") is not None]
        if not mine:
            break
        _evict(min(mine, key=lambda entry: entry[1])[0],
               "to make room for another model opened from your network address, after it was idle longest")
        gc.collect()
    if _client_bytes(client) + nbytes > share:
        raise ValueError(f"{what} needs {format_bytes(nbytes)}, more than the {format_bytes(share)} one network "
                         "address may hold in its own models on this server: keep using the shared default model.")


def add_private(model: torch.nn.Module) -> None:
    """Count ``model`` against the cap for as long as it lives."""
    _private_models.add(model)


EVICTED_KEY = "evicted"


def _evict(state: dict, why: str) -> None:
    _owners.pop(id(state), None)
    if state.get("model") is not None:
        state.update(model=None, tokenizer=None, source="default", name=None,
                     **{EVICTED_KEY: f"Your own model ({state.get('name') or 'a copy'}) was freed {why}: this page "
                                     "now shows the shared default model. Load or fine-tune again to continue."})


def register_owner(state: dict) -> None:
    """Note that ``state`` holds a private model now (used now); call it holding ``PRIVATE_LOCK``."""
    from explorer.state.clients import current

    _owners[id(state)] = [state, time.monotonic(), current()]


def forget_owner(state: dict) -> None:
    with PRIVATE_LOCK:
        _owners.pop(id(state), None)


def touch(state: dict) -> None:
    """The session used its private model now (it is not idle)."""
    entry = _owners.get(id(state))
    if entry is not None:
        entry[1] = time.monotonic()


def expire_idle(now: float | None = None) -> int:
    """Free every private model idle longer than ``IDLE_SECONDS``; how many were freed."""
    now = time.monotonic() if now is None else now
    idle = [entry[0] for entry in list(_owners.values()) if now - entry[1] > IDLE_SECONDS]
    for state in idle:
        _evict(state, f"after {IDLE_SECONDS / 60:g} minutes without use")
    return len(idle)
