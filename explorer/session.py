"""Which model a user is looking at: the shared default model and per-user state.

The default model (``assets/default-model``, or the folder named by ``EXPLORER_DEFAULT_MODEL``) is
loaded once per process and is read-only: nobody attaches LoRA to it, switches its attention
implementation or leaves hooks on it. A user who loads another checkpoint, or who needs to change a
model (LoRA), gets their own copy in their ``gr.State``; nothing they do reaches another user.

Per-user state is a plain dict made by ``new_state()``:
    source     "default", a Hub repo id or a local folder path (what the user asked for)
    name       a short name to show on screen
    model      None (use the shared default) or the user's own ``Decoder``
    tokenizer  None (use the default's) or the user's own tokenizer
"""
from __future__ import annotations

import contextlib
import copy
import os
import re
import threading
import unicodedata
import weakref
from pathlib import Path
from typing import Any

import torch

from models import Decoder, load_pretrained, optimize_for_decode
from models.loading import REPO_ID, fetch_hub, load_tokenizer

REPO_ROOT = Path(__file__).resolve().parent.parent

# Checkpoints larger than this are refused before their weights are read (fp32 bytes on a 2-core CPU box).
MAX_LOAD_PARAMETERS = 600_000_000

_lock = threading.Lock()
_default: tuple[Decoder, Any] | None = None

# Serialises forward passes that attach hooks to a model shared between users (hooks are per module,
# so two requests hooking the same module at once would see each other's captures).
MODEL_LOCK = threading.RLock()


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


def model_root() -> Path:
    """The only folder tree local checkpoints may be loaded from (``EXPLORER_MODEL_ROOT``, default assets/)."""
    return Path(os.environ.get("EXPLORER_MODEL_ROOT", REPO_ROOT / "assets")).resolve()


def load_default() -> tuple[Decoder, Any]:
    """The shared default (model, tokenizer); loaded on first call, then cached for the process."""
    global _default
    with _lock:
        if _default is None:
            folder = default_model_dir()
            if not (folder / "config.json").is_file():
                raise RuntimeError(f"the default model is missing: {folder} has no config.json.")
            model = optimize_for_decode(load_pretrained(folder))
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
    if state.get("model") is not None:
        return state["model"], state["tokenizer"], state["name"]
    model, tokenizer = load_default()
    return model, tokenizer, state.get("name") or default_model_name()


def is_shared(model: Decoder) -> bool:
    return _default is not None and model is _default[0]


# Every visitor's own model (a copy to attach LoRA to, or a loaded checkpoint) lives in their session state
# until Gradio drops it (tab closed; API clients' sessions linger). Their total is capped, so many sessions
# cannot add up to more memory than the machine has: over the cap, a new copy or load is refused first.
# 4 GiB: with one 4 GiB measurement and one 4 GiB fine-tune step at once, a 16 GB CPU Space keeps room to spare.


def _private_budget() -> int:
    from .measure import parse_bytes

    raw = os.environ.get("EXPLORER_PRIVATE_MODELS_BUDGET")
    try:
        return parse_bytes(raw) if raw else 4 * 2**30
    except ValueError:  # a bad setting must not stop the app from starting
        return 4 * 2**30


PRIVATE_MODELS_BUDGET_BYTES = _private_budget()
_private_models: "weakref.WeakSet" = weakref.WeakSet()
_private_lock = threading.Lock()


def model_bytes(model: torch.nn.Module) -> int:
    """Bytes of a model's parameters and buffers."""
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def private_models_bytes() -> int:
    """Bytes held by every visitor's own models that are still alive."""
    return sum(model_bytes(m) for m in list(_private_models))


def reserve_private(nbytes: int, what: str) -> None:
    """Raise ValueError, before anything is allocated, when ``nbytes`` more of private models would pass the cap."""
    from .measure import format_bytes

    held = private_models_bytes()
    if held + nbytes > PRIVATE_MODELS_BUDGET_BYTES:
        import gc

        gc.collect()  # sessions Gradio has dropped may still wait for the collector
        held = private_models_bytes()
    if held + nbytes > PRIVATE_MODELS_BUDGET_BYTES:
        raise ValueError(f"{what} needs {format_bytes(nbytes)}, and visitors' own models already hold "
                         f"{format_bytes(held)} of the {format_bytes(PRIVATE_MODELS_BUDGET_BYTES)} this server keeps "
                         "for them: try again in a while, or keep using the shared default model.")


def private_model(state: dict) -> tuple[Decoder, Any, str]:
    """(model, tokenizer, name) the user may modify: the first call copies the shared default into ``state``."""
    model, tokenizer, name = get_model(state)
    if is_shared(model):
        with _private_lock:
            reserve_private(model_bytes(model), "Your own copy of the model")
            model = copy.deepcopy(model)
            _private_models.add(model)
        state["model"], state["tokenizer"] = model, tokenizer
    return model, tokenizer, state["name"] if state.get("model") is not None else name


