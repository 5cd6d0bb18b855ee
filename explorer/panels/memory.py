"""Memory lab tab: naive vs flash (SDPA) vs tiled attention, measured memory and time beside the analytic
predictions, and the tiled algorithm stepped block by block."""
from __future__ import annotations

import threading
import time
from typing import Any, NamedTuple

import gradio as gr

from explorer.web import links
from explorer.web.groups import MEASURE, PLAY, VIEW, lane
from lens import device as dev
from lens.device import gpu
from explorer import measure
from explorer.state import session
from explorer.state.cache import results
from explorer.state.openings import pin
from explorer.measure.run import STILL_RUNNING, abandonable
from explorer.figures import memory as figs

from explorer.panels.controls import as_whole, outputs_of
from explorer.panels.errors import user_errors
from explorer.state.openings import cached_opening

IMPLS = ("naive", "sdpa", "tiled")
DTYPE_CHOICES = ("float32", "bfloat16", "float16")
MIN_T, MAX_T = 128, 16384
SWEEP_SECONDS = 90.0  # a sweep stops before a size predicted to take it past this
OPENING = dict(max_T=1024, n_heads=8, head_dim=64, n_kv_heads=8, impls=list(IMPLS), causal=True, dtype="float32")
REPEATS = 3
TRACE_HEADS, TRACE_HEAD_DIM = 2, 16

INTRO = """### Memory lab: naive vs flash attention, measured side by side
Naive attention builds the whole T×T score matrix, so its memory grows with the square of the sequence
length; SDPA (PyTorch's fused flash kernel) and our tiled version read the keys in blocks and keep only a
running max and sum per row, so theirs grows linearly. Solid lines are measured now on this machine,
dashed lines are the predictions; on log axes T² is a line twice as steep as T. Our tiled version is
written in PyTorch, one small matmul per block of keys, so on a CPU it trades speed for memory: it saves the
T×T matrix but pays Python's overhead for every block, where SDPA runs the same algorithm in one compiled kernel."""

TRACE_INTRO = """#### The tiled algorithm, one key block at a time
Each step reads one block of keys (red outline). Every query row keeps a running maximum *m* of its
scores and a running sum *l* of exp(score − m); when a new block raises the maximum, the old sum and the
partial output are scaled down by exp(m_old − m_new). Move the slider: the output on the right takes its
final shape without the T×T matrix ever being stored."""


def sweep_lengths(max_T: int) -> list[int]:
    """Powers of two from 128 up to ``max_T`` (and ``max_T`` itself when it is not one)."""
    lens, t = [], MIN_T
    while t <= max_T:
        lens.append(t)
        t *= 2
    if lens[-1] != max_T:
        lens.append(max_T)
    return lens


def _check_request(max_T, n_heads, head_dim, n_kv_heads, impls, causal, dtype) -> dict:
    max_T = as_whole(max_T, "max sequence length", MIN_T, MAX_T)
    n_heads = as_whole(n_heads, "heads", 1, 64)
    head_dim = as_whole(head_dim, "head_dim", 8, 256)
    n_kv_heads = as_whole(n_kv_heads, "KV heads", 1, 64)
    if n_heads % n_kv_heads:
        divisors = [d for d in range(1, n_heads + 1) if n_heads % d == 0]
        raise ValueError(f"KV heads ({n_kv_heads}) must divide the {n_heads} query heads: choose one of {divisors}.")
    if isinstance(impls, str):
        impls = [impls]
    if impls is not None and not isinstance(impls, (list, tuple)):
        raise ValueError(f"Tick at least one implementation among {list(IMPLS)}.")
    impls = [i for i in IMPLS if i in (impls or [])]
    if not impls or set(impls or []) - set(IMPLS):
        raise ValueError(f"Tick at least one implementation among {list(IMPLS)}.")
    if dtype not in DTYPE_CHOICES:
        raise ValueError(f"dtype must be one of {list(DTYPE_CHOICES)}, got {dtype!r}.")
    return dict(max_T=max_T, n_heads=n_heads, head_dim=head_dim, n_kv_heads=n_kv_heads, impls=impls,
                causal=bool(causal), dtype=dtype)


