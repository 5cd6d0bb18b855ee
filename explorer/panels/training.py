"""Training tab: the default model's own training run, step by step, from the snapshots ``python -m training``
saved: the curves the run measured, one head's pattern, the scores and a continuation computed now from the
snapshot at the chosen step, and the induction phase change where it was measured."""
from __future__ import annotations

import json
import math
import time
import weakref
from functools import reduce

import gradio as gr
from plotly.utils import PlotlyJSONEncoder

from explorer.figures import training as figs
from explorer.probes import training as probe
from explorer.state import session, snapshots
from explorer.state.cache import results
from explorer.state.openings import cached_opening
from explorer.state.text import clean_text, encode_with_notice
from explorer.state.threads import threads_for
from explorer.web import gradio_adapter, links
from explorer.web.clients import with_client
from explorer.web.groups import VIEW, lane

from explorer.panels.errors import user_errors
from explorer.panels.training_live import build_live

INTRO = """### Training: watch the circuits form
The default model, saved at {n} of its {steps:,} training steps. Move the slider or press **Play**: the curves
were logged during training (`training_log.json`); the pattern, scores and continuation are computed **now**
from the snapshot. In the shaded band the loss on a repeated random sequence drops as induction heads appear.
The head menu opens on the final model's best induction head."""
NO_SNAPSHOTS = """### Training: watch the circuits form
This model folder has no training snapshots (`checkpoints/step-NNNNN/`), so there is nothing to step through. Train
it with `python -m training`, which saves them."""
DEFAULT_PROMPT = "Sam wrote a secret list of words: cat hat lamp tiger gold. Later, Mia read the list out loud:"
MAX_NEW = 24
PATTERN_SPAN = 12       # the pattern's sequence: [BOS] + 12 random tokens twice, readable on a projector
SCORE_HEADERS = ["head", "previous-token", "induction (span 32)", "first-token (sink)"]
COMPARE_HEADERS = ["step", "what it writes (greedy, computed now)"]
PLAY_SECONDS = 1.0
CURVES_SOURCE = "curves: measured during training, read from training_log.json · the red line: the step shown"


def probe_seed() -> int:
    return int(snapshots.training_log().get("probe_seed", 7))


def reference_span() -> int:
    """The span the training log measured previous-token, sink and repeated-half scores on (32 when it fits)."""
    found = snapshots.logged_snapshots()
    return int(found[-1].get("repeated_half_span", probe.REFERENCE_SPAN)) if found else probe.REFERENCE_SPAN


def head_names(config) -> list[str]:
    return [f"L{layer}H{head}" for layer in range(config.n_layers) for head in range(config.n_heads)]


def parse_head(name, config) -> tuple[int, int]:
    names = head_names(config)
    if name not in names:
        raise ValueError(f"head must be one of {', '.join(names)}, not {str(name)[:20]!r}.")
    layer, head = str(name)[1:].split("H")
    return int(layer), int(head)


