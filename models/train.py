"""Train the shipped default model: ``python -m models.train`` (about 15-20 minutes on 2 CPU cores).

What it does, in order, all from one seed:
1. writes simple English stories with :mod:`models.corpus` (training stories from ``seed``, held-out
   stories from a different seed, so no held-out story is ever trained on);
2. trains a small byte-pair-encoding tokenizer on the training stories (the ``tokenizers`` library;
   Metaspace + punctuation pre-tokenizer, so nearly every corpus word is one token);
3. trains a Llama-style :class:`models.decoder.Decoder` (RoPE, RMSNorm, SwiGLU, grouped-query
   attention) with AdamW and a cosine learning-rate schedule with linear warmup. Each step has a
   batch of story rows and a batch of short "repeated random token" rows (``<s>`` then random token
   spans, each given twice); the loss is the mean of the two. The random rows make copying pay in
   the loss, which is what grows induction heads. Their tokens come from the most frequent story
   tokens at first and from the whole vocabulary later (copying a large vocabulary from scratch sits
   on a long plateau; on a small pool the circuit forms, and growing the pool makes it general);
4. every ``eval_every`` steps measures the held-out loss (stories only) and the head scores
   (previous-token, first-token, induction on ``<s> + r + r``), and keeps the best checkpoint:
   among evaluations that have a previous-token head >= 0.5 and an induction head >= 0.3, the one
   with the lowest held-out loss (else the lowest held-out loss);
5. writes the folder: ``config.json`` + ``model.safetensors`` (transformers' Llama format),
   ``tokenizer.json`` + ``tokenizer_config.json`` + ``special_tokens_map.json``,
   ``training_log.json`` (every evaluation) and the model card ``README.md``.

``python -m models.train --quick --out DIR`` runs the same code on a tiny model and a small slice
for a few steps (well under a minute); it exists so the loop can be tested.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import string
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from . import corpus
from .heads import first_token_score, induction_score, previous_token_score, repeated_random_tokens

DEFAULT_OUT = os.path.join("assets", "default-model")
HELD_OUT_SEED_OFFSET = 1_000_003  # held-out stories come from seed + this


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
    # Each step also trains on a second batch of short "repeated random token" rows.
    random_batch: int = 64
    random_len: int = 64
    random_span: tuple[int, int] = (16, 32)
    # Random tokens come from a pool that grows from the `pool_start` most frequent tokens to the
    # whole vocabulary between these fractions of training (copying forms on a small pool first).
    pool_start: int = 256
    pool_grow: tuple[float, float] = (0.3, 0.7)
    held_out_rows: int = 64
    # optimisation
    steps: int = 1200
    batch: int = 16
    lr: float = 3e-3
    min_lr: float = 1e-4
    warmup: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    # evaluation
    eval_every: int = 50
    probe_span: int = 32
    probe_batch: int = 8
    max_minutes: float = 28.0         # hard stop: the build must fit in 30 minutes

    @classmethod
    def quick(cls) -> "TrainSettings":
        return cls(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, seq_len=64,
                   tokenizer_stories=300, held_out_rows=8, random_batch=8, random_len=32,
                   random_span=(4, 12), pool_start=64, steps=40, batch=8,
                   lr=3e-3, warmup=5,
                   eval_every=20, probe_span=8, probe_batch=4, max_minutes=2.0)


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------
def train_tokenizer(texts, vocab_size: int):
    """A BPE tokenizer whose tokens are (nearly always) whole words.

    Metaspace turns spaces into "▁" and splits on them, Punctuation splits ".", "," and ":" off
    words, so BPE merges never cross a word boundary; once every corpus word is a single token no
    pair is left to merge and training stops below ``vocab_size``. The initial alphabet holds every
    printable ASCII character, so any English text the user types still tokenizes (into pieces).
    ``<s>`` is added in front of every encoded text, as Llama does.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True),
        pre_tokenizers.Punctuation(behavior="isolated"),
    ])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    alphabet = [c for c in string.printable if not c.isspace()] + ["▁"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                  special_tokens=list(corpus.SPECIAL_TOKENS),
                                  initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    return tok


def save_tokenizer(tok, folder: str, model_max_length: int) -> None:
    """tokenizer.json plus the two small files AutoTokenizer reads (offline)."""
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
    }
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as fh:
        json.dump(config, fh, indent=2)
    with open(os.path.join(folder, "special_tokens_map.json"), "w") as fh:
        json.dump(special, fh, indent=2)


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------
def story_rows(tok, seed: int, n_rows: int, seq_len: int) -> torch.Tensor:
    """``n_rows`` rows of ``seq_len + 1`` tokens, each starting at a story's ``<s>``.

    Stories (``<s> story </s>``) are appended until the row is full; the story that overflows is
    cut (its rest is dropped, the next row starts a fresh story). Returns LongTensor (n_rows, seq_len + 1).
    """
    eos = tok.token_to_id("</s>")
    gen = corpus.stories(seed)
    rows = []
    while len(rows) < n_rows:
        batch = [next(gen) for _ in range(256)]
        encoded = [e.ids + [eos] for e in tok.encode_batch(batch)]
        i = 0
        while i < len(encoded) and len(rows) < n_rows:
            row: list[int] = []
            while len(row) < seq_len + 1 and i < len(encoded):
                row.extend(encoded[i])
                i += 1
            if len(row) >= seq_len + 1:
                rows.append(row[: seq_len + 1])
    return torch.tensor(rows, dtype=torch.long)