def _summary(rows: list[dict], req: dict, notes: list[str], elapsed: float) -> str:
    done = [r for r in rows if r["peak_bytes"] is not None]
    if not done:
        return "Nothing measured yet."
    T = max(r["seq_len"] for r in done)
    at = {r["impl"]: r for r in done if r["seq_len"] == T}
    parts = [f"**At T = {T}** ({req['n_heads']} heads × {req['head_dim']} dims, {req['n_kv_heads']} KV heads, "
             f"{req['dtype']}, {'causal' if req['causal'] else 'bidirectional'}):"]
    for impl, r in at.items():
        agree = r["peak_bytes"] / r["predicted_bytes"] if r["predicted_bytes"] else float("nan")
        diff = "" if r["max_abs_diff"] is None else f", max |out − naive out| {r['max_abs_diff']:.2e}"
        parts.append(f"- **{impl}**: peak {measure.format_bytes(r['peak_bytes'])} measured vs "
                     f"{measure.format_bytes(r['predicted_bytes'])} predicted (×{agree:.2f}), "
                     f"{r['seconds'] * 1e3:.2f} ms{diff}")
    if "naive" in at and len(at) > 1:
        best = min((r for i, r in at.items() if i != "naive"), key=lambda r: r["peak_bytes"])
        if best["peak_bytes"]:
            parts.append(f"\nNaive needs **{at['naive']['peak_bytes'] / best['peak_bytes']:.0f}×** the memory of "
                         f"{best['impl']} here.")
    run = measure.runtime_info(device=dev.device(), dtype=req["dtype"])
    parts.append(f"\nMeasured on {run['device']} with torch {run['torch']} in {elapsed:.1f} s "
                 f"(median of {REPEATS} calls; peak memory from "
                 f"{done[0].get('memory_source') or 'the allocator'}). Budget: "
                 f"{measure.format_bytes(measure.MEMORY_BUDGET_BYTES)} per request.")
    parts += notes
    return "\n".join(parts)


def _table(rows: list[dict]) -> list[list]:
    out = []
    for r in rows:
        out.append([r["seq_len"], r["impl"],
                    r["peak_bytes"] if r["peak_bytes"] is not None else "",
                    r["predicted_bytes"],
                    round(r["seconds"] * 1e3, 4) if r["seconds"] is not None else "",
                    f"{r['max_abs_diff']:.2e}" if r["max_abs_diff"] is not None else ""])
    return out


TABLE_HEADERS = ["T", "implementation", "measured peak (bytes)", "predicted peak (bytes)", "time (ms)",
                 "max |Δ| vs naive"]


def _figure(rows: list[dict], req: dict):
    prov = measure.runtime_info(device=dev.device(), dtype=req["dtype"])
    source = next((r.get("memory_source") for r in rows if r.get("memory_source")), None)
    kernel = next((r.get("kernel") for r in rows if r.get("kernel")), None)
    return figs.memory_sweep_figure(rows, provenance=prov, n_heads=req["n_heads"], head_dim=req["head_dim"],
                                    n_kv_heads=req["n_kv_heads"], causal=req["causal"], memory_source=source,
                                    sdpa_kernel=kernel)


def run_sweep(req: dict, progress=None):
    """Yield (rows so far, notes, elapsed) after each sequence length (``measure.timed_sweep``: every size is
    budget-checked first, and the sweep stops before a length predicted to pass ``SWEEP_SECONDS``)."""
    def on_start(i: int, T: int) -> None:
        if progress is not None:
            progress((i, len(lens)), desc=f"measuring T = {T}")

    lens = sweep_lengths(req["max_T"])
    notes: list[str] = []
    for step in measure.timed_sweep(lens, req["n_heads"], req["head_dim"], impls=tuple(req["impls"]),
                                    time_limit=SWEEP_SECONDS, repeats=REPEATS, on_start=on_start,
                                    n_kv_heads=req["n_kv_heads"], dtype=req["dtype"], causal=req["causal"],
                                    device=dev.device()):
        if step.stopped_before is not None:
            T, expect = step.stopped_before
            notes.append(f"\n⏱️ Stopped before T = {T}: it would take about {expect:.0f} s and the sweep is "
                         f"limited to {SWEEP_SECONDS:.0f} s. Lower the maximum, or leave out the slow "
                         "implementations.")
        yield step.rows, notes, step.elapsed


