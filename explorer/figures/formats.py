"""Figures of the weight-formats section: decode tokens/s against bytes read per token, with the memory
bandwidth's speed limit drawn as the line tokens/s = bandwidth / bytes.

Pure functions: numbers in, plotly figures out. No torch modules, no gradio.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from .common import QUALITATIVE, base_layout

MB = 1e6


def roofline_figure(points: Sequence[dict], bandwidth_bytes_per_s: float, *, provenance: str = "") -> go.Figure:
    """Each point {"name", "bytes_per_token", "tokens_per_s"} as a marker; the line bandwidth / bytes beside them.

    x: MB read per decoded token (log); y: tokens per second (log). A point on the line runs at the memory limit.
    """
    if bandwidth_bytes_per_s <= 0:
        raise ValueError("bandwidth must be positive.")
    if not points:
        raise ValueError("give at least one measured point.")
    xs = np.array([p["bytes_per_token"] for p in points], dtype=float)
    if np.any(xs <= 0):
        raise ValueError("bytes per token must be positive.")
    lo, hi = xs.min() / 2, xs.max() * 2
    line_x = np.geomspace(lo, hi, 50)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=line_x / MB, y=bandwidth_bytes_per_s / line_x, mode="lines",
                             name=f"limit: {bandwidth_bytes_per_s / 1e9:.1f} GB/s ÷ bytes per token",
                             line=dict(color="#444", dash="dash"),
                             hovertemplate="%{x:.3g} MB/token → at most %{y:.1f} tokens/s<extra>limit</extra>"))
    for i, p in enumerate(points):
        limit = bandwidth_bytes_per_s / p["bytes_per_token"]
        fig.add_trace(go.Scatter(
            x=[p["bytes_per_token"] / MB], y=[p["tokens_per_s"]], mode="markers+text", name=p["name"],
            text=[p["name"]], textposition="top center", marker=dict(size=12, color=QUALITATIVE[i % len(QUALITATIVE)]),
            hovertemplate=(f"{p['name']}<br>%{{x:.3g}} MB read per token<br>%{{y:.1f}} tokens/s measured<br>"
                           f"{p['tokens_per_s'] / limit:.0%} of the limit ({limit:.1f} tokens/s)<extra></extra>")))
    base_layout(fig, "Decoding speed against bytes read per token (the memory roofline)", height=440)
    fig.update_xaxes(type="log", title="MB read per decoded token (weights + KV cache)")
    fig.update_yaxes(type="log", dtick=1, title="decode tokens per second (measured)")
    if provenance:
        fig.add_annotation(text=provenance, xref="paper", yref="paper", x=0, y=-0.2, showarrow=False,
                           font=dict(size=11, color="#666"), xanchor="left")
    return fig
