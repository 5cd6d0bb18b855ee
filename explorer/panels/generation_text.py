"""The generation tab's sentences: the settings in words, which code computed the tokens, and the summary of a
finished run (times with and without the cache, the cache's size, where it was measured)."""
from __future__ import annotations

import math
import statistics

from explorer import glossary, measure, probes

MIN_COMPARED_STEPS = 3  # decode steps timed both ways before the summary says which was faster
MIN_TOKENS_TO_COMPARE = 16  # new tokens that give that many (uncached_schedule times 8 of them)


def settings_text(s: dict) -> str:
    t = "greedy (temperature 0)" if s["temperature"] == 0 else f"temperature {s['temperature']:g}"
    return (f"{t} · top-k {s['top_k'] if s['top_k'] else 'off'} · top-p {s['top_p'] if s['top_p'] else 'off'}"
            f" · seed {s['seed']}")


def path_text(run, s: dict) -> str:
    """Which code computed the tokens, and, for the fast step's, whether the modules pick the same ones."""
    steps = run.steps
    decode = len(steps) - 1  # the steps after the prompt's
    fast = sum(st["fast_step"] for st in steps)
    if s["decode"] == probes.generation.MODULES:
        return ("**Computed by the modules**: every token went through the model's own modules (models/layers.py, "
                "attention.py, ...), the code the other tabs show.")
    if decode == 0:
        return ("**Computed by the modules**: the one new token comes from the prompt's forward, which always runs "
                "through the modules (the fast step computes only the tokens after it).")
    if fast == 0:
        why = run.stood_aside or "a hook or an edit appeared"
        return (f"**Computed by the modules**: you chose the fast step, but it does not compute this model exactly "
                f"({why}), so it stepped aside and the modules computed every token.")
    check = run.check
    where = (f"the prompt and the first new token through the modules, the {decode} tokens after it through **the "
             "fast step**" if fast == decode else
             f"the prompt, the first new token and {decode - fast} of the {decode} after it through the modules, "
             f"{fast} through **the fast step** (it stepped aside where a hook or an edit appeared)")
    # the fast step reads its own fused copy of the weights, so the teaching modules keep load_pretrained's tensors
    copy = (f" It reads its own fused copy of the weights ({measure.format_bytes(run.layout_bytes)} held beside the "
            "model's), so the modules the other tabs show keep their own tensors." if run.layout_bytes else "")
    head = (f"**Computed by the fast step** (models/speed: the same math as flat array operations, not the modules' "
            f"code): {where}.{copy} One forward of the modules over the finished sequence "
            f"({check['seconds'] * 1e3:.0f} ms) ")
    if s["temperature"] == 0:
        differ = [i for i, ok in enumerate(check["same_greedy"]) if not ok]
        if not differ:
            return head + ("picks the same greedy token at every step: **same tokens as the modules on this "
                           f"prompt** (probabilities within {check['max_abs_dprob']:.1g}).")
        return head + (f"picks **another token at step {differ[0]}** ({len(differ)} steps differ): these are not "
                       "the modules' tokens (an edit of the teaching code, which the fast step cannot see, or a "
                       "near-tie rounding broke). Choose “the modules” to see theirs.")
    agree = sum(check["same_top"])
    return head + (f"ranks the same token first at {agree} of {len(steps)} steps, probabilities within "
                   f"{check['max_abs_dprob']:.1g} of the fast step's. Sampled at temperature {s['temperature']:g}, "
                   "the draws decide the tokens: whether the modules would have drawn the same ones is not "
                   "checked here; set temperature 0 to check.")


