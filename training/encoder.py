"""Train the encoder with masked-language modelling (BERT's objective): ``python -m training --encoder``.

The encoder (:class:`models.encoder.EncoderForMaskedLM`: sinusoidal positions, LayerNorm, GELU,
bidirectional attention, an output head tied to the token embedding) reads the same stories with
the same tokenizer as the default decoder (read from the decoder's folder). In every row 15 % of
the word positions are chosen; of those 80 % become ``<mask>``, 10 % a random token and 10 % stay
as they are, and the loss is the cross-entropy of the original token at the chosen positions only.
Because the model cannot tell which unmasked tokens were swapped, it must build a prediction for
every position from both sides.

Evaluation (:func:`masked_accuracy`): held-out stories, a fixed 15 % of word positions all replaced
by ``<mask>``, top-1 accuracy of the original word; beside it the unigram guess (always the most
frequent training word) and the default decoder's next-token top-1 at the same positions, which
reads only the left side (and an unmasked left side).

The folder holds ``config.json`` (our ``ModelConfig`` fields), ``model.safetensors``, a copy of the
tokenizer files, ``training_log.json`` and the card ``README.md``.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from lens.heldout import (HELD_OUT_FILE, MASK_SEED, choose_positions, held_out_sequences, held_out_stories,
                          masked_accuracy, next_token_accuracy)

from . import corpus
from .data import story_rows
from .loop import DEFAULT_OUT as DECODER_OUT
from .loop import HELD_OUT_SEED_OFFSET, Ema, lr_at, make_optimizer, show_progress

DEFAULT_OUT = os.path.join("assets", "encoder-model")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
TARGET_ACCURACY = 0.5
# Ids below this are special tokens (<pad> <s> </s> <unk> <mask>): never chosen, never a random swap.
N_SPECIAL = len(corpus.SPECIAL_TOKENS)


@dataclass
class EncoderSettings:
    seed: int = 0
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 512
    seq_len: int = 256
    mask_rate: float = 0.15
    held_out_stories: int = 64
    steps: int = 1500
    batch: int = 32
    lr: float = 3e-3
    min_lr: float = 1e-4
    warmup: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    # For the first `short_until` of training every row is cut into rows of `short_len` tokens.
    # At initialisation bidirectional attention is uniform over the whole row, so the neighbours
    # that predict a hidden word carry 1/T of it; on short rows the model learns to look at them
    # much sooner (bench/notes/training.md).
    short_len: int = 64
    short_until: float = 0.3
    # Each step's rows begin at a random point of the story stream instead of at a story's <s>.
    # Rows that always start a story let the encoder guess by position: every story opens "Once
    # upon a time, there was a <trait> <kind> named" or "<Name> was a <trait> <kind> who", so at
    # positions 3-6 it guesses the opening's words whatever the words beside the blank
    # (bench/notes/training.md has what an encoder trained that way said).
    random_offsets: bool = True
    eval_every: int = 50
    max_minutes: float = 38.0
    tokenizer_from: str = DECODER_OUT

    @classmethod
    def quick(cls) -> "EncoderSettings":
        return cls(d_model=32, n_layers=2, n_heads=4, d_ff=64, seq_len=64, held_out_stories=8,
                   short_len=16, steps=30, batch=8, warmup=5, eval_every=15, max_minutes=2.0)


def mask_tokens(tokens: torch.Tensor, vocab_size: int, mask_id: int, rate: float,
                g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's corruption. Returns (inputs, chosen): of the chosen positions 80 % hold ``mask_id``,
    10 % a random non-special token, 10 % their own token. (B, T) each."""
    chosen = (tokens >= N_SPECIAL) & (torch.rand(tokens.shape, generator=g) < rate)
    roll = torch.rand(tokens.shape, generator=g)
    inputs = tokens.clone()
    inputs[chosen & (roll < 0.8)] = mask_id
    swap = chosen & (roll >= 0.8) & (roll < 0.9)
    inputs[swap] = torch.randint(N_SPECIAL, vocab_size, (int(swap.sum()),), generator=g)
    return inputs, chosen