def random_rows(n_rows: int, seq_len: int, vocab_size: int, bos_id: int, n_special: int,
                span: tuple[int, int], g: torch.Generator) -> torch.Tensor:
    """Rows of ``<s>`` then random token spans, each span given twice in a row (``r r q q ...``).

    Tokens are drawn from every non-special id (``n_special .. vocab_size - 1``), so every token of
    the vocabulary, not only corpus words, can be copied. (n_rows, seq_len + 1).
    """
    out = torch.empty(n_rows, seq_len + 1, dtype=torch.long)
    for i in range(n_rows):
        parts = [torch.tensor([bos_id])]
        n = 1
        while n < seq_len + 1:
            L = int(torch.randint(span[0], span[1] + 1, (1,), generator=g))
            r = torch.randint(n_special, vocab_size, (L,), generator=g)
            parts += [r, r]
            n += 2 * L
        out[i] = torch.cat(parts)[: seq_len + 1]
    return out


def pool_size(step: int, s: "TrainSettings", n_tokens: int) -> int:
    """How many tokens the random rows draw from at ``step``: ``pool_start`` until
    ``pool_grow[0]`` of training, then linearly up to all ``n_tokens`` at ``pool_grow[1]``."""
    a, b = s.pool_grow
    f = step / max(1, s.steps)
    t = min(1.0, max(0.0, (f - a) / max(1e-9, b - a)))
    return min(n_tokens, round(s.pool_start + t * (n_tokens - s.pool_start)))


def unigram_entropy(targets: torch.Tensor, vocab_size: int) -> float:
    """Entropy (nats) of the unigram distribution of ``targets``: the loss of a model that knows
    only how often each token occurs, measured on the same tokens (a lower bound for such a model)."""
    counts = torch.bincount(targets.flatten(), minlength=vocab_size).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------
@torch.no_grad()
def held_out_loss(model, rows: torch.Tensor, batch: int = 16) -> float:
    """Mean next-token cross-entropy (nats/token) over every position of ``rows``."""
    model.eval()
    total, n = 0.0, 0
    for i in range(0, len(rows), batch):
        x = rows[i:i + batch]
        logits = model(x[:, :-1])
        total += float(F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten(), reduction="sum"))
        n += x[:, 1:].numel()
    return total / n


@torch.no_grad()
def attention_patterns(model, tokens: torch.Tensor) -> torch.Tensor:
    """Attention weights of every layer: (L, B, H, T, T), read from the ``hook_pattern`` points."""
    model.eval()
    found: list[torch.Tensor] = []
    handles = [blk.attn.hook_pattern.register_forward_hook(
        lambda _m, _inp, out: found.append(out.detach())) for blk in model.blocks]
    try:
        model(tokens)
    finally:
        for h in handles:
            h.remove()
    return torch.stack(found)