def opening_rows() -> tuple[list[dict], float]:
    """The opening sweep, measured once and kept in the result cache as an opening example (the first visitor's
    page waits; later ones do not)."""
    def sweep() -> tuple[list[dict], float]:
        req = _check_request(**OPENING)
        rows, elapsed = [], 0.0
        for rows, _, elapsed in run_sweep(req):
            pass
        return rows, elapsed

    key = ("opening", "memory_sweep", repr(sorted(OPENING.items())))
    pin(key)  # one fixed input, measured for every visitor: kept when the sweeper drops unused results
    return results.get_or_compute(key, sweep)


@user_errors
@gpu(180)
def memory_compare(max_T, n_heads, head_dim, n_kv_heads, impls, causal, dtype, progress=gr.Progress()):
    """Measure naive / SDPA / tiled attention over sequence lengths; yields the chart as each size lands."""
    req = _check_request(max_T, n_heads, head_dim, n_kv_heads, impls, causal, dtype)
    # Run on a worker thread and yield between steps, so that Stop closes this generator within a fraction of a
    # second, even while one long size is being measured (its worker then starts no further size).
    for step in abandonable(run_sweep(req, progress)):
        if step is STILL_RUNNING:
            yield gr.skip(), gr.skip(), gr.skip()
            continue
        rows, notes, elapsed = step
        yield _figure(rows, req), _summary(rows, req, notes, elapsed), _table(rows)


@user_errors
def memory_budget(n_heads, head_dim, n_kv_heads, impls, causal, dtype):
    """How long a sequence fits the memory budget with these settings (predictions only, nothing allocated)."""
    req = _check_request(MIN_T, n_heads, head_dim, n_kv_heads, impls, causal, dtype)
    with session.default_threads():
        return _budget_text(req)


def _budget_text(req: dict) -> str:
    kw = dict(n_kv_heads=req["n_kv_heads"], dtype=req["dtype"], causal=req["causal"], device=dev.device())
    parts = []
    for impl in req["impls"]:
        fits = measure.largest_fitting_seq_len(measure.MEMORY_BUDGET_BYTES, req["n_heads"], req["head_dim"],
                                               impls=(impl,), **kw)
        parts.append(f"{impl} up to T = {fits:,}")
    together = measure.largest_fitting_seq_len(measure.MEMORY_BUDGET_BYTES, req["n_heads"], req["head_dim"],
                                               impls=tuple(req["impls"]), **kw)
    return (f"Predicted to fit the {measure.format_bytes(measure.MEMORY_BUDGET_BYTES)} budget: "
            f"{'; '.join(parts)}; all ticked together up to T = **{together:,}**. Larger requests are refused "
            f"before anything is allocated; a sweep also stops before {SWEEP_SECONDS:.0f} s.")


@user_errors
@gpu(60)
def memory_example():
    req = _check_request(**OPENING)
    rows, elapsed = opening_rows()
    return (_figure(rows, req), _summary(rows, req, ["\n(The opening example, measured once when the app "
                                                     "started; press **Measure** to measure again.)"], elapsed),
            _table(rows))


# --- the tiled trace ----------------------------------------------------------------------------------

def _frame(settings: dict, block: int, head: int):
    """One frame of the trace, built once per setting and shared (a 256-token frame takes Plotly ~0.6 s to
    build on this CPU: every visitor after the first plays from the cache)."""
    trace = _trace_of(settings)
    key = ("memory_trace_frame", settings["seq_len"], settings["tile_size"], bool(settings["causal"]), block, head)
    return results.get_or_compute(key, lambda: _trace_figure(trace, block, head))


def _trace_figure(trace: dict, block: int, head: int):
    blocks = trace["blocks"]
    b = blocks[block]
    return figs.tiled_step_figure(
        trace["weights"][head], b["m"][head], b["l"][head], b["out"][head], trace["out"][head],
        start=b["start"], stop=b["stop"], block=block, n_blocks=len(blocks), head=head,
        final_m=blocks[-1]["m"][head], final_l=blocks[-1]["l"][head])


