"""Figures of the LoRA tab: trainable vs frozen parameters and memory, the live loss curve, and one
head's attention before and after the adapter, side by side.

Pure functions: numbers, lists and NumPy arrays in, plotly figures out. No torch modules, no gradio.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .common import (KEY_AXIS, PAGE_WIDTH, QUALITATIVE, QUERY_AXIS, base_layout, heatmap_trace,
                     provenance_text, stacked_phone, title_lines, token_axes_layout, top_title, two_maps_phone,
                     wrap_title)

MIB = 1024 ** 2
LORA_COLUMN = 900  # px: the LoRA tab's figure column in a 1280 px window (the layout audit's measure)


def parameter_figure(
    counted: Mapping[str, int],
    formula_trainable: int,
    memory: Mapping[str, Mapping[str, float]],
    *,
    rank: int,
    alpha: float,
    targets: Sequence[str],
    dtype: str = "float32",
) -> go.Figure:
    """Left: parameters counted on the adapted model (trainable, frozen) beside the formula's trainable count.
    Right: training memory (MiB) of LoRA vs full fine-tuning, stacked by what holds it.

    counted: ``{"trainable", "frozen", "total"}``; memory: ``{"LoRA": {part: bytes}, "full fine-tune": {...}}``
    with parts such as weights / gradients / AdamW state.
    """
    for k in ("trainable", "frozen"):
        if counted[k] < 0:
            raise ValueError(f"{k} parameter count must be non-negative.")
    fig = make_subplots(rows=1, cols=2, column_widths=[0.5, 0.5], horizontal_spacing=0.16,
                        subplot_titles=("parameters (log scale)", f"training memory, {dtype} (MiB)"))
    names = ["trainable<br>counted", "trainable<br>formula", "frozen<br>counted"]
    values = [counted["trainable"], formula_trainable, counted["frozen"]]
    colours = [QUALITATIVE[2], "#98df8a", QUALITATIVE[7]]
    fig.add_trace(go.Bar(
        x=names, y=values, marker_color=colours, text=[f"{v:,}" for v in values], textposition="outside",
        cliponaxis=False, showlegend=False, hovertemplate="%{x}<br>%{y:,} parameters<extra></extra>",
    ), row=1, col=1)
    parts: list[str] = []
    for bars in memory.values():
        parts += [p for p in bars if p not in parts]
    for i, part in enumerate(parts):
        fig.add_trace(go.Bar(
            x=list(memory), y=[memory[m].get(part, 0) / MIB for m in memory], name=part,
            marker_color=QUALITATIVE[i % len(QUALITATIVE)],
            hovertemplate=f"{part}<br>%{{x}}: %{{y:,.3f}} MiB<extra></extra>",
        ), row=1, col=2)
    share = counted["trainable"] / max(1, counted["trainable"] + counted["frozen"])
    # broken for the LoRA tab's 900 px column; each line past the two planned gets its own 24 px of margin
    total = counted["trainable"] + counted["frozen"]
    title = wrap_title(f"LoRA rank {rank}, alpha {alpha:g} on {', '.join(targets)} · "
                       f"{counted['trainable']:,} trainable ({share:.2%}) of {total:,}<br><sup>counted on a copy of "
                       f"the adapted structure · formula r·(in + out) per projection · "
                       f"memory predicted ({dtype}; activations not included)</sup>", LORA_COLUMN - 20)
    more = 24 * (title_lines(title) - 2)
    base_layout(fig, title, height=440 + more)
    fig.update_layout(title=top_title(title))  # hung from the top: centred, it ran onto the plots
    fig.update_layout(barmode="stack", legend=dict(orientation="h", y=-0.18, x=0.55), margin=dict(t=90 + more, b=90))
    # headroom over the tallest bar (log units): its count, written above it, stays under the subplot title
    top = math.log10(max(1, *values))
    fig.update_yaxes(type="log", dtick=1, title_text="parameters", row=1, col=1,
                     range=[math.log10(max(1, min(values))) - 0.5, top + 0.6])
    fig.update_yaxes(title_text="MiB", rangemode="tozero", row=1, col=2)
    # a phone: the legend from the left edge (from the middle it pushed the right margin out, the plots 165 px wide)
    fig.update_layout(meta={"narrow": {**stacked_phone(fig), "legend": {"x": 0, "xanchor": "left"}}})
    return fig


def loss_curve_figure(
    steps: Sequence[int],
    losses: Sequence[float],
    *,
    max_steps: int,
    status: str = "",
    provenance: Mapping[str, str] | None = None,
) -> go.Figure:
    """Training loss (nats per token) at each step of the fine-tune; empty before the first step."""
    y = np.asarray(losses, dtype=float)
    if y.size and not np.all(np.isfinite(y)):
        raise ValueError("the loss holds NaN or infinite values: lower the learning rate.")
    fig = go.Figure(go.Scatter(
        x=list(steps), y=y.tolist(), mode="lines+markers", name="training loss", line=dict(color=QUALITATIVE[3]),
        hovertemplate="step %{x}<br>loss %{y:.4f} nats/token<extra></extra>",
    ))
    title = "Fine-tuning loss on your text"
    if status:
        title += f" · {status}"
    if provenance:
        title += "<br><sup>" + provenance_text(provenance["device"], provenance["dtype"], provenance["torch"]) + "</sup>"
    base_layout(fig, title, height=360)
    fig.update_xaxes(title_text="step", range=[0, max(1, max_steps) + 0.5])
    fig.update_yaxes(title_text="next-token loss (nats per token)")
    if not y.size:
        fig.add_annotation(text="press Fine-tune to start", xref="paper", yref="paper", x=0.5, y=0.5,
                           showarrow=False, font=dict(size=14, color="#999"))
    return fig


def attention_before_after_figure(
    before: np.ndarray,
    after: np.ndarray,
    labels: Sequence[str],
    *,
    layer: int,
    head_name: str,
    before_title: str = "adapter off (base model)",
    after_title: str = "adapter on",
) -> go.Figure:
    """One head's attention weights (T, T) before and after the adapter, same axes and 0..1 colour range."""
    a, b = np.asarray(before, dtype=float), np.asarray(after, dtype=float)
    if a.shape != b.shape or a.shape != (len(labels), len(labels)):
        raise ValueError(f"both patterns must be ({len(labels)}, {len(labels)}), got {a.shape} and {b.shape}.")
    fig = make_subplots(rows=1, cols=2, subplot_titles=(before_title, after_title), horizontal_spacing=0.12)
    fig.add_trace(heatmap_trace(a, labels, labels, showscale=False, name=before_title), row=1, col=1)
    fig.add_trace(heatmap_trace(b, labels, labels, name=after_title), row=1, col=2)
    diff = float(np.abs(a - b).max()) if a.size else 0.0
    title = f"Layer {layer} · {head_name} · attention weights · largest change {diff:.4f}"
    height = max(380, 160 + 20 * len(labels))
    base_layout(fig, wrap_title(title, PAGE_WIDTH - 20), height=height)
    for col in (1, 2):
        fig.update_xaxes(title_text=KEY_AXIS, type="category", row=1, col=col)
        fig.update_yaxes(title_text=QUERY_AXIS if col == 1 else None, type="category", autorange="reversed",
                         row=1, col=col)
        # every k-th token labelled that stands apart at projector size, keys upright (hover names each)
        fig.update_layout(token_axes_layout(labels, labels, width=PAGE_WIDTH, height=height, top=90,
                                            suffix="" if col == 1 else "2", share=0.44))
    fig.update_layout(meta={"narrow": two_maps_phone(fig, title, labels, labels)})
    return fig