@torch.no_grad()
def head_scores(model, vocab_size: int, bos_id: int, span: int, batch: int, seed: int,
                candidates=None) -> dict[str, list[list[float]]]:
    """previous_token / first_token / induction scores (L x H lists) on ``<s> + r + r``."""
    probe = repeated_random_tokens(vocab_size, span, batch, seed, bos_id=bos_id,
                                   candidates=candidates)
    pat = attention_patterns(model, probe)          # (L, B, H, T, T)
    return {
        "previous_token": previous_token_score(pat).tolist(),
        "first_token": first_token_score(pat).tolist(),
        "induction": induction_score(pat, span).tolist(),
    }


def _best(matrix: list[list[float]]) -> tuple[float, int, int]:
    t = torch.tensor(matrix)
    i = int(t.argmax())
    return float(t.flatten()[i]), i // t.shape[1], i % t.shape[1]


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def lr_at(step: int, s: TrainSettings) -> float:
    """Linear warmup to ``lr`` over ``warmup`` steps, then cosine down to ``min_lr`` at ``steps``."""
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    frac = min(1.0, (step - s.warmup) / max(1, s.steps - s.warmup))
    return s.min_lr + 0.5 * (s.lr - s.min_lr) * (1 + math.cos(math.pi * frac))


def _optimizer(model, s: TrainSettings) -> torch.optim.Optimizer:
    # Weight decay on the matrices only; norms' gains (1-D) stay undecayed.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    keep = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                              {"params": keep, "weight_decay": 0.0}],
                             lr=s.lr, betas=(0.9, 0.95), eps=1e-8)


def _progress(step: int, total: int, loss: float, copy_loss: float, lr: float,
              t0: float) -> None:
    """A one-line progress bar, redrawn in place on a terminal; every 50 steps into a log file."""
    tty = sys.stdout.isatty()
    if not tty and (step + 1) % 50 and step + 1 != total:
        return
    done = (step + 1) / total
    bar = "#" * int(30 * done) + "-" * (30 - int(30 * done))
    el = time.time() - t0
    eta = el / done - el if done > 0 else 0.0
    print(f"{chr(13) if tty else ''}[{bar}] step {step + 1}/{total} story loss {loss:.3f} random-span loss {copy_loss:.3f} lr {lr:.2e} "
          f"{el / 60:.1f} min (eta {eta / 60:.1f} min)", end="" if tty else "\n", flush=True)


