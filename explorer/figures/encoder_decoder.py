"""Encoder vs decoder figures: masks and attention maps side by side on one colour range, the two norms
on the same vector, the two feed-forward activations on the same pre-activations.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .common import (KEY_AXIS, PAGE_WIDTH, QUALITATIVE, QUERY_AXIS, SEQUENTIAL, WEIGHT_COLORBAR,
                     auto_height, base_layout, colorbar, heatmap_trace, stacked_phone, title_lines, token_axes_layout,
                     top_title, two_maps_phone, wrap_title)


def side_by_side_maps(
    left: np.ndarray,
    right: np.ndarray,
    labels: Sequence[str],
    *,
    left_title: str,
    right_title: str,
    title: str,
    colorbar_title: str = WEIGHT_COLORBAR,
    value_name: str = "weight",
    zmin: float = 0.0,
    zmax: float = 1.0,
    right_labels: Sequence[str] | None = None,
    width: int = PAGE_WIDTH,
) -> go.Figure:
    """Two (T, T) maps with one shared colour range (``zmin``..``zmax``). ``right_labels``: the right
    map's tokens when its model tokenizes the sentence differently (default: ``labels``). Laid out for ``width``
    px (every ``k``-th token labelled that stands apart at projector size); on a phone the maps stack."""
    right_labels = labels if right_labels is None else right_labels
    fig = make_subplots(rows=1, cols=2, subplot_titles=[left_title, right_title], horizontal_spacing=0.12)
    for col, z, lab in ((1, left, labels), (2, right, right_labels)):
        trace = heatmap_trace(np.asarray(z, dtype=float), lab, lab, colorbar_title=colorbar_title,
                              zmin=zmin, zmax=zmax, colorscale=SEQUENTIAL, value_name=value_name,
                              showscale=False)
        trace.update(coloraxis="coloraxis")
        fig.add_trace(trace, row=1, col=col)
        fig.update_xaxes(title_text=KEY_AXIS, type="category", tickangle=-45, row=1, col=col)
        fig.update_yaxes(title_text=QUERY_AXIS if col == 1 else None, type="category", autorange="reversed",
                         row=1, col=col)
    fig.update_layout(coloraxis=dict(colorscale=SEQUENTIAL, cmin=zmin, cmax=zmax,
                                     colorbar=colorbar(colorbar_title)))
    wrapped = wrap_title(title, width - 20)
    top = 52 + 24 * title_lines(wrapped)  # the title, then the maps' own titles (8 px fewer: a presented plot's)
    height = auto_height(max(len(labels), len(right_labels)), lo=420, hi=820)
    base_layout(fig, wrapped, height=height)
    fig.update_layout(margin=dict(t=top), title=top_title(wrapped))
    for suffix, lab in (("", labels), ("2", right_labels)):
        fig.update_layout(token_axes_layout(lab, lab, width=width, height=height, top=top, suffix=suffix,
                                            share=0.44))
    fig.update_layout(meta={"narrow": two_maps_phone(fig, title, labels, right_labels), "top": top})  # (common.py)
    return fig


def fill_in_blank_figure(left_tokens: Sequence[str], left_probs: Sequence[float],
                         right_tokens: Sequence[str] | None, right_probs: Sequence[float] | None, *,
                         hidden: str, left_title: str, right_title: str) -> go.Figure:
    """Two top-k bar charts side by side on one probability axis (0..1), best guess at the top; the
    hidden word's bar (if among the guesses) is drawn in another colour. A side given as None is
    left empty with its title saying why."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=[left_title, right_title], horizontal_spacing=0.18)
    for col, tokens, probs in ((1, left_tokens, left_probs), (2, right_tokens, right_probs)):
        if tokens is None:
            continue
        colours = [QUALITATIVE[1] if t == hidden else QUALITATIVE[0] for t in tokens]
        fig.add_trace(go.Bar(x=list(probs), y=[f"{i + 1}·{t}" for i, t in enumerate(tokens)], orientation="h",
                             marker_color=colours, showlegend=False,
                             hovertemplate="%{y}<br>probability %{x:.4f}<extra></extra>"), row=1, col=col)
        fig.update_yaxes(autorange="reversed", type="category", row=1, col=col)
        fig.update_xaxes(title_text="probability (0–1)", range=[0, 1], row=1, col=col)
    base_layout(fig, f"Fill in the blank: top guesses for the hidden token “{hidden}” (orange = the hidden word)",
                height=420)
    fig.update_layout(margin=dict(t=90))
    fig.update_layout(meta={"narrow": stacked_phone(fig)})
    return fig


