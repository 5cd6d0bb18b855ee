"""The shipped encoder (assets/encoder-model), measured on its shipped weights, offline; and the
masked-language-model training code it comes from, in its --quick form."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tests never reach the network

import filecmp
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from explorer.probes import encoder_probe as ep
from lens import heldout
from training import encoder as E
from training.corpus import COLORS
from tests.fixed_logits import FixedLogits

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDER = os.path.join(ROOT, "assets", "encoder-model")
DECODER = os.path.join(ROOT, "assets", "default-model")


@pytest.fixture(scope="module")
def encoder():
    return ep.load_encoder(FOLDER)


@pytest.fixture(scope="module")
def tok():
    return ep.load_encoder_tokenizer(FOLDER)


def test_folder_holds_the_shipped_files_and_assets_stay_small():
    for name in ("config.json", "model.safetensors", "README.md", "training_log.json",
                 heldout.HELD_OUT_FILE, *E.TOKENIZER_FILES):
        assert os.path.isfile(os.path.join(FOLDER, name)), name
    snapshots = os.path.join(ROOT, "assets", "default-model", "checkpoints")
    sizes = {os.path.join(d, f): os.path.getsize(os.path.join(d, f))
             for d, _, files in os.walk(os.path.join(ROOT, "assets")) for f in files}
    in_snapshots = sum(n for path, n in sizes.items() if path.startswith(snapshots + os.sep))
    assert sum(sizes.values()) - in_snapshots < 20 * 1024 * 1024, sizes
    # the default model's training snapshots (issue 27): 26 fp16 copies of 2.07 MB, 53.9 MB in all
    assert in_snapshots < 60e6, in_snapshots


def test_encoder_reads_the_default_decoders_tokenizer(tok):
    for name in E.TOKENIZER_FILES:
        assert filecmp.cmp(os.path.join(FOLDER, name), os.path.join(DECODER, name), shallow=False), name
    assert tok.mask_token == "<mask>" and tok.convert_tokens_to_ids("<mask>") == tok.mask_token_id


def test_mlm_head_is_tied_to_the_embedding(encoder):
    from safetensors.torch import load_file

    state = load_file(os.path.join(FOLDER, "model.safetensors"))
    assert set(state) - {k for k in state if k.startswith("encoder.")} == {"mlm_bias"}
    x = torch.tensor([[1, 20, 30, 40, 2]])
    with torch.no_grad():
        h = encoder.encoder(x)                                   # (1, T, C)
        expected = h @ state["encoder.embed_tokens.weight"].T + state["mlm_bias"]
        torch.testing.assert_close(encoder(x), expected)


def _masked_accuracy_reference(encoder, tok, stories, seed=0, rate=0.15):
    """Written out again here, with its own masking: hide 15 % of word positions, argmax."""
    rng = np.random.default_rng(seed)
    special = set(tok.all_special_ids)
    hits = total = 0
    for story in stories:
        ids = tok(story, truncation=True, max_length=encoder.config.max_seq_len)["input_ids"]
        hide = [i for i, t in enumerate(ids) if t not in special and rng.random() < rate]
        x = torch.tensor([ids])
        x[0, hide] = tok.mask_token_id
        with torch.no_grad():
            pred = encoder(x)[0].argmax(-1)
        hits += sum(int(pred[i]) == ids[i] for i in hide)
        total += len(hide)
    return hits / total, total


@pytest.mark.slow
def test_masked_token_accuracy_on_held_out_stories(encoder, tok):
    with open(os.path.join(FOLDER, "training_log.json")) as fh:
        log = json.load(fh)
    stories = ep.held_out_stories(FOLDER)
    assert len(stories) == log["held_out"]["stories"] >= 32
    acc, n = _masked_accuracy_reference(encoder, tok, stories)
    unigram = log["held_out"]["unigram"]["accuracy"]
    print(f"encoder masked-token top-1 {acc:.3f} on {n} hidden tokens; unigram guess {unigram:.3f}; "
          f"decoder next-token top-1 {log['held_out']['decoder_next_token_accuracy']:.3f}")
    assert acc >= 0.5
    assert acc >= unigram + 0.3
    # The logged number is the one explorer.probes.encoder_probe measures on the same stories.
    seqs = ep.held_out_sequences(tok, stories, encoder.config.max_seq_len)
    chosen = ep.choose_positions(seqs, tok.all_special_ids)
    assert ep.masked_accuracy(encoder, seqs, chosen, tok.mask_token_id) == pytest.approx(
        log["held_out"]["encoder_accuracy"], abs=1e-9)
    assert abs(log["held_out"]["encoder_accuracy"] - acc) < 0.05   # another 15 %, same skill


def test_a_colour_fills_the_colour_blank(encoder, tok):
    ids = tok("Tom gave the red ball to Anna.")["input_ids"]
    pos = ids.index(tok.convert_tokens_to_ids("▁red"))
    x = torch.tensor([ids])
    x[0, pos] = tok.mask_token_id
    with torch.no_grad():
        top5 = encoder(x)[0, pos].topk(5).indices.tolist()
    words = [tok.decode([i]).strip() for i in top5]
    print("top 5 for 'Tom gave the [MASK] ball to Anna.':", words)
    assert set(words) & set(COLORS), words


def test_encoder_reads_the_right_side(encoder, tok):
    # Only the words after the blank differ, so only a model that reads them can tell the two apart.
    a = tok("Mom asked Tom to buy milk. Tom bought the milk.")["input_ids"]
    b = tok("Mom asked Tom to buy milk. Tom bought the eggs.")["input_ids"]
    pos = a.index(tok.convert_tokens_to_ids("▁milk"))
    pa = ep.encoder_probs(encoder, a, pos, tok.mask_token_id)
    pb = ep.encoder_probs(encoder, b, pos, tok.mask_token_id)
    assert (pa - pb).abs().sum() > 0.01   # a left-only model gives exactly 0


def test_mask_tokens_follows_bert():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(E.N_SPECIAL, 1000, (200, 256))
    tokens[:, 0] = 1                                             # <s> is never chosen
    inputs, chosen = E.mask_tokens(tokens, 1000, mask_id=4, rate=0.15, g=g)
    assert not chosen[:, 0].any()
    assert chosen.float().mean().item() == pytest.approx(0.15 * 255 / 256, abs=0.005)
    n = chosen.sum().item()
    masked = (inputs == 4) & chosen
    kept = (inputs == tokens) & chosen
    swapped = chosen & ~masked & ~kept
    assert masked.sum().item() / n == pytest.approx(0.8, abs=0.01)
    assert kept.sum().item() / n == pytest.approx(0.1, abs=0.01)   # (a random swap can hit itself)
    assert swapped.sum().item() / n == pytest.approx(0.1, abs=0.01)
    assert (inputs[swapped] >= E.N_SPECIAL).all()
    assert torch.equal(inputs[~chosen], tokens[~chosen])


def test_mlm_loss_counts_only_the_chosen_positions():
    logits = torch.randn(1, 4, 10)
    tokens = torch.tensor([[1, 5, 6, 7]])
    chosen = torch.tensor([[False, True, False, True]])
    expected = (F.cross_entropy(logits[0, 1:2], tokens[0, 1:2]) + F.cross_entropy(logits[0, 3:4], tokens[0, 3:4])) / 2
    torch.testing.assert_close(E.mlm_loss(FixedLogits(logits), tokens, tokens, chosen), expected)


@pytest.fixture(scope="module")
def quick_encoder(tmp_path_factory, quick_folder):
    """The quick encoder, on the tokenizer of the session's quick decoder run (tests/conftest.py)."""
    dec, _ = quick_folder
    enc = tmp_path_factory.mktemp("quick-encoder") / "encoder"
    proc = subprocess.run([sys.executable, "-m", "training", "--encoder", "--quick", "--out", str(enc), "--set",
                           f"tokenizer_from={dec}"], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dec, enc, proc.stdout


def test_quick_encoder_run_writes_a_folder_the_app_reads(quick_encoder):
    dec, enc, stdout = quick_encoder
    assert "step 30/30" in stdout
    log = json.loads((enc / "training_log.json").read_text())
    model, tok = ep.load_encoder(enc), ep.load_encoder_tokenizer(enc)
    stories = ep.held_out_stories(enc)
    seqs = ep.held_out_sequences(tok, stories, model.config.max_seq_len)
    chosen = ep.choose_positions(seqs, tok.all_special_ids)
    assert ep.masked_accuracy(model, seqs, chosen, tok.mask_token_id) == pytest.approx(
        log["held_out"]["encoder_accuracy"], abs=1e-9)
    assert max(e["held_out_accuracy"] for e in log["history"]) == log["picked"]["held_out_accuracy"]
    card = (enc / "README.md").read_text()
    assert f"**{log['held_out']['encoder_accuracy']:.3f}**" in card
    assert f"**{log['held_out']['unigram']['accuracy']:.3f}**" in card
    assert f"{log['train_minutes']:.1f} minutes" in card
    (enc / "README.md").unlink()
    proc = subprocess.run([sys.executable, "-m", "training", "--encoder", "--card-only", "--out", str(enc)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (enc / "README.md").read_text() == card


def test_training_rows_begin_anywhere_in_the_story_stream_in_order_each_after_bos():
    s = E.EncoderSettings(steps=6, batch=3, seq_len=8)
    rows = torch.arange((s.steps * s.batch + 1) * s.seq_len).view(-1, s.seq_len) + 10   # token = index + 10
    stream = rows.flatten()
    g = torch.Generator().manual_seed(0)
    steps = [E.step_rows(stream, k, s, g, bos_id=1) for k in range(s.steps)]
    assert all(x.shape == (s.batch, s.seq_len) and bool((x[:, 0] == 1).all()) for x in steps)  # <s> first
    starts = [int(x[0, 1]) - 10 for x in steps]
    assert len({st % s.seq_len for st in starts}) > 1                # not always a row's start
    for k, (st, x) in enumerate(zip(starts, steps)):
        assert k * s.batch * s.seq_len <= st < (k * s.batch + 1) * s.seq_len   # step k's block
        assert torch.equal(x[:, 1:].flatten(), torch.arange(st, st + x[:, 1:].numel()) + 10)   # in order
    short = E.step_rows(stream, 0, s, g, bos_id=1, length=4)         # the short rows: <s> + 3 tokens each
    assert short.shape == (6, 4) and bool((short[:, 0] == 1).all())
    s.random_offsets = False                                         # without the shift: from the block's start
    assert torch.equal(E.step_rows(stream, 2, s, g, bos_id=1)[:, 1:].flatten(), stream[48:48 + 21])