def train(s: TrainSettings, out: str, log=print) -> dict:
    """Build the tokenizer, train the model, write the folder ``out``. Returns the summary dict."""
    from .config import ModelConfig
    from .decoder import Decoder

    t_start = time.time()
    torch.manual_seed(s.seed)
    g = torch.Generator().manual_seed(s.seed)

    log(f"tokenizer: BPE on {s.tokenizer_stories} stories (seed {s.seed})")
    tok = train_tokenizer(corpus.stories(s.seed, s.tokenizer_stories), s.vocab_size)
    V = tok.get_vocab_size()
    bos, eos, pad = tok.token_to_id("<s>"), tok.token_to_id("</s>"), tok.token_to_id("<pad>")
    n_special = len(corpus.SPECIAL_TOKENS)
    log(f"tokenizer: {V} tokens")

    n_story = s.steps * s.batch
    t0 = time.time()
    # Training stories continue the tokenizer's seed stream; held-out ones use another seed.
    train_rows = story_rows(tok, s.seed, n_story, s.seq_len)
    held_rows = story_rows(tok, s.seed + HELD_OUT_SEED_OFFSET, s.held_out_rows, s.seq_len)
    rows = train_rows
    # The random-token pool in order: tokens by frequency in the training stories, then the
    # tokens that never occur there (merge steps, characters) in a seeded random order.
    freq = torch.bincount(train_rows.flatten(), minlength=V).double()
    freq[:n_special] = -1.0
    noise = torch.rand(V, generator=g) * 0.5   # breaks ties among unseen tokens, seeded
    pool_order = torch.argsort(freq + noise, descending=True)[: V - n_special]
    log(f"data: {n_story} story rows of {s.seq_len + 1} tokens; each step also "
        f"{s.random_batch} random-span rows of {s.random_len + 1} tokens "
        f"({time.time() - t0:.1f} s); held out: {len(held_rows)} story rows")
    baseline = unigram_entropy(held_rows[:, 1:], V)

    cfg = ModelConfig(vocab_size=V, d_model=s.d_model, n_layers=s.n_layers, n_heads=s.n_heads,
                      n_kv_heads=s.n_kv_heads, d_ff=s.d_ff, max_seq_len=s.seq_len,
                      rope_theta=10000.0, norm_eps=1e-5, tie_embeddings=True, attn_impl="sdpa",
                      bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)
    model = Decoder(cfg)
    model.set_attn_impl("sdpa")
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params:,} parameters, d_model {s.d_model}, {s.n_layers} layers, "
        f"{s.n_heads} query / {s.n_kv_heads} KV heads, d_ff {s.d_ff}, vocab {V}")
    opt = _optimizer(model, s)

    def evaluate(step: int, train_loss: float | None) -> dict:
        scores = head_scores(model, V, bos, s.probe_span, s.probe_batch, seed=s.seed + 7)
        entry = {"step": step, "minutes": (time.time() - t_train) / 60, "train_loss": train_loss,
                 "held_out_loss": held_out_loss(model, held_rows), **scores}
        model.train()
        return entry

    history: list[dict] = []
    best_state, best_entry = None, None

    def consider(entry: dict) -> None:
        nonlocal best_state, best_entry
        history.append(entry)
        ok = _best(entry["previous_token"])[0] >= 0.5 and _best(entry["induction"])[0] >= 0.3
        key = (0 if ok else 1, entry["held_out_loss"])
        if best_entry is None or key < best_entry["_key"]:
            best_entry = {**entry, "_key": key}
            best_state = copy.deepcopy(model.state_dict())

    t_train = time.time()
    consider(evaluate(0, None))        # the untrained model: held-out loss near ln(V)
    log(f"  eval step 0: held-out {history[0]['held_out_loss']:.3f} (unigram {baseline:.3f})")
    model.train()
    ema = ema_copy = None
    step = 0
    stopped_early = False
    for step in range(s.steps):
        lr = lr_at(step, s)
        for group in opt.param_groups:
            group["lr"] = lr
        x = rows[step * s.batch:(step + 1) * s.batch]
        n_pool = pool_size(step, s, len(pool_order))
        r = random_rows(s.random_batch, s.random_len, n_pool, bos, 0, s.random_span, g)
        r = pool_order[r]
        r[:, 0] = bos
        loss_story = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        loss_copy = F.cross_entropy(model(r[:, :-1]).flatten(0, 1), r[:, 1:].flatten())
        loss = 0.5 * (loss_story + loss_copy)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        opt.step()
        lv, lc = loss_story.item(), loss_copy.item()
        ema = lv if ema is None else 0.95 * ema + 0.05 * lv
        ema_copy = lc if ema_copy is None else 0.95 * ema_copy + 0.05 * lc
        _progress(step, s.steps, ema, ema_copy, lr, t_train)
        last = step == s.steps - 1
        over_time = (time.time() - t_start) / 60 > s.max_minutes
        if (step + 1) % s.eval_every == 0 or last or over_time:
            e = evaluate(step + 1, ema)
            e["random_span_loss"] = ema_copy
            e["pool"] = n_pool
            consider(e)
            p, pl, ph = _best(e["previous_token"])
            ind, il, ih = _best(e["induction"])
            if sys.stdout.isatty():
                print("", flush=True)
            log(f"  eval step {step + 1}: held-out {e['held_out_loss']:.3f} (unigram {baseline:.3f}) "
                f"prev-token {p:.2f} (L{pl}H{ph}) induction {ind:.2f} (L{il}H{ih})")
        if over_time:
            stopped_early = True
            log(f"stopping at step {step + 1}: over the {s.max_minutes} minute limit")
            break
    train_minutes = (time.time() - t_train) / 60

    model.load_state_dict(best_state)
    best = {k: v for k, v in best_entry.items() if k != "_key"}
    log(f"picked step {best['step']}: held-out {best['held_out_loss']:.3f}")

    os.makedirs(out, exist_ok=True)
    _save_model(model, out)
    save_tokenizer(tok, out, s.seq_len)
    summary = {
        "settings": asdict(s),
        "vocab_size": V,
        "n_params": n_params,
        "steps_run": step + 1,
        "stopped_early": stopped_early,
        "train_minutes": train_minutes,
        "total_minutes": (time.time() - t_start) / 60,
        "unigram_baseline": baseline,
        "picked": best,
        "history": history,
        "machine": _machine(),
        "torch": torch.__version__,
    }
    # Scores on corpus words only (ids that occur in held-out text), for the card.
    used = torch.unique(held_rows)
    used = used[used >= n_special]
    model.eval()
    summary["picked_word_probe"] = head_scores(model, V, bos, s.probe_span, s.probe_batch,
                                               seed=s.seed + 7, candidates=used)
    summary["samples"] = _samples(model, tok)
    with open(os.path.join(out, "training_log.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    write_model_card(summary, out, cfg)
    log(f"wrote {out} ({(time.time() - t_start) / 60:.1f} min in all)")
    return summary


def _save_model(model, folder: str) -> None:
    from .loading import save_pretrained
    save_pretrained(model, folder)


SAMPLE_PROMPTS = (
    "Once upon a time, there was a",
    "Lily had a small red ball. She",
    "Mom asked Tom to buy milk, eggs and bread. Tom went to the shop. He bought",
    "Sam wrote a secret list of words: cat hat lamp tiger gold. Later, Mia read the list out loud:",
)


@torch.no_grad()
def greedy(model, ids: list[int], max_new: int, eos_id: int | None = None) -> list[int]:
    """Greedy continuation, recomputing the whole prefix each step (no cache: plain and exact)."""
    model.eval()
    x = torch.tensor([ids])
    out: list[int] = []
    for _ in range(max_new):
        if x.shape[1] >= model.config.max_seq_len:
            break
        nxt = int(model(x)[0, -1].argmax())
        out.append(nxt)
        if nxt == eos_id:
            break
        x = torch.cat([x, torch.tensor([[nxt]])], dim=1)
    return out


def _samples(model, tok) -> list[dict]:
    eos = tok.token_to_id("</s>")
    res = []
    for prompt in SAMPLE_PROMPTS:
        ids = tok.encode(prompt).ids
        new = greedy(model, ids, 40, eos)
        res.append({"prompt": prompt, "continuation": tok.decode(new)})
    return res


def _machine() -> dict:
    cpu = platform.processor() or "unknown"
    try:
        txt = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in txt.splitlines():
            if line.strip().startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
                break
    except (OSError, subprocess.SubprocessError):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "python": sys.version.split()[0]}


# ---------------------------------------------------------------------------------------------
# Model card
# ---------------------------------------------------------------------------------------------
def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def _table(scores: dict) -> str:
    L = len(scores["previous_token"])
    H = len(scores["previous_token"][0])
    lines = ["| layer | head | previous-token | induction | first-token |",
             "|---:|---:|---:|---:|---:|"]
    for layer in range(L):
        for h in range(H):
            lines.append(f"| {layer} | {h} | {scores['previous_token'][layer][h]:.3f} | "
                         f"{scores['induction'][layer][h]:.3f} | "
                         f"{scores['first_token'][layer][h]:.3f} |")
    return "\n".join(lines)


def write_model_card(summary: dict, out: str, cfg) -> None:
    s = summary["settings"]
    best = summary["picked"]
    p, pl, ph = _best(best["previous_token"])
    ind, il, ih = _best(best["induction"])
    wp = summary["picked_word_probe"]
    wind, wil, wih = _best(wp["induction"])
    size = os.path.getsize(os.path.join(out, "model.safetensors"))
    hist = "\n".join(
        f"| {e['step']} | {e['minutes']:.1f} | {_num(e['train_loss'])} | "
        f"{_num(e.get('random_span_loss'))} | {e['held_out_loss']:.3f} | "
        f"{_best(e['previous_token'])[0]:.2f} | {_best(e['induction'])[0]:.2f} |"
        for e in summary["history"])
    samples = "\n\n".join(f"**Prompt:** {x['prompt']}\n\n**Greedy:** {x['continuation']}"
                          for x in summary["samples"])
    m = summary["machine"]
    stop_note = (f"this run hit that limit and stopped at step {summary['steps_run']} of {s['steps']}."
                 if summary.get("stopped_early") else
                 f"this run finished all {s['steps']} steps before it.")
    card = f"""# Transformer Explorer default model

A small Llama-style decoder trained from scratch, on this project's own generated stories, by
`python -m models.train` (the code in `models/train.py` and `models/corpus.py`). It is there to be
looked inside: its heads have clear jobs (previous-token, induction, attention sink), and its
tokens are whole words, so the attention maps read as words.

It loads as it is with `transformers.LlamaForCausalLM.from_pretrained(folder)` /
`AutoTokenizer.from_pretrained(folder)` and with `models.loading.load_pretrained(folder)`.

## Corpus
Simple English stories written by `models/corpus.py` from a seed (seed {s['seed']} for training,
seed {s['seed'] + HELD_OUT_SEED_OFFSET} for held-out text). Each story has two recurring named
characters referred to by pronouns (she/he, her/his), a recurring object ("a big red kite ... the
red kite") and place, a refrain said more than once, and lists that are recalled later word for
word: shopping lists, animals seen, and a "secret list" of random words read out again. Some
stories contain a plain **random span** of words followed by the same span again, with no grammar.
Each story row holds {s['seq_len']} input tokens (plus the next token as the last target) and
starts at a story's `<s>`; stories follow one another (`</s> <s>`) until the row is full.

**Repeated random tokens.** Every training step has two batches: {s['batch']} story rows of
{s['seq_len']} tokens, and {s['random_batch']} rows of {s['random_len']} tokens that are not text
at all: `<s>` then spans of {s['random_span'][0]}-{s['random_span'][1]} random token ids, each span
given twice in a row. The loss is the mean of the two batches' losses. The random tokens are drawn
from the {s['pool_start']} most frequent story tokens for the first {s['pool_grow'][0]:.0%} of
training, then from a pool that grows linearly to the whole vocabulary (special tokens excepted) by
{s['pool_grow'][1]:.0%}. A model trained on templated stories alone barely learns induction (the
project's design notes), and copying spans of a large vocabulary from scratch sits on a long
plateau; the small pool first lets the copying circuit form, the growing pool makes it general.
The held-out loss below is measured on stories only.

## Tokenizer
Byte-pair encoding trained with the `tokenizers` library on {s['tokenizer_stories']:,} training
stories, Metaspace (`▁` marks a word start) plus punctuation splitting, so merges never cross words.
BPE stops when no pair is left to merge, which is when every corpus word is one token:
**{summary['vocab_size']:,} tokens** (the cap was {s['vocab_size']}), of which the ones that are
not whole corpus words are the merge steps on the way and the printable ASCII characters (so any
English text still tokenizes, into pieces). Special tokens: `<pad>` 0, `<s>` 1 (added in front of
every text, as Llama does), `</s>` 2, `<unk>` 3.

## Shapes
| | |
|---|---|
| architecture | Llama (pre-norm RMSNorm, RoPE θ={cfg.rope_theta:g}, SwiGLU, grouped-query attention) |
| d_model | {cfg.d_model} |
| layers | {cfg.n_layers} |
| query heads / KV heads | {cfg.n_heads} / {cfg.n_kv_heads} (head dim {cfg.head_dim}) |
| d_ff (SwiGLU) | {cfg.d_ff} |
| vocabulary | {cfg.vocab_size} |
| context | {cfg.max_seq_len} tokens |
| embeddings | tied (the LM head reuses the token embedding) |
| parameters | {summary['n_params']:,} |
| weights file | {size / 1e6:.1f} MB (fp32 safetensors) |

## Training
AdamW (β = 0.9, 0.95; weight decay {s['weight_decay']} on matrices), learning rate
{s['lr']:g} after {s['warmup']} warmup steps, cosine down to {s['min_lr']:g}, gradient clipping at
{s['grad_clip']}, {summary['steps_run']} steps of {s['batch']} × {s['seq_len']} story tokens plus
{s['random_batch']} × {s['random_len']} random-span tokens
({summary['steps_run'] * s['batch'] * s['seq_len']:,} story tokens in all), seed {s['seed']}.
Training took **{summary['train_minutes']:.1f} minutes** ({summary['total_minutes']:.1f} minutes
with the tokenizer, data and evaluation) on {m['cpu']} (lscpu model name), {m['threads']} torch threads on {m.get('cores', os.cpu_count())} cores,
torch {summary['torch']}, CPU, fp32, SDPA attention. The cores were shared with other work, so
times vary from run to run. The loop stops after {s['max_minutes']:g} minutes whatever the step,
keeping the best evaluation so far, so a rebuild on a busy machine still ends within 30 minutes;
{stop_note}

Every {s['eval_every']} steps the loop measured the held-out loss and the head scores; the shipped
weights are the evaluation with the lowest held-out loss among those with a previous-token head
≥ 0.5 and an induction head ≥ 0.3: **step {best['step']}**.

The random-span loss can only fall on the second copy of each span; it rises while the pool grows
(an unpredictable first-copy token costs ln(pool size) nats) and falls once copying works.

| step | minutes | story loss (train, EMA) | random-span loss (train, EMA) | held-out loss | best previous-token | best induction |
|---:|---:|---:|---:|---:|---:|---:|
{hist}

## Results (shipped weights)
- Held-out loss: **{best['held_out_loss']:.3f} nats/token** on {s['held_out_rows']} held-out story
  rows, against a unigram baseline of **{summary['unigram_baseline']:.3f} nats/token** (the entropy
  of the held-out token distribution: the best loss a model that ignores context can reach).
- Best previous-token head: layer {pl}, head {ph}: {p:.3f}.
- Best induction head: layer {il}, head {ih}: {ind:.3f} on `<s> + r + r` with r {s['probe_span']}
  random token ids from the whole vocabulary ({s['probe_batch']} rows); {wind:.3f} (layer {wil}, head
  {wih}) when r is drawn from tokens that occur in held-out text.

Head scores (means of attention weights, 0 to 1) on `<s> + r + r`, r = {s['probe_span']} random
tokens: previous-token = weight on the token before, mean over queries t ≥ 1; induction = weight
on the token after the query token's earlier occurrence, mean over the second copy; first-token =
weight on position 0 (`<s>`), mean over queries t ≥ 1. Computed by `models/heads.py`.

{_table(best)}

## Sample greedy generations (shipped weights)
{samples}

## Limits
A toy: it knows about {summary['vocab_size']} tokens of simple story English and nothing else;
words outside the corpus split into letters and pieces it has barely seen. It is not a language
model of anything real, and its stories repeat themselves.
"""
    with open(os.path.join(out, "README.md"), "w") as fh:
        fh.write(card)


def rewrite_card(folder: str) -> None:
    """Write README.md again from the numbers a training run logged (training_log.json)."""
    from .config import ModelConfig

    with open(os.path.join(folder, "training_log.json")) as fh:
        summary = json.load(fh)
    with open(os.path.join(folder, "config.json")) as fh:
        cfg = ModelConfig.from_hf(json.load(fh))
    write_model_card(summary, folder, cfg)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="a tiny model, a small slice, a few steps (well under a minute)")
    ap.add_argument("--out", default=None, help=f"output folder (default {DEFAULT_OUT}; "
                    "--quick has no default and needs one)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default 2; 1 with --quick, where a tiny model gains "
                         "nothing from a second thread and loses a lot when cores are shared)")
    ap.add_argument("--card-only", action="store_true",
                    help="rewrite README.md in --out from its training_log.json and config.json "
                         "(no training)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="override one TrainSettings field (for experiments), e.g. --set d_model=128")
    args = ap.parse_args(argv)
    if args.quick and args.out is None:
        ap.error("--quick needs --out: it must not overwrite the shipped model.")
    if args.card_only:
        out = args.out or DEFAULT_OUT
        rewrite_card(out)
        return json.load(open(os.path.join(out, "training_log.json")))
    torch.set_num_threads(args.threads or (1 if args.quick else 2))
    s = TrainSettings.quick() if args.quick else TrainSettings()
    if args.seed is not None:
        s.seed = args.seed
    if args.steps is not None:
        s.steps = args.steps
    for item in args.set:
        name, _, value = item.partition("=")
        if name not in TrainSettings.__dataclass_fields__:
            ap.error(f"--set {item}: TrainSettings has no field {name!r}.")
        current = getattr(s, name)
        setattr(s, name, tuple(int(v) for v in value.split(",")) if isinstance(current, tuple)
                else type(current)(value))
    return train(s, args.out or DEFAULT_OUT)


if __name__ == "__main__":
    main()
