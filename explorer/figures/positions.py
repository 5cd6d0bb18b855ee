"""Position figures: RoPE pairs turning on the unit circle, the angle table, score against relative
distance, and the encoder's sinusoidal table.

Angles are radians; positions are token indices (0 at the top of every position axis).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from .common import DIVERGING, QUALITATIVE, base_layout, colorbar, phone_layout

CYCLIC = "Twilight"


def rope_circle_figure(
    angles: np.ndarray,
    pairs: Sequence[int],
    position: int,
    *,
    head_dim: int,
    theta: float,
    wavelengths: np.ndarray | None = None,
) -> go.Figure:
    """Each followed pair ``i`` as a unit vector turned by ``angles[position, i]``; a faint trail shows
    positions 0..position. ``angles`` (T, D/2) radians."""
    angles = np.asarray(angles, dtype=float)
    T = angles.shape[0]
    if not 0 <= position < T:
        raise ValueError(f"position must be between 0 and {T - 1}, got {position}.")
    fig = go.Figure()
    circle = np.linspace(0, 2 * math.pi, 181)
    fig.add_trace(go.Scatter(x=np.cos(circle), y=np.sin(circle), mode="lines", hoverinfo="skip",
                             line=dict(color="#bbb", width=1), showlegend=False))
    half = head_dim // 2
    for n, i in enumerate(pairs):
        colour = QUALITATIVE[n % len(QUALITATIVE)]
        a = angles[: position + 1, i]
        # (the turn on a line of its own: on one line a phone's legend ran past the figure's right edge)
        wl = f",<br>one turn per {wavelengths[i]:,.1f} positions" if wavelengths is not None else ""
        name = f"pair {i} (dims {i}, {i + half}){wl}"
        fig.add_trace(go.Scatter(
            x=np.cos(a), y=np.sin(a), mode="lines+markers", line=dict(color=colour, width=1),
            marker=dict(size=4, color=colour, opacity=0.35), name=name, legendgroup=str(i), showlegend=False,
            customdata=np.stack([np.arange(position + 1), a], axis=-1),
            hovertemplate=f"pair {i}<br>position %{{customdata[0]}}<br>angle %{{customdata[1]:.3f}} rad<extra></extra>",
        ))
        ang = angles[position, i]
        fig.add_trace(go.Scatter(
            x=[0, math.cos(ang)], y=[0, math.sin(ang)], mode="lines+markers", name=name, legendgroup=str(i),
            line=dict(color=colour, width=3), marker=dict(size=[0, 12], color=colour),
            hovertemplate=f"pair {i} at position {position}<br>angle {ang:.3f} rad "
                          f"({math.degrees(ang) % 360:.1f}° mod 360)<extra></extra>",
        ))
    base_layout(fig, f"RoPE pairs turned to position {position} · θ = {theta:,.0f}", height=520)
    fig.update_xaxes(title_text="first dim of the pair (i)", range=[-1.25, 1.25], zeroline=True)
    fig.update_yaxes(title_text="second dim of the pair (i + D/2)", range=[-1.25, 1.25], zeroline=True,
                     scaleanchor="x", scaleratio=1)
    fig.update_layout(legend=dict(orientation="h", y=-0.18, x=0))
    # a phone: the title wrapped and the figure taller, the square circle 200 px beside a legend of two-line entries
    narrow = phone_layout(fig)
    narrow["height"] = narrow.get("height", 520) + 100
    fig.update_layout(meta={"narrow": narrow})
    return fig


def rope_angle_heatmap(angles: np.ndarray, *, theta: float, wavelengths: np.ndarray | None = None) -> go.Figure:
    """Rotation angle (mod 2π) of every pair at every position: fast pairs stripe, slow pairs barely move."""
    angles = np.asarray(angles, dtype=float)
    T, P = angles.shape
    wrapped = np.mod(angles, 2 * math.pi)
    custom = None
    hover = "position %{y}<br>pair %{x}<br>angle %{z:.3f} rad (mod 2π)<extra></extra>"
    if wavelengths is not None:
        custom = np.broadcast_to(np.asarray(wavelengths, dtype=float)[None, :], (T, P))
        hover = ("position %{y}<br>pair %{x} (one turn per %{customdata:,.1f} positions)<br>"
                 "angle %{z:.3f} rad (mod 2π)<extra></extra>")
    fig = go.Figure(go.Heatmap(
        z=wrapped, x=np.arange(P), y=np.arange(T), colorscale=CYCLIC, zmin=0, zmax=2 * math.pi,
        customdata=custom, hovertemplate=hover,
        colorbar=colorbar("angle (rad, mod 2π)",
                      tickvals=[0, math.pi / 2, math.pi, 3 * math.pi / 2, 2 * math.pi],
                      ticktext=["0", "π/2", "π", "3π/2", "2π"]),
    ))
    base_layout(fig, f"Decoder · RoPE angles · position × pair · θ = {theta:,.0f}", height=480)
    fig.update_xaxes(title_text="pair i (rotates dims i and i + D/2; higher i turns slower)")
    fig.update_yaxes(title_text="position", autorange="reversed")
    return fig


def rope_distance_figure(curves: Mapping[str, np.ndarray], *, highlight: str | None = None,
                         subtitle: str = "") -> go.Figure:
    """Rotated q·k/√D against relative distance m − n (0, 1, 2, ...): one line per θ."""
    fig = go.Figure()
    for n, (label, y) in enumerate(curves.items()):
        y = np.asarray(y, dtype=float)
        bold = label == highlight
        fig.add_trace(go.Scatter(
            x=np.arange(len(y)), y=y, mode="lines", name=label,
            line=dict(width=3 if bold else 1.5, color=QUALITATIVE[n % len(QUALITATIVE)],
                      dash=None if bold else "dot"),
            hovertemplate=f"{label}<br>distance %{{x}}<br>q·k/√D %{{y:.4f}}<extra></extra>",
        ))
    title = "Rotated q·k/√D against relative distance m − n"
    if subtitle:
        title += f"<br><sup>{subtitle}</sup>"
    base_layout(fig, title, height=440)
    fig.update_layout(margin=dict(t=100), legend=dict(orientation="h", y=-0.2, x=0))
    fig.update_xaxes(title_text="relative distance m − n (positions)")
    fig.update_yaxes(title_text="score q·k/√D (unitless)", zeroline=True)
    return fig


def sinusoidal_heatmap(table: np.ndarray) -> go.Figure:
    """The encoder's position table (T, C): even channels sin, odd channels cos, values in −1..1."""
    table = np.asarray(table, dtype=float)
    T, C = table.shape
    fig = go.Figure(go.Heatmap(
        z=table, x=np.arange(C), y=np.arange(T), colorscale=DIVERGING, zmin=-1, zmax=1, zmid=0,
        colorbar=colorbar("value added to the embedding (−1..1)"),
        hovertemplate="position %{y}<br>channel %{x}<br>value %{z:.4f}<extra></extra>",
    ))
    base_layout(fig, "Encoder · sinusoidal position table (added to the embedding)", height=480)
    fig.update_xaxes(title_text="channel (even: sin, odd: cos; higher channels change slower)")
    fig.update_yaxes(title_text="position", autorange="reversed")
    return fig


