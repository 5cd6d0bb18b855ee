"""The figures of "Train one now" (the Training tab's live run): its curves so far and every head's induction score
at the latest record. Arrays in, Figures out."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .common import QUALITATIVE, base_layout, heatmap_figure, phone_layout

PHASE_LINE = dict(color="#d62728", width=2, dash="dash")


def _values(xs: Sequence[float | None]) -> list[float | None]:
    return [None if x is None else float(x) for x in xs]


def live_curves(steps: Sequence[int], loss: Sequence[float | None], repeated_half: Sequence[float],
                best_induction: Sequence[float], best_previous: Sequence[float], *, phase_step: int | None,
                source: str) -> go.Figure:
    """Top: the training copy loss and the loss on the repeated half of the probe, against step. Bottom: the best
    head's induction and previous-token scores on a fixed 0-1 axis, with the phase change (the first step whose
    best induction score reached 0.5) as a vertical line once it has happened."""
    steps = list(steps)
    if not (len(loss) == len(repeated_half) == len(best_induction) == len(best_previous) == len(steps)):
        raise ValueError("live_curves needs one value of each curve per step.")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        subplot_titles=("loss (nats per token)", "best head's score (0 to 1)"))
    fig.add_trace(go.Scatter(x=steps, y=_values(loss), name="training loss (second copy)", mode="lines+markers",
                             line=dict(color="#333"), hovertemplate="step %{x}<br>loss %{y:.3f}<extra></extra>"),
                  row=1, col=1)
    fig.add_trace(go.Scatter(x=steps, y=_values(repeated_half), name="loss on the repeated half (probe)",
                             mode="lines+markers", line=dict(color=QUALITATIVE[3]),
                             hovertemplate="step %{x}<br>repeated-half loss %{y:.3f}<extra></extra>"), row=1, col=1)
    for ys, label, colour in ((best_induction, "best induction", QUALITATIVE[1]),
                              (best_previous, "best previous-token", QUALITATIVE[0])):
        fig.add_trace(go.Scatter(x=steps, y=_values(ys), name=label, mode="lines+markers",
                                 line=dict(color=colour, width=3),
                                 hovertemplate=f"{label}<br>step %{{x}}: %{{y:.3f}}<extra></extra>"), row=2, col=1)
    if phase_step is not None:
        for x, y in (("x", "y"), ("x2", "y2")):
            fig.add_shape(type="line", x0=phase_step, x1=phase_step, xref=x, y0=0, y1=1, yref=f"{y} domain",
                          line=PHASE_LINE)
        fig.add_annotation(x=phase_step, y=0.95, xref="x2", yref="y2 domain", xanchor="left", showarrow=False,
                           text=f" phase change: step {phase_step}", font=dict(size=12, color=PHASE_LINE["color"]))
    fig.update_yaxes(title_text="nats/token", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="score", range=[0, 1.05], row=2, col=1)
    fig.update_xaxes(title_text="training step", row=2, col=1)
    base_layout(fig, f"Training now, live<br><sup>{source}</sup>", height=560)
    fig.update_layout(legend=dict(orientation="h", y=-0.14), hovermode="x unified")
    fig.update_layout(meta={"narrow": phone_layout(fig)})
    return fig


def induction_now(scores: np.ndarray, *, step: int, span: int) -> go.Figure:
    """Every head's induction score at ``step`` ((L, H), on the span-``span`` probe), 0 to 1 fixed."""
    z = np.asarray(scores, dtype=float)
    if z.ndim != 2:
        raise ValueError(f"induction scores must be (layers, heads), got shape {z.shape}.")
    return heatmap_figure(z, [f"head {h}" for h in range(z.shape[1])], [f"layer {layer}" for layer in range(z.shape[0])],
                          title=f"Every head's induction score at step {step}<br><sup>span {span}, "
                                "computed during training</sup>",
                          x_title="head", y_title="layer", colorbar_title="induction score", zmin=0.0, zmax=1.0,
                          x_name="", y_name="", value_name="induction", value_format=".3f", height=300,
                          texttemplate="%{z:.2f}")
