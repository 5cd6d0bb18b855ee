"""Test a claim by changing the model: knock heads out, patch activations, and measure what changes.

Notation: L layers, H query heads, D head dim, T positions, C model dim, V vocabulary, R rows of one batch.

Every intervention runs the model's own modules with edits at its hook points (``lens.hooks.run_with_hooks``):
the code a student reads is the code that is changed. Many interventions share one forward as the rows of a
batch, and an intervention at layer l starts from the unchanged run's residual stream entering l
(``Decoder.forward``'s ``start_at_layer``), so the layers before it are computed once, not once per row.

Head output ``z`` is a head's D values per position before ``o_proj`` (``blocks.{l}.attn.hook_z``, (B, H, T, D)).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import nn

from lens.hooks import as_tokens, check_layer, run_with_cache, run_with_hooks
from models.kv_cache import KVCache
from lens.loss import per_token_loss, token_losses  # noqa: F401 (per_token_loss is part of this API)

HOWS = ("zero", "mean")
SITES = ("resid_pre", "head")
# The most one batch's logits may take (longer prompts run fewer rows at a time): under glibc's largest mmap
# threshold (32 MiB), so a freed batch is reused from the heap, not mapped and page-faulted in again each time.
ROW_BYTES = 24 * 2**20
# The most row-positions one block runs at once (a block's activations take ~25 KB a row-position on the
# SmolLM2-135M shape), and the fewest layer groups a sweep or patching reports progress in.
STAIR_TOKENS = 4096
PROGRESS_STEPS = 5


def check_decoder(model: nn.Module) -> None:
    if not hasattr(model, "lm_head"):
        raise ValueError("interventions measure next-token predictions: load a decoder (the encoder has no LM head).")


def check_heads(model: nn.Module, heads) -> list[tuple[int, int]]:
    """``heads`` as a list of distinct (layer, head) pairs, each in range; ValueError saying which is not."""
    L, H = len(model.blocks), model.config.n_heads
    if isinstance(heads, tuple) and len(heads) == 2 and all(isinstance(x, int) for x in heads):
        heads = [heads]
    out = []
    for pair in heads or []:
        if not (isinstance(pair, Sequence) and len(pair) == 2):
            raise ValueError(f"each head is a (layer, head) pair, got {pair!r}.")
        layer, head = (int(x) if isinstance(x, int) and not isinstance(x, bool) else x for x in pair)
        if not isinstance(layer, int) or not 0 <= layer < L:
            raise ValueError(f"layer must be between 0 and {L - 1}, got {layer!r} in {tuple(pair)}.")
        if not isinstance(head, int) or not 0 <= head < H:
            raise ValueError(f"head must be between 0 and {H - 1}, got {head!r} in {tuple(pair)}.")
        if (layer, head) not in out:
            out.append((layer, head))
    if not out:
        raise ValueError("choose at least one head to knock out, as (layer, head).")
    return out


def check_how(how: str) -> str:
    if how not in HOWS:
        raise ValueError(f"how must be one of {HOWS} (set the head's output to 0, or to its mean over the "
                         f"prompt's positions), got {how!r}.")
    return how


def _knocked_out(z: torch.Tensor, rows: torch.Tensor, heads: torch.Tensor, how: str) -> torch.Tensor:
    """z (R, H, T, D) with head ``heads[i]`` of row ``rows[i]`` zeroed or replaced by its mean over positions."""
    z = z.clone()
    if how == "zero":
        z[rows, heads] = 0.0
    else:
        z[rows, heads] = z[rows, heads].mean(dim=-2, keepdim=True).expand_as(z[rows, heads])
    return z


def ablate_heads(model: nn.Module, tokens, heads, how: str = "zero") -> torch.Tensor:
    """Logits (B, T, V) with every (layer, head) in ``heads`` knocked out at every position.

    how="zero": the head's output z is 0; how="mean": z is replaced by its mean over the prompt's positions
    (each row of the batch its own mean).
    """
    check_decoder(model)
    heads, how = check_heads(model, heads), check_how(how)
    tokens = as_tokens(model, tokens)
    edits = []
    for layer in sorted({lay for lay, _ in heads}):
        hs = torch.tensor([h for lay, h in heads if lay == layer])

        def edit(z: torch.Tensor, point, hs=hs) -> torch.Tensor:  # (B, H, T, D)
            B = z.shape[0]
            rows = torch.arange(B).repeat_interleave(len(hs))
            return _knocked_out(z, rows, hs.repeat(B), how)
        edits.append((f"blocks.{layer}.attn.hook_z", edit))
    return run_with_hooks(model, tokens, edits)


def knockout_before_after(model: nn.Module, tokens, heads, how: str = "zero") -> dict[str, torch.Tensor]:
    """One prompt ``tokens`` (1, T) as it is and with ``heads`` knocked out (``ablate_heads``): "before" and
    "after", the loss of predicting each next token (T - 1,) in nats; "p_before" and "p_after", the last
    position's next-token probabilities (V,) in float64."""
    tokens = _one_sequence(model, tokens, "a knock-out")
    before, _ = run_with_cache(model, tokens, [])
    after = ablate_heads(model, tokens, heads, how)
    return {"before": token_losses(before, tokens)[0], "after": token_losses(after, tokens)[0],
            "p_before": torch.softmax(before[0, -1].double(), -1), "p_after": torch.softmax(after[0, -1].double(), -1)}


