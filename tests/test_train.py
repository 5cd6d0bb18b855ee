"""The training loop that builds the shipped model, run in its --quick form."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tests never reach the network

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from models import load_pretrained
from models import train as T

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def quick_folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("quick") / "model"
    proc = subprocess.run(
        [sys.executable, "-m", "models.train", "--quick", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc.stdout


def test_quick_run_writes_a_complete_folder(quick_folder):
    out, stdout = quick_folder
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "training_log.json", "README.md"):
        assert (out / name).is_file(), name
    assert "step 40/40" in stdout


def test_quick_run_loss_goes_down(quick_folder):
    out, _ = quick_folder
    log = json.loads((out / "training_log.json").read_text())
    held = [e["held_out_loss"] for e in log["history"]]
    assert held[0] > held[-1] + 0.5                       # clearly learned something
    assert held[0] == pytest.approx(math.log(log["vocab_size"]), abs=0.5)   # starts near ln V
    train = [e["train_loss"] for e in log["history"] if e["train_loss"] is not None]
    assert train[-1] < train[0]


def test_quick_folder_loads_in_ours_and_in_transformers(quick_folder):
    from transformers import AutoTokenizer, LlamaForCausalLM

    out, _ = quick_folder
    ours = load_pretrained(out)
    hf = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok("Once upon a time, there was a girl named Mia.", return_tensors="pt").input_ids
    assert ids[0, 0].item() == tok.bos_token_id == ours.config.bos_token_id
    with torch.no_grad():
        a = ours(ids)
        b = hf(ids).logits
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_quick_without_out_refuses(tmp_path):
    with pytest.raises(SystemExit):
        T.main(["--quick"])


def test_lr_schedule_warms_up_then_decays():
    s = T.TrainSettings(steps=100, warmup=10, lr=1e-3, min_lr=1e-5)
    lrs = [T.lr_at(i, s) for i in range(100)]
    assert lrs[0] == pytest.approx(1e-4)
    assert lrs[9] == pytest.approx(1e-3)
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:10]))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[-1] == pytest.approx(1e-5, rel=0.05)


def test_random_rows_repeat_each_span():
    g = torch.Generator().manual_seed(0)
    rows = T.random_rows(3, 40, vocab_size=100, bos_id=1, n_special=4, span=(5, 5), g=g)
    assert rows.shape == (3, 41)
    assert (rows[:, 0] == 1).all()
    body = rows[:, 1:]
    assert (body >= 4).all() and (body < 100).all()
    assert torch.equal(body[:, 0:5], body[:, 5:10])        # r r
    assert torch.equal(body[:, 10:15], body[:, 15:20])      # q q


def test_story_rows_start_with_bos(quick_folder):
    from tokenizers import Tokenizer

    out, _ = quick_folder
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    rows = T.story_rows(tok, seed=9, n_rows=5, seq_len=32)
    assert rows.shape == (5, 33)
    assert (rows[:, 0] == tok.token_to_id("<s>")).all()
    assert torch.equal(rows, T.story_rows(tok, seed=9, n_rows=5, seq_len=32))


def test_unigram_entropy_matches_numpy():
    t = torch.tensor([0, 0, 1, 2, 2, 2, 5])
    p = np.array([2, 1, 3, 1]) / 7
    assert T.unigram_entropy(t, 6) == pytest.approx(float(-(p * np.log(p)).sum()))


def test_random_token_pool_grows_to_the_whole_vocabulary():
    s = T.TrainSettings(steps=100, pool_start=50, pool_grow=(0.3, 0.7))
    sizes = [T.pool_size(i, s, 1000) for i in range(101)]
    assert sizes[0] == sizes[30] == 50
    assert sizes[50] == 525
    assert sizes[70] == sizes[100] == 1000
    assert all(a <= b for a, b in zip(sizes, sizes[1:]))


def test_model_card_reports_the_logged_numbers(quick_folder, tmp_path):
    import shutil

    out, _ = quick_folder
    folder = tmp_path / "copy"
    shutil.copytree(out, folder)
    (folder / "README.md").unlink()
    T.main(["--card-only", "--out", str(folder)])
    card = (folder / "README.md").read_text()
    log = json.loads((folder / "training_log.json").read_text())
    assert f"{log['picked']['held_out_loss']:.3f} nats/token" in card
    assert f"{log['unigram_baseline']:.3f} nats/token" in card
    assert f"{log['n_params']:,}" in card
    assert log["machine"]["cpu"] in card
    n_heads = len(log["picked"]["induction"][0])
    n_layers = len(log["picked"]["induction"])
    assert card.count("\n| ") >= n_layers * n_heads          # one table row per head
    for sample in log["samples"]:
        assert sample["prompt"] in card