def set_model(state: dict, model: Decoder | None, tokenizer: Any, name: str, source: str) -> dict:
    """Point ``state`` at a model (None: back to the shared default). Returns the same dict."""
    state.update(model=model, tokenizer=tokenizer, name=name, source=source)
    return state


def reset_to_default(state: dict) -> dict:
    return set_model(state, None, None, default_model_name(), "default")


# --- loading another checkpoint ----------------------------------------------------------------

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
    except OSError as exc:  # a name too long for the file system, a loop of links, ...
        raise ValueError(f"{source[:80]!r} is not a usable folder name ({exc.strerror or exc}): give a checkpoint "
                         "folder under the allowed root or a Hub id like 'HuggingFaceTB/SmolLM2-135M'.") from None


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
        raise ValueError(f"Local models must be inside {root} (EXPLORER_MODEL_ROOT); {source!r} is outside it. "
                         "Copy the checkpoint folder there, or give a Hub id like 'HuggingFaceTB/SmolLM2-135M'.")
    if not path.is_dir():
        raise ValueError(f"{source!r} is not a folder under {root}: give a checkpoint folder there "
                         "(config.json + model.safetensors) or a Hub id like 'HuggingFaceTB/SmolLM2-135M'.")
    return "local", str(path)


def load_checkpoint(source: str) -> tuple[Decoder | None, Any, str, str]:
    """Load what the user asked for: (model or None for the default, tokenizer, name, source).

    Hub ids are fetched only when the Hub is reachable; offline (``HF_HUB_OFFLINE=1`` or no network)
    raises ValueError and the caller keeps the model the user had.
    """
    kind, cleaned = resolve_model_source(source)
    if kind == "default":
        return None, None, default_model_name(), "default"
    import json

    if kind == "hub":
        folder = fetch_hub(cleaned)  # the Hub only: never a folder outside the root
        name = cleaned
    else:
        folder = Path(cleaned)
        name = f"{folder.relative_to(model_root())} (local)" if folder != model_root() else "assets (local)"
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{name} has no config.json: it is not a transformers checkpoint folder.")
    from models import ModelConfig

    try:  # the config must build a model before anything is sized or read
        hf = json.loads(config_path.read_text())
        if not isinstance(hf, dict):
            raise TypeError("the file holds no JSON object")
        config = ModelConfig.from_hf(hf)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError) as exc:
        raise ValueError(f"{name}: config.json is not a readable Llama config ({exc}).") from exc
    from .measure import MEMORY_BUDGET_BYTES, format_bytes, parameter_count

    n = parameter_count(config)["total"]
    limit = min(MAX_LOAD_PARAMETERS, MEMORY_BUDGET_BYTES // 4)  # fp32 weights must fit the memory budget
    if n > limit:
        raise ValueError(f"{name} has about {n / 1e6:.0f} M parameters ({4 * n / 2**30:.1f} GiB in float32); this "
                         f"app loads at most {limit / 1e6:.0f} M on this machine. Choose a smaller checkpoint.")
    tables = 2 * config.max_seq_len * config.head_dim * 4  # rotary cos/sin tables, (max_seq_len, head_dim) fp32 each
    if 4 * n + tables > MEMORY_BUDGET_BYTES:
        raise ValueError(f"{name}: max_position_embeddings {config.max_seq_len:,} needs {format_bytes(tables)} of rotary "
                         f"tables besides the weights, over the {format_bytes(MEMORY_BUDGET_BYTES)} budget. Choose a "
                         "checkpoint with a shorter context.")
    try:
        on_disk = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    except OSError as exc:
        raise ValueError(f"{name}: its weight files cannot be read ({exc.strerror or exc}).") from None
    if on_disk > 8 * n + 2**20 or on_disk > MEMORY_BUDGET_BYTES:  # more than the config's weights, even in float64
        raise ValueError(f"{name}: its .safetensors files hold {format_bytes(on_disk)}, more than its config.json "
                         f"describes ({n:,} parameters) or the {format_bytes(MEMORY_BUDGET_BYTES)} budget allows: "
                         "they were not read. Choose a checkpoint whose files match its config.")
    with _private_lock:  # one load at a time: two loads must not both pass the check below
        reserve_private(4 * n + tables, f"{name} (float32 weights and rotary tables)")
        model = optimize_for_decode(load_pretrained(folder))
        _private_models.add(model)
    for p in model.parameters():
        p.requires_grad_(False)
    tokenizer = load_tokenizer(folder)
    return model, tokenizer, name, cleaned


# --- text in --------------------------------------------------------------------------------------

MAX_TEXT_CHARS = 100_000
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069]")


def clean_text(text: Any) -> str:
    """The prompt with control characters removed (tabs and newlines kept). Raises ValueError if empty."""
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise ValueError("The prompt must be text.")
    if len(text) > MAX_TEXT_CHARS:  # refused before the tokenizer spends time and memory on it
        raise ValueError(f"The text is {len(text):,} characters long; paste at most {MAX_TEXT_CHARS:,} (every view "
                         "uses far fewer tokens than that).")
    text = _CONTROL.sub("", text)
    if not text.strip():
        raise ValueError("The prompt is empty: type a sentence.")
    return text


