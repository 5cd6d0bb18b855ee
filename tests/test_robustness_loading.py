"""Loading a model: sources outside the root, broken configs and weights, links out, no unsafe loading in the code.

Shared helpers and fixtures: tests/hostile.py.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import gradio as gr
import pytest
import torch

from explorer.state import checkpoints

from tests.hostile import (  # noqa: F401 - fixtures are found by their names here
    forbid, forbid_loading, hub_local_only, load, root, served,
)

pytestmark = pytest.mark.usefixtures("served")  # not an argument: hypothesis would print the model


@pytest.mark.parametrize("source, message", [
    ("/etc", "must be inside"), ("/etc/passwd", "must be inside"), ("../../etc", "must be inside"),
    ("good/../../..", "must be inside"), ("~", "must be inside"), ("link-out", "must be inside"),
    ("owner/name/extra", "not a folder"), ("-bad/repo", "not a folder"), ("a" * 97 + "/b", "not a folder"),
    ("https://huggingface.co/gpt2", "not a folder"), ("good\x00", "control characters"),
    ("x" * 5000, "not a usable folder name|not a folder"),
])
def test_sources_outside_the_root_or_not_repo_ids_are_refused_before_loading(monkeypatch, root, source, message):
    (root / "link-out").symlink_to("/etc")
    forbid_loading(monkeypatch)
    with pytest.raises(gr.Error, match=message):
        load(source)


def test_unknown_hub_ids_never_reach_the_network_offline(monkeypatch, root):
    import huggingface_hub

    calls = []

    def fake(repo_id, **kw):
        calls.append(kw)
        raise FileNotFoundError(repo_id)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    forbid(monkeypatch, checkpoints, "load_pretrained")
    with pytest.raises(gr.Error, match="offline"):
        load("nobody-here/no-such-model-12345")
    assert calls and all(kw.get("local_files_only") for kw in calls)  # only the local cache was asked


def _write_config(folder: Path, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("change, message", [
    (dict(num_attention_heads=0), "config.json is not a readable Llama config"),
    (dict(hidden_size=30), "config.json is not a readable Llama config"),
    (dict(num_hidden_layers=-2), "config.json is not a readable Llama config"),
    (dict(vocab_size="many"), "config.json is not a readable Llama config"),
    (dict(rope_parameters="yes"), "config.json is not a readable Llama config"),
    (dict(model_type="gpt2"), "Only Llama-family"),
    (dict(max_position_embeddings=10**9), "rotary tables"),
    (dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
          num_key_value_heads=8, head_dim=128), "M parameters"),
    ("[1, 2, 3]", "config.json is not a readable Llama config"),
    ("{not json", "config.json is not a readable Llama config"),
])
def test_configs_that_cannot_be_built_are_refused_before_reading_weights(monkeypatch, root, change, message):
    import shutil

    bad = root / "bad"
    shutil.copytree(root / "good", bad)
    if isinstance(change, str):
        (bad / "config.json").write_text(change)
    else:
        _write_config(bad, **change)
    forbid_loading(monkeypatch)
    with pytest.raises(gr.Error, match=message):
        load("bad")


@pytest.mark.parametrize("kind, message", [
    ("pickle only", "holds no .safetensors"),
    ("truncated", "not a readable safetensors"),
    ("corrupt", "not a readable safetensors"),
    ("empty", "not a readable safetensors"),
])
def test_weight_files_that_are_not_safetensors_or_broken_are_refused(monkeypatch, root, kind, message):
    import shutil

    bad = root / "bad"
    shutil.copytree(root / "good", bad)
    weights = bad / "model.safetensors"
    data = weights.read_bytes()
    if kind == "pickle only":
        weights.unlink()
        torch.save({"x": torch.zeros(2)}, bad / "pytorch_model.bin")
    elif kind == "truncated":
        weights.write_bytes(data[: len(data) // 2])
    elif kind == "corrupt":
        weights.write_bytes(os.urandom(len(data)))
    else:
        weights.write_bytes(b"")
    forbid(monkeypatch, torch, "load")  # pickled weights are never opened
    with pytest.raises(gr.Error, match=message):
        load("bad")


def test_weight_files_too_large_are_refused_before_reading(monkeypatch, root):
    import shutil

    bad = root / "bad"
    shutil.copytree(root / "good", bad)
    with open(bad / "model-00002.safetensors", "wb") as f:  # sparse: 5 GiB on paper, nothing on disk
        f.truncate(5 * 2**30)
    forbid_loading(monkeypatch)
    with pytest.raises(gr.Error, match="were not read"):
        load("bad")


def test_a_good_local_checkpoint_still_loads(root):
    status, *_, state = load("good")
    assert "Loaded" in status and state["model"] is not None


def test_symlinks_out_of_the_model_root_are_refused_and_the_shipped_model_costs_no_private_copy(tmp_path,
                                                                                                monkeypatch):
    from explorer.state import checkpoints
    from explorer.state.private_models import private_models_bytes

    root = tmp_path / "root"
    outside = tmp_path / "outside"
    (root / "ckpt").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.txt").write_text("not a model card")
    (root / "ckpt" / "config.json").write_text("{}")
    (root / "ckpt" / "README.md").symlink_to(outside / "secret.txt")
    monkeypatch.setenv("EXPLORER_MODEL_ROOT", str(root))
    with pytest.raises(ValueError, match="links to a file outside the allowed model folder") as caught:
        checkpoints.load_checkpoint("ckpt")
    assert str(tmp_path) not in str(caught.value)  # no server path in the sentence
    with pytest.raises(ValueError) as caught:
        checkpoints.load_checkpoint("/etc")
    assert "must be inside" in str(caught.value) and str(root) not in str(caught.value)

    from explorer.panels.model import _card_text

    assert "not a model card" not in _card_text(root / "ckpt")

    shipped = checkpoints.default_model_dir().resolve()
    monkeypatch.setenv("EXPLORER_MODEL_ROOT", str(shipped.parent))
    before = private_models_bytes()
    for _ in range(5):
        model, _, _, source = checkpoints.load_checkpoint(shipped.name)
        assert model is None and source == "default"  # the shared model, not a private copy
    assert private_models_bytes() == before
SOURCE_FILES = [p for d in ("explorer", "models") for p in (checkpoints.REPO_ROOT / d).rglob("*.py")] + \
    [checkpoints.REPO_ROOT / "app.py"]


def test_no_pickle_loading_remote_code_or_shell_in_the_app():
    import re

    for path in SOURCE_FILES:
        text = path.read_text()
        for call in re.findall(r"torch\.load\([^)]*\)", text):
            assert "weights_only=True" in call, f"{path.name}: {call}"
        assert not re.search(r"trust_remote_code\s*=\s*True", text), path
        assert "shell=True" not in text and "os.system(" not in text and "os.popen(" not in text, path
        assert "pickle.load" not in text and "eval(" not in text.replace(".eval(", ""), path
        if path.parent.name == "panels" or path.name in ("app.py", "session.py", "checkpoints.py", "private_models.py", "text.py"):
            assert "subprocess" not in text, path
