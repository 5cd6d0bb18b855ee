"""Train the shipped default decoder (``python -m training``).

What it does, in order, all from one seed:
1. writes simple English stories with :mod:`training.corpus` (training stories from ``seed``,
   held-out stories from a different seed, so no held-out story is ever trained on);
2. trains the word-level BPE tokenizer (:mod:`training.tokenizer`) on the training stories;
3. trains a Llama-style :class:`models.decoder.Decoder` with AdamW and a cosine learning-rate
   schedule with linear warmup. Each step has a batch of story rows and a batch of "repeated span"
   rows (:func:`training.data.repeated_span_rows`): spans of 4 to 124 random token ids, each written
   twice with a gap of 0 to 64 tokens between the copies, over story text or over random tokens.
   The loss is the mean of the two batches' losses. Copying pays in the loss only when the model
   finds the earlier copy, whatever its distance, which is what grows induction heads that work at
   every span. The random tokens come from a small random part of the vocabulary at first and from
   the whole vocabulary later (copying from a large vocabulary from scratch sits on a long plateau);
4. every ``eval_every`` steps measures the held-out story loss and the head scores at spans 8, 16,
   32, 64 and 120 (:mod:`training.evaluate`) and keeps the best checkpoint
   (:func:`training.evaluate.checkpoint_key`);
5. writes the folder: ``config.json`` + ``model.safetensors`` (transformers' Llama format), the
   tokenizer files, ``training_log.json`` (every evaluation) and the model card ``README.md``.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from . import corpus
from .card import write_model_card
from .data import (pool_size, random_background, repeated_span_rows, story_rows, token_pool,
                   unigram_entropy)
from .evaluate import best, evaluate, spans_that_fit, worst_span_induction
from .snapshots import SNAPSHOT_DIR, Checkpoints, kept_snapshots, save_snapshot
from .tokenizer import save_tokenizer, train_tokenizer

DEFAULT_OUT = os.path.join("assets", "default-model")
HELD_OUT_SEED_OFFSET = 1_000_003  # held-out stories come from seed + this
PROBE_SEED_OFFSET = 7             # head scores during training use seed + this (the tests use others)


@dataclass
class TrainSettings:
    seed: int = 0
    # model
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    d_ff: int = 384
    seq_len: int = 256
    # data
    tokenizer_stories: int = 20_000
    vocab_size: int = 4096            # an upper bound: BPE stops once every word is one token
    # Each step also trains on `span_batch` rows of seq_len + 1 tokens in which random spans recur.
    span_batch: int = 16
    span: tuple[int, int] = (4, 124)
    max_gap: int = 16                 # tokens between the two copies of a span
    max_lead: int = 4                 # tokens before each pair of copies
    story_background: float = 0.25    # share of span rows whose copies sit inside story text
    # Until this share of training each span row is cut into `short_rows` rows with spans of
    # `short_span` (see span_batch).
    short_until: float = 0.45
    short_rows: int = 4
    short_span: tuple[int, int] = (4, 28)
    # From this share of training on (induction works at every span by then), each step has
    # `late_span_batch` repeated-span rows and `late_batch` story rows instead: the same tokens per
    # step, more of them stories. The loss weighs the two batches by their rows.
    late_from: float = 0.55
    late_batch: int = 24
    late_span_batch: int = 8
    pool_start: int = 256
    # "shuffled": the pool's order is a seeded random permutation, so the first pool holds common and rare tokens
    # alike and one previous-token head grows for every token; "frequency": the most frequent story tokens first,
    # which splits that job between heads by frequency (bench/notes/training.md compares the two).
    pool_order: str = "shuffled"
    pool_grow: tuple[float, float] = (0.2, 0.5)
    held_out_rows: int = 64
    # optimisation
    steps: int = 1800
    batch: int = 16
    lr: float = 3e-3
    min_lr: float = 1e-4
    warmup: int = 50
    weight_decay: float = 0.1
    # Weight decay on the query and key projections, kept as a setting because it caps how large q·k can grow, so
    # how sharp a positional head can get (bench/notes/training.md has what it measured).
    qk_weight_decay: float = 0.1
    grad_clip: float = 1.0
    # evaluation
    eval_every: int = 50
    max_minutes: float = 28.0         # hard stop: the build must fit in 30 minutes
    # Snapshots: the decoder saved as it is (fp16, a transformers folder under checkpoints/step-NNNNN/) and
    # measured from those saved weights. Every `snapshot_every` steps a snapshot is saved; after training
    # those in `snapshot_steps` are kept, and every one across the measured phase change (where the best
    # induction or previous-token score at span 32 goes from under 0.2 to 0.8 or more, one more on each
    # side), widened until `snapshot_min` are kept: dense where the scores change fastest, wherever that
    # turns out to be in this run. Saving reads no random numbers, so the run is the same without it.
    snapshot_steps: tuple[int, ...] = (0, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400,
                                       1600, 1800)
    snapshot_every: int = 25          # 0: the steps of snapshot_steps only
    snapshot_min: int = 24

    @classmethod
    def quick(cls) -> "TrainSettings":
        return cls(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, seq_len=64,
                   tokenizer_stories=300, held_out_rows=8, span_batch=8, span=(4, 20),
                   short_span=(2, 6),
                   max_gap=8, max_lead=4, pool_start=64, steps=40, batch=8, late_batch=12,
                   late_span_batch=4, lr=3e-3, warmup=5,
                   eval_every=20, max_minutes=2.0, snapshot_steps=(0, 20, 40), snapshot_every=10,
                   snapshot_min=5)


def lr_at(step: int, s: TrainSettings) -> float:
    """Linear warmup to ``lr`` over ``warmup`` steps, then cosine down to ``min_lr`` at ``steps``."""
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    frac = min(1.0, (step - s.warmup) / max(1, s.steps - s.warmup))
    return s.min_lr + 0.5 * (s.lr - s.min_lr) * (1 + math.cos(math.pi * frac))


def make_optimizer(model, s) -> torch.optim.Optimizer:
    # Weight decay on the matrices only; norms' gains (1-D) stay undecayed. Query and key
    # projections get ``qk_weight_decay`` where the settings have one.
    qk_decay = getattr(s, "qk_weight_decay", s.weight_decay)
    groups = {"decay": [], "qk": [], "keep": []}
    for name, p in model.named_parameters():
        if p.dim() < 2:
            groups["keep"].append(p)
        elif name.endswith(("q_proj.weight", "k_proj.weight")):
            groups["qk"].append(p)
        else:
            groups["decay"].append(p)
    return torch.optim.AdamW([{"params": groups["decay"], "weight_decay": s.weight_decay},
                              {"params": groups["qk"], "weight_decay": qk_decay},
                              {"params": groups["keep"], "weight_decay": 0.0}],
                             lr=s.lr, betas=(0.9, 0.95), eps=1e-8)


def rows_at(step: int, s: TrainSettings) -> tuple[int, int]:
    """(story rows, repeated-span rows) of the batch at ``step``."""
    if step >= s.late_from * s.steps:
        return s.late_batch, s.late_span_batch
    return s.batch, s.span_batch


def n_story_background(span_rows: int, s: TrainSettings) -> int:
    return round(s.story_background * span_rows)


def story_slices(step: int, s: TrainSettings, n_rows: int) -> tuple[slice, slice]:
    """Which of the ``n_rows`` training rows ``step`` trains on as stories, and which lie under its
    repeated spans: stories are read from the front, backgrounds from the back, never a row twice
    when ``n_rows == sum(story_rows_needed(s))``."""
    story = background = 0
    for k in range(step):
        n, m = rows_at(k, s)
        story += n
        background += n_story_background(m, s)
    n, m = rows_at(step, s)
    end = n_rows - background
    return slice(story, story + n), slice(end - n_story_background(m, s), end)


def story_rows_needed(s: TrainSettings) -> tuple[int, int]:
    """(rows trained on as stories, rows under repeated spans) over the whole run; the story rows
    come first in the training rows, the backgrounds after them, so no row is read twice."""
    story = background = 0
    for step in range(s.steps):
        n, m = rows_at(step, s)
        story += n
        background += n_story_background(m, s)
    return story, background


def progress_line(step: int, total: int, loss: float, span_loss: float, lr: float,
                  elapsed: float) -> str:
    done = (step + 1) / total
    bar = "#" * int(30 * done) + "-" * (30 - int(30 * done))
    eta = elapsed / done - elapsed
    return (f"[{bar}] step {step + 1}/{total} story loss {loss:.3f} repeated-span loss "
            f"{span_loss:.3f} lr {lr:.2e} {elapsed / 60:.1f} min (eta {eta / 60:.1f} min)")


def show_progress(step: int, total: int, line: str) -> None:
    """Redrawn in place on a terminal; every 50 steps (and the last) into a log file."""
    if sys.stdout.isatty():
        print("\r" + line, end="", flush=True)
    elif (step + 1) % 50 == 0 or step + 1 == total:
        print(line, flush=True)


@dataclass
class Data:
    tokenizer: object
    vocab_size: int
    train_rows: torch.Tensor     # (story + background rows, seq_len + 1), see story_rows_needed
    held_rows: torch.Tensor      # (held_out_rows, seq_len + 1) stories from another seed
    pool: torch.Tensor           # token ids in the order the span pool grows through (pool_order)


def prepare_data(s: TrainSettings, g: torch.Generator, log) -> Data:
    log(f"tokenizer: BPE on {s.tokenizer_stories} stories (seed {s.seed})")
    tok = train_tokenizer(corpus.stories(s.seed, s.tokenizer_stories), s.vocab_size)
    V = tok.get_vocab_size()
    log(f"tokenizer: {V} tokens")
    # Training stories continue the tokenizer's seed stream; held-out ones use another seed.
    n_story, n_background = story_rows_needed(s)
    train_rows = story_rows(tok, s.seed, n_story + n_background, s.seq_len)
    held_rows = story_rows(tok, s.seed + HELD_OUT_SEED_OFFSET, s.held_out_rows, s.seq_len)
    pool = token_pool(train_rows, V, len(corpus.SPECIAL_TOKENS), g)
    if s.pool_order == "shuffled":
        pool = pool[torch.randperm(len(pool), generator=g)]
    elif s.pool_order != "frequency":
        raise ValueError(f"pool_order must be 'frequency' or 'shuffled', not {s.pool_order!r}.")
    n_span = sum(rows_at(step, s)[1] for step in range(s.steps))
    log(f"data: {n_story} story rows (and {n_background} more under repeated spans) and {n_span} "
        f"repeated-span rows of {s.seq_len + 1} tokens; held out: {len(held_rows)} story rows")
    return Data(tok, V, train_rows, held_rows, pool)


def build_model(s: TrainSettings, tok, vocab_size: int):
    from models import Decoder, ModelConfig

    cfg = ModelConfig(vocab_size=vocab_size, d_model=s.d_model, n_layers=s.n_layers,
                      n_heads=s.n_heads, n_kv_heads=s.n_kv_heads, d_ff=s.d_ff,
                      max_seq_len=s.seq_len, rope_theta=10000.0, norm_eps=1e-5,
                      tie_embeddings=True, attn_impl="sdpa", bos_token_id=tok.token_to_id("<s>"),
                      eos_token_id=tok.token_to_id("</s>"), pad_token_id=tok.token_to_id("<pad>"))
    return Decoder(cfg)


def span_batch(step: int, s: TrainSettings, data: Data,
               g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """This step's repeated-span rows and the mask of their second copies.

    The first part of the rows lies over story text (read from the end of the training rows, so
    not the rows this step trains on), the rest over random tokens from the whole vocabulary (so
    that while the span pool is small the filler rarely holds a span's tokens). Until
    ``short_until`` of training the same tokens come as rows of ``seq_len // short_rows`` with
    spans of ``short_span``: at initialisation attention spreads over the whole row, so the one key
    an induction head needs carries 1/T of it, and on short rows the circuit forms much sooner.
    """
    n_pool = pool_size(step, s.steps, s.pool_start, s.pool_grow, len(data.pool))
    n_rows = rows_at(step, s)[1]
    n_story = n_story_background(n_rows, s)
    stories = data.train_rows[story_slices(step, s, len(data.train_rows))[1]]
    noise = random_background(n_rows - n_story, s.seq_len + 1, data.pool, len(data.pool), g)
    background = torch.cat([stories, noise])                       # (span rows, seq_len + 1)
    span, max_gap, max_lead = s.span, s.max_gap, s.max_lead
    if step < s.short_until * s.steps:
        width = s.seq_len // s.short_rows
        background = background[:, :width * s.short_rows].reshape(-1, width)  # (N, W*k) -> (N*k, W)
        span, max_gap, max_lead = s.short_span, min(max_gap, 4), min(max_lead, 2)
    bos = data.tokenizer.token_to_id("<s>")
    return repeated_span_rows(background, data.pool, n_pool, bos, span, max_gap, max_lead, g)


def next_token_loss(model, rows: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy of rows[:, 1:] given the tokens before; only where ``targets`` (a bool
    (B, T + 1) over the rows) is True, when given."""
    logits = model(rows[:, :-1])                                   # (B, T, V)
    if targets is None:
        return F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten())
    keep = targets[:, 1:]
    return F.cross_entropy(logits[keep], rows[:, 1:][keep])


