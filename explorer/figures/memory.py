"""Figures of the memory lab: naive vs flash (SDPA) vs tiled attention, measured beside predicted, and the
tiled algorithm stepped block by block.

Pure functions: lists, dicts of numbers and NumPy arrays in, plotly figures out. No torch modules, no gradio.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .common import (
    DIVERGING,
    KEY_AXIS,
    QUERY_AXIS,
    WEIGHT_COLORBAR,
    base_layout,
    colorbar,
    log_ticks,
    provenance_text,
    symmetric_range,
)

MIB = 1024 ** 2
IMPL_COLOURS = {"naive": "#d62728", "sdpa": "#2ca02c", "tiled": "#1f77b4"}
IMPL_NAMES = {"naive": "naive (full T×T matrix)", "sdpa": "SDPA (PyTorch's fused flash kernel)",
              "tiled": "tiled (our online softmax)"}
GROWTH = {"naive": "O(T²)", "sdpa": "O(T)", "tiled": "O(T)"}


def _clean(values) -> list[float | None]:
    """Floats with None for missing, non-finite or non-positive entries (log axes cannot show them)."""
    out: list[float | None] = []
    for v in values:
        out.append(float(v) if v is not None and np.isfinite(v) and v > 0 else None)
    return out


def memory_sweep_figure(
    rows: Sequence[Mapping],
    *,
    provenance: Mapping[str, str],
    n_heads: int,
    head_dim: int,
    n_kv_heads: int,
    causal: bool = True,
    batch: int = 1,
    memory_source: str | None = None,
    sdpa_kernel: str | None = None,
) -> go.Figure:
    """Peak memory (left) and time (right) against sequence length, one colour per implementation.

    rows: ``explorer.measure.attention_sweep`` rows (``seq_len``, ``impl``, ``peak_bytes``, ``predicted_bytes``,
    ``seconds``; ``peak_bytes``/``seconds`` None where a size was refused). Measured: solid lines with filled
    markers. Predicted (the analytic peak, O(T²) for naive, O(T) for the others): dashed lines, same colour,
    same units (MiB). Both axes logarithmic, so T² is a line twice as steep as T.
    """
    impls = [i for i in ("naive", "sdpa", "tiled") if any(r["impl"] == i for r in rows)]
    impls += sorted({r["impl"] for r in rows} - set(impls))
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("peak extra memory (MiB, log scale)", "time per call (ms, log scale)"))
    mib: list[float | None] = []
    times: list[float | None] = []
    for impl in impls:
        mine = sorted((r for r in rows if r["impl"] == impl), key=lambda r: r["seq_len"])
        x = [int(r["seq_len"]) for r in mine]
        colour = IMPL_COLOURS.get(impl, "#7f7f7f")
        name = IMPL_NAMES.get(impl, impl)
        peak = _clean(r["peak_bytes"] / MIB if r["peak_bytes"] is not None else None for r in mine)
        pred = _clean(r["predicted_bytes"] / MIB if r["predicted_bytes"] is not None else None for r in mine)
        ms = _clean(r["seconds"] * 1e3 if r["seconds"] is not None else None for r in mine)
        mib += peak + pred
        times += ms
        fig.add_trace(go.Scatter(
            x=x, y=peak, mode="lines+markers", name=f"{name} · measured", legendgroup=impl,
            line=dict(color=colour, width=3), marker=dict(size=8),
            hovertemplate=f"{impl} measured<br>T=%{{x}}<br>%{{y:,.3f}} MiB<extra></extra>",
        ), row=1, col=1)
        fig.add_trace(go.Scatter(
            x=x, y=pred, mode="lines+markers", name=f"{name} · predicted {GROWTH.get(impl, '')}", legendgroup=impl,
            line=dict(color=colour, dash="dash", width=1.5), marker=dict(symbol="circle-open", size=10),
            hovertemplate=f"{impl} predicted<br>T=%{{x}}<br>%{{y:,.3f}} MiB<extra></extra>",
        ), row=1, col=1)
        fig.add_trace(go.Scatter(
            x=x, y=ms, mode="lines+markers", name=f"{impl} · time", legendgroup=impl, showlegend=False,
            line=dict(color=colour, width=3), marker=dict(size=8),
            hovertemplate=f"{impl} measured<br>T=%{{x}}<br>%{{y:,.3f}} ms<extra></extra>",
        ), row=1, col=2)
    kv = f"{n_kv_heads} KV heads" if n_kv_heads != n_heads else "MHA"
    text = (provenance_text(provenance["device"], provenance["dtype"], provenance["torch"], "measured (solid)")
            + " · predicted (dashed)")
    if memory_source:
        text += f" · peak from {memory_source.split(' allocation')[0]}"
    if sdpa_kernel:
        text += f" · SDPA ran its {sdpa_kernel} kernel"
    heading = ["Naive vs flash attention", f"{n_heads} heads × {head_dim} dims ({kv})",
               f"batch {batch} · {'causal' if causal else 'bidirectional'}"]
    base_layout(fig, f"{' · '.join(heading)}<br><sup>{text}</sup>", height=500)
    fig.update_layout(legend=dict(orientation="h", y=-0.2, x=0), margin=dict(t=90, b=150))
    lens = sorted({int(r["seq_len"]) for r in rows})
    for col in (1, 2):
        fig.update_xaxes(type="log", title_text="sequence length T (tokens)", tickvals=lens,
                         ticktext=[str(t) for t in lens], row=1, col=col)
    # named ticks (1 MiB, 10 MiB, ...): Plotly's own log ticks label the steps between decades "2" and "5"
    for col, unit, values in ((1, "MiB", mib), (2, "ms", times)):
        vals, names = log_ticks(values, unit)
        fig.update_yaxes(type="log", tickmode="array", tickvals=vals, ticktext=names, title_text=unit, row=1, col=col)
    fig.update_layout(meta={"narrow": _stacked(fig, heading, text)})
    return fig


def _stacked(fig: go.Figure, heading: list[str], provenance: str) -> dict:
    """The sweep's layout for a phone (the page's Plotly wrappers apply it under 640 px): memory above time, each
    chart the page's width, the heading one part a line and the provenance on lines of about 45 characters."""
    memory, time = (a.to_plotly_json() for a in fig.layout.annotations)
    lines: list[str] = []
    for part in provenance.split(" · "):
        if lines and len(lines[-1]) + 3 + len(part) <= 45:
            lines[-1] += " · " + part
        else:
            lines.append(part)
    return {"height": 980, "margin": {"l": 60, "r": 10, "t": 220, "b": 220},
            "title": {"font": {"size": 15}, "y": 0.935, "yanchor": "top",  # below the figure's label
                      "text": "<br>".join(heading) + f"<br><sup>{'<br>'.join(lines)}</sup>"},
            "xaxis": {"domain": [0, 1], "title": {"text": ""}}, "yaxis": {"domain": [0.58, 1]},
            "xaxis2": {"domain": [0, 1]}, "yaxis2": {"domain": [0, 0.42]},
            # (lifted off the chart: the top tick label, "100 MiB", sat under the subplot title)
            "annotations": [{**memory, "x": 0.5, "y": 1.0, "yshift": 12, "font": {"size": 13}},
                            {**time, "x": 0.5, "y": 0.42, "yshift": 12, "font": {"size": 13}}],
            "legend": {"y": -0.1, "yanchor": "top", "font": {"size": 11}}}


