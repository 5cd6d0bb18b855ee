"""Checkpoints: transformers' format (``config.json`` + ``*.safetensors``) in and out, for Llama and the families
that change it in a few named ways (``models.families``: Mistral, Qwen2, Qwen3, Gemma 3 text).

Safetensors only: no file is ever unpickled. Our parameter names are transformers' names with three prefix
changes, so no per-parameter renaming table exists:
    model.layers.{i}.self_attn.q_proj.weight  <->  blocks.{i}.attn.q_proj.weight
    model.embed_tokens.weight / model.norm.weight  <->  embed_tokens.weight / norm.weight
The families' extra weights keep their transformers leaf names too: q_proj.bias (Qwen2), self_attn.q_norm.weight
and k_norm (Qwen3, Gemma 3), pre_feedforward_layernorm and post_feedforward_layernorm (Gemma 3's sandwich).
The config is read and written by ``models.families``; every family's config.json fields have their own reader.
"""
from __future__ import annotations

import contextlib

import json
import os
import re
from pathlib import Path

import torch

from .config import ModelConfig
from .decoder import Decoder

REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
HUB_FILES = ["config.json", "*.safetensors", "model.safetensors.index.json", "tokenizer.json",
             "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"]


def hf_to_ours(name: str) -> str:
    if name.startswith("model."):
        name = name[len("model."):]
    return name.replace("layers.", "blocks.", 1).replace(".self_attn.", ".attn.")


def ours_to_hf(name: str) -> str:
    if name.startswith("lm_head."):
        return name
    return "model." + name.replace("blocks.", "layers.", 1).replace(".attn.", ".self_attn.")


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` says the Hub must not be asked."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def fetch_hub(repo_id: str) -> Path:
    """A Hub checkpoint's folder: from huggingface_hub's local cache, else downloaded when online.

    Only the files a checkpoint needs are fetched (``HUB_FILES``: no pickles, no code).
    """
    if not REPO_ID.match(repo_id) or ".." in repo_id:
        raise ValueError(f"{repo_id!r} is not a Hugging Face repo id like 'HuggingFaceTB/SmolLM2-135M'.")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES, local_files_only=True))
    except Exception:
        pass
    if hub_offline():
        raise ValueError(f"could not fetch {repo_id!r}: it is not in the local cache and the Hub is switched off "
                         "(HF_HUB_OFFLINE=1, offline). Load a local folder instead.")
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES, etag_timeout=10))
    except Exception as exc:  # no network, unknown repo, gated repo: all end the same way for the user
        raise ValueError(f"could not fetch {repo_id!r} from the Hugging Face Hub ({type(exc).__name__}): the "
                         "machine may be offline or the repo id wrong. Load a local folder instead.") from exc


def resolve_source(source: str | os.PathLike) -> Path:
    """A local folder as is; a Hub repo id through ``fetch_hub``."""
    path = Path(source)
    if path.is_dir():
        return path
    source = str(source)
    if not REPO_ID.match(source) or ".." in source:
        raise ValueError(f"{source!r} is neither a folder nor a Hugging Face repo id like 'HuggingFaceTB/SmolLM2-135M'.")
    return fetch_hub(source)


def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder} holds no .safetensors weights (other formats are refused: they can run code).")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except Exception as exc:
            raise ValueError(f"{f.name} is not a readable safetensors file ({exc}).") from exc
    return state


def load_pretrained(source: str | os.PathLike, dtype: torch.dtype = torch.float32,
                    device: str | torch.device | None = None) -> Decoder:
    """A checkpoint of a family that loads (folder or Hub id; ``models.families.FAMILIES``) as our ``Decoder``,
    in eval mode.

    device: where to build it (None: torch's default device, the CPU unless changed).
    """
    folder = resolve_source(source)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{folder} has no config.json: it is not a transformers checkpoint folder.")
    try:
        hf = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{config_path} is not valid JSON ({exc}).") from exc
    try:
        config = ModelConfig.from_hf(hf)
    except KeyError as exc:
        raise ValueError(f"{config_path} lacks the field {exc.args[0]!r} of a {hf.get('model_type', 'llama')} "
                         "config.") from exc
    state = {hf_to_ours(k): v for k, v in read_state_dict(folder).items()}
    if config.tie_embeddings:
        state.pop("lm_head.weight", None)
    with torch.device(device) if device is not None else contextlib.nullcontext():
        model = Decoder(config)
    expected = model.state_dict()
    if config.tie_embeddings:
        expected.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"weights do not match the config: missing {missing[:4]}, unexpected {unexpected[:4]}.")
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, the config needs {tuple(expected[name].shape)}.")
    model.load_state_dict(state, strict=False)
    return model.to(dtype=dtype).eval()


def save_pretrained(model: Decoder, folder: str | os.PathLike, dtype: torch.dtype | None = None) -> Path:
    """Write ``config.json`` and ``model.safetensors`` that the transformers class of ``model.config.family``
    loads (``LlamaForCausalLM``, ``Qwen3ForCausalLM``, ...). Raises ValueError, before writing anything, when the
    config's switches do not fit that class.

    dtype: the weights' dtype on disk (None: as they are in ``model``); the config names it.
    """
    from safetensors.torch import save_file

    hf_config = model.config.to_hf()
    if dtype is not None:
        hf_config["dtype"] = str(dtype).removeprefix("torch.")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {ours_to_hf(k): v.detach().to(dtype or v.dtype).contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_embeddings:
        state.pop("lm_head.weight")
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    return folder


def _plain_fast_tokenizer(folder: Path) -> bool:
    """Whether ``folder`` holds a Llama checkpoint whose tokenizer is a plain ``tokenizer.json`` that its
    ``tokenizer_config.json`` names ``PreTrainedTokenizerFast`` (no custom code): the class AutoTokenizer picks
    for it, loaded without AutoTokenizer's detour through the model's config (whose import costs about 0.8 s of
    start-up on 2 cores)."""
    try:
        tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return False
    return (tokenizer_config.get("tokenizer_class") == "PreTrainedTokenizerFast" and "auto_map" not in tokenizer_config
            and model_type == "llama" and (folder / "tokenizer.json").is_file())


def load_tokenizer(source: str | os.PathLike):
    """The checkpoint's tokenizer through transformers' AutoTokenizer (no remote code); a plain fast tokenizer of a
    Llama checkpoint (the shipped ones) as the same class directly."""
    folder = resolve_source(source)
    try:
        if _plain_fast_tokenizer(Path(folder)):
            from transformers import PreTrainedTokenizerFast

            return PreTrainedTokenizerFast.from_pretrained(str(folder))
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    except Exception as exc:
        raise ValueError(f"{folder} has no tokenizer that transformers can load ({exc}).") from exc
