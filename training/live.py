"""Train one live (``python -m training.live``): a small decoder grows an induction head in well under a minute.

A 2-layer ``models.Decoder`` (d_model 64, 2 heads of 32 dims a layer, 256-token vocabulary) is trained from
scratch for at most ``seconds`` of wall time on rows ``<s> + r + r + random tokens``, ``r`` a span of distinct
random token ids, the loss counted on the second copy only. Short rows first (spans of 8-32 in rows of 64 tokens);
once the copy loss falls under ``switch_loss`` (the phase change on short rows), long rows (spans of 8-120 in rows
of 240), so the head found on short rows learns to reach back as far as the probe asks.

While it trains, a record is made every ``record_every`` seconds: the step, the elapsed wall and CPU seconds, the
training loss, the loss on the repeated half of the induction probe, and every head's previous-token score and
induction scores at several spans (``lens.heads``; never one span). The phase change is the first record whose
best induction score (the best head at the span where the best head is weakest, as ``training.evaluate`` scores
the shipped model) reaches ``PHASE_SCORE``. At the end, or as soon as ``should_stop()`` says so, the decoder as
trained so far is written as a transformers checkpoint (config.json, model.safetensors, the tokenizer) with its
curves (``live_log.json``).

Library use (a job that streams): ``train_live(seconds, seed, out, on_step=callback, should_stop=callable)``.
Benchmark: ``python -m training.live --bench --seeds 0-4 --seconds 90``. Nothing here imports gradio or explorer.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from . import corpus
from .evaluate import best
from .tokenizer import save_tokenizer, train_tokenizer

PHASE_SCORE = 0.5            # the best induction score that marks the phase change
TOKENIZER_SEED = 0           # every live run shares one tokenizer, so runs of different seeds compare token by token
PROBE_SEED = 1_234           # the probe rows the records are scored on (the tests use other seeds)
MAX_SECONDS = 3600.0
LOG_FILE = "live_log.json"
SNAPSHOT_DIR = "checkpoints"


@dataclass(frozen=True)
class Rows:
    """One kind of training batch: ``batch`` rows of ``length + 1`` tokens, spans of ``span`` (inclusive)."""
    length: int
    batch: int
    span: tuple[int, int]


@dataclass
class LiveSettings:
    # model
    d_model: int = 64
    n_layers: int = 2
    # Two heads of 32 dims, not four of 16: RoPE turns most pairs of a 16-dim head too fast for a query to match
    # a key by content 100 tokens back (and transformers' Llama keeps head_dim = d_model / n_heads).
    n_heads: int = 2
    n_kv_heads: int = 2
    head_dim: int | None = None
    d_ff: int = 128
    max_seq_len: int = 256            # the context: the probe's span 120 needs 1 + 2 * 120 positions
    # tokenizer: BPE on the shipped corpus; the spans draw from all of its ids but <s>, as the probe does
    vocab_size: int = 256
    tokenizer_stories: int = 500
    # data
    short: Rows = Rows(64, 16, (8, 32))
    long: Rows = Rows(240, 4, (8, 120))
    switch_loss: float = 1.5          # copy loss (nats/token, moving average) under which the long rows start
    # optimisation
    lr: float = 3e-3
    warmup: int = 20
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    # records
    record_every: float = 1.0         # seconds of wall time between records
    record_every_steps: int = 0       # > 0: a record every this many steps instead (reproducible curves)
    probe_spans: tuple[int, ...] = (8, 16, 32, 64, 120)
    probe_rows: int = 4
    max_records: int = 1000           # beyond this, every other old record is dropped (bounded memory)

    @classmethod
    def tiny(cls) -> "LiveSettings":
        """For tests: a model and batches small enough that a step takes milliseconds."""
        return cls(d_model=16, n_heads=2, n_kv_heads=1, head_dim=None, d_ff=32, max_seq_len=64, vocab_size=128,
                   tokenizer_stories=50, short=Rows(16, 2, (2, 6)), long=Rows(32, 2, (2, 12)),
                   probe_spans=(4, 8), probe_rows=2, record_every=0.0)


@dataclass
class LiveRun:
    """What ``train_live`` returns (and writes to ``live_log.json``)."""
    out: str | None
    seed: int
    steps: int
    seconds: float                     # wall seconds of the whole run (tokenizer and writing included)
    cpu_seconds: float                 # this process's CPU seconds over the same time
    stopped: str                       # "time" or "stop" (should_stop said so)
    phase_change: dict | None          # step, seconds, cpu_seconds, best_induction of the first record >= PHASE_SCORE
    long_rows_from: int | None         # the step the long rows started at
    final: dict                        # the record of the written weights
    records: list[dict] = field(default_factory=list)
    settings: dict = field(default_factory=dict)


def check_seconds(seconds) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        raise ValueError(f"seconds must be a number, got {seconds!r}.")
    if not 0 < seconds <= MAX_SECONDS:
        raise ValueError(f"seconds must be more than 0 and at most {MAX_SECONDS:g}, got {seconds:g}: "
                         "choose a time limit in that range.")
    return float(seconds)


def check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a whole number 0 or more, got {seed!r}.")
    return seed


def build_tokenizer(s: LiveSettings):
    return train_tokenizer(corpus.stories(TOKENIZER_SEED, s.tokenizer_stories), s.vocab_size)


def build_model(s: LiveSettings, tok):
    from models import Decoder, ModelConfig

    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), d_model=s.d_model, n_layers=s.n_layers,
                      n_heads=s.n_heads, n_kv_heads=s.n_kv_heads, head_dim=s.head_dim, d_ff=s.d_ff,
                      max_seq_len=s.max_seq_len, tie_embeddings=True, attn_impl="sdpa",
                      bos_token_id=tok.token_to_id("<s>"), eos_token_id=tok.token_to_id("</s>"),
                      pad_token_id=tok.token_to_id("<pad>"))
    return Decoder(cfg)


def span_pool(vocab_size: int, bos: int) -> torch.Tensor:
    """Every id but <s>: the ids ``lens.heads.repeated_random_tokens`` draws the probe from."""
    ids = torch.arange(vocab_size)
    return ids[ids != bos]


def repeated_rows(kind: Rows, pool: torch.Tensor, bos: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``kind.batch`` rows ``<s> + r + r + random tokens`` of ``kind.length + 1`` tokens, ``len(r)`` uniform in
    ``kind.span``, no token twice in ``r``. Returns (rows, second): LongTensor (N, W) and the bool (N, W) that is
    True on the second copy, the only tokens a model can predict from earlier in the row."""
    rows = pool[torch.randint(0, len(pool), (kind.batch, kind.length + 1), generator=g)]  # (N, W)
    rows[:, 0] = bos
    second = torch.zeros(rows.shape, dtype=torch.bool)
    for row, is_copy in zip(rows, second):
        n = int(torch.randint(kind.span[0], kind.span[1] + 1, (), generator=g))
        r = pool[torch.randperm(len(pool), generator=g)[:n]]
        row[1:1 + n] = r
        row[1 + n:1 + 2 * n] = r
        is_copy[1 + n:1 + 2 * n] = True
    return rows, second