def train_step(model, opt, stories: torch.Tensor, spans: tuple[torch.Tensor, torch.Tensor],
               s: TrainSettings, lr: float, story_weight: float = 0.5) -> tuple[float, float]:
    """One optimiser step on ``story_weight`` × story loss + the rest × repeated-span loss."""
    for group in opt.param_groups:
        group["lr"] = lr
    loss_story = next_token_loss(model, stories)
    # The repeated-span loss counts the second copies only: the random first copies and background
    # cannot be predicted, and their ln(V) nats would drown the copying signal (bench/notes/training.md).
    loss_span = next_token_loss(model, *spans)
    opt.zero_grad(set_to_none=True)
    (story_weight * loss_story + (1 - story_weight) * loss_span).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
    opt.step()
    return loss_story.item(), loss_span.item()


class Ema:
    """Exponential moving average of a training loss (a readable curve from noisy steps)."""

    def __init__(self, decay: float = 0.95):
        self.decay, self.value = decay, None

    def update(self, x: float) -> float:
        self.value = x if self.value is None else self.decay * self.value + (1 - self.decay) * x
        return self.value


def describe(entry: dict, baseline: float) -> str:
    p, pl, ph = best(entry["previous_token"])
    spans = " ".join(f"{k}:{best(m)[0]:.2f}" for k, m in entry["induction"].items())
    return (f"  eval step {entry['step']}: held-out {entry['held_out_loss']:.3f} (unigram "
            f"{baseline:.3f}) prev-token {p:.2f} (L{pl}H{ph}) induction by span {spans}")


