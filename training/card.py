"""The default decoder's model card (README.md), written from its training_log.json."""
from __future__ import annotations

import json
import os

from .evaluate import (TARGET_HELD_OUT_LOSS, TARGET_INDUCTION, TARGET_PREVIOUS_TOKEN, best,
                       worst_span_induction)


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def machine_line(m: dict) -> str:
    threads = m.get("torch_threads", m.get("threads"))
    return (f"{m['cpu']} (lscpu model name), {threads} torch threads on {m['cores']} cores, "
            f"torch {m['torch']}, Python {m['python']}")


def head_table(entry: dict) -> str:
    """One row per head: previous-token, first-token and induction at every probed span."""
    spans = list(entry["induction"])
    L, H = len(entry["previous_token"]), len(entry["previous_token"][0])
    lines = ["| layer | head | previous-token | first-token | "
             + " | ".join(f"induction @ {k}" for k in spans) + " |",
             "|---:|---:|---:|---:|" + "---:|" * len(spans)]
    for layer in range(L):
        for h in range(H):
            ind = " | ".join(f"{entry['induction'][k][layer][h]:.3f}" for k in spans)
            lines.append(f"| {layer} | {h} | {entry['previous_token'][layer][h]:.3f} | "
                         f"{entry['first_token'][layer][h]:.3f} | {ind} |")
    return "\n".join(lines)


def history_table(history: list[dict]) -> str:
    spans = list(history[0]["induction"])
    lines = ["| step | minutes | story loss (train, EMA) | repeated-span loss (train, EMA) | "
             "held-out loss | best previous-token | "
             + " | ".join(f"best induction @ {k}" for k in spans) + " |",
             "|---:|---:|---:|---:|---:|---:|" + "---:|" * len(spans)]
    for e in history:
        ind = " | ".join(f"{best(e['induction'][k])[0]:.2f}" for k in spans)
        lines.append(f"| {e['step']} | {e['minutes']:.1f} | {_num(e['train_loss'])} | "
                     f"{_num(e.get('repeated_span_loss'))} | {e['held_out_loss']:.3f} | "
                     f"{best(e['previous_token'])[0]:.2f} | {ind} |")
    return "\n".join(lines)


def pool_sentence(s: dict, vocab_size: int) -> str:
    if s["pool_start"] >= vocab_size:
        return ("The spans' tokens are drawn from the whole vocabulary (special tokens excepted) "
                "from the first step.")
    first = (f"{s['pool_start']} most frequent story tokens" if s.get("pool_order", "frequency") == "frequency"
             else f"{s['pool_start']} tokens picked at random (common and rare alike; a seeded shuffle of the "
                  "vocabulary)")
    return (f"The spans' tokens are drawn from {first} for "
            f"the first {s['pool_grow'][0]:.0%} of training, then from a pool that grows linearly "
            f"to the whole vocabulary (special tokens excepted) by {s['pool_grow'][1]:.0%}.")


def late_sentence(s: dict) -> str:
    """The switch to more story rows late in training, when the settings have one."""
    if "late_from" not in s or (s["late_batch"], s["late_span_batch"]) == (s["batch"], s["span_batch"]):
        return "."
    return (f"; from {s['late_from']:.0%} of training on (induction works at every span by then) "
            f"{s['late_batch']} story rows and {s['late_span_batch']} repeated-span rows: the same "
            "tokens per step, more of them stories, which is what the held-out loss needs.")


def decay_words(s: dict) -> str:
    qk = s.get("qk_weight_decay", s["weight_decay"])
    if qk == s["weight_decay"]:
        return f"{s['weight_decay']} on matrices"
    return (f"{s['weight_decay']} on matrices except the query and key projections, which get "
            f"{qk:g}: decay on them caps how large q·k can grow, so how sharp a positional head such "
            "as the previous-token head (RoPE offset 1) can get")


def results(summary: dict) -> str:
    picked = summary["picked"]
    p, pl, ph = best(picked["previous_token"])
    lines = [f"- Held-out loss: **{picked['held_out_loss']:.3f} nats/token** on "
             f"{summary['settings']['held_out_rows']} held-out story rows (target ≤ "
             f"{TARGET_HELD_OUT_LOSS}), against a unigram baseline of "
             f"**{summary['unigram_baseline']:.3f} nats/token** (the entropy of the held-out token "
             "distribution: the best loss a model that ignores context can reach).",
             f"- Best previous-token head: layer {pl}, head {ph}: **{p:.3f}** (target ≥ "
             f"{TARGET_PREVIOUS_TOKEN}).",
             f"- Best induction head at each span (target ≥ {TARGET_INDUCTION} at every span):"]
    for span, m in picked["induction"].items():
        v, il, ih = best(m)
        lines.append(f"  - span {span}: **{v:.3f}** (layer {il}, head {ih})")
    return "\n".join(lines)