def copy_loss(model, rows: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy on the second copy only: nothing else in a row can be predicted, and the ln(V) nats of
    the rest would drown the copying signal."""
    logits = model(rows[:, :-1])                                   # (N, T, V)
    keep = second[:, 1:]
    return F.cross_entropy(logits[keep], rows[:, 1:][keep])


def lr_at(step: int, s: LiveSettings) -> float:
    """Linear warm-up, then constant: the run's length is set by the clock, not by a step count."""
    return s.lr * min(1.0, (step + 1) / s.warmup)


@torch.no_grad()
def measure(model, s: LiveSettings) -> dict:
    """The head scores and the repeated-half loss, JSON-ready. ``induction`` maps each probe span that fits the
    context (as a string) to an (L, H) list; ``previous_token`` is (L, H), from the longest span's probe."""
    from lens.heads import head_scores
    from lens.loss import repeated_half_loss

    was_training = model.training
    model.eval()
    spans = [n for n in s.probe_spans if 1 + 2 * n <= model.config.max_seq_len]
    if not spans:
        raise ValueError(f"no probe span of {s.probe_spans} fits the context of {model.config.max_seq_len}: "
                         "choose shorter probe_spans or a longer max_seq_len.")
    induction, prev = {}, None
    for n in spans:
        scores = head_scores(model, span_len=n, batch=s.probe_rows, seed=PROBE_SEED)
        induction[str(n)] = scores["induction"].tolist()
        prev = scores["previous_token"].tolist()
    out = {"induction": induction, "previous_token": prev,
           "best_induction": min(best(m)[0] for m in induction.values()),
           "best_previous_token": best(prev)[0],
           "repeated_half_span": spans[-1],
           "repeated_half_loss": repeated_half_loss(model, spans[-1], s.probe_rows, PROBE_SEED)}
    model.train(was_training)
    return out


def thin(records: list[dict], limit: int) -> list[dict]:
    """Every other record but the first and the last, once there are more than ``limit``: a long run keeps a
    curve of the whole run in bounded memory."""
    if len(records) <= limit:
        return records
    return records[:1] + records[1:-1][1::2] + records[-1:]


def write_checkpoint(model, tok, folder: str, s: LiveSettings) -> None:
    from models import save_pretrained

    save_pretrained(model, folder)
    save_tokenizer(tok, folder, s.max_seq_len)


def train_live(seconds: float, seed: int, out: str | None, *, settings: LiveSettings | None = None,
               on_step: Callable[[dict], None] | None = None, should_stop: Callable[[], bool] | None = None,
               snapshot_steps: Iterable[int] = (), snapshot_phase: bool = False,
               log: Callable[[str], None] | None = None) -> LiveRun:
    """Train for at most ``seconds`` of wall time (tokenizer and measurements included), then write ``out``.

    on_step(record): called with each record (every ``settings.record_every`` seconds, the first at step 0, the
      last for the written weights); a record holds ``step``, ``seconds``, ``cpu_seconds``, ``loss`` (training copy
      loss, moving average, nats/token; None at step 0), ``lr``, ``row_len`` and ``measure``'s keys; the record of
      the phase change also has ``"phase_change": True``.
    should_stop(): asked before every step; True ends the run there and the steps so far are written.
    snapshot_steps: steps at which the decoder is also written to ``out/checkpoints/step-NNNNN``.
    snapshot_phase: also write it there at the phase change's step (not known in advance).
    out: None trains and measures without writing anything.
    Uses torch's thread count as the caller set it.
    """
    seconds = check_seconds(seconds)
    seed = check_seed(seed)
    s = settings or LiveSettings()
    log = log or (lambda line: None)
    snapshot_steps = set(snapshot_steps)
    t0, c0 = time.time(), time.process_time()

    tok = build_tokenizer(s)
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    model = build_model(s, tok)
    bos = model.config.bos_token_id
    pool = span_pool(model.config.vocab_size, bos)
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, betas=(0.9, 0.98), weight_decay=s.weight_decay)
    log(f"model: {model.num_parameters():,} parameters, d_model {s.d_model}, {s.n_layers} layers, "
        f"{s.n_heads} query / {s.n_kv_heads} KV heads, vocab {model.config.vocab_size}")

    records: list[dict] = []
    phase: dict | None = None
    loss_ema: float | None = None
    kind, long_from = s.short, None

    def record(step: int, lr: float) -> dict:
        nonlocal phase, records
        rec = {"step": step, "seconds": round(time.time() - t0, 3),
               "cpu_seconds": round(time.process_time() - c0, 3), "loss": loss_ema, "lr": lr,
               "row_len": kind.length, **measure(model, s)}
        if phase is None and rec["best_induction"] >= PHASE_SCORE:
            rec["phase_change"] = True
            phase = {k: rec[k] for k in ("step", "seconds", "cpu_seconds", "best_induction")}
            if snapshot_phase and out is not None:
                write_checkpoint(model, tok, os.path.join(out, SNAPSHOT_DIR, f"step-{step:05d}"), s)
        records = thin(records + [rec], s.max_records)
        if on_step is not None:
            on_step(rec)
        loss = "   -  " if loss_ema is None else f"{loss_ema:6.3f}"
        log(f"step {step:5d} {rec['seconds']:6.1f} s  loss {loss}  repeated half {rec['repeated_half_loss']:.3f}  "
            f"previous-token {rec['best_previous_token']:.2f}  induction {rec['best_induction']:.2f}"
            + ("  <- phase change" if rec.get("phase_change") else ""))
        return rec

    def snapshot(step: int) -> None:
        if out is not None and step in snapshot_steps:
            write_checkpoint(model, tok, os.path.join(out, SNAPSHOT_DIR, f"step-{step:05d}"), s)

    model.train()
    step, stopped, lr = 0, "time", 0.0
    last = record(0, 0.0)
    snapshot(0)
    next_record = time.time() + s.record_every
    while True:
        if should_stop is not None and should_stop():
            stopped = "stop"
            break
        if time.time() - t0 >= seconds:
            break
        if long_from is None and loss_ema is not None and loss_ema < s.switch_loss:
            kind, long_from = s.long, step
            log(f"step {step}: copy loss {loss_ema:.2f} < {s.switch_loss}: rows of {kind.length} from now on")
        lr = lr_at(step, s)
        for group in opt.param_groups:
            group["lr"] = lr
        loss = copy_loss(model, *repeated_rows(kind, pool, bos, g))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        opt.step()
        step += 1
        loss_ema = loss.item() if loss_ema is None else 0.9 * loss_ema + 0.1 * loss.item()
        snapshot(step)
        due = step % s.record_every_steps == 0 if s.record_every_steps > 0 else time.time() >= next_record
        if due:
            last = record(step, lr)
            next_record = time.time() + s.record_every
    if last["step"] != step:
        last = record(step, lr)
    model.eval()
    if out is not None:
        write_checkpoint(model, tok, out, s)
    run = LiveRun(out=out, seed=seed, steps=step, seconds=round(time.time() - t0, 3),
                  cpu_seconds=round(time.process_time() - c0, 3), stopped=stopped, phase_change=phase,
                  long_rows_from=long_from, final=last, records=records, settings=asdict(s))
    if out is not None:
        from lens.machine import machine_info

        with open(os.path.join(out, LOG_FILE), "w") as fh:
            json.dump({**asdict(run), "machine": machine_info()}, fh, indent=1)
    return run