def _trace_info(trace: dict) -> str:
    return (f"{trace['seq_len']} tokens, {len(trace['blocks'])} key blocks of {trace['tile_size']}, "
            f"{trace['n_heads']} heads × {trace['head_dim']} dims, random q/k/v (seed fixed). "
            f"Final tiled output vs naive attention: max |Δ| = **{trace['max_abs_diff']:.2e}**. "
            f"The tiled version keeps per row only m, l and the output ({trace['head_dim'] + 2} numbers); "
            f"naive keeps {trace['seq_len']} weights per row.")


def _trace_of(settings: dict) -> dict:
    """The trace for these settings, computed once and shared by every session (it uses no model and a fixed
    seed, so a trace evicted from the cache is recomputed identically)."""
    if not isinstance(settings, dict) or set(settings) != {"seq_len", "tile_size", "causal"}:
        raise ValueError("Press “Trace” first.")
    seq_len = as_whole(settings["seq_len"], "trace length", 4, 256)
    tile_size = as_whole(settings["tile_size"], "block size", 1, 256)
    causal = bool(settings["causal"])
    return results.get_or_compute(
        ("memory_trace", seq_len, tile_size, causal),
        lambda: measure.tiled_trace(seq_len, TRACE_HEADS, TRACE_HEAD_DIM, tile_size, seed=0, causal=causal))


class TraceView(NamedTuple):
    """The tiled trace's outputs, in order."""
    trace: dict  # the trace's settings (three numbers), kept in the session; the trace lives in explorer.state.cache
    block: Any  # gr.Slider update: one step per key block
    figure: Any  # plotly Figure of block 0
    info: str


@user_errors
@gpu(60)
def memory_trace(seq_len, tile_size, causal, head) -> TraceView:
    seq_len = as_whole(seq_len, "trace length", 4, 256)
    tile_size = as_whole(tile_size, "block size", 1, 256)
    head = as_whole(head, "head", 0, TRACE_HEADS - 1)
    settings = {"seq_len": seq_len, "tile_size": tile_size, "causal": bool(causal)}
    trace = _trace_of(settings)
    n = len(trace["blocks"])
    slider = gr.Slider(minimum=0, maximum=max(n - 1, 1), value=0, step=1,  # one block: Gradio refuses min == max
                       interactive=n > 1, label=f"key block (0–{n - 1})")
    return TraceView(trace=settings, block=slider, figure=_frame(settings, 0, head), info=_trace_info(trace))


@user_errors
def memory_trace_step(settings, block, head):
    if not settings:
        return gr.skip()  # the slider moved before any trace exists (page still loading): nothing to redraw
    trace = _trace_of(settings)
    n = len(trace["blocks"])
    block = as_whole(block, "key block", 0, n - 1)
    head = as_whole(head, "head", 0, TRACE_HEADS - 1)
    return _frame(settings, block, head)


PLAY_SECONDS = 4.0  # the whole animation, however many blocks: 40 visitors pressing Play never queue for minutes


def memory_trace_play(settings, head):
    """Step through every key block, one frame every ~0.6 s or faster (at most ``PLAY_SECONDS`` in all)."""
    if not settings:
        raise ValueError("Press “Trace” first.")
    trace = _trace_of(settings)
    head = as_whole(head, "head", 0, TRACE_HEADS - 1)
    n = len(trace["blocks"])
    for block in range(n):
        yield block, _frame(settings, block, head)
        time.sleep(min(0.6, PLAY_SECONDS / n))


