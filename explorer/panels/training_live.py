"""The Training tab's "Train one now": a small decoder trained from scratch on this server while the class watches
its induction head form (``explorer.jobs.live_training``), then loadable as ``live@final`` from the header."""
from __future__ import annotations

import numpy as np
import gradio as gr

from explorer.figures import live as figs
from explorer.jobs import live_training as job
from explorer.web.groups import TRAIN, VIEW, lane

from explorer.panels.errors import user_errors

INTRO = """### Train one now
A 2-layer decoder (d_model 64, two heads a layer) starts from random weights here, on this server, and learns to
finish sequences that repeat a random span of tokens. Every second the page shows its loss and how strongly each
head does the two jobs of an induction circuit: look at the previous token, and look at the token after the
earlier copy of this one. **Predict first:** which layer will hold the induction head, and will the loss fall
smoothly or all at once? (On this server's CPU the jump has come after 10-14 seconds when idle, about 25 when busy.) Anyone who presses the button
while a run trains watches the same run; Stop ends it and keeps what it learnt, to load as `live@final`."""
IDLE = "Nothing is training now: press **Train one now**."


def best_head(record: dict) -> tuple[float, int, int]:
    """The best induction score at the longest span measured, and its (layer, head)."""
    m = np.asarray(record["induction"][str(record["repeated_half_span"])], dtype=float)
    layer, head = np.unravel_index(int(np.argmax(m)), m.shape)
    return float(m[layer, head]), int(layer), int(head)


def status_text(run: job.LiveJob, recs: list[dict]) -> str:
    if not recs:
        return f"Starting: seed {run.seed}, {run.seconds:g} s (building the tokenizer and the model)…"
    last = recs[-1]
    _, layer, head = best_head(last)
    parts = [f"step {last['step']}", f"{last['seconds']:.1f} s",
             f"best induction {last['best_induction']:.2f} (layer {layer}, head {head})"]
    parts.append(f"the phase change at step {run.phase['step']}" if run.phase else "no phase change yet")
    line = " · ".join(parts)
    if not run.finished.is_set():
        return f"⏳ Training: {line}"
    if run.outcome == "failed":
        return f"❌ The run failed ({run.error}): press Train one now to start another."
    how = "stopped" if run.outcome == "stop" else "time is up"
    return (f"✅ Ended ({how}): {line}. Type `live@final` in the model box at the top and press **Load model** to "
            "look inside it in every tab (snapshots: " + ", ".join(f"`{n}`" for n in _snapshot_names()) + ").")


def _snapshot_names() -> list[str]:
    from explorer.state import live_models

    return [n for n in live_models.names() if n != "live@final"] or ["none"]


def figures(run: job.LiveJob, recs: list[dict]):
    """The curves so far and the latest heatmap (None before the first record)."""
    if not recs:
        return None, None
    source = f"seed {run.seed} · trained now on this server, one CPU thread · measured every second"
    curves = figs.live_curves([r["step"] for r in recs], [r["loss"] for r in recs],
                              [r["repeated_half_loss"] for r in recs], [r["best_induction"] for r in recs],
                              [r["best_previous_token"] for r in recs],
                              phase_step=run.phase["step"] if run.phase else None, source=source)
    last = recs[-1]
    heat = figs.induction_now(last["induction"][str(last["repeated_half_span"])], step=last["step"],
                              span=last["repeated_half_span"])
    return curves, heat


def check_seed(seed) -> int:
    if seed is None or isinstance(seed, bool) or float(seed) != int(seed) or not 0 <= int(seed) <= 1_000_000:
        raise ValueError("The seed must be a whole number from 0 to 1,000,000: type one like 0 or 7.")
    return int(seed)


def _session(request: gr.Request | None) -> str | None:
    return getattr(request, "session_hash", None)


def train_now(seconds, seed, request: gr.Request = None):
    """Start (or join) the live run and stream its figures and status about every second until it ends."""
    run = job.start(job.DEFAULT_SECONDS if seconds is None else seconds, check_seed(seed), owner=_session(request))
    recs = job.records(run)
    yield *figures(run, recs), status_text(run, recs)
    for recs in job.updates(run):
        yield *figures(run, recs), status_text(run, recs)


def stop_now(request: gr.Request = None):
    """End the live run this page started before its next step; what it learnt is written and loadable."""
    run = job.current()
    if run is None or run.finished.is_set():
        return IDLE if run is None else status_text(run, job.records(run))
    job.stop(run, by=_session(request))
    return status_text(run, job.records(run))


def build_live(demo: gr.Blocks) -> None:
    gr.Markdown(INTRO, elem_id="live-intro")
    with gr.Row(equal_height=True):
        seconds = gr.Slider(10, job.MAX_SECONDS, value=job.DEFAULT_SECONDS, step=5, label="seconds of training",
                            scale=3, elem_id="live-seconds")
        seed = gr.Number(0, precision=0, label="seed", minimum=0, scale=1, min_width=90, elem_id="live-seed")
        train = gr.Button("Train one now", variant="primary", scale=0, min_width=150, elem_id="live-train")
        stop = gr.Button("Stop", variant="stop", scale=0, min_width=90, elem_id="live-stop")
    status = gr.Markdown(IDLE, elem_id="live-status")
    with gr.Row():
        with gr.Column(scale=3):
            curves = gr.Plot(label="Loss and head scores, live", elem_id="live-curves")
        with gr.Column(scale=2):
            heat = gr.Plot(label="Every head's induction score now", elem_id="live-heads")
    # the stream redraws each second: a progress overlay each time would make the figures flicker
    train.click(user_errors(train_now), [seconds, seed], [curves, heat, status], api_name="training_live",
                show_progress="hidden", **lane(TRAIN))
    stop.click(user_errors(stop_now), None, [status], api_name="training_live_stop", **lane(VIEW))