def summary(run, ctx: dict, s: dict, text_of: dict, config, prov: dict) -> str:
    """The paragraph under the charts: which code computed the tokens, the prompt, the times with and without
    the cache and whether both give the same tokens, the cache's bytes, and where it was measured."""
    steps, c = run.steps, config
    measured = [st for st in steps if st["uncached_seconds"] is not None]
    dlogit = max(st["uncached_max_abs_dlogit"] for st in measured)
    differ = [st["step"] for st in measured if not st["uncached_same_top"]]
    same = ("**identical tokens**: the recomputed logits rank the same token first at every measured step"
            if not differ else f"**the tokens differ** at step {differ[0]} (rounding moved a near-tie)")
    # Step 0 is the prefill, the same forward with or without the cache: compared are the decode steps, by
    # their medians (one step slowed by another process on a shared CPU cannot turn the verdict around).
    compared = [st for st in measured if st["step"] > 0] or measured
    on_ms = statistics.median(st["seconds"] for st in compared) * 1e3
    off_ms = statistics.median(st["uncached_seconds"] for st in compared) * 1e3
    decode_compared = sum(st["step"] > 0 for st in measured)
    if decode_compared < MIN_COMPARED_STEPS:
        # a ratio of one or two decode steps measures the first call's costs and a shared CPU's noise, not the cache
        verdict = (f"too short to compare ({decode_compared} decode step(s) measured both ways; generate at least "
                   f"{MIN_TOKENS_TO_COMPARE} new tokens for a verdict)")
    elif on_ms > 0 and off_ms >= on_ms:
        verdict = f"the cache was **{off_ms / on_ms:.1f}× faster**"
    elif on_ms > 0:
        verdict = (f"the cache was **{on_ms / off_ms:.1f}× slower** on this machine: with a model this small and "
                   "a sequence this short, recomputing costs less than the cache's bookkeeping")
    else:
        verdict = "too fast to compare"
    total = sum(st["seconds"] for st in steps)
    decode = [st["seconds"] for st in steps[1:]]
    tps = len(decode) / sum(decode) if decode and sum(decode) > 0 else float("nan")
    ended = ("stopped at the end token " + text_of[steps[-1]["token"]]
             if steps[-1]["token"] in run.stops else f"{len(steps)} of {s['max_new_tokens']} new tokens")
    shared = sum(st["shared_cores"] for st in steps)
    used = steps[-1]["cache_bytes_used_per_layer"] * c.n_layers
    alloc = steps[0]["cache_bytes_allocated_per_layer"] * c.n_layers
    summary = (
        path_text(run, s) + "\n\n"
        f"**Model:** {ctx['name']} · prompt {len(run.ids)} tokens"
        + (" (wrapped by the chat template)" if ctx["chat"] else "")
        + (" (as plain text: this model's tokenizer has no chat template)"
           if ctx["chat_ignored"] else "") + f" + {len(steps)} new ({ended}) · "
        f"{settings_text(s)}\n\n"
        f"With the cache: {total * 1e3:.1f} ms in all (prefill {steps[0]['seconds'] * 1e3:.1f} ms"
        + (f", then {tps:.0f} tokens/s" if math.isfinite(tps) else "") + "). "
        f"Without the cache, the whole sequence was recomputed at {len(measured)} of the {len(steps)} steps "
        f"(steps {', '.join(str(st['step']) for st in measured)}; not at the others, so the run does not take "
        f"twice as long): a median {off_ms:.1f} ms per token there vs {on_ms:.1f} ms with the cache at the same "
        f"steps" + (" (the prefill, step 0, is the same forward either way)" if len(compared) < len(measured)
                    else "") + f": {verdict}. "
        f"The recomputed next-token {glossary.term('logit', 'logits')} differ from the cached ones by at most "
        f"{dlogit:.2g} ({glossary.term('max |Δlogit|')}): {same}.\n\n"
        f"Cache: {measure.format_bytes(used)} filled of {measure.format_bytes(alloc)} allocated ({c.n_layers} "
        f"layers × {c.n_kv_heads} {glossary.term('KV head', 'KV heads')} × {c.head_dim} dims × 2 (K, V) × "
        f"{prov['dtype']}). Measured on "
        f"{prov['device']}, torch {prov['torch']}."
        + (f" During {shared} of the {len(steps)} steps another measurement was running on the same cores: "
           "those timings may be slower than alone." if shared else ""))
    return summary
