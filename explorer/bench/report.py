"""The benchmark's markdown report, from the report dict ``run_bench`` writes as JSON."""
from __future__ import annotations

from typing import Any

from explorer import measure

def _mark(p: bool | None) -> str:
    return "—" if p is None else ("pass" if p else "**FAIL**")


def _f(x: float | None, fmt: str = "{:.3f}") -> str:
    return "—" if x is None else fmt.format(x)



def render_markdown(report: dict[str, Any]) -> str:
    m, s = report["machine"], report["settings"]
    lines = [f"# Transformer Explorer benchmark ({s['mode']})", "",
             f"{m['date']} · {m['cpu']} · {m['cores']} cores ({m['torch_threads']} torch threads) · "
             f"torch {m['torch']} · transformers {m.get('transformers', '—')} · device {m['device']}"
             f"{' (' + m['gpu'] + ')' if m.get('gpu') else ''} · dtype {m['dtype']}"
             f"{' · one-token products: ' + m['decode_blas'] if m.get('decode_blas') else ''}", ""]
    for note in report["notes"]:
        lines.append(f"- {note}")
    lines += ["", "## Targets", "", "| target | measured | result | from |", "|---|---|---|---|"]
    for t in report["targets"]:
        lines.append(f"| {t['target']} | {t['measured']} | {_mark(t['pass'])} | {t['source']} |")
    lines += ["", "## (a) Attention: naive vs sdpa vs tiled",
              "", "8 heads, head_dim 64, batch 1, causal, one call measured for memory (peak above the inputs; "
              f"{report['attention_memory_source']}), median of {s['attn_repeats']} timed call(s) after a warm-up. "
              "Predicted = the analytic count in explorer/measure/predict.py.", "",
              "| T | impl | measured peak | predicted | measured/predicted | seconds | naive/impl memory | "
              "naive/impl time | max abs diff vs naive |", "|---|---|---|---|---|---|---|---|---|"]
    for r in report["attention"]:
        if r["refused"]:
            lines.append(f"| {r['seq_len']} | {r['impl']} | refused | {measure.format_bytes(r['predicted_bytes'])} "
                         f"| — | — | — | — | over the budget of {measure.format_bytes(report['budget_bytes'])} |")
            continue
        lines.append(
            f"| {r['seq_len']} | {r['impl']} | {measure.format_bytes(r['peak_bytes'])} | "
            f"{measure.format_bytes(r['predicted_bytes'])} | {_f(r['measured_over_predicted'])} | "
            f"{_f(r['seconds'], '{:.4f}')} | {_f(r['naive_over_impl_memory'], '{:.1f}x')} | "
            f"{_f(r['naive_over_impl_time'], '{:.1f}x')} | {_f(r['max_abs_diff'], '{:.1e}')} |")
    c, cfg = report["cache"], report["model"]
    lines += ["", f"## (b) KV cache: greedy decoding of {c['new_tokens']} tokens", "",
              f"Model: {cfg['description']}. Prompt {c['prompt_len']} tokens; cached = models.generate with the "
              "preallocated cache and the fast step (models.speed.fast_step), uncached = the whole sequence "
              "recomputed by the modules every step.", "",
              "| | seconds | tokens/s |", "|---|---|---|",
              f"| cached | {c['cached_seconds']:.2f} | {c['cached_tokens_per_s']:.1f} |",
              f"| uncached | {c['uncached_seconds']:.2f} | {c['uncached_tokens_per_s']:.1f} |", "",
              f"Speed-up {c['speedup']:.1f}x. The tokens are "
              f"{'identical' if c['tokens_identical'] else 'NOT identical'} with and without the cache.", ""]
    v = report["vs_transformers"]
    d = v["decode"]
    lines += ["## (c) Our decoder vs transformers' LlamaForCausalLM (same random weights)", "",
              f"Model: {cfg['description']}; transformers loads our save_pretrained folder with "
              f"attn_implementation=\"sdpa\". Max |logit difference| on a 32-token probe: "
              f"{v['max_abs_logit_diff']:.1e}. Runs interleaved, ours and theirs alternating who goes first; "
              "medians.", "",
              "| measurement | ours | transformers | ratio |", "|---|---|---|---|"]
    for T, p in v["prefill"].items():
        lines.append(f"| prefill T={T}, full logits (ms) | {p['ours_seconds'] * 1e3:.1f} | "
                     f"{p['transformers_seconds'] * 1e3:.1f} | ours/theirs time {p['ours_over_transformers']:.2f} |")
    lines += [f"| greedy decode {d['new_tokens']} tokens after {d['prompt_len']} (tokens/s; ours: the fast step) | "
              f"{d['ours_tokens_per_s']:.1f} | {d['transformers_tokens_per_s']:.1f} | "
              f"ours/theirs speed {d['ours_over_transformers']:.2f}x |",
              f"| fraction of the bandwidth bound | {d['ours_fraction_of_bound']:.0%} | "
              f"{d['transformers_fraction_of_bound']:.0%} | |", "",
              f"Decoded tokens ours vs transformers: {'identical' if d['tokens_identical'] else 'different'}. "
              f"Bandwidth bound: {measure.format_bytes(d['weight_bytes_per_token'])} of weights read per token / "
              f"{d['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s measured copy bandwidth (read + write of a "
              f"{measure.format_bytes(report['settings']['bandwidth_bytes'])} tensor) = "
              f"{d['bound_tokens_per_s']:.1f} tokens/s.", "",
              ]
    if report.get("formats"):
        from .formats import render_formats

        lines += render_formats(report["formats"])
    app = report.get("app", {})
    lines += ["## (d) The app: Attention tab, one update", ""]
    if "skipped" in app:
        lines += [f"Skipped: {app['skipped']}.", ""]
    else:
        lines += ["The Attention tab's handlers called as the app calls them, the model as a user's own. First "
                  "answer: the result cache emptied first, so everything is computed (the forward with every head's "
                  "weights, the induction probe, head scores, every figure); naive vs fused: the /attention_impls "
                  "follow-up the app chains after every answer (two more forwards, the answer's own reused); head "
                  "switch: the same prompt at the last layer and head right after (the forward reused, figures "
                  f"built). Median of {report['settings']['app_repeats']} after a warm-up. Payload = the JSON of "
                  "the larger of the first answer's and the switch's outputs.", "",
                  "| model | parameters | prompt tokens | first answer (ms) | naive vs fused follow-up (ms) | "
                  "head switch (ms) | payload |", "|---|---|---|---|---|---|---|"]
        for name, a in app.items():
            switch = f"{a['switch_seconds'] * 1e3:.0f}" if "switch_seconds" in a else "—"
            impls = f"{a['impls_seconds'] * 1e3:.0f}" if "impls_seconds" in a else "—"
            lines.append(f"| {name} | {a['parameters'] / 1e6:.1f}M | {a['tokens']} | {a['seconds'] * 1e3:.0f} | "
                         f"{impls} | {switch} | {measure.format_bytes(a['payload_bytes'])} |")
        lines.append("")
        for name, a in app.items():
            if a.get("breakdown_seconds"):
                parts = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in a["breakdown_seconds"].items())
                lines.append(f"- {name}, the parts of a first answer timed alone: {parts}.")
        lines.append("")
    ind = report.get("induction")
    if ind:
        lines += ["## Induction at several spans (shipped default model)", "",
                  f"Best induction head score on {ind['batch']} rows of "
                  f"{'`<s>` + r + r' if ind['bos_first'] else 'r + r'} (r random distinct tokens, seed {ind['seed']}).",
                  "", "| span | best score | layer | head |", "|---|---|---|---|"]
        for span, r in ind["spans"].items():
            lines.append(f"| {span} | {r['best']:.3f} | {r['layer']} | {r['head']} |")
        lines.append("")
    tr = report.get("training") or {}
    if "step_cold_seconds" in tr:
        ms = lambda d: f"{d['median'] * 1e3:.0f} | {d['max'] * 1e3:.0f}"  # noqa: E731
        lines += ["## Training tab (shipped model's snapshots)", "",
                  f"{tr['snapshots']} snapshots, {measure.format_bytes(tr['total_bytes'])} on disk. Each answer of the "
                  "step slider: scores, pattern, 24-token continuation, figures and the JSON sent.", "",
                  "| row | median ms | slowest ms |", "|---|---|---|",
                  f"| snapshot read from disk (fp16 file to a float32 model) | {ms(tr['load_seconds'])} |",
                  f"| step answer, snapshot read from disk first | {ms(tr['step_cold_seconds'])} |",
                  f"| step answer, snapshot in memory | {ms(tr['step_warm_seconds'])} |", "",
                  f"Largest answer sent: {measure.format_bytes(tr['payload_bytes'])}.", ""]
    lines += _load_lines(report.get("load") or {})
    lines += _vote_lines(report.get("vote") or {})
    lines += ["## (e) Machine", "", "| | |", "|---|---|"]
    for k, val in m.items():
        lines.append(f"| {k} | {val} |")
    lines += ["", f"Total benchmark time {report['wall_seconds']:.0f} s.", ""]
    return "\n".join(lines)