def _finite_or_none(a: np.ndarray, floor: float = -1e30) -> list:
    """Nested lists with None where a value is missing (NaN, inf, or the masking fill value)."""
    a = np.asarray(a, dtype=float)
    ok = np.isfinite(a) & (a > floor)
    return np.where(ok, a, None).tolist()


def tiled_step_figure(
    weights: np.ndarray,
    m: np.ndarray,
    l: np.ndarray,
    out: np.ndarray,
    final_out: np.ndarray,
    *,
    start: int,
    stop: int,
    block: int,
    n_blocks: int,
    head: int,
    final_m: np.ndarray | None = None,
    final_l: np.ndarray | None = None,
) -> go.Figure:
    """One step of tiled (online-softmax) attention for one head.

    weights (T, S): the full attention weights, for reference (keys already read: bright; this block:
    outlined; keys not read yet: greyed). m (T,), l (T,): running max of the scores and running sum of
    exp(score - m) per query row after this block. out (T, D): the output so far (acc / l); final_out (T, D)
    the finished output, drawn with the same colour range so the rows visibly take their final shape.
    """
    w = np.asarray(weights, dtype=float)
    T, S = w.shape
    out, final_out = np.asarray(out, dtype=float), np.asarray(final_out, dtype=float)
    rows = list(range(T))
    fig = make_subplots(
        rows=2, cols=2, horizontal_spacing=0.2, vertical_spacing=0.16,
        subplot_titles=(
            f"attention weights · key block {block} = keys {start}–{stop - 1}",
            f"output so far (acc / l) · max |so far − final| {np.nanmax(np.abs(out - final_out)):.2e}",
            "running max m of the scores, per query row",
            "running sum l of exp(score − m), per query row",
        ),
    )
    fig.add_trace(go.Heatmap(
        z=_finite_or_none(w), x=list(range(S)), y=rows, colorscale="Viridis", zmin=0, zmax=1,
        colorbar=colorbar(WEIGHT_COLORBAR, x=0.41, len=0.42, y=0.79),
        hovertemplate="query %{y}<br>key %{x}<br>weight %{z:.4f}<extra></extra>",
    ), row=1, col=1)
    # keys not read yet: grey veil; the current block: red outline
    if stop < S:
        fig.add_shape(type="rect", x0=stop - 0.5, x1=S - 0.5, y0=-0.5, y1=T - 0.5, fillcolor="rgba(255,255,255,0.75)",
                      line=dict(width=0), row=1, col=1)
    fig.add_shape(type="rect", x0=start - 0.5, x1=stop - 0.5, y0=-0.5, y1=T - 0.5, line=dict(color="#d62728", width=3),
                  row=1, col=1)
    vmax = symmetric_range(final_out)
    fig.add_trace(go.Heatmap(
        z=_finite_or_none(out), y=rows, colorscale=DIVERGING, zmin=-vmax, zmax=vmax, zmid=0,
        colorbar=colorbar("output value (signed)", x=1.0, len=0.42, y=0.79),
        hovertemplate="query %{y}<br>dim %{x}<br>value %{z:.4f}<extra></extra>",
    ), row=1, col=2)
    for col, now, final, name in ((1, m, final_m, "m"), (2, l, final_l, "l")):
        fig.add_trace(go.Scatter(
            x=rows, y=_finite_or_none(now), mode="lines+markers", name=f"{name} after block {block}",
            line=dict(color="#1f77b4"), marker=dict(size=4),
            hovertemplate=f"query %{{x}}<br>{name} %{{y:.4f}}<extra>after block {block}</extra>",
        ), row=2, col=col)
        if final is not None:
            fig.add_trace(go.Scatter(
                x=rows, y=_finite_or_none(final), mode="lines", name=f"{name} at the end",
                line=dict(color="#7f7f7f", dash="dash"),
                hovertemplate=f"query %{{x}}<br>final {name} %{{y:.4f}}<extra></extra>",
            ), row=2, col=col)
    base_layout(fig, f"Tiled attention, head {head} · step {block + 1} of {n_blocks}", height=720)
    fig.update_layout(legend=dict(orientation="h", y=-0.12, x=0))
    fig.update_xaxes(title_text=KEY_AXIS + " (position)", row=1, col=1)
    fig.update_yaxes(title_text=QUERY_AXIS + " (position)", autorange="reversed", row=1, col=1)
    fig.update_xaxes(title_text="head dimension", row=1, col=2)
    fig.update_yaxes(title_text="query position", autorange="reversed", row=1, col=2)
    fig.update_xaxes(title_text="query position", row=2, col=1)
    fig.update_xaxes(title_text="query position", row=2, col=2)
    fig.update_yaxes(title_text="m (scaled score)", row=2, col=1)
    fig.update_yaxes(title_text="l (sum of exp)", row=2, col=2)
    return fig