def norm_figure(x: np.ndarray, rms: np.ndarray, ln: np.ndarray, *, token: str, eps: float) -> go.Figure:
    """The same hidden vector through RMSNorm and LayerNorm (unit gain, zero bias), channel by channel,
    and the three value distributions. x, rms, ln: (C,)."""
    x, rms, ln = (np.asarray(a, dtype=float) for a in (x, rms, ln))
    C = x.shape[0]
    ch = np.arange(C)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.62, 0.38], horizontal_spacing=0.1,
                        subplot_titles=["value per channel", "distribution of the values"])
    series = [
        (f"input x · mean {x.mean():+.3f}, rms {np.sqrt((x ** 2).mean()):.3f}", x, "#7f7f7f"),
        (f"RMSNorm(x) = x / rms(x) · mean {rms.mean():+.3f}, rms {np.sqrt((rms ** 2).mean()):.3f}", rms,
         QUALITATIVE[0]),
        (f"LayerNorm(x) = (x − mean) / std · mean {ln.mean():+.3f}, std {ln.std():.3f}", ln, QUALITATIVE[1]),
    ]
    for name, y, colour in series:
        fig.add_trace(go.Scatter(x=ch, y=y, mode="lines", name=name, legendgroup=name, line=dict(color=colour,
                                 width=1.5), hovertemplate="channel %{x}<br>value %{y:.4f}<extra></extra>"),
                      row=1, col=1)
        fig.add_trace(go.Histogram(x=y, name=name, legendgroup=name, showlegend=False, opacity=0.55,
                                   marker_color=colour, nbinsx=40,
                                   hovertemplate="value %{x}<br>channels %{y}<extra></extra>"), row=1, col=2)
    fig.update_layout(barmode="overlay", legend=dict(orientation="h", y=-0.25, x=0))
    fig.update_xaxes(title_text="channel", row=1, col=1)
    fig.update_yaxes(title_text="value (unitless)", row=1, col=1)
    fig.update_xaxes(title_text="value (unitless)", row=1, col=2)
    fig.update_yaxes(title_text="channels", row=1, col=2)
    base_layout(fig, f"RMSNorm vs LayerNorm on the same vector (token {token}; gain 1, bias 0, eps {eps:g})",
                height=470)
    fig.update_layout(margin=dict(t=80, b=120))
    fig.update_layout(meta={"narrow": stacked_phone(fig)})
    return fig


def activation_figure(grid: np.ndarray, silu_grid: np.ndarray, gelu_grid: np.ndarray, u: np.ndarray,
                      silu_u: np.ndarray, gelu_u: np.ndarray, swiglu: np.ndarray, *, token: str) -> go.Figure:
    """Left: SiLU (SwiGLU's gate) and GELU as functions, with the real pre-activations ``u`` marked on both.
    Right: the distribution of what each feed-forward passes on for the same ``u``: GELU(u) against
    SwiGLU's SiLU(gate)·up."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=["activation functions and the real pre-activations",
                                        "what goes into down_proj"])
    fig.add_trace(go.Scatter(x=grid, y=silu_grid, mode="lines", name="SiLU(u) = u·σ(u) (SwiGLU gate)",
                             line=dict(color=QUALITATIVE[0], width=2),
                             hovertemplate="u %{x:.3f}<br>SiLU %{y:.4f}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=grid, y=gelu_grid, mode="lines", name="GELU(u) = u·Φ(u)",
                             line=dict(color=QUALITATIVE[1], width=2, dash="dash"),
                             hovertemplate="u %{x:.3f}<br>GELU %{y:.4f}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=u, y=silu_u, mode="markers", name="real u through SiLU",
                             marker=dict(color=QUALITATIVE[0], size=5, opacity=0.6),
                             hovertemplate="u %{x:.3f}<br>SiLU %{y:.4f}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=u, y=gelu_u, mode="markers", name="real u through GELU",
                             marker=dict(color=QUALITATIVE[1], size=5, opacity=0.6, symbol="x"),
                             hovertemplate="u %{x:.3f}<br>GELU %{y:.4f}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Histogram(x=gelu_u, name="GELU(u)", opacity=0.55, marker_color=QUALITATIVE[1], nbinsx=40,
                               hovertemplate="value %{x}<br>units %{y}<extra></extra>"), row=1, col=2)
    fig.add_trace(go.Histogram(x=swiglu, name="SwiGLU: SiLU(gate)·up", opacity=0.55, marker_color=QUALITATIVE[2],
                               nbinsx=40, hovertemplate="value %{x}<br>units %{y}<extra></extra>"), row=1, col=2)
    fig.update_layout(barmode="overlay", legend=dict(orientation="h", y=-0.25, x=0))
    fig.update_xaxes(title_text="pre-activation u (unitless)", row=1, col=1)
    fig.update_yaxes(title_text="activation (unitless)", row=1, col=1)
    fig.update_xaxes(title_text="value (unitless)", row=1, col=2)
    fig.update_yaxes(title_text="hidden units", row=1, col=2)
    base_layout(fig, f"SwiGLU vs GELU on the same pre-activations (token {token})", height=470)
    fig.update_layout(margin=dict(t=80, b=120))
    fig.update_layout(meta={"narrow": stacked_phone(fig)})
    return fig

