"""The training package that builds the shipped decoder, run in its --quick form."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tests never reach the network

import argparse
import json
import math

import numpy as np
import pytest
import torch

from models import load_pretrained
from training import __main__ as cli
from training import data as D
from training import evaluate as E
from training import loop as T
from tests.fixed_logits import FixedLogits

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
        cli.main(["--quick"])


def test_lr_schedule_warms_up_then_decays():
    s = T.TrainSettings(steps=100, warmup=10, lr=1e-3, min_lr=1e-5)
    lrs = [T.lr_at(i, s) for i in range(100)]
    assert lrs[0] == pytest.approx(1e-4)
    assert lrs[9] == pytest.approx(1e-3)
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:10]))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[-1] == pytest.approx(1e-5, rel=0.05)


def test_repeated_span_rows_repeat_each_span():
    g = torch.Generator().manual_seed(0)
    pool = torch.arange(4, 100)
    background = torch.zeros(3, 41, dtype=torch.long)
    rows, second = D.repeated_span_rows(background, pool, len(pool), bos_id=1, span=(5, 5), max_gap=0,
                                        max_lead=0, g=g)
    assert rows.shape == (3, 41)
    assert (rows[:, 0] == 1).all()
    assert (background == 0).all()                          # the background is not written to
    body = rows[:, 1:]
    assert (body >= 4).all() and (body < 100).all()
    assert torch.equal(body[:, 0:5], body[:, 5:10])        # r r
    assert torch.equal(body[:, 10:15], body[:, 15:20])      # q q
    for row in body:
        assert len(set(row[0:5].tolist())) == 5            # distinct within a span
    # Only second copies are marked as predictable targets: positions 6-10, 16-20, ...
    expected = torch.zeros(41, dtype=torch.bool)
    for start in range(6, 41, 10):
        expected[start:start + 5] = True
    assert torch.equal(second, expected.expand(3, 41))


def test_repeated_spans_vary_in_length_and_gap_and_keep_the_background():
    g = torch.Generator().manual_seed(1)
    W = 257
    pairs = [p for _ in range(200) for p in D.place_repeats(W, (4, 124), 64, 32, g)]
    lengths = [n for _, _, n in pairs]
    gaps = [b - a - n for a, b, n in pairs]
    assert min(lengths) >= 4 and max(lengths) <= 124
    assert sum(n <= 12 for n in lengths) > 0.1 * len(lengths)
    assert sum(n >= 64 for n in lengths) > 0.1 * len(lengths)
    assert min(gaps) == 0 and max(gaps) > 40 and sum(gp > 0 for gp in gaps) > 0.5 * len(gaps)
    assert all(b + n <= W and a >= 1 for a, b, n in pairs)
    # Over story text the tokens outside the copies are the story's own.
    background = torch.arange(1000, 1000 + W).repeat(2, 1)
    pool = torch.arange(4, 900)
    g = torch.Generator().manual_seed(2)
    rows, second = D.repeated_span_rows(background, pool, len(pool), 1, (4, 124), 64, 32, g)
    g = torch.Generator().manual_seed(2)
    placed = [D.place_repeats(W, (4, 124), 64, 32, g) for _ in range(2)]
    for row, bg, where, marked in zip(rows, background, placed, second):
        covered = torch.zeros(W, dtype=torch.bool)
        seconds = torch.zeros(W, dtype=torch.bool)
        for a, b, n in where:
            assert torch.equal(row[a:a + n], row[b:b + n])
            covered[a:a + n] = covered[b:b + n] = True
            seconds[b:b + n] = True
        assert torch.equal(marked, seconds)
        covered[0] = True
        assert torch.equal(row[~covered], bg[~covered])
        assert (row[covered][1:] < 900).all()


def test_story_rows_start_with_bos(quick_folder):
    from tokenizers import Tokenizer

    out, _ = quick_folder
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    rows = D.story_rows(tok, seed=9, n_rows=5, seq_len=32)
    assert rows.shape == (5, 33)
    assert (rows[:, 0] == tok.token_to_id("<s>")).all()
    assert torch.equal(rows, D.story_rows(tok, seed=9, n_rows=5, seq_len=32))


def test_unigram_entropy_matches_numpy():
    t = torch.tensor([0, 0, 1, 2, 2, 2, 5])
    p = np.array([2, 1, 3, 1]) / 7
    assert D.unigram_entropy(t, 6) == pytest.approx(float(-(p * np.log(p)).sum()))


def test_random_token_pool_grows_to_the_whole_vocabulary():
    sizes = [D.pool_size(i, 100, 50, (0.3, 0.7), 1000) for i in range(101)]
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
    cli.main(["--card-only", "--out", str(folder)])
    card = (folder / "README.md").read_text()
    log = json.loads((folder / "training_log.json").read_text())
    assert f"{log['picked']['held_out_loss']:.3f} nats/token" in card
    assert f"{log['unigram_baseline']:.3f} nats/token" in card
    assert f"{log['n_params']:,}" in card
    assert log["machine"]["cpu"] in card
    n_layers = len(log["picked"]["previous_token"])
    n_heads = len(log["picked"]["previous_token"][0])
    assert card.count("\n| ") >= n_layers * n_heads          # one table row per head
    assert log["machine"]["torch"] in card
    assert f"{log['train_minutes']:.1f} minutes" in card
    for span, scores in log["picked"]["induction"].items():
        assert f"span {span}: **{E.best(scores)[0]:.3f}**" in card
    for sample in log["samples"]:
        assert sample["prompt"] in card


def test_logged_head_scores_are_the_shipped_weights_scores_in_transformers(quick_folder):
    from transformers import LlamaForCausalLM

    from lens.heads import induction_score, previous_token_score, repeated_random_tokens

    out, _ = quick_folder
    log = json.loads((out / "training_log.json").read_text())
    hf = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    cfg = hf.config
    assert list(log["picked"]["induction"]) == ["8", "16"]      # the spans that fit 64 tokens
    for span, logged in log["picked"]["induction"].items():
        x = repeated_random_tokens(cfg.vocab_size, int(span), 8, seed=log["probe_seed"],
                                   bos_id=cfg.bos_token_id)
        with torch.no_grad():
            pat = torch.stack(hf(x, output_attentions=True).attentions)   # (L, B, H, T, T)
        torch.testing.assert_close(induction_score(pat, int(span)), torch.tensor(logged),
                                   atol=1e-4, rtol=0)
        if span == "16":                                        # the reference span here
            torch.testing.assert_close(previous_token_score(pat),
                                       torch.tensor(log["picked"]["previous_token"]),
                                       atol=1e-4, rtol=0)


def test_quick_tokenizer_has_the_mask_token(quick_folder):
    from transformers import AutoTokenizer

    out, _ = quick_folder
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.mask_token == "<mask>" and tok.mask_token_id == 4
    assert [tok.convert_ids_to_tokens(i) for i in range(5)] == ["<pad>", "<s>", "</s>", "<unk>",
                                                                "<mask>"]


def _entry(loss, prev, *induction):
    return {"held_out_loss": loss, "previous_token": [[prev, 0.0]],
            "induction": {str(8 * (i + 1)): [[v, 0.0]] for i, v in enumerate(induction)}}


def test_checkpoint_choice_wants_every_span_then_the_lowest_loss():
    good_high_loss = _entry(1.2, 0.9, 0.8, 0.75)
    good_low_loss = _entry(1.0, 0.9, 0.9, 0.71)
    one_span_weak = _entry(0.8, 0.9, 0.99, 0.5)       # lowest loss, but fails at one span
    weak_prev = _entry(0.8, 0.5, 0.99, 0.99)
    nearer = _entry(1.5, 0.9, 0.9, 0.6)
    assert E.meets_targets(good_low_loss) and not E.meets_targets(one_span_weak)
    assert not E.meets_targets(weak_prev)
    ranked = sorted([one_span_weak, good_high_loss, weak_prev, good_low_loss, nearer],
                    key=E.checkpoint_key)
    assert ranked[:2] == [good_low_loss, good_high_loss]
    assert ranked[2] is weak_prev                     # meets induction, misses previous-token
    assert ranked.index(nearer) < ranked.index(one_span_weak)
    assert E.worst_span_induction(one_span_weak) == 0.5


def test_set_overrides_settings_fields_and_refuses_unknown_ones():
    s = T.TrainSettings()
    ap = argparse.ArgumentParser()
    cli._apply_overrides(s, ["max_gap=7", "span=3,9", "story_background=0.25"], ap)
    assert (s.max_gap, s.span, s.story_background) == (7, (3, 9), 0.25)
    with pytest.raises(SystemExit):
        cli._apply_overrides(s, ["no_such_field=1"], ap)


def test_span_loss_counts_only_the_marked_targets():
    torch.manual_seed(0)
    rows = torch.tensor([[1, 5, 6, 5, 6]])
    logits = torch.randn(1, 4, 10)
    marked = torch.tensor([[False, False, False, True, True]])
    expected = torch.nn.functional.cross_entropy(logits[0, 2:], rows[0, 3:])
    torch.testing.assert_close(T.next_token_loss(FixedLogits(logits), rows, marked), expected)
    everything = torch.nn.functional.cross_entropy(logits[0], rows[0, 1:])
    torch.testing.assert_close(T.next_token_loss(FixedLogits(logits), rows), everything)


def test_late_steps_trade_span_rows_for_story_rows_and_read_no_row_twice():
    s = T.TrainSettings(steps=20, batch=4, span_batch=4, late_from=0.5, late_batch=6,
                        late_span_batch=2, story_background=0.5)
    assert T.rows_at(9, s) == (4, 4) and T.rows_at(10, s) == (6, 2)
    n_story, n_background = T.story_rows_needed(s)
    assert (n_story, n_background) == (10 * 4 + 10 * 6, 10 * 2 + 10 * 1)
    total = n_story + n_background
    seen = []
    for step in range(s.steps):
        story, under = T.story_slices(step, s, total)
        assert story.stop - story.start == T.rows_at(step, s)[0]
        assert under.stop - under.start == T.n_story_background(T.rows_at(step, s)[1], s)
        seen += list(range(total))[story] + list(range(total))[under]
    assert sorted(seen) == list(range(total))          # every row once, none twice


def test_query_and_key_projections_get_their_own_weight_decay():
    s = T.TrainSettings.quick()
    s.qk_weight_decay, s.weight_decay = 0.0, 0.1
    from tokenizers import Tokenizer, models as tm

    tok = Tokenizer(tm.WordLevel({"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, "x": 4}, unk_token="<unk>"))
    model = T.build_model(s, tok, 16)
    opt = T.make_optimizer(model, s)
    decay_of = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        want = (0.0 if p.dim() < 2 else 0.0 if name.endswith(("q_proj.weight", "k_proj.weight"))
                else 0.1)
        assert decay_of[id(p)] == want, name
    assert len(decay_of) == len(list(model.parameters()))