def _step(value) -> tuple[int, str]:
    """(snapshot step, a note when the value was not a snapshot's step)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"The step must be a number, not {str(value)[:20]!r}.") from None
    if not math.isfinite(x):
        raise ValueError("The step must be a finite number.")
    step = snapshots.nearest_step(x)
    return step, ("" if step == x else f" (the nearest snapshot to step {x:g})")


def _prompt_ids(prompt, tokenizer, config) -> tuple[list[int], str]:
    ids, _, notice = encode_with_notice(tokenizer, clean_text(prompt), config.max_seq_len - MAX_NEW, truncate=True)
    return ids, notice


def _continuation(model, tokenizer, ids) -> str:
    eos = model.config.eos_token_id
    return tokenizer.decode(probe.greedy_continuation(model, ids, MAX_NEW, eos), skip_special_tokens=True)


def curves_figure(step: int, span: int):
    """The curves of the training log with ``step`` marked, as ``gr.Plot`` sends them: drawn once per log and
    span and kept in the result cache (``figs.mark_step`` adds the step), so the slider's answer does not rebuild
    them."""
    def draw():
        c = probe.curves(snapshots.logged_snapshots(), str(span))
        return figs.training_curves(c, probe.phase_change(c), source=CURVES_SOURCE).to_plotly_json()

    base = results.get_or_compute(("training_curves", snapshots.log_version(), span), draw)
    return gradio_adapter.plotly_payload(json.dumps(figs.mark_step(base, step), cls=PlotlyJSONEncoder))


def _compare_steps(c: dict, phase: dict) -> list[int]:
    """About 100 steps in, where the phase change starts and ends, and the last snapshot."""
    steps = c["steps"]
    wanted = [snapshots.nearest_step(100, steps), phase.get("start"), phase.get("end"), steps[-1]]
    return sorted({s for s in wanted if s is not None})


def _log_entry(step: int) -> dict:
    return next((e for e in snapshots.logged_snapshots() if e["step"] == step), {})


def step_view(step, head, prompt):
    """(curves, pattern, score rows, summary, continuation) at the snapshot nearest ``step``, computed from it."""
    step, note = _step(step)
    tokenizer = session.load_default()[1]
    was_loaded = snapshots.is_loaded(step)
    t0 = time.perf_counter()
    model = snapshots.shared_snapshot(step)
    loaded_ms = (time.perf_counter() - t0) * 1e3
    layer, h = parse_head(head, model.config)
    ids, notice = _prompt_ids(prompt, tokenizer, model.config)
    span = reference_span()
    curves = curves_figure(step, span)
    seed = probe_seed()
    tokens = probe.probe_tokens(model, PATTERN_SPAN, seed)
    with threads_for(model):
        pattern = probe.head_pattern(model, tokens, layer, h)
        scores = probe.step_scores(model, seed, span)
        text = _continuation(model, tokenizer, ids)
    labels = session.token_strings(tokenizer, tokens[0].tolist())
    shown = f"computed now from default@step-{step} · seed {seed}"
    pattern_fig = figs.pattern_at_step(pattern, labels, step=step, head=head, span=PATTERN_SPAN, source=shown)
    rows = [[name, round(float(scores["previous_token"][i // model.config.n_heads, i % model.config.n_heads]), 4),
             round(float(scores["induction"][i // model.config.n_heads, i % model.config.n_heads]), 4),
             round(float(scores["first_token"][i // model.config.n_heads, i % model.config.n_heads]), 4)]
            for i, name in enumerate(head_names(model.config))]
    logged = _log_entry(step)
    held = f"{logged['held_out_loss']:.3f}" if "held_out_loss" in logged else "not in the log"
    summary = (f"**Step {step}**{note} · snapshot `default@step-{step}` ({'in memory' if was_loaded else f'read from disk in {loaded_ms:.0f} ms'}) · computed now: loss on the repeated half **{scores['repeated_half_loss']:.3f}** "
               f"nats/token (span {span}, {probe.PROBE_ROWS} rows, seed {seed}), best induction "
               f"**{scores['induction'].max():.2f}**, best previous-token **{scores['previous_token'].max():.2f}** · "
               f"from the training log: held-out story loss {held}")
    if notice:
        summary += f"\n\n{notice}"
    return curves, pattern_fig, rows, summary, text


def training_view(step, head, prompt):
    """``step_view`` and the continuation at a few steps side by side, and the phase change in words."""
    curves, pattern, rows, summary, text = step_view(step, head, prompt)
    tokenizer = session.load_default()[1]
    c = probe.curves(snapshots.logged_snapshots(), str(reference_span()))
    phase = probe.phase_change(c)
    config = snapshots.shared_snapshot(c["steps"][-1]).config
    ids, _ = _prompt_ids(prompt, tokenizer, config)
    compare = []
    for s in _compare_steps(c, phase):
        model = snapshots.shared_snapshot(s)
        with threads_for(model):
            compare.append([s, _continuation(model, tokenizer, ids)])
    return curves, pattern, rows, summary, text, compare, phase_text(c, phase)


def phase_text(c: dict, phase: dict) -> str:
    if phase["start"] is None or phase["end"] is None:
        return (f"The best induction score (span {c['span']}) did not cross both 0.2 and 0.8 in these snapshots, "
                "so no phase change is marked. " + probe.order_sentence(phase))
    a, b = phase["start_entry"], phase["end_entry"]
    return (f"**The phase change, as measured** (from the training log, on the saved snapshots): the best induction "
            f"score at span {c['span']} first reached 0.2 at step {a['step']} ({a['induction']:.2f}) and 0.8 at step "
            f"{b['step']} ({b['induction']:.2f}); over those steps the loss on the repeated half went from "
            f"{a['repeated_half_loss']:.2f} to {b['repeated_half_loss']:.2f} nats/token and the held-out story "
            f"loss from {a['held_out_loss']:.2f} to {b['held_out_loss']:.2f}. " + probe.order_sentence(phase))


def next_step(step):
    """Play: the next snapshot after ``step``; the timer stops at the last one (and Play is offered again)."""
    steps = snapshots.available_steps()
    step, _ = _step(step)
    later = [s for s in steps if s > step]
    going = len(later) > 1
    return ((later[0] if later else step), gr.Timer(active=going), gr.Button(value="Pause" if going else "▶ Play"),
            going)


def toggle_play(step, playing: bool, opening: int | None = None):
    """Play from the first snapshot when the slider is where the page opened it (``opening``, the end of the phase
    change: playing from there would skip the change itself) or at the last; from the step a link, a lesson or the
    visitor set otherwise. Or pause."""
    steps = snapshots.available_steps()
    if playing:
        return step, gr.Timer(active=False), gr.Button(value="▶ Play"), False
    at = _step(step)[0]
    start = steps[0] if at in (steps[-1], opening) else at
    return start, gr.Timer(active=True), gr.Button(value="Pause"), True


def playing_view(move):
    """Play's click or tick as one answer: the slider's step and the figures of that same step, so that they never
    disagree (drawn by separate events, the slider ran ahead of a slow figure: 1800 over a figure of 1400)."""
    def run(step, playing, head, prompt):
        moved = move(step, playing)
        return (*moved, *step_view(moved[0], head, prompt))
    return run


_KNOCK: "weakref.WeakKeyDictionary[gr.Blocks, tuple]" = weakref.WeakKeyDictionary()


def build_training(demo: gr.Blocks, state: gr.State) -> None:
    steps = snapshots.available_steps()
    entries = snapshots.logged_snapshots()
    if len(entries) < 2:
        gr.Markdown(NO_SNAPSHOTS)
        build_live(demo)
        return
    span = reference_span()
    c = probe.curves(entries, str(span))
    phase = probe.phase_change(c)
    log = snapshots.training_log()
    gr.Markdown(INTRO.format(steps=log.get("steps_run", steps[-1]), n=len(steps)))
    final = entries[-1]
    _, bl, bh = probe.best(final["induction"][c["span"]])
    config = snapshots.shared_snapshot(steps[-1]).config
    opening_step = phase["end"] if phase["end"] is not None else steps[-1]
    gap = reduce(math.gcd, [b - a for a, b in zip(steps, steps[1:])]) or 1
    with gr.Row(equal_height=True):
        step = gr.Slider(steps[0], steps[-1], value=opening_step, step=gap, label="training step",
                         info=f"{len(steps)} snapshots, steps {steps[0]}-{steps[-1]}; another step shows the nearest",
                         scale=4, elem_id="training-step")
        play = gr.Button("▶ Play", scale=0, min_width=110, elem_id="training-play")
        # no info line: in a narrow column it wraps and pushes the figures below a projector's window
        head = gr.Dropdown(head_names(config), value=f"L{bl}H{bh}", label="head (pattern)", scale=1, min_width=160)
        knock = gr.Button("Knock out at this step →", scale=0, min_width=200, elem_id="training-knock",
                          variant="secondary")
    playing = gr.State(False)
    timer = gr.Timer(PLAY_SECONDS, active=False)
    with gr.Row():  # the figures right under the controls: on a projector they are the first thing in view
        with gr.Column(scale=3):
            curves = gr.Plot(label="The training run", elem_id="training-curves")
        with gr.Column(scale=2):
            pattern = gr.Plot(label="The head's attention at this step", elem_id="training-pattern")
    summary = gr.Markdown()
    phase_md = gr.Markdown()
    headers = [h.replace("span 32", f"span {span}") for h in SCORE_HEADERS]
    scores = gr.Dataframe(headers=headers, label="Every head at this step (computed now from the snapshot, "
                          f"on the span-{span} probe the training log used)", interactive=False)
    with gr.Row():
        prompt = gr.Textbox(DEFAULT_PROMPT, label="prompt", lines=2, scale=3)
        text = gr.Textbox(label="what the model writes at this step (greedy, computed now)", interactive=False,
                          lines=2, scale=3)
    compare = gr.Dataframe(headers=COMPARE_HEADERS, label="the same prompt at a few steps", interactive=False,
                           wrap=True)

    shown = user_errors(step_view)
    outs = [curves, pattern, scores, summary, text]
    step.release(shown, [step, head, prompt], outs, api_name="training_step", trigger_mode="always_last", **lane(VIEW))
    head.input(shown, [step, head, prompt], outs, api_name="training_head", api_visibility="private", **lane(VIEW))
    view = user_errors(training_view)
    prompt.submit(view, [step, head, prompt], [*outs, compare, phase_md], api_name="training_prompt",
                  api_visibility="private", **lane(VIEW))
    start = user_errors(playing_view(lambda s, p: toggle_play(s, p, opening_step)))
    play.click(start, [step, playing, head, prompt], [step, timer, play, playing, *outs], api_name="training_play",
               api_visibility="private", **lane(VIEW, step_view))
    # Play's steps draw without a progress overlay: one a second would make the figures flicker; a tick that comes
    # while the last one still runs is dropped (trigger_mode="once"), so the slider never runs ahead of the figures
    tick = user_errors(playing_view(lambda s, p: next_step(s)))
    timer.tick(tick, [step, playing, head, prompt], [step, timer, play, playing, *outs], api_name="training_tick",
               api_visibility="private", show_progress="hidden", trigger_mode="once", **lane(VIEW, step_view))
    _KNOCK[demo] = (knock, step, state)
    links.register(demo, "training", cached_opening("training_view", training_view), [step, head, prompt],
                   [*outs, compare, phase_md], api_name="training_view",
                   params={"step": step, "head": head, "prompt": prompt}, follow_model=False,
                   focus=dict(curves=curves, pattern=pattern))
    build_live(demo)


def snapshot_step(value) -> str:
    """The picker's name of the snapshot nearest ``value``."""
    return snapshots.snapshot_name(_step(value)[0])


def open_in_experiments(value, state, progress=gr.Progress()):
    """"Knock out at this step": the snapshot nearest ``value`` loaded for this session (as the header picker loads
    a model), its name for the picker, and the Experiments tab selected, then the Model tab's card outputs."""
    from explorer.panels.model import load_model

    name = snapshot_step(value)
    loaded = load_model(name, state, progress)
    return name, gr.Tabs(selected="experiments"), *loaded


def connect_header(demo: gr.Blocks, tabs: gr.Tabs, picker: gr.Dropdown, card: list) -> None:
    """Wire "knock out at this step" (``open_in_experiments``): afterwards every tab re-runs on the snapshot
    (``links.register_model_loads``). Called by app.py before ``links.wire``; nothing when the tab has no
    snapshots."""
    if demo not in _KNOCK:
        return
    knock, step, state = _KNOCK.pop(demo)
    event = knock.click(with_client(user_errors(open_in_experiments)), [step, state], [picker, tabs, *card, state],
                        api_name="training_knock_out", api_visibility="private", **lane(VIEW))
    links.register_model_loads(demo, event)