def snapshot_section(summary: dict) -> str:
    """The snapshots the run kept, their size and the phase change measured on them ("" when none)."""
    snaps = summary.get("snapshots") or []
    if not snaps:
        return ""
    s = summary["settings"]
    span = str(snaps[0].get("repeated_half_span", 32))
    total = sum(e["bytes"] for e in snaps)
    ind = [(e["step"], best(e["induction"][span])[0]) for e in snaps]
    start = next((st for st, v in ind if v >= 0.2), None)
    end = next((st for st, v in ind if v >= 0.8), None)
    at = {e["step"]: e for e in snaps}
    phase = ""
    if start is not None and end is not None:
        a, b = at[start], at[end]
        phase = (f" On them the best induction score at span {span} first reached 0.2 at step {start} "
                 f"({best(a['induction'][span])[0]:.2f}) and 0.8 at step {end} ({best(b['induction'][span])[0]:.2f}); "
                 f"the loss on the repeated half went from {a['repeated_half_loss']:.2f} to "
                 f"{b['repeated_half_loss']:.2f} nats/token and the held-out loss from {a['held_out_loss']:.3f} to "
                 f"{b['held_out_loss']:.3f}.")
    rows = ["| step | held-out loss | repeated-half loss | best previous-token | best induction (span "
            f"{span}) |", "|---|---|---|---|---|"]
    for e in snaps:
        p, pl, ph = best(e["previous_token"])
        v, il, ih = best(e["induction"][span])
        rows.append(f"| {e['step']} | {e['held_out_loss']:.3f} | {e['repeated_half_loss']:.3f} | {p:.2f} (L{pl}H{ph}) "
                    f"| {v:.2f} (L{il}H{ih}) |")
    return f"""## Snapshots
The model as it was at {len(snaps)} steps of this run is in `checkpoints/step-NNNNN/` (config.json + fp16
model.safetensors, {total / len(snaps) / 1e6:.2f} MB each, {total / 1e6:.1f} MB in all); each loads with
`LlamaForCausalLM.from_pretrained` (the tokenizer is this folder's). A snapshot was saved every
{s.get('snapshot_every', 0)} steps; kept are steps {', '.join(map(str, s['snapshot_steps']))} and every one
across the measured phase change (the best induction or previous-token score at span {span} going from under
0.2 to 0.8, one more on each side), at least {s.get('snapshot_min', len(snaps))} in all. Each was measured from
its saved fp16 weights: the held-out loss, the head scores, and the loss on the second copy of the span-{span}
probe from its second token on.{phase}

{chr(10).join(rows)}
"""