def mlm_loss(model, tokens: torch.Tensor, inputs: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    logits = model(inputs)                                        # (B, T, V)
    return F.cross_entropy(logits[chosen], tokens[chosen])


def unigram_accuracy(train_rows: torch.Tensor, sequences: list[list[int]],
                     chosen: list[torch.Tensor], tok=None) -> dict:
    """Always guessing the most frequent training token: its top-1 accuracy at ``chosen``."""
    words = train_rows[train_rows >= N_SPECIAL]
    top = int(torch.bincount(words).argmax())
    hidden = torch.cat([torch.tensor(ids)[c] for ids, c in zip(sequences, chosen)])
    out = {"token_id": top, "accuracy": float((hidden == top).double().mean())}
    if tok is not None:
        out["word"] = tok.decode([top])
    return out


def save_encoder(model, folder: str) -> None:
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump({"model_type": "transformer-explorer-encoder",
                   "architectures": ["EncoderForMaskedLM"], **model.config.to_dict()}, fh, indent=2)


def build_encoder(s: EncoderSettings, tok):
    from models import ModelConfig
    from models.encoder import EncoderForMaskedLM

    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), d_model=s.d_model, n_layers=s.n_layers,
                      n_heads=s.n_heads, n_kv_heads=s.n_heads, d_ff=s.d_ff, max_seq_len=s.seq_len,
                      norm_eps=1e-5, attn_impl="sdpa", bos_token_id=tok.token_to_id("<s>"),
                      eos_token_id=tok.token_to_id("</s>"), pad_token_id=tok.token_to_id("<pad>"))
    model = EncoderForMaskedLM(cfg)
    # Token embeddings at std 1/√C, not Llama's 0.02: the encoder multiplies them by √C, so tokens
    # enter at unit scale beside the sinusoidal positions (amplitude 1) instead of a quarter of it,
    # and the tied output head starts with logits of unit spread instead of near-uniform ones.
    torch.nn.init.normal_(model.encoder.embed_tokens.weight, std=s.d_model ** -0.5)
    return model


@dataclass
class HeldOut:
    """Held-out stories as ``<s> story`` ids and the positions hidden when accuracy is measured."""
    stories: list[str]
    sequences: list[list[int]]
    chosen: list[torch.Tensor]


def held_out(hf_tok, s: EncoderSettings) -> HeldOut:
    stories = list(corpus.stories(s.seed + HELD_OUT_SEED_OFFSET, s.held_out_stories))
    seqs = held_out_sequences(hf_tok, stories, s.seq_len)
    return HeldOut(stories, seqs, choose_positions(seqs, hf_tok.all_special_ids, s.mask_rate))


def step_rows(stream: torch.Tensor, step: int, s: EncoderSettings, g: torch.Generator, bos_id: int,
              length: int | None = None) -> torch.Tensor:
    """The rows that ``step`` trains on: ``batch * seq_len / length`` rows of ``length`` tokens
    (default ``seq_len``), each ``<s>`` followed by ``length - 1`` tokens of ``stream`` (the story
    rows laid end to end; one row longer than ``steps * batch`` rows), read in order from step
    ``k``'s block of ``batch * seq_len`` tokens, shifted by a random 0..seq_len-1 tokens when
    ``random_offsets``. A row thus begins anywhere in a story, but always with ``<s>``, as BERT's
    rows always begin with [CLS]: every query has the same first key to rest on.
    (rows, length)"""
    T = length or s.seq_len
    n = s.batch * s.seq_len // T
    shift = int(torch.randint(0, s.seq_len, (), generator=g)) if s.random_offsets else 0
    start = step * s.batch * s.seq_len + shift
    body = stream[start:start + n * (T - 1)].view(n, T - 1)          # (n * (T-1),) -> (n, T-1)
    return torch.cat([torch.full((n, 1), bos_id, dtype=body.dtype), body], dim=1)   # (n, T)


def train_one_step(model, opt, x: torch.Tensor, mask_id: int, s: EncoderSettings, lr: float,
                   g: torch.Generator) -> float:
    for group in opt.param_groups:
        group["lr"] = lr
    inputs, chosen = mask_tokens(x, model.config.vocab_size, mask_id, s.mask_rate, g)
    model.train()
    loss = mlm_loss(model, x, inputs, chosen)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
    opt.step()
    model.eval()
    return loss.item()