def theta_attention_figure(before: np.ndarray, after: np.ndarray, labels: Sequence[str], *,
                           theta_before: float, theta_after: float, layer: int, head_text: str) -> go.Figure:
    """The same head with the trained θ and with another θ, side by side on one 0..1 scale."""
    from .encoder_decoder import side_by_side_maps

    return side_by_side_maps(
        before, after, labels,
        left_title=f"θ = {theta_before:,.0f} (trained)", right_title=f"θ = {theta_after:,.0f}",
        title=f"Layer {layer} · {head_text} · attention weights with another rope_theta",
    )


def rope_wavelength_figure(plain: np.ndarray, scaled: np.ndarray | None, *, theta: float, scaling_text: str = "",
                           context: int | None = None) -> go.Figure:
    """Positions per full turn of each pair (D/2,), log scale: θ^(2i/D)·2π as trained, and beside it the
    wavelengths the model really rotates by when it has RoPE scaling (``scaled``; None: no scaling)."""
    plain = np.asarray(plain, dtype=float)
    pairs = np.arange(len(plain))
    fig = go.Figure(go.Scatter(
        x=pairs, y=plain, mode="lines+markers", name=f"plain: 2π·θ^(2i/D), θ = {theta:,.0f}",
        line=dict(color=QUALITATIVE[0], width=2, dash="dot" if scaled is not None else None),
        hovertemplate="pair %{x}<br>plain: one turn per %{y:,.1f} positions<extra></extra>",
    ))
    if scaled is not None:
        fig.add_trace(go.Scatter(
            x=pairs, y=np.asarray(scaled, dtype=float), mode="lines+markers", name=f"scaled ({scaling_text})",
            line=dict(color=QUALITATIVE[1], width=3),
            hovertemplate="pair %{x}<br>scaled: one turn per %{y:,.1f} positions<extra></extra>",
        ))
    if context:
        # A trace, not add_hline's annotation: Plotly reads an annotation's y on a log axis as log10(y), so a
        # context of 256 stretched the axis to 10^277.
        fig.add_trace(go.Scatter(
            x=[pairs[0], pairs[-1]], y=[context, context], mode="lines", name=f"context: {context:,} positions",
            line=dict(color="#888", dash="dash", width=1),
            hovertemplate=f"context: {context:,} positions<extra></extra>",
        ))
    what = f"plain and scaled ({scaling_text})" if scaled is not None else "this model has no RoPE scaling"
    base_layout(fig, f"RoPE wavelength of each pair · {what}", height=420)
    fig.update_layout(legend=dict(orientation="h", y=-0.2, x=0))
    fig.update_xaxes(title_text="pair i (rotates dims i and i + D/2)")
    # dtick=1: one label per power of ten (the default labels 2 and 5 too, unreadable from the back of a room).
    fig.update_yaxes(title_text="wavelength (positions per full turn, log scale)", type="log", dtick=1)
    return fig
