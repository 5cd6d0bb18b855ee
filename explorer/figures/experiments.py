"""Figures of the Experiments tab: what a knock-out or a patch changed. Arrays in, plotly Figures out.

Notation: L layers, H heads, T positions.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from .common import (DIVERGING, FONT, PAGE_WIDTH, PHONE_WIDTH, PROJECTOR_TEXT, QUALITATIVE, SEQUENTIAL, auto_height,
                     base_layout, colorbar, head_label, symmetric_range, text_px, thinned, tick_step, title_lines,
                     token_ticks, top_title, wrap_title)


LEGEND_WIDTH = 200  # px the loss figure's legend takes right of the plot, its 16 px names in projector mode
LOSS_WIDTH = 720  # px the Experiments tab gives the loss per token at 1280 (its wider column of two)


def loss_per_token_figure(targets: Sequence[str], before: np.ndarray, after: np.ndarray, *, title: str,
                          repeated_from: int | None = None, provenance: str = "", width: int = LOSS_WIDTH) -> go.Figure:
    """Loss of predicting each token (nats), before and after the knock-out; ``targets`` label the predicted
    tokens (unique labels, position first); the repeated part, from index ``repeated_from``, shaded. Laid out
    for ``width`` px, and for a phone in ``layout.meta.narrow``."""
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
    wrapped = wrap_title(full, width - 20)
    # the title only: the legend stands right of the plot (above it, it cost a presented figure 26 px of plot)
    top = 24 + 20 * title_lines(wrapped)
    below = min(220, 40 + max((text_px(t, PROJECTOR_TEXT) for t in x), default=0))  # the upright targets
    base_layout(fig, wrapped, height=int(top + 240 + below))
    # the targets upright, every k-th labelled that stands apart at projector size (hover names each)
    fig.update_xaxes(title_text="token being predicted", tickangle=-90,
                     **token_ticks(x, width - 70 - LEGEND_WIDTH, PROJECTOR_TEXT))
    fig.update_yaxes(title_text="loss (nats per token)", rangemode="tozero")
    fig.update_layout(legend=dict(orientation="v", y=1, yanchor="top", x=1.02, xanchor="left"),
                      margin=dict(t=top), title=top_title(wrapped))
    phone = wrap_title(full, PHONE_WIDTH - 20)
    fig.update_layout(meta={"narrow": {
        "title": top_title(phone), "height": int(300 + below + 24 * title_lines(phone)),
        "margin": {"t": 66 + 24 * title_lines(phone), "l": 60, "r": 10},  # the legend above the plot there
        "legend": {"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 1, "xanchor": "right"},
        "xaxis": token_ticks(x, PHONE_WIDTH - 70, FONT["size"])}, "top": top})  # "top": see common.heatmap_figure
    return fig


def _panels_layout(names: Sequence[str], axes: Sequence[dict], layers: list[str], H: int, title: str, *,
                   stacked: bool, width: float, tick_px: float) -> dict:
    """The panels' axes, colour bars and titles: side by side on one layer axis, or (a phone) one above another,
    each with its layers labelled every k-th where ``tick_px`` labels would touch."""
    n = len(names)
    title = wrap_title(title, width - 20)
    top = 60 + 24 * title_lines(title)
    if stacked:
        panel_h, gap = int(min(320, max(150, 14 * len(layers)))), 90
        plot_h = n * panel_h + (n - 1) * gap
    else:
        panel_h = gap = 0
        plot_h = auto_height(len(layers), per_row=30, lo=320, hi=900) - top - 60
    layout: dict = {"height": top + plot_h + 60, "margin": {"t": top, "b": 60, "l": 70, "r": 40},
                    "title": top_title(title), "annotations": []}
    spacing = 0.09
    w = (1 - spacing * (n - 1)) / n
    shown = thinned(layers, tick_step(len(layers), panel_h or plot_h, tick_px))
    for i, (name, axis) in enumerate(zip(names, axes)):
        suffix = "" if i == 0 else str(i + 1)
        if stacked:
            x = [0.0, 0.86]
            y1 = 1 - i * (panel_h + gap) / plot_h
            y = [max(0.0, y1 - panel_h / plot_h), y1]
        else:
            x, y = [i * (w + spacing), min(1.0, i * (w + spacing) + w)], [0.0, 1.0]
        layout[f"xaxis{suffix}"] = dict(domain=x, anchor=f"y{suffix}", type="category", tickangle=0, tickmode="array",
                                        tickvals=axis["heads"], ticktext=[str(h) for h in range(H)],
                                        title=dict(text="head", standoff=4))
        layout[f"yaxis{suffix}"] = dict(domain=y, anchor=f"x{suffix}", type="category", autorange="reversed",
                                        tickmode="array", tickvals=shown, ticktext=shown,
                                        showticklabels=stacked or i == 0)
        bar = dict(axis["colorbar"], x=x[1] + 0.005, len=(y[1] - y[0]) * 0.9, y=(y[0] + y[1]) / 2, yanchor="middle",
                   thickness=12)
        layout[f"coloraxis{suffix}"] = dict({k: v for k, v in axis.items() if k not in ("colorbar", "heads")},
                                            colorbar=bar)
        layout["annotations"].append(dict(text=name, x=(x[0] + x[1]) / 2, y=y[1], xref="paper", yref="paper",
                                          xanchor="center", yanchor="bottom", showarrow=False,
                                          font=dict(size=15 if not stacked else 13)))
    return layout


def _side_by_side(panels: Sequence[tuple[str, np.ndarray, dict]], heads: list[str], layers: list[str],
                  title: str, selected: tuple[int, int] | None) -> go.Figure:
    """(subtitle, (L, H) values, colour axis) panels side by side on one layer axis; on a phone
    (``layout.meta.narrow``) one above another. Heads are numbered on the axis (hover names their KV head)."""
    fig = go.Figure()
    for i, (name, z, _) in enumerate(panels):
        suffix = "" if i == 0 else str(i + 1)
        fig.add_trace(go.Heatmap(z=np.asarray(z, dtype=float), x=heads, y=layers, coloraxis=f"coloraxis{suffix}",
                                 xaxis=f"x{suffix}", yaxis=f"y{suffix}",
                                 hovertemplate=f"{name}<br>%{{y}} · %{{x}}<br>%{{z:.3f}}<extra></extra>"))
        if selected is not None:
            fig.add_trace(go.Scatter(x=[heads[selected[1]]], y=[layers[selected[0]]], mode="markers",
                                     showlegend=False, hoverinfo="skip", xaxis=f"x{suffix}", yaxis=f"y{suffix}",
                                     marker=dict(symbol="square-open", size=20, color="#e4572e", line=dict(width=3))))
    base_layout(fig, title)
    names = [p[0] for p in panels]
    axes = [dict(p[2], heads=heads) for p in panels]
    H = len(heads)
    fig.update_layout(_panels_layout(names, axes, layers, H, title, stacked=False, width=PAGE_WIDTH,
                                     tick_px=PROJECTOR_TEXT))
    narrow = _panels_layout(names, axes, layers, H, title, stacked=True, width=PHONE_WIDTH, tick_px=FONT["size"])
    narrow["margin"].update(l=60, r=10)
    fig.update_layout(meta={"narrow": narrow})
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
    height = auto_height(L, per_row=30, lo=320, hi=900)
    base_layout(fig, title, height=height)
    fig.update_xaxes(title_text=x_title, tickangle=-90, **token_ticks(list(x_labels), PAGE_WIDTH - 180))
    fig.update_yaxes(title_text="layer", autorange="reversed",
                     **token_ticks([f"layer {layer}" for layer in range(L)], height - 240))
    fig.update_layout(margin=dict(t=90))
    fig.update_layout(meta={"narrow": {"title": {"text": wrap_title(title, PHONE_WIDTH - 20)},
                                       "xaxis": token_ticks(list(x_labels), PHONE_WIDTH - 160, FONT["size"])}})
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