def run_mlm(model, train_rows: torch.Tensor, ho: HeldOut, mask_id: int, s: EncoderSettings,
            t_start: float, log, hf_tok):
    """The optimisation. Returns (history, best entry, best state, steps run, minutes)."""
    g = torch.Generator().manual_seed(s.seed)
    g_offsets = torch.Generator().manual_seed(s.seed + 1)
    stream = train_rows.flatten()
    bos_id = model.config.bos_token_id
    opt = make_optimizer(model, s)
    history, best_entry, best_state = [], None, None
    loss_ema = Ema()
    t_train = time.time()
    step = 0
    for step in range(s.steps):
        lr = lr_at(step, s)
        short = step < s.short_until * s.steps
        x = step_rows(stream, step, s, g_offsets, bos_id, s.short_len if short else None)
        loss_ema.update(train_one_step(model, opt, x, mask_id, s, lr, g))
        show_progress(step, s.steps, f"step {step + 1}/{s.steps} masked-token loss "
                      f"{loss_ema.value:.3f} lr {lr:.2e} {(time.time() - t_train) / 60:.1f} min")
        over_time = (time.time() - t_start) / 60 > s.max_minutes
        if (step + 1) % s.eval_every == 0 or step == s.steps - 1 or over_time:
            acc = masked_accuracy(model, ho.sequences, ho.chosen, mask_id)
            entry = {"step": step + 1, "minutes": (time.time() - t_train) / 60,
                     "train_loss": loss_ema.value, "held_out_accuracy": acc,
                     "colour_probe": [w for w, _ in colour_probe(model, hf_tok)["top"]]}
            history.append(entry)
            log(f"  eval step {step + 1}: held-out masked-token top-1 {acc:.3f}; top 5 for "
                f"'Tom gave the [MASK] ball to Anna.': {', '.join(entry['colour_probe'])}")
            if best_entry is None or acc > best_entry["held_out_accuracy"]:
                best_entry, best_state = entry, copy.deepcopy(model.state_dict())
        if over_time:
            log(f"stopping at step {step + 1}: over the {s.max_minutes} minute limit")
            break
    return history, best_entry, best_state, step + 1, (time.time() - t_train) / 60


@torch.no_grad()
def colour_probe(model, hf_tok, sentence: str = "Tom gave the red ball to Anna.",
                 word: str = "red", k: int = 5) -> dict:
    """The encoder's top-``k`` for ``word`` masked in ``sentence``."""
    ids = list(hf_tok(sentence)["input_ids"])
    pos = ids.index(hf_tok.convert_tokens_to_ids("▁" + word))
    x = torch.tensor([ids])
    x[0, pos] = hf_tok.mask_token_id
    top = model(x)[0, pos].softmax(-1).topk(k)
    return {"sentence": sentence, "masked": word,
            "top": [[hf_tok.decode([int(i)]), float(p)] for p, i in zip(top.values, top.indices)]}


def train_encoder(s: EncoderSettings, out: str, log=print) -> dict:
    from lens.heldout import load_encoder_tokenizer
    from lens.machine import machine_info

    t_start = time.time()
    torch.manual_seed(s.seed)
    hf_tok = load_encoder_tokenizer(s.tokenizer_from)
    tok = hf_tok.backend_tokenizer
    mask_id = hf_tok.mask_token_id
    if mask_id is None:
        raise ValueError(f"the tokenizer in {s.tokenizer_from} has no <mask> token: retrain the "
                         "decoder (python -m training) first.")
    # Rows of exactly seq_len tokens: no shifted target here, the targets are the rows themselves.
    # One row more than the steps read, for the last step's shift (see step_rows).
    train_rows = story_rows(tok, s.seed, s.steps * s.batch + 1, s.seq_len - 1)
    ho = held_out(hf_tok, s)
    model = build_encoder(s, tok)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"encoder: {n_params:,} parameters; {len(train_rows)} story rows of {s.seq_len} tokens; "
        f"{len(ho.stories)} held-out stories")
    history, picked, state, steps_run, minutes = run_mlm(model, train_rows, ho, mask_id, s,
                                                         t_start, log, hf_tok)
    model.load_state_dict(state)
    model.eval()
    save_encoder(model, out)
    for name in TOKENIZER_FILES:
        shutil.copy(os.path.join(s.tokenizer_from, name), os.path.join(out, name))
    with open(os.path.join(out, HELD_OUT_FILE), "w", encoding="utf-8") as fh:
        fh.write("\n".join(ho.stories) + "\n")
    summary = {
        "settings": asdict(s), "vocab_size": tok.get_vocab_size(), "n_params": n_params,
        "steps_run": steps_run, "train_minutes": minutes,
        "total_minutes": (time.time() - t_start) / 60, "picked": picked, "history": history,
        "held_out": {"stories": len(ho.stories),
                     "masked_tokens": int(sum(int(c.sum()) for c in ho.chosen)),
                     "encoder_accuracy": masked_accuracy(model, ho.sequences, ho.chosen, mask_id),
                     "unigram": unigram_accuracy(train_rows, ho.sequences, ho.chosen, tok),
                     "decoder_next_token_accuracy": None,
                     "seed": s.seed + HELD_OUT_SEED_OFFSET, "mask_seed": MASK_SEED},
        "colour_probe": colour_probe(model, hf_tok),
        "machine": machine_info(),
    }
    with open(os.path.join(out, "training_log.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    if same_tokenizer_files(s.tokenizer_from, out) and os.path.isfile(
            os.path.join(s.tokenizer_from, "model.safetensors")):
        summary = compare_decoder(out, s.tokenizer_from)
    else:
        write_card(summary, out)
    h = summary["held_out"]
    log(f"held-out masked-token top-1 {h['encoder_accuracy']:.3f} (unigram guess "
        f"{h['unigram']['accuracy']:.3f}); wrote {out} ({(time.time() - t_start) / 60:.1f} min in all)")
    return summary


def same_tokenizer_files(a: str, b: str) -> bool:
    import filecmp

    return all(os.path.isfile(os.path.join(d, n)) for d in (a, b) for n in TOKENIZER_FILES) and all(
        filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False) for n in TOKENIZER_FILES)