# --- the command line and the benchmark ------------------------------------------------------------------------

def parse_seeds(text: str) -> list[int]:
    """``"0-4"`` -> [0, 1, 2, 3, 4]; ``"0,3,7"`` -> [0, 3, 7]."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            lo, dash, hi = part.strip().partition("-")
            seeds.extend(range(int(lo), int(hi) + 1) if dash else [int(lo)])
    except ValueError:
        raise ValueError(f"--seeds {text!r}: write seeds as a range like 0-4 or a list like 0,3,7.") from None
    if not seeds or min(seeds) < 0:
        raise ValueError(f"--seeds {text!r}: give at least one seed, each 0 or more.")
    return seeds


def parse_steps(text: str) -> list[int]:
    """``"0,100,250"`` -> [0, 100, 250]; ``""`` -> []."""
    try:
        steps = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--snapshot-steps {text!r}: write steps as a list like 0,100,250.") from None
    if any(n < 0 for n in steps):
        raise ValueError(f"--snapshot-steps {text!r}: steps are 0 or more.")
    return steps


def bench(seeds: list[int], seconds: float, settings: LiveSettings | None = None,
          log: Callable[[str], None] = lambda line: print(line, flush=True), after_phase_s: float | None = None) -> dict:
    """Train one live per seed (nothing written) and report, for each, the seconds until the best induction score
    first reached ``PHASE_SCORE``, the final losses and scores and the curves (about 40 points), with the machine
    and its load. With ``after_phase_s`` a run ends that long after its phase change (the benchmark's shortcut)."""
    from lens.machine import machine_info

    runs = []
    for seed in seeds:
        load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        seen: dict[str, float] = {}

        def on_step(rec: dict) -> None:
            if rec.get("phase_change"):
                seen.setdefault("phase", time.monotonic())

        def should_stop() -> bool:
            return after_phase_s is not None and "phase" in seen and time.monotonic() - seen["phase"] > after_phase_s

        run = train_live(seconds, seed, None, settings=settings, on_step=on_step, should_stop=should_stop)
        load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        f, p = run.final, run.phase_change
        row = {"seed": seed, "steps": run.steps, "steps_per_s": round(run.steps / run.seconds, 2),
               "cpu_ms_per_step": round(1e3 * run.cpu_seconds / max(1, run.steps), 1),
               "phase_step": p and p["step"], "phase_s": p and p["seconds"], "phase_cpu_s": p and p["cpu_seconds"],
               "long_rows_from": run.long_rows_from, "final_loss": f["loss"],
               "final_repeated_half_loss": f["repeated_half_loss"], "final_best_induction": f["best_induction"],
               "final_best_previous_token": f["best_previous_token"], "wall_s": run.seconds,
               "cpu_s": run.cpu_seconds, "load_before": load_before, "load_after": load_after,
               "curve": [{k: r.get(k) for k in ("step", "seconds", "loss", "repeated_half_loss", "best_induction")}
                         for r in run.records[::max(1, len(run.records) // 40)]]}
        runs.append(row)
        log(bench_line(row))
    return {"seconds": seconds, "phase_score": PHASE_SCORE, "machine": machine_info(), "runs": runs}


def bench_line(r: dict) -> str:
    phase = ("never" if r["phase_s"] is None else
             f"step {r['phase_step']} at {r['phase_s']:.1f} s wall / {r['phase_cpu_s']:.1f} s CPU")
    return (f"seed {r['seed']}: {r['steps']} steps ({r['steps_per_s']:.1f}/s, {r['cpu_ms_per_step']:.1f} ms CPU each), "
            f"induction >= {PHASE_SCORE}: {phase}; final loss {r['final_loss']:.3f}, repeated half "
            f"{r['final_repeated_half_loss']:.3f}, induction {r['final_best_induction']:.2f}, previous-token "
            f"{r['final_best_previous_token']:.2f}; {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU, "
            f"load {r['load_before']:.1f} -> {r['load_after']:.1f}")


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(prog="python -m training.live", description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=90.0, help="wall-time limit of each run (default 90)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="the folder to write the checkpoint and live_log.json to")
    # One thread: a model this small gains nothing from a second one, and on shared cores two threads wait on
    # each other (see bench/notes/live-training.md).
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--snapshot-steps", default="", metavar="N,N,...",
                    help="also write the decoder at these steps, under OUT/checkpoints/step-NNNNN")
    ap.add_argument("--bench", action="store_true", help="train one per seed of --seeds and report the phase change")
    ap.add_argument("--seeds", default="0-4", help="with --bench: a range like 0-4 or a list like 0,3,7")
    ap.add_argument("--json", default=None, metavar="FILE", help="with --bench: write the report as JSON here")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    args = ap.parse_args(argv)
    try:
        seconds = check_seconds(args.seconds)
        if args.threads < 1:
            raise ValueError(f"--threads must be 1 or more, got {args.threads}.")
        if args.bench:
            seeds = parse_seeds(args.seeds)
        else:
            check_seed(args.seed)
            if args.out is None:
                raise ValueError("--out is needed: name the folder to write the checkpoint to.")
            snapshots = parse_steps(args.snapshot_steps)
    except ValueError as exc:
        ap.error(str(exc))
    torch.set_num_threads(args.threads)
    if args.bench:
        report = bench(seeds, seconds)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(report, fh, indent=1)
        return report
    log = (lambda line: None) if args.quiet else (lambda line: print(line, flush=True))
    run = train_live(seconds, args.seed, args.out, snapshot_steps=snapshots, log=log)
    p = run.phase_change
    print(f"wrote {args.out}: {run.steps} steps in {run.seconds:.1f} s ({run.cpu_seconds:.1f} s CPU); induction >= "
          f"{PHASE_SCORE} " + (f"at step {p['step']}, {p['seconds']:.1f} s" if p else "not reached") +
          f"; final best induction {run.final['best_induction']:.2f}", flush=True)
    return run


if __name__ == "__main__":
    main()