def run_loop(model, data: Data, s: TrainSettings, g: torch.Generator, t_start: float, log,
             out: str | None = None):
    """The optimisation itself. Returns (Checkpoints, steps run, stopped early, minutes); with
    ``out``, ``ckpt.snapshots`` lists the snapshots written under it (``s.snapshot_steps``)."""
    opt = make_optimizer(model, s)
    spans = spans_that_fit(s.seq_len)
    seed = s.seed + PROBE_SEED_OFFSET
    baseline = unigram_entropy(data.held_rows[:, 1:], data.vocab_size)
    ckpt = Checkpoints()
    t_train = time.time()

    def log_eval(step: int, story_loss, span_loss) -> None:
        entry = {"step": step, "minutes": (time.time() - t_train) / 60, "train_loss": story_loss,
                 "repeated_span_loss": span_loss,
                 "pool": pool_size(step, s.steps, s.pool_start, s.pool_grow, len(data.pool)),
                 **evaluate(model, data.held_rows, spans, seed)}
        ckpt.consider(entry, model)
        if sys.stdout.isatty():
            print("", flush=True)
        log(describe(entry, baseline))

    wanted = set(s.snapshot_steps) if out is not None else set()
    if out is not None and s.snapshot_every > 0:
        wanted |= set(range(0, s.steps + 1, s.snapshot_every))

    def snapshot(step: int) -> None:
        if step in wanted:
            entry = save_snapshot(model, step, out, data.held_rows, spans, seed)
            ckpt.snapshots.append(entry)
            model.train()
            log(f"  snapshot step {step}: {entry['folder']} ({entry['bytes'] / 1e6:.2f} MB)")

    log_eval(0, None, None)        # the untrained model: held-out loss near ln(V)
    snapshot(0)
    model.train()
    story_ema, span_ema = Ema(), Ema()
    step, stopped_early = 0, False
    for step in range(s.steps):
        lr = lr_at(step, s)
        n_rows, n_span = rows_at(step, s)
        stories = data.train_rows[story_slices(step, s, len(data.train_rows))[0]]
        ls, lc = train_step(model, opt, stories, span_batch(step, s, data, g), s, lr,
                            story_weight=n_rows / (n_rows + n_span))
        story_ema.update(ls)
        span_ema.update(lc)
        show_progress(step, s.steps, progress_line(step, s.steps, story_ema.value, span_ema.value,
                                                   lr, time.time() - t_train))
        over_time = (time.time() - t_start) / 60 > s.max_minutes
        if (step + 1) % s.eval_every == 0 or step == s.steps - 1 or over_time:
            log_eval(step + 1, story_ema.value, span_ema.value)
        snapshot(step + 1)
        if over_time:
            stopped_early = True
            log(f"stopping at step {step + 1}: over the {s.max_minutes} minute limit")
            break
    return ckpt, step + 1, stopped_early, (time.time() - t_train) / 60