def token_strings(tokenizer, ids: list[int]) -> list[str]:
    """How each token reads on screen (one string per id; a byte piece of a longer character shows as ``�``)."""
    out = []
    for i in ids:
        s = tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if not s:
            s = str(tokenizer.convert_ids_to_tokens(i))
        out.append(s)
    return out


def encode(tokenizer, text: str, max_len: int, *, truncate: bool = False) -> tuple[list[int], list[str]]:
    """Token ids and their unique labels ``"{i}·{token}"`` for ``text``.

    Longer than ``max_len`` tokens: ValueError saying so, or with ``truncate`` the first ``max_len`` tokens
    (use ``encode_with_notice`` to get the sentence to show).
    """
    ids, labels, _ = encode_with_notice(tokenizer, text, max_len, truncate=truncate)
    return ids, labels


def encode_with_notice(tokenizer, text: str, max_len: int, *, truncate: bool = True) -> tuple[list[int], list[str], str]:
    """Like ``encode``; also returns a notice ("" when nothing was cut) to show beside the figure."""
    from .figures.common import token_labels

    text = clean_text(text)
    ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
    if not ids:
        raise ValueError("The prompt produced no tokens: type a sentence.")
    notice = ""
    if len(ids) > max_len:
        if not truncate:
            raise ValueError(f"The prompt is {len(ids)} tokens long; this view takes at most {max_len}: shorten it.")
        notice = f"The prompt is {len(ids)} tokens long; only the first {max_len} are shown."
        ids = ids[:max_len]
    return ids, token_labels(token_strings(tokenizer, ids)), notice


def as_tensor(ids: list[int], model: Decoder) -> torch.Tensor:
    """(1, T) int64 on the model's device."""
    return torch.tensor([ids], dtype=torch.int64, device=model.embed_tokens.weight.device)


def runtime_info(model: torch.nn.Module | None = None) -> dict[str, str]:
    """device, dtype and torch version, for provenance lines."""
    if model is not None:
        p = next(model.parameters())
        device, dtype = str(p.device), str(p.dtype).replace("torch.", "")
    else:
        device, dtype = "cpu", "float32"
    return {"device": device, "dtype": dtype, "torch": torch.__version__}


ENCODER_SEED = 0
_encoders: dict[tuple, Any] = {}


def encoder_for(model: Decoder):
    """The untrained companion encoder for ``model``'s vocabulary and width (random weights, seed 0).

    Same vocabulary size, model width and query-head count as the decoder (so one tokenizer serves both),
    at most 4 layers, plain multi-head attention, GELU feed-forward of 4 × width. Built once per shape.
    """
    from models import Encoder, ModelConfig

    c = model.config
    key = (c.vocab_size, c.d_model, c.n_heads, min(c.n_layers, 4), min(c.max_seq_len, 1024))
    with _lock:
        enc = _encoders.get(key)
        if enc is None:
            cfg = ModelConfig(vocab_size=key[0], d_model=key[1], n_heads=key[2], n_kv_heads=key[2],
                              n_layers=key[3], d_ff=4 * key[1], max_seq_len=key[4], attn_impl="sdpa")
            g = torch.random.fork_rng()
            with g:
                torch.manual_seed(ENCODER_SEED)
                enc = Encoder(cfg).eval()
            for p in enc.parameters():
                p.requires_grad_(False)
            while len(_encoders) >= 3:  # loaded models of other shapes must not pile up encoders for ever
                _encoders.pop(next(iter(_encoders)))
            _encoders[key] = enc
        return enc


SMALL_MODEL_PARAMETERS = 20_000_000


# The intra-op thread count at start-up (EXPLORER_THREADS overrides it). The count is per calling thread
# (OpenMP), but a thread that starts while another has lowered it inherits the lowered value, so every block
# below ends by putting its thread back to this number: no request changes what the next one runs with.
DEFAULT_THREADS = int(os.environ.get("EXPLORER_THREADS", "0") or 0) or torch.get_num_threads()


@contextlib.contextmanager
def run_threads(n: int):
    """Run the block on ``n`` intra-op threads (this thread only), then back to ``DEFAULT_THREADS``."""
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != DEFAULT_THREADS:
            torch.set_num_threads(DEFAULT_THREADS)


def default_threads():
    """The start-up thread count for this block: measurements and their predictions (the fused kernel's
    scratch memory grows with the thread count) do not depend on what another request set."""
    return run_threads(DEFAULT_THREADS)


def threads_for(model: torch.nn.Module):
    """Run a small model's interactive forward passes on one intra-op thread, then restore the setting.

    On a 2-core machine shared with other work, two OpenMP threads on a (18 × 192) matmul spend their time
    waiting for each other: measured here under load, one small linear took 16 ms with 2 threads and 0.13 ms
    with 1. Larger models keep every thread.
    """
    small = sum(p.numel() for p in model.parameters()) < SMALL_MODEL_PARAMETERS
    return run_threads(1 if small else DEFAULT_THREADS)