def _vote_lines(vote: dict[str, Any]) -> list[str]:
    """(g) A lecture hall votes: 200 phones through the phone page, 120 behind one campus address."""
    lines = ["## (g) A lecture hall votes from their phones", ""]
    if "skipped" in vote or "rounds" not in vote:
        return lines + [f"Skipped: {vote.get('skipped', 'not measured')}.", ""]

    def fmt(d, digits=2):
        return "—" if not d or d["p50"] is None else " / ".join(f"{d[k]:.{digits}f}" for k in ("p50", "p95", "max"))

    lines += [
        "`python app.py` in its own process with `EXPLORER_PROXY_HOPS=1` (explorer/bench/vote.py): a teacher's "
        f"session asks the walkthrough's question and polls the tally once a second as its page's timer does; "
        f"{vote['phones']} phones open the phone page over 30 s ({vote['campus']} behind one campus address in "
        "X-Forwarded-For, the rest an address each), hold a long poll and vote 0.5-3 s after each question reaches "
        "them, a tenth reloading and voting again (plain HTTP/1.1, each phone its own connections, in two processes "
        "of their own: explorer/bench/phones.py). Three questions in the one room: while the phones join, with the "
        f"server otherwise idle, and while {vote['visitors']} other sessions ask the Attention tab. Where an ack "
        "went: its vote's time on the server (arrival in the middleware to answer), and the worst lag of the "
        "server's and the phones' event loops while the question's votes came.", "",
        "| question | votes (voters) | ack p50 / p95 / max (s) | on the server p50 / p95 / max (s) | loop lag: "
        "server / phones (s) | Ask pressed to phone p50 / p95 / max (s) | tally after the last vote (s) | exact | "
        "attention answered meanwhile |", "|---|---|---|---|---|---|---|---|---|"]

    def lag(x):
        return "—" if x is None else f"{x:.2f}"

    for name, r in vote["rounds"].items():
        if "failed" in r:
            lines.append(f"| {name} | failed: {r['failed']} | | | | | | | |")
            continue
        tally = r["tally_after_last_vote"]
        lines.append(f"| {name} | {r['votes']} ({r['voters']}) | {fmt(r['ack_seconds'])} | "
                     f"{fmt(r.get('server_vote_seconds'), 3)} | {lag(r.get('server_lag_max'))} / "
                     f"{lag(r.get('phones_lag_max'))} | "
                     f"{fmt(r['ask_to_phone_seconds'])} | {'—' if tally is None else f'{tally:.2f}'} | "
                     f"{'yes' if r['exact'] else 'NO'} | {r['attention_answered']} |")
    return lines + ["", f"{vote['joined']} of {vote['phones']} phones joined; {vote['refused_429']} requests "
                    f"answered 429; {vote['failures']} failures.", ""]


