"""Loading a checkpoint a visitor asks for: the default model's folder, the allowed local root, Hub ids, and
the checks made before a single weight is read (config builds a model, size fits, files match the config).
"""
from __future__ import annotations

import json
import math
import os
import re
import unicodedata
import weakref
from pathlib import Path
from typing import Any

from models import Decoder, ModelConfig, load_pretrained
from models.loading import REPO_ID, fetch_hub, load_tokenizer

from . import private_models
from .private_models import PRIVATE_LOCK, add_private, reserve_private
from . import live_models, snapshots
from .sizes import format_bytes, parameter_count
from .folders import REPO_ROOT, default_model_dir, default_model_name, prepare  # noqa: F401



def max_load_parameters() -> int:
    """The most parameters a checkpoint may have to be loaded: its float32 weights (4 bytes each) must fit the
    memory this server allows visitors' own models (``EXPLORER_PRIVATE_MODELS_BUDGET``, default 4 GiB: about
    1,070 M parameters). Read at each load, so a changed setting counts."""
    return private_models.PRIVATE_MODELS_BUDGET_BYTES // 4


def rope_table_bytes(config: ModelConfig) -> int:
    """Bytes of a decoder's rotary cos/sin tables, (max_seq_len, head_dim) fp32 each: a second pair when local
    layers turn at their own theta (Gemma 3)."""
    pairs = 1 if config.local_rope_theta is None else 2
    return pairs * 2 * config.max_seq_len * config.head_dim * 4


def load_bytes(config: ModelConfig) -> int:
    """Bytes a load of ``config`` reserves from the visitors' budget: its float32 weights and rotary tables."""
    return 4 * parameter_count(config)["total"] + rope_table_bytes(config)


def budget_needed(config: ModelConfig) -> int:
    """The smallest ``EXPLORER_PRIVATE_MODELS_BUDGET`` (bytes) that lets one visitor load ``config``: its
    ``load_bytes`` must fit the budget and, from a network client, that client's share of it
    (``EXPLORER_CLIENT_PRIVATE_SHARE``, default one half)."""
    return math.ceil(load_bytes(config) / private_models.CLIENT_SHARE)


def budget_setting(config: ModelConfig) -> str:
    """What an operator sets for one visitor to load ``config``: 'default' when the default budget does, else
    ``EXPLORER_PRIVATE_MODELS_BUDGET=<n>GiB`` (``budget_needed`` rounded up to a whole GiB)."""
    need = budget_needed(config)
    if need <= private_models.DEFAULT_BUDGET_BYTES:
        return "default"
    return f"EXPLORER_PRIVATE_MODELS_BUDGET={math.ceil(need / 2**30)}GiB"


def model_root() -> Path:
    """The only folder tree local checkpoints may be loaded from (``EXPLORER_MODEL_ROOT``, default assets/)."""
    return Path(os.environ.get("EXPLORER_MODEL_ROOT", REPO_ROOT / "assets")).resolve()


def shown_root() -> str:
    """The allowed model folder as the page names it: relative to the app (no absolute server path)."""
    root = model_root()
    try:
        return str(root.relative_to(REPO_ROOT)) + "/"
    except ValueError:
        return "the allowed model folder"


_MARKUP = re.compile(r"[^\w .,+/-]|_(?![^\W_])|(?<![^\W_])_")


def shown_name(text: str) -> str:
    """A folder or repo name as the page may show it: every character that Markdown, HTML or a Plotly title
    could read as markup (``<``, ``&``, ``*``, a backtick, an ``_`` not inside a word, ...) becomes ``?``, since
    the name is the visitor's text and lands in Markdown and chart titles across every tab."""
    return _MARKUP.sub("?", text)[:200]


