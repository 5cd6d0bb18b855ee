"""Figures of the KV cache and generation tab: next-token probabilities, cache growth, time per token,
and KV-cache bytes of real configurations.

Pure functions: lists and NumPy arrays in, plotly figures out. No torch modules, no gradio.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from .common import PHONE_WIDTH, QUALITATIVE, base_layout, display_token, phone_layout, provenance_text, wrap_title

CHOSEN = "#d62728"
OTHER = "#1f77b4"
MIB = 1024 ** 2


def _finite(values, name: str) -> np.ndarray:
    a = np.asarray(values, dtype=float)
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} holds NaN or infinite values: nothing sensible to draw.")
    return a


def next_token_figure(
    tokens: Sequence[str],
    probs: Sequence[float],
    *,
    chosen_index: int | None,
    step: int,
    model_probs: Sequence[float] | None = None,
    ranks: Sequence[int] | None = None,
    chosen_text: str | None = None,
    settings: str = "",
) -> go.Figure:
    """Horizontal bars of the most likely next tokens at one step, the sampled one in red.

    tokens: the candidates' text (most likely first); probs: their probabilities under the distribution
    the sampler drew from (temperature, top-k, top-p applied), each in 0..1; model_probs (optional): the
    model's plain softmax for the same tokens, drawn as a dark tick on each bar; chosen_index: the
    position in ``tokens`` of the token picked (None if it is not among them); ranks: each candidate's
    rank by logit (default 0, 1, 2, ...); chosen_text: the picked token's text for the title when it is not
    among ``tokens`` (sampling can pick a token outside the top few).
    """
    p = _finite(probs, "probabilities")
    if len(tokens) != len(p):
        raise ValueError("tokens and probabilities must have the same length.")
    ranks = list(range(len(tokens))) if ranks is None else list(ranks)
    labels = [f"#{r + 1} {display_token(t)}" for r, t in zip(ranks, tokens)]  # the rank keeps labels unique
    colours = [CHOSEN if i == chosen_index else OTHER for i in range(len(tokens))]
    fig = go.Figure()
    fig.add_trace(go.Bar(
        x=p.tolist(), y=labels, orientation="h", marker_color=colours, name="sampled from (after settings)",
        text=[f"{v:.3f}" for v in p], textposition="outside", cliponaxis=False,
        hovertemplate="token %{y}<br>probability sampled from %{x:.6f}<extra></extra>",
    ))
    if model_probs is not None:
        mp = _finite(model_probs, "model probabilities")
        fig.add_trace(go.Scatter(
            x=mp.tolist(), y=labels, mode="markers", name="model softmax (temperature 1, no cut-off)",
            marker=dict(symbol="line-ns", size=22, line=dict(width=3, color="#333333")),
            hovertemplate="token %{y}<br>model softmax %{x:.6f}<extra></extra>",
        ))
    title = f"Step {step} · next-token probabilities"
    if chosen_index is not None:
        title += f" · chose “{display_token(tokens[chosen_index])}”"
    elif chosen_text is not None:
        title += f" · chose “{display_token(chosen_text)}” (outside the top {len(tokens)})"
    base_layout(fig, title, height=max(320, 110 + 30 * len(labels)))
    fig.update_layout(legend=dict(orientation="h", y=-0.18))
    fig.update_xaxes(title_text="probability (0–1)", range=[0, 1.1])
    fig.update_yaxes(title_text="candidate next token (most likely at the top)", type="category",
                     autorange="reversed")
    if settings:
        fig.add_annotation(text=settings, xref="paper", yref="paper", x=0, y=1.0, yshift=6, xanchor="left",
                           yanchor="bottom", showarrow=False, font=dict(size=11, color="#666"))
    # a phone: the settings line wrapped, and a taller plot so the long y axis title stays beside it; each label's
    # rank above its token and room past 1 for a bar's value ("#10 ⟨id 36006⟩" left the bars 177 px, and the
    # "1.000" after the top bar ran past the edge)
    narrow = phone_layout(fig, size=11)
    narrow["height"] = narrow.get("height", fig.layout.height) + 140
    narrow["yaxis"] = {"tickmode": "array", "tickvals": labels,
                       "ticktext": [f"#{r + 1}<br>{display_token(t)}" for r, t in zip(ranks, tokens)]}
    narrow["xaxis"] = {"range": [0, 1.22]}
    fig.update_layout(meta={"narrow": narrow})
    return fig


def cache_growth_figure(
    cache_len: Sequence[int],
    bytes_per_layer: Sequence[float],
    *,
    n_layers: int,
    capacity_bytes_per_layer: float | None = None,
    provenance: Mapping[str, str] | None = None,
) -> go.Figure:
    """Cache fill as generation proceeds: bytes of keys and values held per layer vs positions cached.

    cache_len: positions in the cache after each step; bytes_per_layer: filled K+V bytes of one layer then.
    """
    x = _finite(cache_len, "cache lengths")
    y = _finite(bytes_per_layer, "cache bytes") / MIB
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x.tolist(), y=y.tolist(), mode="lines+markers", name="filled, one layer",
                             line=dict(color=QUALITATIVE[0]),
                             hovertemplate="%{x} positions<br>%{y:.4f} MiB per layer<extra></extra>"))
    fig.add_trace(go.Scatter(x=x.tolist(), y=(y * n_layers).tolist(), mode="lines+markers",
                             name=f"filled, all {n_layers} layers", line=dict(color=QUALITATIVE[1]),
                             hovertemplate="%{x} positions<br>%{y:.4f} MiB in all layers<extra></extra>"))
    if capacity_bytes_per_layer is not None:
        cap = float(capacity_bytes_per_layer) / MIB
        fig.add_trace(go.Scatter(x=[x.min(), x.max()], y=[cap * n_layers] * 2, mode="lines",
                                 name="allocated (preallocated cache), all layers",
                                 line=dict(color="#7f7f7f", dash="dash"),
                                 hovertemplate="allocated %{y:.4f} MiB<extra></extra>"))
    return _per_token_layout(fig, "KV cache fill (keys + values)", provenance, "measured (tensor sizes)",
                             x_title="positions in the cache (prompt + generated)", y_title="cache memory (MiB)")


def _per_token_layout(fig: go.Figure, title: str, provenance: Mapping[str, str] | None, kind: str, *,
                      x_title: str, y_title: str) -> go.Figure:
    """The look the step-by-step charts share: provenance under the title, legend below, y axis from zero."""
    if provenance:
        title += "<br><sup>" + provenance_text(provenance["device"], provenance["dtype"], provenance["torch"],
                                               kind) + "</sup>"
    base_layout(fig, title, height=380)
    fig.update_layout(legend=dict(orientation="h", y=-0.25, x=0), margin=dict(t=80, b=110))
    fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(title_text=y_title, rangemode="tozero")
    # a phone: taller (the plot was 75 px under the wrapped title), the x title on lines that fit and the legend
    # hung below it (anchored at its bottom, the legend rose onto the axis title)
    narrow = phone_layout(fig, left=60, right=10)
    narrow["margin"]["b"] = 190
    narrow.update(height=narrow["height"] + 230, legend={"y": -0.3, "yanchor": "top", "x": 0},
                  xaxis={"title": {"text": wrap_title(x_title, PHONE_WIDTH - 90, size=12)}})
    fig.update_layout(meta={"narrow": narrow})
    return fig


def cache_timing_figure(
    seconds_with: Sequence[float],
    seconds_without: Sequence[float],
    *,
    provenance: Mapping[str, str],
    identical: bool | None = None,
    without_steps: Sequence[int] | None = None,
) -> go.Figure:
    """Time to produce each new token with the KV cache and without it (recomputing the whole sequence).

    without_steps: the new-token numbers (1-based) at which ``seconds_without`` was measured, when it was
    measured at some steps only (default: every step); only those points are drawn."""
    w = _finite(seconds_with, "times with cache") * 1e3
    wo = _finite(seconds_without, "times without cache") * 1e3
    wo_x = list(range(1, len(wo) + 1)) if without_steps is None else [int(x) for x in without_steps]
    if len(wo_x) != len(wo):
        raise ValueError("without_steps and seconds_without must have the same length.")
    every = without_steps is None or len(wo_x) == len(w)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=list(range(1, len(w) + 1)), y=w.tolist(), mode="lines+markers",
                             name=f"with KV cache (total {w.sum():.1f} ms)", line=dict(color=QUALITATIVE[2]),
                             hovertemplate="token %{x}<br>%{y:.3f} ms<extra>with cache</extra>"))
    wo_name = (f"without cache (total {wo.sum():.1f} ms)" if every else
               f"without cache, measured at {len(wo)} of {len(w)}<br>tokens only ({wo.sum():.1f} ms there)")
    fig.add_trace(go.Scatter(x=wo_x, y=wo.tolist(), mode="lines+markers", name=wo_name,
                             line=dict(color=QUALITATIVE[3]),
                             hovertemplate="token %{x}<br>%{y:.3f} ms<extra>without cache</extra>"))
    title = "Time per token · with vs without cache"
    if identical is not None:
        title += " · same tokens" if identical else " · tokens differ"
    return _per_token_layout(fig, title, provenance, "measured", x_title="new token (1 includes the prompt pass)",
                             y_title="time per token (ms)")


def kv_calculator_figure(
    seq_lens: Sequence[int],
    series: Mapping[str, Sequence[float]],
    *,
    dtype: str,
    batch: int = 1,
    highlight: str | None = None,
    window: int | None = None,
    local_note: str = "",
) -> go.Figure:
    """KV-cache bytes vs sequence length for named configurations (predicted: 2 · Hkv · D · bytes for each
    position each layer keeps: every one in a global layer, at most ``window`` in a local one).

    series: label -> bytes at each of ``seq_lens``. Log-log axes: without local layers the lines are parallel
    (all linear in T) and their vertical gaps are the MHA/GQA/MQA savings; local layers bend them after
    ``window``, drawn as a dotted line with ``local_note`` (which layers are local) beside it.
    """
    x = _finite(seq_lens, "sequence lengths")
    fig = go.Figure()
    for i, (name, values) in enumerate(series.items()):
        y = _finite(values, f"bytes of {name}") / MIB
        fig.add_trace(go.Scatter(
            x=x.tolist(), y=y.tolist(), mode="lines+markers", name=name,
            line=dict(color=QUALITATIVE[i % len(QUALITATIVE)], width=4 if name == highlight else 2),
            hovertemplate=f"{name}<br>%{{x}} tokens<br>%{{y:,.2f}} MiB<extra></extra>",
        ))
    kept = "tokens" if window is None else "tokens kept (a local layer: at most its window)"
    note = f"<br><sup>{local_note}</sup>" if local_note else ""
    base_layout(fig, f"KV cache size vs sequence length · batch {batch} · {dtype}<br><sup>predicted: 2 (K and V) × "
                     f"layers × KV heads × head_dim × {kept} × bytes per value</sup>{note}", height=440)
    if window is not None:
        fig.add_vline(x=window, line=dict(color="#555", dash="dot", width=1.5))
        fig.add_annotation(x=math.log10(window), y=1, yref="paper", xanchor="left", yanchor="top", showarrow=False,
                           text=f"window {window:,}: the local layers stop growing", font=dict(size=12))
    fig.update_layout(legend=dict(orientation="h", y=-0.22, x=0), margin=dict(t=100 if local_note else 80, b=120))
    fig.update_xaxes(title_text="sequence length (tokens, log scale)", type="log", tickvals=x.tolist(),
                     ticktext=[_short(int(t)) for t in x])
    fig.update_yaxes(title_text="KV cache (MiB, log scale)", type="log", dtick=1)
    return fig


def _short(n: int) -> str:
    """1024 -> "1k", 131072 -> "128k", 1048576 -> "1M" (binary multiples), else the number."""
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n >= 1024 and n % 1024 == 0:
        return f"{n >> 10}k"
    return str(n)