def compare_decoder(folder: str, decoder_from: str = DECODER_OUT) -> dict:
    """Measure the decoder in ``decoder_from`` (same tokenizer) at the encoder's held-out positions:
    its next-token top-1 goes into the encoder's training_log.json and card. Returns the log."""
    from lens.heldout import load_encoder_tokenizer
    from models import load_pretrained

    if not same_tokenizer_files(folder, decoder_from):
        raise ValueError(f"the decoder in {decoder_from} uses another tokenizer than the encoder in "
                         f"{folder}: train the encoder again from that decoder's tokenizer.")
    with open(os.path.join(folder, "training_log.json")) as fh:
        summary = json.load(fh)
    tok = load_encoder_tokenizer(folder)
    stories = held_out_stories(folder)
    seqs = held_out_sequences(tok, stories, summary["settings"]["seq_len"])
    chosen = choose_positions(seqs, tok.all_special_ids, summary["settings"]["mask_rate"])
    decoder = load_pretrained(decoder_from)
    seqs = [ids[:decoder.config.max_seq_len + 1] for ids in seqs]
    summary["held_out"]["decoder_next_token_accuracy"] = next_token_accuracy(
        decoder, seqs, [c[:len(ids)] for c, ids in zip(chosen, seqs)])
    summary["held_out"]["decoder"] = decoder_from
    with open(os.path.join(folder, "training_log.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    write_card(summary, folder)
    return summary


def offsets_paragraph(s: dict) -> str:
    if not s.get("random_offsets"):
        return ""
    return f"""
The rows are cut from the stories laid end to end, each step's block shifted by a random 0 to
{s['seq_len'] - 1} tokens, so a row begins anywhere in a story; each row then gets `<s>` in front
(as BERT's rows begin with [CLS]), so every query has the same first key to rest on (rows that
began mid-story with no `<s>` first reached 0.32 held-out top-1 after 600 steps). Rows that always
begin a story let the encoder guess by position: every story opens with "Once upon a time, there
was a <trait> <kind> named" or "<Name> was a <trait> <kind> who", and an encoder trained on such
rows (held-out top-1 0.618) filled "Tom gave the [MASK] ball to Anna." with king, prince, man, boy,
time and "Tom gave the red [MASK] to Anna." with there, his: the words of a story's opening at
those positions, whatever stood beside the blank.
"""


def write_card(summary: dict, out: str) -> None:
    from .card import machine_line

    s, h = summary["settings"], summary["held_out"]
    with open(os.path.join(out, "config.json")) as fh:
        cfg = json.load(fh)
    size = os.path.getsize(os.path.join(out, "model.safetensors"))
    hist = "\n".join(f"| {e['step']} | {e['minutes']:.1f} | {e['train_loss']:.3f} | "
                     f"{e['held_out_accuracy']:.3f} | {', '.join(e.get('colour_probe', ['–']))} |"
                     for e in summary["history"])
    dec = h["decoder_next_token_accuracy"]
    dec_line = ("" if dec is None else
                f"\n- The default decoder's **next-token** top-1 at the same positions (it reads "
                f"only the tokens to the left, unmasked): **{dec:.3f}**.")
    probe = summary["colour_probe"]
    top = ", ".join(f"{w} ({p:.1%})" for w, p in probe["top"])
    card = f"""# Transformer Explorer encoder

A classic Transformer encoder (embedding × √C plus a sinusoidal position table, pre-norm blocks
with LayerNorm, bidirectional multi-head attention and a GELU feed-forward, a final LayerNorm)
trained from scratch with **masked-language modelling** (BERT's objective) by
`python -m training --encoder` (the code in `training/encoder.py`), on the same generated stories
and with the same word-level tokenizer as the default decoder in `assets/default-model` (the
tokenizer files here are a copy of that folder's). It exists to contrast with the decoder: every
token reads both sides of the sentence.

Load it with `explorer.probes.encoder_probe.load_encoder(folder)` (a `models.encoder.EncoderForMaskedLM`);
`config.json` holds our `ModelConfig` fields, not a transformers config.

## Objective
In every training row 15 % of the word positions are chosen (special tokens never are); of those
80 % are replaced by `<mask>`, 10 % by a random word and 10 % left as they are. The loss is the
cross-entropy of the original token at the chosen positions only. The output head is tied to the
token embedding (logits = hidden · Eᵀ + b), so it adds only a bias of {cfg['vocab_size']} numbers.
{offsets_paragraph(s)}
## Shapes
| | |
|---|---|
| d_model | {cfg['d_model']} |
| layers | {cfg['n_layers']} |
| heads | {cfg['n_heads']} (head dim {cfg['d_model'] // cfg['n_heads']}) |
| d_ff (GELU) | {cfg['d_ff']} |
| vocabulary | {cfg['vocab_size']} |
| context | {cfg['max_seq_len']} tokens |
| parameters | {summary['n_params']:,} |
| weights file | {size / 1e6:.1f} MB (fp32 safetensors) |

## Training
AdamW (β = 0.9, 0.95; weight decay {s['weight_decay']} on matrices), learning rate {s['lr']:g}
after {s['warmup']} warmup steps, cosine down to {s['min_lr']:g}, gradient clipping at
{s['grad_clip']}, {summary['steps_run']} steps of {s['batch']} story rows of {s['seq_len']} tokens,
seed {s['seed']}. Training took **{summary['train_minutes']:.1f} minutes**
({summary['total_minutes']:.1f} minutes in all) on {machine_line(summary['machine'])}, CPU, fp32.
The cores were shared with other work, so times vary from run to run. Every {s['eval_every']} steps
the held-out accuracy was measured; the shipped weights are the best evaluation: step
{summary['picked']['step']}.

| step | minutes | masked-token loss (train, EMA) | held-out masked-token top-1 | top 5 for "Tom gave the [MASK] ball to Anna." |
|---:|---:|---:|---:|:---|
{hist}

## Results (shipped weights)
{h['stories']} held-out stories (seed {h['seed']}, each cut to the first {s['seq_len']} tokens),
{h['masked_tokens']:,} token positions chosen at 15 % (seed {h['mask_seed']}), every one replaced by
`<mask>` (the stories are in `{HELD_OUT_FILE}`; the app measures the same numbers again):
- Encoder masked-token top-1 accuracy: **{h['encoder_accuracy']:.3f}**.
- Unigram guess (always the most frequent training token, "{h['unigram'].get('word', h['unigram']['token_id'])}"):
  **{h['unigram']['accuracy']:.3f}**.{dec_line}

"{probe['sentence']}" with "{probe['masked']}" masked, the encoder's top 5: {top}.

## Limits
A toy: about {summary['vocab_size']} tokens of simple story English; it has never seen anything else.
"""
    with open(os.path.join(out, "README.md"), "w") as fh:
        fh.write(card)


def rewrite_card(folder: str) -> dict:
    """Write README.md again from the encoder's training_log.json; returns the log."""
    with open(os.path.join(folder, "training_log.json")) as fh:
        summary = json.load(fh)
    write_card(summary, folder)
    return summary