def resolve_model_source(source: str) -> tuple[str, str]:
    """Classify and validate what the user typed: ("default" | "hub" | "local", cleaned source).

    Local folders must lie inside ``model_root()`` (after resolving links and ``..``); Hub ids must match
    ``owner/name``. Raises ValueError with a sentence saying what to change.
    """
    if source is not None and not isinstance(source, str):
        raise ValueError("The model source must be text: 'default', a Hub id like 'HuggingFaceTB/SmolLM2-135M' "
                         "or a folder path.")
    try:
        return _resolve_model_source(source)
    except OSError as exc:  # a name too long for the file system, ...
        raise ValueError(f"{source[:80]!r} is not a usable folder name ({exc.strerror or exc}): give a checkpoint "
                         "folder under the allowed root or a Hub id like 'HuggingFaceTB/SmolLM2-135M'.") from None
    except RuntimeError:  # Python 3.11's pathlib answers a loop of links with a RuntimeError
        raise ValueError(f"{source[:80]!r} is a loop of links that leads to no folder: give a checkpoint folder "
                         "under the allowed root or a Hub id like 'HuggingFaceTB/SmolLM2-135M'.") from None


def _resolve_model_source(source: str | None) -> tuple[str, str]:
    source = (source or "").strip()
    if not source or source.lower() in ("default", default_model_name().lower()):
        return "default", "default"
    if any(unicodedata.category(c).startswith("C") for c in source):
        raise ValueError("The model source contains control characters: type a Hub id like "
                         "'HuggingFaceTB/SmolLM2-135M' or a folder path.")
    looks_like_path = source.startswith(("/", ".", "~")) or os.sep in source.replace("/", "", 1) \
        or Path(source).is_absolute()
    if not looks_like_path and REPO_ID.match(source) and ".." not in source:
        root_candidate = model_root() / source
        if not root_candidate.is_dir():
            return "hub", source
        source = str(root_candidate)
    root = model_root()
    path = Path(os.path.expanduser(source))
    if not path.is_absolute():
        path = root / path
    path = path.resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"Local models must be inside the allowed model folder; {source[:80]!r} is outside it. "
                         "Copy the checkpoint folder there, or give a Hub id like 'HuggingFaceTB/SmolLM2-135M'.")
    if not path.is_dir():
        raise ValueError(f"{source[:80]!r} is not a folder under the allowed model folder: give a checkpoint folder there "
                         "(config.json + model.safetensors) or a Hub id like 'HuggingFaceTB/SmolLM2-135M'.")
    return "local", str(path)


def check_files_inside_root(folder: Path) -> None:
    """ValueError when a file in a local checkpoint folder is a link to somewhere outside ``model_root()``:
    every file (config, weights, tokenizer, model card) is resolved before any is read."""
    root = model_root()
    try:
        entries = sorted(folder.iterdir())
    except OSError as exc:
        raise ValueError(f"{folder.name}: the folder cannot be read ({exc.strerror or exc}).") from None
    for entry in entries:
        try:
            target = entry.resolve(strict=True)
        except (OSError, RuntimeError):  # a broken link or a loop of links
            raise ValueError(f"{folder.name}/{entry.name[:60]} is a link that leads nowhere: remove it from the "
                             "checkpoint folder.") from None
        if not target.is_relative_to(root):
            raise ValueError(f"{folder.name}/{entry.name[:60]} links to a file outside the allowed model folder, "
                             "so this checkpoint was not read: copy the real file into the folder instead.")


