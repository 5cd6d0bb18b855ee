"""Train one live (training/live.py): the command line, the records, Stop, the checkpoint, and (slow) the induction
head a 90-second run grows, scored through transformers."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tests never reach the network

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from training import live as L

ROOT = Path(__file__).resolve().parent.parent
RECORD_KEYS = {"step", "seconds", "cpu_seconds", "loss", "lr", "row_len", "induction", "previous_token",
               "best_induction", "best_previous_token", "repeated_half_span", "repeated_half_loss"}


def stop_after(n_steps: int):
    """A should_stop that lets ``n_steps`` steps run (it is asked once before each step)."""
    calls = [0]

    def should_stop() -> bool:
        calls[0] += 1
        return calls[0] > n_steps
    return should_stop


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, one_thread):
    out = tmp_path_factory.mktemp("live") / "model"
    records = []
    run = L.train_live(60, 3, str(out), settings=L.LiveSettings.tiny(), on_step=records.append,
                       should_stop=stop_after(4), snapshot_steps=(0, 2))
    return out, run, records


# --- the command line -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, says", [
    (["--seconds", "0", "--out", "x"], "seconds must be more than 0"),
    (["--seconds", "-3", "--out", "x"], "seconds must be more than 0"),
    (["--seconds", "100000", "--out", "x"], "at most 3600"),
    (["--seconds", "nan", "--out", "x"], "seconds must be a number"),
    (["--seconds", "5"], "--out is needed"),
    (["--seconds", "5", "--seed", "-1", "--out", "x"], "seed must be a whole number 0 or more"),
    (["--seconds", "5", "--out", "x", "--threads", "0"], "--threads must be 1 or more"),
    (["--seconds", "5", "--out", "x", "--snapshot-steps", "10,x"], "a list like 0,100,250"),
    (["--bench", "--seeds", "0-x"], "a range like 0-4"),
    (["--bench", "--seeds", "-2"], "a range like 0-4"),
    (["--seconds", "five", "--out", "x"], "invalid float value"),
])
def test_cli_refuses_bad_arguments_with_a_sentence(argv, says, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        L.main(argv)
    assert exc.value.code == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not Path("x").exists()


def test_parse_seeds_reads_ranges_and_lists():
    assert L.parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert L.parse_seeds("2,5-6") == [2, 5, 6]
    assert L.parse_steps("") == [] and L.parse_steps("0, 10") == [0, 10]


def test_train_live_refuses_bad_numbers():
    with pytest.raises(ValueError, match="seconds"):
        L.train_live(0, 0, None)
    with pytest.raises(ValueError, match="seed"):
        L.train_live(1, 1.5, None)


# --- the data ---------------------------------------------------------------------------------------------------

def test_repeated_rows_hold_two_copies_and_mark_the_second():
    pool = L.span_pool(50, bos=1)
    kind = L.Rows(40, 8, (3, 19))
    rows, second = L.repeated_rows(kind, pool, 1, torch.Generator().manual_seed(0))
    rows, second = rows.numpy(), second.numpy()
    assert rows.shape == second.shape == (8, 41)
    for row, mask in zip(rows, second):
        assert row[0] == 1 and (row[1:] != 1).all()
        n = int(mask.sum())
        assert kind.span[0] <= n <= kind.span[1]
        expected = np.zeros(41, dtype=bool)
        expected[1 + n:1 + 2 * n] = True
        assert (mask == expected).all()
        assert (row[1:1 + n] == row[1 + n:1 + 2 * n]).all()
        assert len(set(row[1:1 + n].tolist())) == n        # no token twice within a span


def test_thin_keeps_the_ends_and_halves_the_middle():
    recs = list(range(11))
    assert L.thin(recs, 20) == recs
    assert L.thin(recs, 10) == [0, 2, 4, 6, 8, 10]


# --- a tiny run -------------------------------------------------------------------------------------------------

def test_records_have_the_promised_keys(tiny_run):
    _, run, records = tiny_run
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]     # record_every=0: every step, and step 0
    for rec in records:
        assert RECORD_KEYS <= set(rec)
        assert set(rec["induction"]) == {"4", "8"}
        for m in [*rec["induction"].values(), rec["previous_token"]]:
            assert np.asarray(m).shape == (2, 2)
            assert ((np.asarray(m) >= 0) & (np.asarray(m) <= 1)).all()
        assert rec["best_induction"] == pytest.approx(min(np.max(m) for m in rec["induction"].values()))
    assert records[0]["loss"] is None and all(r["loss"] > 0 for r in records[1:])
    assert records[-1]["cpu_seconds"] >= records[0]["cpu_seconds"]
    json.dumps(records)  # a job can send them as they are


def test_should_stop_ends_at_once_and_writes(tiny_run):
    out, run, records = tiny_run
    assert run.stopped == "stop" and run.steps == 4
    assert run.final["step"] == 4 == records[-1]["step"]
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", L.LOG_FILE):
        assert (out / name).is_file(), name
    log = json.loads((out / L.LOG_FILE).read_text())
    assert log["steps"] == 4 and log["stopped"] == "stop" and len(log["records"]) == 5
    assert "cpu" in log["machine"]
    for step in (0, 2):
        assert (out / L.SNAPSHOT_DIR / f"step-{step:05d}" / "model.safetensors").is_file()
    assert not (out / L.SNAPSHOT_DIR / "step-00001").exists()


def test_checkpoint_loads_in_transformers_with_our_logits(tiny_run):
    from transformers import AutoTokenizer, LlamaForCausalLM

    from models import load_pretrained

    out, _, _ = tiny_run
    ours = load_pretrained(out)
    hf = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok("Lily saw a cat. Lily saw a cat.", return_tensors="pt").input_ids
    assert ids[0, 0].item() == tok.bos_token_id == ours.config.bos_token_id
    assert hf.config.vocab_size == ours.config.vocab_size == len(tok)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, rtol=1e-4, atol=1e-4)


def test_stop_before_the_first_step_writes_the_untrained_model(tmp_path, one_thread):
    run = L.train_live(60, 0, str(tmp_path / "m"), settings=L.LiveSettings.tiny(), should_stop=lambda: True)
    assert run.steps == 0 and run.stopped == "stop" and run.phase_change is None
    assert (tmp_path / "m" / "model.safetensors").is_file()


def test_time_limit_ends_the_run(one_thread):
    s = L.LiveSettings.tiny()
    s.record_every = 3600.0   # only the first and the last record
    run = L.train_live(1.5, 0, None, settings=s)
    assert run.stopped == "time" and run.steps > 0
    assert [r["step"] for r in run.records] == [0, run.steps]
    assert run.records[-1]["seconds"] >= 1.5    # it trained until the limit, not fewer seconds


def test_long_rows_start_once_the_copy_loss_is_low(one_thread):
    s = L.LiveSettings.tiny()
    s.switch_loss = 100.0     # under it once the first step has a loss: the second step trains on long rows
    records = []
    run = L.train_live(60, 0, None, settings=s, should_stop=stop_after(3), on_step=records.append)
    assert run.long_rows_from == 1
    # a record's row_len: the rows its last step trained on
    assert [r["row_len"] for r in records] == [s.short.length, s.short.length, s.long.length, s.long.length]


def test_phase_change_is_the_first_record_at_the_score(monkeypatch, one_thread):
    scores = iter([0.1, 0.3, 0.55, 0.4, 0.9])

    def fake_measure(model, s):
        v = next(scores)
        return {"induction": {"8": [[v]]}, "previous_token": [[0.0]], "best_induction": v,
                "best_previous_token": 0.0, "repeated_half_span": 8, "repeated_half_loss": 1.0}

    monkeypatch.setattr(L, "measure", fake_measure)
    records = []
    run = L.train_live(60, 0, None, settings=L.LiveSettings.tiny(), should_stop=stop_after(4),
                       on_step=records.append)
    assert [bool(r.get("phase_change")) for r in records] == [False, False, True, False, False]
    assert run.phase_change["step"] == 2 and run.phase_change["best_induction"] == 0.55


def test_same_seed_same_run(one_thread):
    s = L.LiveSettings.tiny()
    a = L.train_live(60, 5, None, settings=s, should_stop=stop_after(3))
    b = L.train_live(60, 5, None, settings=s, should_stop=stop_after(3))
    assert a.final["loss"] == b.final["loss"] and a.final["induction"] == b.final["induction"]


# --- the 90-second run, scored through transformers -----------------------------------------------------------

def induction_scores_hf(folder: Path, spans=(8, 16, 32, 64, 120), rows: int = 8, seed: int = 2024) -> dict:
    """{span: (L, H) induction scores} from transformers' eager attention weights on ``<s> + r + r``, ``r`` distinct
    random ids (not <s>) drawn with NumPy: query j of the second copy should look at j - span + 1."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    bos, V = model.config.bos_token_id, model.config.vocab_size
    candidates = np.array([i for i in range(V) if i != bos])
    rng = np.random.default_rng(seed)
    out = {}
    for span in spans:
        r = np.stack([rng.choice(candidates, size=span, replace=False) for _ in range(rows)])
        ids = np.concatenate([np.full((rows, 1), bos), r, r], axis=1)
        with torch.no_grad():
            att = model(torch.from_numpy(ids), output_attentions=True).attentions   # L x (B, H, T, T)
        w = torch.stack(att).numpy()                                                  # (L, B, H, T, T)
        q = np.arange(1 + span, 1 + 2 * span)
        out[span] = w[:, :, :, q, q - span + 1].mean(axis=(1, 3))                     # (L, H)
    return out


@pytest.mark.slow
@pytest.mark.train
def test_ninety_seconds_grow_an_induction_head_seen_by_transformers(tmp_path):
    out = tmp_path / "live"
    proc = subprocess.run([sys.executable, "-m", "training.live", "--seconds", "90", "--seed", "0", "--out",
                           str(out), "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    scores = induction_scores_hf(out)
    best_by_span = {span: float(m.max()) for span, m in scores.items()}
    assert min(best_by_span.values()) >= 0.5, best_by_span
    log = json.loads((out / L.LOG_FILE).read_text())
    assert log["phase_change"] is not None and log["phase_change"]["seconds"] <= 90


def test_the_phase_change_is_snapshotted_when_asked(tmp_path, monkeypatch, one_thread):
    monkeypatch.setattr(L, "PHASE_SCORE", -1.0)  # every record qualifies: the first one (step 0) is the phase change
    run = L.train_live(60, 0, str(tmp_path / "m"), settings=L.LiveSettings.tiny(), should_stop=stop_after(2),
                       snapshot_phase=True)
    assert run.phase_change["step"] == 0
    assert sorted(p.name for p in (tmp_path / "m" / L.SNAPSHOT_DIR).iterdir()) == ["step-00000"]