SAMPLE_PROMPTS = (
    "Once upon a time, there was a",
    "Lily had a small red ball. She",
    "Mom asked Tom to buy milk, eggs and bread. Tom went to the shop. He bought",
    "Sam wrote a secret list of words: cat hat lamp tiger gold. Later, Mia read the list out loud:",
)


def greedy_samples(model, tok, max_new: int = 40) -> list[dict]:
    """Greedy continuations of ``SAMPLE_PROMPTS``, cut at ``</s>``."""
    from models import generate

    eos = tok.token_to_id("</s>")
    out = []
    for prompt in SAMPLE_PROMPTS:
        ids = tok.encode(prompt).ids
        new = generate(model, torch.tensor([ids]), max_new, use_cache=False)[0, len(ids):].tolist()
        if eos in new:
            new = new[:new.index(eos)]
        out.append({"prompt": prompt, "continuation": tok.decode(new)})
    return out


def train(s: TrainSettings, out: str, log=print) -> dict:
    """Build the tokenizer, train the model, write the folder ``out``. Returns the summary dict."""
    from lens.machine import machine_info
    from models import save_pretrained

    t_start = time.time()
    torch.manual_seed(s.seed)
    g = torch.Generator().manual_seed(s.seed)
    data = prepare_data(s, g, log)
    model = build_model(s, data.tokenizer, data.vocab_size)
    n_params = model.num_parameters()
    log(f"model: {n_params:,} parameters, d_model {s.d_model}, {s.n_layers} layers, "
        f"{s.n_heads} query / {s.n_kv_heads} KV heads, d_ff {s.d_ff}, vocab {data.vocab_size}")
    shutil.rmtree(os.path.join(out, SNAPSHOT_DIR), ignore_errors=True)  # no snapshot of another run
    ckpt, steps_run, stopped_early, train_minutes = run_loop(model, data, s, g, t_start, log, out)
    kept = kept_snapshots(ckpt.snapshots, s)
    for entry in ckpt.snapshots:
        if entry not in kept:
            shutil.rmtree(os.path.join(out, entry["folder"]))
    ckpt.snapshots = kept
    log(f"kept {len(kept)} snapshots: steps {', '.join(str(e['step']) for e in kept)} "
        f"({sum(e['bytes'] for e in kept) / 1e6:.1f} MB)")

    model.load_state_dict(ckpt.best_state)
    model.eval()
    picked = ckpt.best_entry
    log(f"picked step {picked['step']}: held-out {picked['held_out_loss']:.3f}, weakest-span "
        f"induction {worst_span_induction(picked):.2f}")
    os.makedirs(out, exist_ok=True)
    save_pretrained(model, out)
    save_tokenizer(data.tokenizer, out, s.seq_len)
    summary = {
        "settings": asdict(s),
        "vocab_size": data.vocab_size,
        "n_params": n_params,
        "steps_run": steps_run,
        "story_tokens": sum(rows_at(k, s)[0] for k in range(steps_run)) * s.seq_len,
        "stopped_early": stopped_early,
        "train_minutes": train_minutes,
        "total_minutes": (time.time() - t_start) / 60,
        "unigram_baseline": unigram_entropy(data.held_rows[:, 1:], data.vocab_size),
        "probe_seed": s.seed + PROBE_SEED_OFFSET,
        "held_out_seed": s.seed + HELD_OUT_SEED_OFFSET,
        "picked": picked,
        "history": ckpt.history,
        "snapshots": ckpt.snapshots,
        "machine": machine_info(),
        "samples": greedy_samples(model, data.tokenizer),
    }
    with open(os.path.join(out, "training_log.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    write_model_card(summary, out, model.config)
    log(f"wrote {out} ({(time.time() - t_start) / 60:.1f} min in all)")
    return summary