def load_checkpoint(source: str) -> tuple[Decoder | None, Any, str, str]:
    """Load what the user asked for: (model or None for the default, tokenizer, name, source).

    Hub ids are fetched only when the Hub is reachable; offline (``HF_HUB_OFFLINE=1`` or no network)
    raises ValueError and the caller keeps the model the user had.
    """
    step = snapshots.parse_name(source) if isinstance(source, str) else None
    live = live_models.parse_name(source)
    if step is not None:  # the default model as it was at a step of its training
        kind, cleaned = "local", str(snapshots.snapshot_folder(snapshots.check_step(step)).resolve())
    elif live is not None:  # the model trained live in the Training tab: this server's own folder, not a visitor's
        kind, cleaned = "live", source.strip()
    else:
        kind, cleaned = resolve_model_source(source)
    tokenizer_folder = None  # the checkpoint's own folder
    if kind == "default":
        return None, None, default_model_name(), "default"
    if kind == "hub":
        folder = fetch_hub(cleaned)  # the Hub only: never a folder outside the root
        name = shown_name(cleaned)
    elif kind == "live":
        folder, name = live_models.folder_for(cleaned), cleaned
    else:
        folder = Path(cleaned)
        if folder == default_model_dir().resolve():  # the shipped model, unchanged: the shared copy, no private one
            return None, None, default_model_name(), "default"
        snapshot = re.fullmatch(r"step-(\d+)", folder.name)
        if snapshot and folder.parent == snapshots.snapshots_dir().resolve():
            # a snapshot: its folder holds weights only; the tokenizer is the default model's
            step = int(snapshot.group(1))
            name, cleaned, tokenizer_folder = snapshots.snapshot_name(step), snapshots.snapshot_name(step), \
                default_model_dir()
        else:
            check_files_inside_root(folder)
            name = f"{shown_name(str(folder.relative_to(model_root())))} (local)" if folder != model_root() \
                else "assets (local)"
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{name} has no config.json: it is not a transformers checkpoint folder.")
    try:  # the config must build a model before anything is sized or read
        hf = json.loads(config_path.read_text())
        if not isinstance(hf, dict):
            raise TypeError("the file holds no JSON object")
        config = ModelConfig.from_hf(hf)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError) as exc:
        raise ValueError(f"{name}: config.json is not a readable Llama config ({exc}).") from exc
    budget = private_models.PRIVATE_MODELS_BUDGET_BYTES
    n = parameter_count(config)["total"]
    limit = max_load_parameters()
    if n > limit:
        raise ValueError(f"{name} has about {n / 1e6:.0f} M parameters ({format_bytes(4 * n)} in float32); this "
                         f"server allows visitors' models {format_bytes(budget)} (EXPLORER_PRIVATE_MODELS_BUDGET), "
                         f"room for {limit / 1e6:.0f} M parameters in float32. Choose a smaller checkpoint.")
    tables = rope_table_bytes(config)
    if 4 * n + tables > budget:
        raise ValueError(f"{name}: max_position_embeddings {config.max_seq_len:,} needs {format_bytes(tables)} of rotary "
                         f"tables besides the weights, over the {format_bytes(budget)} budget. Choose a "
                         "checkpoint with a shorter context.")
    try:
        on_disk = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    except OSError as exc:
        raise ValueError(f"{name}: its weight files cannot be read ({exc.strerror or exc}).") from None
    if on_disk > 8 * n + 2**20 or on_disk > budget:  # more than the config's weights, even in float64
        raise ValueError(f"{name}: its .safetensors files hold {format_bytes(on_disk)}, more than its config.json "
                         f"describes ({n:,} parameters) or the {format_bytes(budget)} budget allows: "
                         "they were not read. Choose a checkpoint whose files match its config.")
    key = _files_key(folder)
    with PRIVATE_LOCK:  # one load at a time: two loads must not both pass the check below
        model = _shared_loads.get(key)
        if model is not None:  # another session holds these very files unchanged: one copy serves both
            return model, _shared_tokenizers[model], name, cleaned
        reserve_private(load_bytes(config), f"{name} (float32 weights and rotary tables)")
        model = prepare(load_pretrained(folder))  # the app's device and dtype, once
        for p in model.parameters():
            p.requires_grad_(False)
        tokenizer = load_tokenizer(tokenizer_folder or folder)
        add_private(model)
        _shared_loads[key], _shared_tokenizers[model] = model, tokenizer
    return model, tokenizer, name, cleaned


#: Loaded checkpoints, by their folder and files, for as long as a session holds one: read-only like the
#: default model (``session.private_model`` copies one before a fine-tune or LoRA changes it).
_shared_loads: "weakref.WeakValueDictionary[tuple, Decoder]" = weakref.WeakValueDictionary()
_shared_tokenizers: "weakref.WeakKeyDictionary[Decoder, Any]" = weakref.WeakKeyDictionary()


def _files_key(folder: Path) -> tuple:
    """A checkpoint folder and its files' sizes and change times: files changed on disk make a new load."""
    try:
        files = sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in folder.iterdir() if f.is_file())
    except OSError as exc:
        raise ValueError(f"{shown_name(folder.name)}: the folder cannot be read ({exc.strerror or exc}).") from None
    return str(folder.resolve()), tuple(files)


def is_shared_load(model: Decoder) -> bool:
    """Whether ``model`` is a loaded checkpoint that sessions share (read-only), not one session's own."""
    return any(m is model for m in list(_shared_loads.values()))
