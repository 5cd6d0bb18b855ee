"""explorer.bench: the command runs end to end on a toy model and writes both reports; targets are judged
from the numbers given. No timing assertions (speed is what the benchmark reports, not what tests check)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from explorer import bench

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_quick_bench_on_a_tiny_config_writes_markdown_and_json(tmp_path):
    out = tmp_path / "report"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # one thread: on a shared 2-core machine two OpenMP threads can stall each other for milliseconds per op
    proc = subprocess.run([sys.executable, "-m", "explorer.bench", "--quick", "--tiny", "--threads", "1",
                           "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "bench.json").read_text())
    md = (out / "bench.md").read_text()
    for key in ("machine", "attention", "cache", "vs_transformers", "targets", "settings"):
        assert key in report
    assert report["cache"]["tokens_identical"] is True
    assert report["vs_transformers"]["max_abs_logit_diff"] < 1e-4  # same weights, same logits
    assert report["vs_transformers"]["decode"]["tokens_identical"] is True
    assert {r["impl"] for r in report["attention"]} == {"naive", "sdpa", "tiled"}
    assert all(r["max_abs_diff"] < 1e-4 for r in report["attention"])
    # 11 for the models (2 of them the decode roofline), 2 for the generation stream, 5 for the Attention tab
    # (time and payload, 2 models; head switch), 5 induction spans, 5 for classroom load (a plain page, a link,
    # 64 sessions, 40 own questions, attention beside measurements), 5 for the lecture's long actions, 3 for a lecture hall voting, 7 for a
    # stranger's script (queue, victim, a classmate behind the flooder's address, a class beside 4 x 300 long jobs,
    # lanes, Stop of a sweep and of a fine-tune, memory), 2 for a lecture (the
    # formats view, cold start), 1 for the Training tab's step, 4 for the door (a new Host, a 25 MB body, the soak's
    # memory and its visitor), 1 for growing an induction head live
    assert len(report["targets"]) == 55
    assert all(report["experiments"][k]["seconds"] > 0 for k in ("knockout_sweep", "patch_resid_pre", "patch_head",
                                                                "patching_experiment", "induction_span_120"))
    assert "skipped" in report["load"] and "Classroom load" in md
    assert "skipped" in report["vote"] and "A lecture hall votes from their phones" in md
    assert report["generation"]["new_tokens"] == 128 and report["generation"]["uncached_steps"] == 8
    assert list(report["induction"]["spans"]) == ["8", "16", "32", "64", "120"]  # the shipped model's context fits
    f = report["formats"]
    assert set(f["rows"]) == {"ours fp32", "ours bf16", "ours int8", "transformers fp32"}
    for r in f["rows"].values():  # each fraction is its own measured speed over bandwidth / bytes
        assert r["fraction_of_limit"] * f["bandwidth"]["bytes_per_s"] / r["bytes_per_token"] == \
            pytest.approx(r["tokens_per_s"])
    assert "Decoding in three weight formats" in md
    shipped = report["app"]["shipped default model"]  # the Attention tab: the follow-up and the breakdown timed too
    assert shipped["impls_seconds"] > 0 and len(shipped["breakdown_seconds"]) == 3
    assert "naive vs fused follow-up (ms)" in md and "the parts of a first answer timed alone" in md
    assert "| target | measured | result |" in md and "tiny" in md
    for needle in ("Prefill T=128", "Decode 64 tokens", "Cached vs uncached", "naive vs sdpa at T=4096"):
        assert needle in md
    for key in ("cpu", "cores", "torch", "device", "dtype", "date"):
        assert report["machine"][key]


def test_bench_refuses_cuda_without_a_gpu(tmp_path):
    import torch

    if torch.cuda.is_available():
        return
    try:
        bench.main(["--out", str(tmp_path), "--device", "cuda"])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("expected the command to stop with an error")
    assert not (tmp_path / "bench.md").exists()


def _report(**over):
    attention = []
    for impl, peak, pred, sec, diff in (("naive", 1.1e9, 1.1e9, 1.4, 0.0), ("sdpa", 9e6, 9e6, 0.1, 1e-6),
                                        ("tiled", 7e7, 7e7, 2.0, 1e-6)):
        attention.append({"seq_len": 4096, "impl": impl, "peak_bytes": peak, "predicted_bytes": pred,
                          "seconds": sec, "max_abs_diff": diff, "refused": None})
    report = {
        "attention": attention,
        "cache": {"speedup": 7.0, "tokens_identical": True},
        "vs_transformers": {
            "prefill": {"128": {"ours_over_transformers": 0.9}, "512": {"ours_over_transformers": 1.2}},
            "decode": {"ours_over_transformers": 1.6, "ours_tokens_per_s": 16.0, "transformers_tokens_per_s": 10.0},
        },
    }
    report.update(over)
    return report


def test_targets_are_judged_from_the_numbers():
    t = {x["target"].split(":")[0]: x for x in bench.evaluate_targets(_report())}
    assert t["Prefill T=128"]["pass"] is True
    assert t["Prefill T=512"]["pass"] is False
    assert t["Decode 64 tokens"]["pass"] is True
    assert t["Cached vs uncached greedy decoding of 128 tokens"]["pass"] is True
    naive_sdpa = [x for x in bench.evaluate_targets(_report()) if x["target"].startswith("naive vs sdpa")]
    assert [x["pass"] for x in naive_sdpa] == [True, True]  # 122x memory, 14x time
    rest = {x["target"]: x["pass"] for x in bench.evaluate_targets(_report())}
    assert rest["tiled peak at least 10x under naive at T=4096"] is True
    assert rest["naive measured peak within 25% of its prediction at T=4096"] is True


def test_roofline_targets_are_judged_from_the_formats_rows():
    rows = {"ours fp32": {"tokens_per_s": 30.0, "limit_tokens_per_s": 50.0, "fraction_of_limit": 0.6},
            "transformers fp32": {"tokens_per_s": 25.0}}
    t = {x["target"].split(":")[0]: x for x in
         bench.evaluate_targets(_report(formats={"rows": rows, "ours_fp32_over_transformers": 1.2}))}
    assert t["Roofline"]["pass"] is True and t["Roofline"]["measured"].startswith("60%")
    assert t["Decode steps alone (prefill cancelled out)"]["pass"] is False
    assert t["Decode steps alone (prefill cancelled out)"]["measured"].startswith("1.200x")


def test_targets_not_measured_are_neither_pass_nor_fail():
    targets = bench.evaluate_targets(_report(attention=[], cache=None))
    by = {x["target"]: x for x in targets}
    assert by["tiled peak at least 10x under naive at T=4096"]["pass"] is None
    assert by["tiled peak at least 10x under naive at T=4096"]["measured"] == "not measured"
    assert by["Cached vs uncached greedy decoding of 128 tokens: >= 5x faster, identical tokens"]["pass"] is None


def test_different_tokens_fail_the_cache_target():
    targets = bench.evaluate_targets(_report(cache={"speedup": 50.0, "tokens_identical": False}))
    cache = [x for x in targets if x["target"].startswith("Cached")][0]
    assert cache["pass"] is False and "DIFFERENT" in cache["measured"]


def test_training_tab_target_is_the_slowest_cold_step():
    def judged(cold_max):
        tr = {"snapshots": 24, "total_bytes": 50_000_000, "payload_bytes": 90_000,
              "load_seconds": {"median": 0.01, "max": 0.02},
              "step_cold_seconds": {"median": 0.1, "max": cold_max},
              "step_warm_seconds": {"median": 0.08, "max": 0.09}}
        report = _report(training=tr)
        return next(x for x in bench.evaluate_targets(report) if x["target"].startswith("Training tab"))
    ok, slow = judged(0.25), judged(0.35)
    assert ok["pass"] is True and slow["pass"] is False
    assert slow["measured"].startswith("350 ms (median 100 ms")
    assert next(x for x in bench.evaluate_targets(_report())
                if x["target"].startswith("Training tab"))["pass"] is None


def test_live_training_target_is_the_slowest_seed_and_fails_when_one_never_formed():
    def judged(phases):
        runs = [{"seed": i, "phase_s": p} for i, p in enumerate(phases)]
        report = _report(live_training={"runs": runs})
        return next(x for x in bench.evaluate_targets(report) if x["target"].startswith("Live training"))
    ok, slow, never = judged([12.4, 13.5, 11.1, 9.8, 12.3]), judged([12.4, 95.0]), judged([12.4, None])
    assert ok["pass"] is True and ok["measured"].startswith("13.5 s (each seed: 12.4, 13.5, 11.1, 9.8, 12.3 s")
    assert slow["pass"] is False and never["pass"] is False and "1 of 2 formed" in never["measured"]
    assert next(x for x in bench.evaluate_targets(_report())
                if x["target"].startswith("Live training"))["pass"] is None
