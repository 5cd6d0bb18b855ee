"""The Training tab's figures: the training run's curves over steps, and one head's pattern at a step."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .common import (QUALITATIVE, auto_height, base_layout, heatmap_figure, phone_layout, title_lines, token_labels,
                     top_title)

SCORES = (("previous_token", "previous-token", QUALITATIVE[0]), ("induction", "induction", QUALITATIVE[1]),
          ("first_token", "first-token (sink)", QUALITATIVE[2]))


def training_curves(c: dict, phase: dict, *, source: str) -> go.Figure:
    """Top: held-out loss and loss on the repeated half. Bottom: the best head's previous-token, induction and
    sink scores (thick), every head's (thin, named on hover). The phase change (``phase["start"]`` ..
    ``phase["end"]``) is a shaded band; ``mark_step`` adds the current step. ``c`` is
    ``explorer.probes.training.curves``."""
    steps = c["steps"]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("loss (nats per token)",
                                        f"head scores (best head thick, every head thin; induction at span "
                                        f"{c['span']})"))
    fig.add_trace(go.Scatter(x=steps, y=c["held_out_loss"], name="held-out story loss", mode="lines+markers",
                             line=dict(color="#333"), hovertemplate="step %{x}<br>held-out loss %{y:.3f}<extra></extra>"),
                  row=1, col=1)
    fig.add_trace(go.Scatter(x=steps, y=c["repeated_half_loss"], name="loss on the repeated half",
                             mode="lines+markers", line=dict(color=QUALITATIVE[3]),
                             hovertemplate="step %{x}<br>repeated-half loss %{y:.3f}<extra></extra>"), row=1, col=1)
    for kind, label, colour in SCORES:
        mats = c[kind]  # (steps, L, H)
        if mats.size:
            for layer in range(mats.shape[1]):
                for head in range(mats.shape[2]):
                    fig.add_trace(go.Scatter(
                        x=steps, y=mats[:, layer, head], mode="lines", showlegend=False, opacity=0.35,
                        line=dict(color=colour, width=1), name=f"L{layer}H{head} {label}",
                        hovertemplate=f"L{layer}H{head} {label}<br>step %{{x}}: %{{y:.3f}}<extra></extra>"),
                        row=2, col=1)
        best = c[f"best_{kind}"]
        fig.add_trace(go.Scatter(
            x=steps, y=[b[0] for b in best], name=f"best {label}", mode="lines+markers",
            line=dict(color=colour, width=3), customdata=[f"L{b[1]}H{b[2]}" for b in best],
            hovertemplate=f"best {label}: %{{customdata}}<br>step %{{x}}: %{{y:.3f}}<extra></extra>"), row=2, col=1)
    if phase.get("start") is not None and phase.get("end") is not None:
        for row in (1, 2):
            fig.add_vrect(x0=phase["start"], x1=phase["end"], fillcolor=QUALITATIVE[1], opacity=0.12, line_width=0,
                          row=row, col=1)
        fig.add_annotation(x=phase["end"], y=0.08, xref="x2", yref="y2 domain", xanchor="left",
                           text=f" phase change: induction 0.2 → 0.8, steps {phase['start']}–{phase['end']}",
                           showarrow=False, font=dict(size=11))
    fig.update_yaxes(title_text="nats/token", row=1, col=1)
    fig.update_yaxes(title_text="score", range=[0, 1.05], row=2, col=1)
    fig.update_xaxes(title_text="training step", row=2, col=1)
    base_layout(fig, f"The training run<br><sup>{source}</sup>", height=620)
    fig.update_layout(legend=dict(orientation="h", y=-0.12), hovermode="closest")
    fig.update_layout(meta={"narrow": _curves_phone(fig)})
    return fig


def _curves_phone(fig: go.Figure) -> dict:
    """``phone_layout`` with the title hung from the top over a margin that holds its lines (centred in a margin
    sized for fewer, its source lines sat on the first subplot's title) and the phase note folded inside the plot
    (on one line it ran past a phone's right edge)."""
    narrow = phone_layout(fig)
    lines = title_lines(narrow["title"]["text"])
    narrow["title"] = top_title(narrow["title"]["text"])
    narrow["margin"]["t"] = 56 + 18 * lines
    narrow["height"] = fig.layout.height + narrow["margin"]["t"] - (fig.layout.margin.t or 60)
    for a in narrow["annotations"]:
        if a.get("xref") == "x2" and "phase change" in str(a.get("text")):
            words = str(a["text"]).strip().split(", ")
            a.update(text=",<br>".join(words).replace(": ", ":<br>", 1), x=1, xref="x2 domain", xanchor="right",
                     y=0.5, yanchor="middle", align="right")
    return narrow


STEP_LINE = dict(color="#d62728", width=2, dash="dash")


def mark_step(figure: dict, step: int) -> dict:
    """``figure`` (a ``training_curves`` figure as a dict, ``fig.to_plotly_json()``) with ``step`` marked by a
    vertical line through both panels and named in the title; ``figure`` itself is left as it is, so one drawing
    of the curves serves every step (a new Plotly figure per step would cost more than the step's computation)."""
    layout = dict(figure["layout"])
    lines = [dict(type="line", x0=step, x1=step, xref=x, y0=0, y1=1, yref=f"{y} domain", line=STEP_LINE)
             for x, y in (("x", "y"), ("x2", "y2"))]
    layout["shapes"] = [*layout.get("shapes", ()), *lines]
    title = dict(layout.get("title", {}))
    title["text"] = str(title.get("text", "")).replace("The training run", f"The training run, step {step} marked", 1)
    layout["title"] = title
    narrow = (layout.get("meta") or {}).get("narrow")
    if narrow and "title" in narrow:  # the phone's title names the step too
        text = narrow["title"]["text"].replace("The training run", f"The training run, step {step} marked", 1)
        layout["meta"] = {**layout["meta"], "narrow": {**narrow, "title": {**narrow["title"], "text": text}}}
    return {"data": figure["data"], "layout": layout}


PATTERN_WIDTH = 480  # px the Training tab gives the pattern at 1280 (its narrower column of two)


def pattern_at_step(pattern: np.ndarray, tokens: Sequence[str], *, step: int, head: str, span: int,
                    source: str) -> go.Figure:
    """One head's attention on ``[BOS] + r + r``: an induction head lights the stripe ``span - 1`` keys right of
    the diagonal's reflection (each token of the second copy looks at the token after its first occurrence)."""
    labels = token_labels(tokens)
    return heatmap_figure(np.asarray(pattern), labels, labels,
                          title=f"{head} at step {step} · random tokens, repeated (span {span})"
                                f"<br><sup>{source}</sup>",
                          height=auto_height(len(labels), per_row=14, lo=420, hi=700), width=PATTERN_WIDTH)