def _one_sequence(model: nn.Module, tokens, what: str, min_len: int = 2) -> torch.Tensor:
    t = as_tokens(model, tokens)
    if t.shape[0] != 1 or t.shape[1] < min_len:
        raise ValueError(f"{what} takes one sequence of at least {min_len} tokens, got shape {tuple(t.shape)}.")
    return t


def _layer_groups(L: int, tokens_per_layer: int) -> list[tuple[int, int]]:
    """Consecutive layers [a, b) whose rows run as one staircase (``_staircase``): at most ``STAIR_TOKENS``
    row-positions in all, and at least ``PROGRESS_STEPS`` groups so a long action reports progress."""
    size = max(1, min(-(-L // PROGRESS_STEPS), STAIR_TOKENS // max(1, tokens_per_layer)))
    return [(a, min(L, a + size)) for a in range(0, L, size)]


def _staircase(model: nn.Module, tokens: torch.Tensor, joins: dict, *, start_pos: int = 0,
               kept: KVCache | None = None) -> torch.Tensor:
    """Rows that join one batch block by block, each running from the block it joins at to the last block.

    tokens (1, T') the positions run (T' = T - start_pos); joins {layer j: (x, edit)}: x (r, T', C) the joining
    rows' residual stream entering block j, edit None or ``edit(z) -> z`` for their heads' outputs at block j
    (z (r, H, T', D)). kept: the unchanged run's KV cache (1 row), whose positions before ``start_pos`` every row
    reads. Returns the residual stream leaving the last block (R, T', C), rows in the order they joined.

    The same numbers as one run per row (``Decoder.forward`` from ``start_at_layer``): each block sees each row
    alone, only in a larger batch, so its products fill the CPU's vector units and the model is called once per
    block, not once per block per row.
    """
    first, L, Tn = min(joins), len(model.blocks), tokens.shape[1]
    cache = None
    if start_pos:
        cache = _full_cache(model, sum(x.shape[0] for x, _ in joins.values()), start_pos + Tn)
        for j in range(first, L):
            cache.k[j][:, :, :start_pos] = kept.k[j][:, :, :start_pos]
            cache.v[j][:, :, :start_pos] = kept.v[j][:, :, :start_pos]
    x = None
    for j in range(first, L):
        edits = []
        if j in joins:
            new, edit = joins[j]
            n_old = 0 if x is None else x.shape[0]
            x = new if x is None else torch.cat([x, new])
            if edit is not None:
                def z_edit(z: torch.Tensor, point, n_old=n_old, edit=edit) -> torch.Tensor:  # (R, H, T', D)
                    z = z.clone()
                    z[n_old:] = edit(z[n_old:])  # only the rows joining at this block
                    return z
                edits = [(f"blocks.{j}.attn.hook_z", z_edit)]
        R = x.shape[0]
        if cache is not None:  # block j reads its cache once: the rows present now are its batch
            cache.k[j], cache.v[j] = cache.k[j][:R], cache.v[j][:R]
        x = run_with_hooks(model, tokens.expand(R, Tn), edits, start_pos=start_pos, cache=cache, start_at_layer=j,
                           stop_at_layer=j + 1, resid=x)
    return x


def _logits(model: nn.Module, tokens: torch.Tensor, x: torch.Tensor, rows: int):
    """The LM head on the residual stream leaving the last block, ``rows`` rows at a time: yields (start, logits
    (r, T', V)), tokens (1, T') giving T'."""
    for i in range(0, x.shape[0], rows):
        part = x[i:i + rows]
        yield i, run_with_hooks(model, tokens.expand(part.shape[0], -1), [], start_at_layer=len(model.blocks),
                                resid=part)


def _resid_pre(model: nn.Module, tokens: torch.Tensor, extra: tuple[str, ...] = (), **forward_kwargs):
    """One unchanged forward: logits (1, T, V) and a cache of every layer's resid_pre (1, T, C) and ``extra``."""
    wanted = ("hook_resid_pre",) + extra
    return run_with_cache(model, tokens, lambda n: n.endswith(wanted), **forward_kwargs)


def knockout_sweep(model: nn.Module, tokens, how: str = "zero") -> dict:
    """Knock out each head in turn: the loss at every position with each head gone.

    Returns {"base": (T - 1,) nats, "knocked": (L, H, T - 1) nats}; ``knocked[l, h] - base`` is what head (l, h)
    does for each prediction of this prompt. Row (l, h) starts at block l from the unchanged run's residual stream
    (the blocks before it are computed once), in a staircase of rows (``_staircase``).
    """
    for _, _, result in iter_knockout_sweep(model, tokens, how):
        pass
    return result


def iter_knockout_sweep(model: nn.Module, tokens, how: str = "zero"):
    """``knockout_sweep`` a group of layers at a time: yields (layers done, L, result so far) after each group,
    the rows of the layers not done yet NaN, so a caller that stops early keeps what was computed."""
    check_decoder(model)
    how = check_how(how)
    tokens = _one_sequence(model, tokens, "a knock-out sweep")
    c = model.config
    L, H, T = len(model.blocks), c.n_heads, tokens.shape[1]
    logits, cache = _resid_pre(model, tokens)
    base = token_losses(logits, tokens)[0]  # (T - 1,)
    knocked = torch.full((L, H, T - 1), float("nan"), device=tokens.device)
    heads = torch.arange(H)

    def edit(z: torch.Tensor) -> torch.Tensor:  # (H, H, T, D): row i loses head i
        return _knocked_out(z, heads, heads, how)
    for a, b in _layer_groups(L, H * T):
        joins = {j: (cache[f"blocks.{j}.hook_resid_pre"].expand(H, T, -1), edit) for j in range(a, b)}
        x = _staircase(model, tokens, joins)  # (rows (j, h) for j in a..b-1, T, C)
        losses = torch.empty(x.shape[0], T - 1, device=tokens.device)
        # one layer's rows at a time at most: already a tall product, and the logits and their log-softmax stay small
        for i, out in _logits(model, tokens, x, max(1, min(H, ROW_BYTES // (4 * T * c.vocab_size)))):
            losses[i:i + out.shape[0]] = token_losses(out, tokens.expand(out.shape[0], T))
        knocked[a:b] = losses.view(b - a, H, T - 1)
        yield b, L, {"base": base, "knocked": knocked}


def check_answer(model: nn.Module, answer) -> tuple[int, int]:
    V = model.config.vocab_size
    if not (isinstance(answer, Sequence) and len(answer) == 2):
        raise ValueError(f"answer is a (good_id, bad_id) pair of token ids, got {answer!r}.")
    good, bad = answer
    for name, x in (("good", good), ("bad", bad)):
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < V:
            raise ValueError(f"the {name} answer must be a token id between 0 and {V - 1}, got {x!r}.")
    if good == bad:
        raise ValueError("the two answers are the same token: choose two different ones.")
    return good, bad


def logit_diff(logits: torch.Tensor, answer: tuple[int, int]) -> torch.Tensor:
    """logits (R, T, V) -> (R,): logit(good) - logit(bad) at the last position, fp32."""
    last = logits[:, -1].float()
    return last[:, answer[0]] - last[:, answer[1]]


def check_pair(model: nn.Module, clean, corrupt) -> tuple[torch.Tensor, torch.Tensor]:
    clean = _one_sequence(model, clean, "patching's clean prompt", 1)
    corrupt = _one_sequence(model, corrupt, "patching's corrupted prompt", 1)
    if clean.shape != corrupt.shape:
        raise ValueError(f"the clean prompt has {clean.shape[1]} tokens and the corrupted one {corrupt.shape[1]}: "
                         "patching swaps activations position by position, so give both the same length.")
    return clean, corrupt


def patched_metrics(model: nn.Module, target, source, site: str, answer) -> torch.Tensor:
    """logit(good) - logit(bad) at the last position of ``target`` with one activation of ``source`` put in.

    site="resid_pre": (L, T), entry [l, p] with the residual stream entering block l at position p taken from
    ``source``; site="head": (L, H), entry [l, h] with head h's output z at layer l, every position, taken from
    ``source``. ``patch`` turns these into fractions recovered.
    """
    return torch.stack([row for _, row in _patched_rows(model, target, source, site, answer)])


def _patched_rows(model: nn.Module, target, source, site: str, answer, runs: "_Runs | None" = None):
    """``patched_metrics`` a layer at a time: yields (layer, its row (T,) or (H,)). ``runs``: the two unchanged
    runs when the caller has them (``_unchanged_runs``)."""
    check_decoder(model)
    if site not in SITES:
        raise ValueError(f"site must be one of {SITES}, got {site!r}.")
    answer = check_answer(model, answer)
    target, source = check_pair(model, target, source)
    runs = _unchanged_runs(model, target, source, site == "head") if runs is None else runs
    if site == "resid_pre":
        return _patch_resid_pre(model, target, runs, answer)
    return _patch_heads(model, target, source, runs, answer)


class _Runs(NamedTuple):
    """The unchanged runs patching starts from: the source's activations (``src``), the target's (``tgt``), the
    target's logits (1, T, V) and KV cache (``kept``: every position of every layer), the source's logits."""
    src: dict
    tgt: dict
    logits: torch.Tensor
    kept: KVCache
    source_logits: torch.Tensor


def _unchanged_runs(model: nn.Module, target: torch.Tensor, source: torch.Tensor, heads: bool) -> _Runs:
    """One forward of each prompt: the source's resid_pre (and, with ``heads``, every head's z), the target's
    resid_pre, logits and KV cache. Both sites of a patching experiment start from the same two runs."""
    source_logits, src = _resid_pre(model, source, ("attn.hook_z",) if heads else ())
    kept = _full_cache(model, 1, target.shape[1])
    logits, tgt = _resid_pre(model, target, cache=kept)
    return _Runs(src, tgt, logits, kept, source_logits)


def _patch_resid_pre(model: nn.Module, target: torch.Tensor, runs: _Runs, answer):
    """Yields (layer, (T,)), a group of layers at a time. A patch at position p leaves every position before p as
    it was (attention looks back only), so patches at positions >= q run positions q.. alone, reading the earlier
    keys and values from the unchanged run's KV cache; the patches of a group of layers run as one staircase."""
    L, T = len(model.blocks), target.shape[1]
    src, tgt, kept = runs.src, runs.tgt, runs.kept
    unchanged = logit_diff(runs.logits, answer)[0]
    step = max(1, -(-T // 6))  # positions per staircase: rows of one batch compute positions q.. whatever their p
    out = torch.full((L, T), float(unchanged), device=target.device)
    todo = []
    for layer in range(L):
        same = (src[f"blocks.{layer}.hook_resid_pre"][0] == tgt[f"blocks.{layer}.hook_resid_pre"][0]).all(-1)
        todo.append(torch.nonzero(~same).flatten())  # a shared prefix: the same residual in both runs, no swap
    for a, b in _layer_groups(L, step * T):
        for lo in range(0, T, step):
            joins, rows = {}, []
            idx = {j: todo[j][(todo[j] >= lo) & (todo[j] < lo + step)] for j in range(a, b)}
            if not any(len(i) for i in idx.values()):
                continue
            q = min(int(i[0]) for i in idx.values() if len(i))  # the first position this staircase changes
            for j, i in idx.items():
                if len(i):
                    x = tgt[f"blocks.{j}.hook_resid_pre"][0, q:].expand(len(i), T - q, -1).clone()  # (r, T - q, C)
                    x[torch.arange(len(i)), i - q] = src[f"blocks.{j}.hook_resid_pre"][0, i]
                    joins[j] = (x, None)
                    rows += [(j, int(p)) for p in i]
            x = _staircase(model, target[:, q:], joins, start_pos=q, kept=kept)
            for i, logits in _logits(model, target[:, -1:], x[:, -1:], len(rows)):
                for (j, p), m in zip(rows, logit_diff(logits, answer)):
                    out[j, p] = m
        for layer in range(a, b):
            yield layer, out[layer]


def _full_cache(model: nn.Module, batch: int, T: int) -> KVCache:
    """A cache holding every position of every layer (a sliding-window layer's too, its window applied by the mask),
    so a prefix of it can be copied position for position."""
    c, p = model.config, model.embed_tokens.weight
    return KVCache(c.n_layers, batch, c.n_kv_heads, T, c.head_dim, dtype=p.dtype, device=p.device)


def _patch_heads(model: nn.Module, target: torch.Tensor, source: torch.Tensor, runs: _Runs, answer):
    """Yields (layer, (H,)), a group of layers at a time: row (l, h) starts at block l from the unchanged run's
    residual stream, at the first position where the two prompts differ (before it both runs are the same, so a
    head's output there is the same too), the earlier keys and values read from the unchanged run's KV cache."""
    c = model.config
    L, H, T = len(model.blocks), c.n_heads, target.shape[1]
    differ = torch.nonzero(target[0] != source[0]).flatten()
    q = min(int(differ[0]), T - 1) if len(differ) else T - 1
    src, tgt, kept = runs.src, runs.tgt, runs.kept
    heads = torch.arange(H)
    for a, b in _layer_groups(L, H * (T - q)):
        joins = {}
        for j in range(a, b):
            z_src = src[f"blocks.{j}.attn.hook_z"][0, :, q:]  # (H, T - q, D)

            def edit(z: torch.Tensor, z_src=z_src) -> torch.Tensor:  # (H, H, T - q, D): row i gets head i's z
                z = z.clone()
                z[heads, heads] = z_src
                return z
            joins[j] = (tgt[f"blocks.{j}.hook_resid_pre"][:, q:].expand(H, T - q, -1), edit)
        x = _staircase(model, target[:, q:], joins, start_pos=q, kept=kept)
        (_, logits), = _logits(model, target[:, -1:], x[:, -1:], x.shape[0])
        metric = logit_diff(logits, answer).view(b - a, H)
        for layer in range(a, b):
            yield layer, metric[layer - a]


def patch(model: nn.Module, clean, corrupt, site: str, answer) -> torch.Tensor:
    """Activation patching: the fraction of the clean run's answer recovered in the corrupted run when one
    activation is taken from the clean run.

    clean, corrupt: (1, T) token ids of the same length; answer: (good_id, bad_id). The metric is
    logit(good) - logit(bad) at the last position; the result is (patched - corrupt) / (clean - corrupt):
    1 where the patch brings the clean answer back entirely, 0 where it changes nothing.
    site="resid_pre" -> (L, T); site="head" -> (L, H) (see ``patched_metrics``).
    """
    check_decoder(model)
    answer = check_answer(model, answer)
    clean, corrupt = check_pair(model, clean, corrupt)
    m_clean, m_corrupt = _answer_gap(model, clean, corrupt, answer)
    return (patched_metrics(model, corrupt, clean, site, answer) - m_corrupt) / (m_clean - m_corrupt)


def patching_experiment(model: nn.Module, clean, corrupt, answer) -> dict:
    """What the Experiments tab shows for one pair: ``patch`` at both sites ("resid_pre" (L, T), "head" (L, H)),
    and the logit differences of the clean and corrupted runs ("clean", "corrupt", floats)."""
    for _, _, result in iter_patching_experiment(model, clean, corrupt, answer):
        pass
    return result


def iter_patching_experiment(model: nn.Module, clean, corrupt, answer):
    """``patching_experiment`` a layer at a time: yields (steps done, steps in all, result so far) after each layer
    of each site (resid_pre's layers, then the heads'), the entries not computed yet NaN."""
    check_decoder(model)
    answer = check_answer(model, answer)
    clean, corrupt = check_pair(model, clean, corrupt)
    runs = _unchanged_runs(model, corrupt, clean, heads=True)  # the corrupted run patched from the clean one
    m_clean, m_corrupt = _answer_gap(model, clean, corrupt, answer, runs)
    L, H, T = len(model.blocks), model.config.n_heads, clean.shape[1]
    nan = float("nan")
    out = {"resid_pre": torch.full((L, T), nan), "head": torch.full((L, H), nan), "clean": m_clean,
           "corrupt": m_corrupt}
    done = 0
    for site in ("resid_pre", "head"):
        for layer, row in _patched_rows(model, corrupt, clean, site, answer, runs):
            out[site][layer] = ((row - m_corrupt) / (m_clean - m_corrupt)).to(out[site].device)
            done += 1
            yield done, 2 * L, out


def _answer_gap(model: nn.Module, clean: torch.Tensor, corrupt: torch.Tensor, answer,
                runs: _Runs | None = None) -> tuple[float, float]:
    """logit(good) - logit(bad) at the last position of the clean and the corrupted run; a sentence when they
    are equal (no gap for a patch to recover). ``runs``: both runs already made (the corrupted one patched from the
    clean one: their logits are read)."""
    with torch.inference_mode():
        both = [_resid_pre(model, t)[0] for t in (clean, corrupt)] if runs is None else [runs.source_logits,
                                                                                          runs.logits]
        ends = logit_diff(torch.cat(both), answer)
    m_clean, m_corrupt = float(ends[0]), float(ends[1])
    if abs(m_clean - m_corrupt) < 1e-6 * max(1.0, abs(m_clean)):
        raise ValueError(f"the clean and corrupted prompts give the same logit difference ({m_clean:.4g}): nothing is "
                         "left to recover; choose prompts whose answers differ.")
    return m_clean, m_corrupt


def check_circuit_heads(model: nn.Module, previous, induction) -> tuple[tuple[int, int], tuple[int, int]]:
    (p,), (i,) = check_heads(model, [previous]), check_heads(model, [induction])
    if p[0] >= i[0]:
        raise ValueError(f"the previous-token head (layer {p[0]}) must sit in an earlier layer than the induction "
                         f"head (layer {i[0]}) for it to feed it.")
    return p, i


def induction_circuit(model: nn.Module, tokens, previous, induction, span_len: int, how: str = "zero") -> dict:
    """Loss on the repeated half of ``tokens`` (``[prefix] + r + r``, the second copy its last ``span_len``
    tokens) with neither head, each, and both knocked out: {"neither", "previous", "induction", "both"},
    each (B,) mean nats per token over the second copy's predictions."""
    check_decoder(model)
    previous, induction = check_circuit_heads(model, previous, induction)
    tokens = as_tokens(model, tokens)
    T = tokens.shape[1]
    if not isinstance(span_len, int) or not 1 <= span_len <= (T - 1) // 2:
        raise ValueError(f"span_len must be between 1 and {(T - 1) // 2} for {T} tokens, got {span_len!r}.")
    second = slice(T - span_len - 1, T - 1)  # predictions of the second copy's tokens (positions T - span .. T - 1)
    out = {}
    with torch.inference_mode():
        for name, heads in (("neither", []), ("previous", [previous]), ("induction", [induction]),
                            ("both", [previous, induction])):
            logits = ablate_heads(model, tokens, heads) if heads else run_with_hooks(model, tokens, [])
            out[name] = token_losses(logits, tokens)[:, second].mean(-1)
    return out


__all__ = ["ablate_heads", "patch", "per_token_loss", "knockout_sweep", "iter_knockout_sweep", "patched_metrics",
           "iter_patching_experiment", "induction_circuit",
           "logit_diff", "check_heads", "check_layer"]
