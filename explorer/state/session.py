"""Which model a user is looking at: the shared default model and per-user state.

The default model (``assets/default-model``, or the folder named by ``EXPLORER_DEFAULT_MODEL``) is
loaded once per process and is read-only: nobody attaches LoRA to it, switches its attention
implementation or leaves hooks on it. A checkpoint loaded by several sessions is one copy, read-only the same
way (``checkpoints.load_checkpoint``). A user who needs to change a model (LoRA) gets their own copy in their
``gr.State``; nothing they do reaches another user.

Per-user state is a plain dict made by ``new_state()``:
    source     "default", a Hub repo id or a local folder path (what the user asked for)
    name       a short name to show on screen
    model      None (use the shared default) or the user's own ``Decoder``
    tokenizer  None (use the default's) or the user's own tokenizer

Loading checkpoints lives in ``explorer.state.checkpoints``, the cap on private models in
``explorer.state.private_models``, text in ``explorer.state.text`` and thread counts in ``explorer.state.threads`` (their
functions a panel calls are re-exported here).
"""
from __future__ import annotations

import threading
from typing import Any

from models import Decoder, load_pretrained
from models.speed import prepared_copy
from models.loading import load_tokenizer

from .checkpoints import is_shared_load
from .folders import default_model_dir, default_model_name, prepare
from . import private_models
from .private_models import PRIVATE_LOCK, add_private, model_bytes, reserve_private
# Re-exported: what a panel needs to read a user's text and run on their model, from one import.
from .text import as_tensor, clean_text, encode, encode_with_notice, token_strings  # noqa: F401
from .threads import default_threads, threads_for  # noqa: F401

_lock = threading.Lock()  # guards the default model's first load
_default: tuple[Decoder, Any] | None = None


def load_default() -> tuple[Decoder, Any]:
    """The shared default (model, tokenizer); loaded on first call, then cached for the process."""
    global _default
    with _lock:
        if _default is None:
            folder = default_model_dir()
            if not (folder / "config.json").is_file():
                raise RuntimeError(f"the default model is missing: {folder} has no config.json.")
            model = prepare(load_pretrained(folder))  # the app's device and dtype, once
            for p in model.parameters():
                p.requires_grad_(False)
            _default = (model, load_tokenizer(folder))
        return _default


def new_state() -> dict[str, Any]:
    """A fresh per-user state: the shared default model, nothing private yet."""
    return {"source": "default", "name": default_model_name(), "model": None, "tokenizer": None}


def get_model(state: dict | None) -> tuple[Decoder, Any, str]:
    """(model, tokenizer, name) this user is looking at. The default model is shared: do not modify it."""
    state = state or new_state()
    evicted = state.pop(private_models.EVICTED_KEY, None)
    if evicted:  # told once, on the next action; the state already points at the shared model
        state["name"] = default_model_name()
        raise ValueError(evicted)
    if state.get("model") is not None:
        private_models.touch(state)
        return state["model"], state["tokenizer"], state["name"]
    model, tokenizer = load_default()
    return model, tokenizer, state.get("name") or default_model_name()


def is_shared(model: Decoder) -> bool:
    """Whether sessions share ``model`` (the default, or a checkpoint loaded by several): nobody may change it."""
    return _default is not None and model is _default[0] or is_shared_load(model)


def private_model(state: dict) -> tuple[Decoder, Any, str]:
    """(model, tokenizer, name) the user may modify: the first call copies the shared model (the default, or a
    checkpoint other sessions loaded too) into ``state``."""
    model, tokenizer, name = get_model(state)
    if is_shared(model):
        with PRIVATE_LOCK:
            reserve_private(model_bytes(model), "Your own copy of the model")
            model = prepared_copy(model)  # a deepcopy (the weights stay plain, as loaded)
            add_private(model)
            state["model"], state["tokenizer"] = model, tokenizer
            private_models.register_owner(state)
    return model, tokenizer, state["name"] if state.get("model") is not None else name


def set_model(state: dict, model: Decoder | None, tokenizer: Any, name: str, source: str) -> dict:
    """Point ``state`` at a model (None: back to the shared default). Returns the same dict."""
    state.update(model=model, tokenizer=tokenizer, name=name, source=source)
    if model is None:
        private_models.forget_owner(state)
    else:
        with PRIVATE_LOCK:
            private_models.register_owner(state)
    return state


def reset_to_default(state: dict) -> dict:
    return set_model(state, None, None, default_model_name(), "default")