def build_memory(demo: gr.Blocks, state: gr.State) -> None:
    # Measure the opening example in the background now, so the first visitor's page does not wait for it.
    # Not a daemon, like every thread that runs torch kernels (explorer.measure.run.abandonable says why).
    threading.Thread(target=_warm_opening, name="memory-lab-opening").start()
    gr.Markdown(INTRO)
    with gr.Row():
        with gr.Column(scale=1, min_width=260):
            max_T = gr.Slider(MIN_T, MAX_T, value=OPENING["max_T"], step=128, label="max sequence length T",
                              info="the sweep measures 128, 256, 512, … up to this")
            n_heads = gr.Slider(1, 64, value=OPENING["n_heads"], step=1, label="query heads")
            head_dim = gr.Dropdown([16, 32, 64, 128], value=OPENING["head_dim"], label="head_dim")
            n_kv_heads = gr.Slider(1, 64, value=OPENING["n_kv_heads"], step=1, label="KV heads (GQA)",
                                   info="must divide the query heads; 1 = multi-query")
            impls = gr.CheckboxGroup(list(IMPLS), value=list(IMPLS), label="implementations")
            with gr.Row():
                causal = gr.Checkbox(value=True, label="causal")
                dtype = gr.Dropdown(list(DTYPE_CHOICES), value="float32", label="dtype")
            with gr.Row():
                run = gr.Button("Measure", variant="primary")
                stop = gr.Button("Stop", variant="stop")
            budget_md = gr.Markdown()
        with gr.Column(scale=3):
            plot = gr.Plot(label="Peak memory and time: measured (solid) and predicted (dashed)", elem_id="memory-sweep")
            summary = gr.Markdown()
    table = gr.Dataframe(headers=TABLE_HEADERS, label="Every measurement", interactive=False, max_height=300)

    gr.Markdown(TRACE_INTRO)
    trace_state = gr.State(None)
    with gr.Row():
        with gr.Column(scale=1, min_width=260):
            t_len = gr.Slider(4, 256, value=48, step=4, label="sequence length")
            t_block = gr.Dropdown([4, 8, 16, 32, 64], value=8, label="key block size")
            t_causal = gr.Checkbox(value=True, label="causal")
            t_head = gr.Dropdown([(f"head {h}", h) for h in range(TRACE_HEADS)], value=0, label="head")
            trace_btn = gr.Button("Trace", variant="primary")
            block = gr.Slider(0, 5, value=0, step=1, label="key block")
            play = gr.Button("▶ Play the blocks")
        with gr.Column(scale=3):
            trace_plot = gr.Plot(label="Tiled attention, step by step", elem_id="memory-tiles")
            trace_info = gr.Markdown()

    sweep_inputs = [max_T, n_heads, head_dim, n_kv_heads, impls, causal, dtype]
    sweep_outputs = [plot, summary, table]
    event = run.click(memory_compare, sweep_inputs, sweep_outputs, api_name="memory_compare",
                      **lane(MEASURE))
    stop.click(None, None, None, cancels=[event], api_name="memory_stop", api_visibility="private")
    trace_inputs = [t_len, t_block, t_causal, t_head]
    trace_outputs = outputs_of(TraceView, trace=trace_state, block=block, figure=trace_plot, info=trace_info)
    trace_btn.click(memory_trace, trace_inputs, trace_outputs, api_name="memory_trace", **lane(VIEW))
    block.input(memory_trace_step, [trace_state, block, t_head], [trace_plot], api_name="memory_trace_step",
                show_progress="hidden", **lane(VIEW))
    play.click(user_errors(memory_trace_play), [trace_state, t_head], [block, trace_plot],
               api_name="memory_trace_play", api_visibility="private", show_progress="hidden",
               **lane(PLAY))
    t_head.input(memory_trace_step, [trace_state, block, t_head], [trace_plot], api_name="memory_trace_head",
                 api_visibility="private", **lane(VIEW))
    budget_inputs = [n_heads, head_dim, n_kv_heads, impls, causal, dtype]
    for control in budget_inputs:
        control.input(memory_budget, budget_inputs, [budget_md], api_name=f"memory_budget_{control.label.split()[0]}",
                      api_visibility="private", show_progress="hidden", **lane(VIEW))
    demo.load(cached_opening("memory_budget", memory_budget), budget_inputs, [budget_md], api_name="memory_budget", api_visibility="undocumented", **lane(VIEW))
    links.register(demo, "memory", memory_example, [], sweep_outputs, api_name="memory_example", follow_model=False,
                   focus=dict(sweep=plot, tiles=trace_plot))
    demo.load(cached_opening("memory_trace_example", memory_trace), trace_inputs, trace_outputs,
              api_name="memory_trace_example", api_visibility="undocumented",
              **lane(VIEW, memory_trace))


def _warm_opening() -> None:
    try:
        opening_rows()
    except Exception:  # noqa: BLE001 - the page load reports it with a message instead
        pass