def write_model_card(summary: dict, out: str, cfg) -> None:
    s = summary["settings"]
    picked = summary["picked"]
    size = os.path.getsize(os.path.join(out, "model.safetensors"))
    samples = "\n\n".join(f"**Prompt:** {x['prompt']}\n\n**Greedy:** {x['continuation']}"
                          for x in summary["samples"])
    stop_note = (f"this run hit that limit and stopped at step {summary['steps_run']} of "
                 f"{s['steps']}." if summary.get("stopped_early") else
                 f"this run finished all {s['steps']} steps before it.")
    spans = ", ".join(picked["induction"])
    card = f"""# Transformer Explorer default model

A small Llama-style decoder trained from scratch, on this project's own generated stories, by
`python -m training` (the code in `training/`). It is there to be looked inside: its heads have
clear jobs (previous-token, induction at every distance that fits its context, attention sink),
and its tokens are whole words, so the attention maps read as words.

It loads as it is with `transformers.LlamaForCausalLM.from_pretrained(folder)` /
`AutoTokenizer.from_pretrained(folder)` and with `models.loading.load_pretrained(folder)`.

## Corpus
Simple English stories written by `training/corpus.py` from a seed (seed {s['seed']} for
training, seed {summary['held_out_seed']} for held-out text). Each story has two recurring named
characters referred to by pronouns (she/he, her/his), a recurring object ("a big red kite ... the
red kite") and place, a refrain said more than once, and lists that are recalled later word for
word: shopping lists, animals seen, and a "secret list" of random words read out again. Some
stories contain a plain **random span** of 4-32 words, a gap of 0-12 other words, and the same
span again, with no grammar. Each story row holds {s['seq_len']} input tokens (plus the next token
as the last target) and starts at a story's `<s>`; stories follow one another (`</s> <s>`) until
the row is full.

**Repeated spans.** Every training step has two batches: {s['batch']} story rows and
{s['span_batch']} repeated-span rows, both {s['seq_len']} tokens long{late_sentence(s)} In a repeated-span row,
spans of {s['span'][0]}-{s['span'][1]} distinct random token ids (half the draws uniform in
length, half log-uniform) are each written twice, with 0-{s['max_gap']} tokens between the two
copies and 0-{s['max_lead']} tokens before each pair, over story text in
{s['story_background']:.0%} of the rows and over random tokens from the whole vocabulary in the
rest. The loss is the mean of
the two batches' losses (weighted by their rows), and the repeated-span batch's loss counts only the tokens of the second
copies: the first copies and the filler are random and cannot be predicted, and their ln(V) nats
would drown the copying signal (a run that counted them grew no induction head in 1200 steps).
For the first {s['short_until']:.0%} of training the same tokens come as
{s['short_rows']}× as many rows of {s['seq_len'] // s['short_rows']} tokens with spans of
{s['short_span'][0]}-{s['short_span'][1]} tokens: at initialisation a head's attention spreads
over the whole row, so the one key an induction head needs carries 1/T of it, and on short rows
the circuit forms sooner. A model trained on spans of one range of lengths given back to back
learns "look 16-32 tokens back" rather than "find the earlier occurrence" (its induction vanished
at span 64); with copy distances from {s['span'][0]} to {s['span'][1] + s['max_gap']} tokens, only
the second works. {pool_sentence(s, summary['vocab_size'])} The held-out loss below is measured on
stories only.

## Tokenizer
Byte-pair encoding trained with the `tokenizers` library on {s['tokenizer_stories']:,} training
stories, Metaspace (`▁` marks a word start) plus punctuation splitting, so merges never cross
words. BPE stops when no pair is left to merge, which is when every corpus word is one token:
**{summary['vocab_size']:,} tokens** (the cap was {s['vocab_size']}), of which the ones that are
not whole corpus words are the merge steps on the way and the printable ASCII characters (so any
English text still tokenizes, into pieces). Special tokens: `<pad>` 0, `<s>` 1 (added in front
of every text, as Llama does), `</s>` 2, `<unk>` 3, `<mask>` 4 (used by the encoder in
`assets/encoder-model`, which shares this tokenizer).

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
AdamW (β = 0.9, 0.95; weight decay {decay_words(s)}), learning rate {s['lr']:g}
after {s['warmup']} warmup steps, cosine down to {s['min_lr']:g}, gradient clipping at
{s['grad_clip']}, {summary['steps_run']} steps of story rows and repeated-span rows of
{s['seq_len']} tokens as above
({summary.get('story_tokens', summary['steps_run'] * s['batch'] * s['seq_len']):,} story tokens in all), seed {s['seed']}.
Training took **{summary['train_minutes']:.1f} minutes** ({summary['total_minutes']:.1f} minutes
with the tokenizer, data and evaluation) on {machine_line(summary['machine'])}, CPU, fp32, SDPA
attention. The cores were shared with other work, so times vary from run to run. The loop stops
after {s['max_minutes']:g} minutes whatever the step, keeping the best evaluation so far, so a
rebuild on a busy machine still ends in bounded time; {stop_note}

Every {s['eval_every']} steps the loop measured the held-out loss and the head scores at spans
{spans} (8 probe rows, seed {summary['probe_seed']}); the shipped weights are the evaluation with
the lowest held-out loss among those whose best induction head reaches {TARGET_INDUCTION} at every
span and whose best previous-token head reaches {TARGET_PREVIOUS_TOKEN} (if none did, the one
closest to the induction target at its weakest span): **step {picked['step']}**, weakest-span
induction {worst_span_induction(picked):.3f}.

The repeated-span loss is measured on second copies only: it sits near ln(pool size) until the
model copies, and falls towards zero once induction works.

{history_table(summary['history'])}

{snapshot_section(summary)}
## Results (shipped weights)
{results(summary)}

Head scores (means of attention weights, 0 to 1) on `<s> + r + r`, r = a span of distinct random
token ids from the whole vocabulary, 8 rows: induction = weight on the token after the query
token's earlier occurrence, mean over the second copy; previous-token = weight on the token before
and first-token = weight on position 0 (`<s>`), both means over queries t ≥ 1 of the span-32
probe. Computed by `lens/heads.py` (`head_scores`).

{head_table(picked)}

## Sample greedy generations (shipped weights)
{samples}

## Limits
A toy: it knows about {summary['vocab_size']} tokens of simple story English and nothing else;
words outside the corpus split into letters and pieces it has barely seen. It is not a language
model of anything real, and its stories repeat themselves.
"""
    with open(os.path.join(out, "README.md"), "w") as fh:
        fh.write(card)


def rewrite_card(folder: str) -> dict:
    """Write README.md again from the numbers a training run logged; returns the log."""
    from models import ModelConfig

    with open(os.path.join(folder, "training_log.json")) as fh:
        summary = json.load(fh)
    with open(os.path.join(folder, "config.json")) as fh:
        cfg = ModelConfig.from_hf(json.load(fh))
    write_model_card(summary, folder, cfg)
    return summary
