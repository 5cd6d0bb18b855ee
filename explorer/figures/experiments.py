"""Figures of the Experiments tab: what a knock-out or a patch changed. Arrays in, plotly Figures out.

Notation: L layers, H heads, T positions.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from .common import (DIVERGING, QUALITATIVE, SEQUENTIAL, auto_height, base_layout, colorbar, head_label,
                     symmetric_range)


def loss_per_token_figure(targets: Sequence[str], before: np.ndarray, after: np.ndarray, *, title: str,
                          repeated_from: int | None = None, provenance: str = "") -> go.Figure:
    """Loss of predicting each token (nats), before and after the knock-out; ``targets`` label the predicted
    tokens (unique labels, position first); the repeated part, from index ``repeated_from``, shaded."""
    x = list(targets)
    fig = go.Figure()
    for name, y, colour in (("before", before, QUALITATIVE[0]), ("after the knock-out", after, QUALITATIVE[3])):
        fig.add_trace(go.Scatter(x=x, y=np.asarray(y, dtype=float), mode="lines+markers", name=name,
                                 line=dict(color=colour), hovertemplate="predicting %{x}<br>%{y:.3f} nats<extra>"
                                 + name + "</extra>"))
    if repeated_from is not None and repeated_from < len(x):
        fig.add_vrect(x0=repeated_from - 0.5, x1=len(x) - 0.5, fillcolor="#f2c14e", opacity=0.18, line_width=0,
                      annotation_text="repeated part", annotation_position="top left")
    full = title + (f"<br><sup>{provenance}</sup>" if provenance else "")
    base_layout(fig, full, height=380)
    fig.update_xaxes(title_text="token being predicted", type="category", tickangle=-45)
    fig.update_yaxes(title_text="loss (nats per token)", rangemode="tozero")
    fig.update_layout(legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"),
                      margin=dict(t=90))
    return fig


def _side_by_side(panels: Sequence[tuple[str, np.ndarray, dict]], heads: list[str], layers: list[str],
                  title: str, selected: tuple[int, int] | None) -> go.Figure:
    """(subtitle, (L, H) values, colour axis) panels side by side on one shared layer axis."""
    fig = go.Figure()
    n, spacing = len(panels), 0.09
    width = (1 - spacing * (n - 1)) / n
    for i, (name, z, axis) in enumerate(panels):
        x0 = i * (width + spacing)
        xaxis = "x" if i == 0 else f"x{i + 1}"
        coloraxis = "coloraxis" if i == 0 else f"coloraxis{i + 1}"
        fig.update_layout({f"xaxis{'' if i == 0 else i + 1}": dict(domain=[x0, min(1.0, x0 + width)], anchor="y",
                                                                    type="category", tickangle=-45),
                           coloraxis: dict(axis, colorbar=dict(axis["colorbar"], x=min(1.0, x0 + width) + 0.005,
                                                               len=0.9, thickness=12))})
        fig.add_annotation(text=name, x=x0 + width / 2, y=1.0, xref="paper", yref="paper", xanchor="center",
                           yanchor="bottom", showarrow=False, font=dict(size=15))
        fig.add_trace(go.Heatmap(z=np.asarray(z, dtype=float), x=heads, y=layers, coloraxis=coloraxis, xaxis=xaxis,
                                 yaxis="y", hovertemplate=f"{name}<br>%{{y}} · %{{x}}<br>%{{z:.3f}}<extra></extra>"))
        if selected is not None:
            fig.add_trace(go.Scatter(x=[heads[selected[1]]], y=[layers[selected[0]]], mode="markers",
                                     showlegend=False, hoverinfo="skip", xaxis=xaxis, yaxis="y",
                                     marker=dict(symbol="square-open", size=20, color="#e4572e", line=dict(width=3))))
    fig.update_yaxes(type="category", autorange="reversed")
    base_layout(fig, title, height=auto_height(len(layers), per_row=30, lo=320, hi=900))
    fig.update_layout(margin=dict(t=100, r=40))
    return fig


def knockout_sweep_figure(delta: np.ndarray, scores: Mapping[str, np.ndarray], *, n_kv_heads: int,
                          subtitle: str = "", selected: tuple[int, int] | None = None) -> go.Figure:
    """What each head does (loss change when it alone is knocked out, nats per token, diverging around 0)
    beside what it looks like (its scores, 0..1)."""
    L, H = delta.shape
    heads = [head_label(h, H, n_kv_heads) for h in range(H)]
    layers = [f"layer {layer}" for layer in range(L)]
    m = symmetric_range(delta)
    panels = [("Δ loss when knocked out (nats/token)", delta,
               dict(colorscale=DIVERGING, cmin=-m, cmax=m, colorbar=colorbar("Δ nats")))]
    for name, z in scores.items():
        panels.append((name, z, dict(colorscale=SEQUENTIAL, cmin=0, cmax=1,
                                     colorbar=colorbar("score"))))
    title = "What each head does vs what it looks like"
    if subtitle:
        title += f"<br><sup>{subtitle}</sup>"
    return _side_by_side(panels, heads, layers, title, selected)


def patching_figure(fractions: np.ndarray, x_labels: Sequence[str], *, title: str, x_title: str) -> go.Figure:
    """Fraction of the clean answer recovered by each patch, (L, X), 0 = nothing, 1 = all of it."""
    z = np.asarray(fractions, dtype=float)
    L = z.shape[0]
    m = max(1.0, symmetric_range(z))
    fig = go.Figure(go.Heatmap(
        z=z, x=list(x_labels), y=[f"layer {layer}" for layer in range(L)], colorscale=DIVERGING, zmin=-m, zmax=m,
        zmid=0, colorbar=colorbar("fraction recovered"),
        hovertemplate="%{y} · %{x}<br>fraction recovered %{z:.3f}<extra></extra>"))
    base_layout(fig, title, height=auto_height(L, per_row=30, lo=320, hi=900))
    fig.update_xaxes(title_text=x_title, type="category", tickangle=-45)
    fig.update_yaxes(title_text="layer", type="category", autorange="reversed")
    fig.update_layout(margin=dict(t=90))
    return fig


CIRCUIT_ORDER = ("neither", "previous", "induction", "both")


def circuit_figure(losses: Mapping[str, np.ndarray], labels: Mapping[str, str], *, title: str) -> go.Figure:
    """Loss on the repeated half with neither, each and both heads knocked out: a bar per case (the mean over
    rows) with each row's value as a dot."""
    fig = go.Figure()
    names = [labels[k] for k in CIRCUIT_ORDER]
    means = [float(np.mean(losses[k])) for k in CIRCUIT_ORDER]
    fig.add_trace(go.Bar(x=names, y=means, marker_color=[QUALITATIVE[i] for i in (2, 1, 0, 3)],
                         text=[f"{v:.2f}" for v in means], textposition="outside", name="mean over rows",
                         hovertemplate="%{x}<br>mean %{y:.3f} nats/token<extra></extra>"))
    for k, name in zip(CIRCUIT_ORDER, names):
        rows = np.asarray(losses[k], dtype=float)
        fig.add_trace(go.Scatter(x=[name] * len(rows), y=rows, mode="markers", showlegend=False,
                                 marker=dict(color="#333", size=6), hovertemplate="one row: %{y:.3f}<extra></extra>"))
    base_layout(fig, title, height=400)
    fig.update_xaxes(title_text="heads knocked out")
    fig.update_yaxes(title_text="loss on the repeated half (nats per token)", rangemode="tozero")
    fig.update_layout(margin=dict(t=90), showlegend=False)
    return fig