def _load_lines(load: dict[str, Any]) -> list[str]:
    """(f) Classroom load: the sessions opening the page at once, and the three-client check."""
    lines = ["## (f) Classroom load: many sessions opening the page at once", ""]
    if "skipped" in load or not load.get("classes"):
        return lines + [f"Skipped: {load.get('skipped', 'not measured')}.", ""]
    lines += ["`python app.py` with its default settings in its own process, clients on loopback "
              "(explorer/bench/load.py): each session gets the page (its opening examples inside, computed once at "
              "start-up), fires the events the page sends on opening (none without a link; with a link, its "
              "tab's link trigger and that tab's view), then asks the Attention tab a prompt no other session "
              "sent. One warm-up visitor first.", "",
              "| sessions | events on opening | page | page ready p50 / p95 / max (s) | attention after it p50 / p95 / max (s) "
              "| refused | failed | server CPU (s) | server RSS before → after |", "|---|---|---|---|---|---|---|---|---|"]

    def q(d):
        return "—" if d["p50"] is None else f"{d['p50']:.2f} / {d['p95']:.2f} / {d['max']:.2f}"

    for n, r in load["classes"].items():
        name = f"{n} at `?{r['query']}`" if r.get("query") else n
        lines.append(f"| {name} | {r['events_per_page']} | {r.get('page_bytes', 0) / 2**10:.0f} KiB | "
                     f"{q(r['page_ready_seconds'])} | {q(r['attention_seconds'])} | "
                     f"{r['refused']} | {r['failed']} | {r.get('server_cpu_seconds', 0):.1f} | "
                     f"{r['rss_before'] / 2**20:.0f} → {r['rss_after'] / 2**20:.0f} MiB |")
    three = load.get("three_clients") or {}
    if three:
        a = three.get("attention_seconds")
        lines += ["", f"Three clients at once (a memory sweep, a generation, then an attention question): the "
                      f"attention answer took {'—' if a is None else f'{a * 1e3:.0f} ms'}; the sweep was "
                      f"{'still running' if three.get('sweep_still_running') else 'already done'} when it came."]
    return lines + [""]
