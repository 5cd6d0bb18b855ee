"""Where the app's models come from: the app's own folder, the default model's folder and its name on screen, and
the one step every model the app loads goes through (``prepare``). Below ``checkpoints`` and ``snapshots``, which
both read it.
"""
from __future__ import annotations

import os
from pathlib import Path

from lens.device import place
from models import Decoder

REPO_ROOT = Path(__file__).resolve().parents[2]


def prepare(model: Decoder) -> Decoder:
    """``model`` on the app's device and dtype, its weights exactly as ``load_pretrained`` made them: the fast
    one-token decode (``models.speed``) prepares its own layout of them the first time it runs."""
    return place(model)


def default_model_dir() -> Path:
    return Path(os.environ.get("EXPLORER_DEFAULT_MODEL", REPO_ROOT / "assets" / "default-model"))


def default_model_name() -> str:
    """How the default model is named on screen: the shipped folder, or the folder the environment chose."""
    folder = default_model_dir()
    try:
        shown = folder.resolve().relative_to(REPO_ROOT)
    except ValueError:
        shown = folder
    return f"default model ({shown})"
