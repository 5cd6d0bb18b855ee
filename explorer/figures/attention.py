"""Attention figures: one head's weights, every layer × head at once, head scores, GQA groups.

Inputs are NumPy arrays of attention weights (rows: queries, columns: keys; each row sums to 1) and the
token labels from ``common.token_labels``. Colour range fixed at 0..1 so heads compare.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.colors import sample_colorscale

from .common import (KEY_AXIS, QUALITATIVE, QUERY_AXIS, SEQUENTIAL, WEIGHT_COLORBAR, WEIGHT_RANGE, auto_height,
                     base_layout, colorbar, head_label, heatmap_figure, kv_head_of, thinned, tick_step)

SCORE_TITLES = {
    "previous_token": "previous-token",
    "induction": "induction",
    "first_token": "sink (first token)",
    "duplicate_token": "duplicate-token",
}


SINK_NOTE = "sink hidden: key 0 removed, each row renormalised"
SINK_COLORBAR = "share of the weight not on key 0 (0–1)"
COMPACT_CELLS = 120_000  # above this many weights the grid goes out as one byte a weight (see attention_grid)
# up to this many weights each cell's hover names its tokens: about 80 bytes a cell, so at most about 0.7 MB
LABELLED_CELLS = 8_000
GRID_PAGE = 8  # layers per page of the all-heads grid: 8 rows of maps stay legible at any model depth


def attention_title(layer: int, head: int, n_heads: int, n_kv_heads: int, *, causal: bool = True,
                    sink_hidden: bool = False) -> str:
    view = "" if causal else " · bidirectional view (mask removed)"
    sink = f" · {SINK_NOTE}" if sink_hidden else ""
    return f"Layer {layer} · {head_label(head, n_heads, n_kv_heads)} · attention weights{view}{sink}"


def _label_every_token(fig: go.Figure, x_labels: Sequence[str], y_labels: Sequence[str], height: int) -> None:
    """A tick for every token that fits (Plotly's own thinning of category ticks keeps about ten): a smaller font
    past 24 tokens, keys rotated, every k-th query label where neighbours would overlap at the figure's height.
    The keys' width is the page's: the page script thins both axes again at the drawn size and tick font."""
    size = 12 if max(len(x_labels), len(y_labels)) <= 24 else 9
    longest = max((len(t) for t in x_labels), default=1)
    plot_height = height - 60 - min(200, 40 + 0.6 * size * longest)  # the title above, rotated key labels below
    ys = thinned(y_labels, tick_step(len(y_labels), plot_height, size))
    fig.update_xaxes(tickmode="array", tickvals=list(x_labels), ticktext=list(x_labels), tickangle=-90,
                     tickfont=dict(size=size))
    fig.update_yaxes(tickmode="array", tickvals=ys, ticktext=ys, tickfont=dict(size=size))


def attention_heatmap(
    weights: np.ndarray,
    labels: Sequence[str],
    *,
    layer: int,
    head: int,
    n_heads: int,
    n_kv_heads: int,
    causal: bool = True,
    sink_hidden: bool = False,
    window: int | None = None,
) -> go.Figure:
    """One head's weights: row t is token t looking at the tokens it may see.

    ``weights`` (T, T); with ``sink_hidden`` (T, T - 1): key 0 removed and rows renormalised
    (``lens.heads.without_sink``), so the keys are ``labels[1:]`` and row 0 is blank. ``window``: the layer's
    sliding window (a local layer): a dashed staircase marks the band's lower edge, the keys a row can no longer see.
    """
    weights = np.asarray(weights, dtype=float)
    keys = list(labels[1:]) if sink_hidden else list(labels)
    title = attention_title(layer, head, n_heads, n_kv_heads, causal=causal, sink_hidden=sink_hidden)
    if window is not None:
        title += f" · local layer, sliding window {window}"
    height = auto_height(len(labels), per_row=16 if len(labels) > 24 else 22, hi=1200)
    fig = heatmap_figure(
        weights, keys, labels,
        title=title,
        x_title=KEY_AXIS + (" · key 0 hidden" if sink_hidden else ""), y_title=QUERY_AXIS, height=height,
        colorbar_title=SINK_COLORBAR if sink_hidden else WEIGHT_COLORBAR, hoverongaps=False,
    )
    _label_every_token(fig, keys, labels, height)
    if window is not None and len(labels) > window:
        fig.add_shape(type="path", path=window_edge_path(len(labels), window, 1 if sink_hidden else 0),
                      line=dict(color="white", width=2, dash="dash"), xref="x", yref="y")
    return fig


def window_edge_path(T: int, window: int, key_offset: int = 0) -> str:
    """SVG path of the sliding window's lower edge on a (T, T) map in category coordinates: row t sees keys
    t - window + 1 .. t, so the edge runs between key t - window and t - window + 1 (``key_offset`` keys dropped
    from the left of the map shift it)."""
    points = []
    for t in range(window, T):
        x = t - window + 0.5 - key_offset
        points += [(x, t - 0.5), (x, t + 0.5)]
    return "M " + " L ".join(f"{x},{y}" for x, y in points)


def grid_page(layer: int, n_layers: int, page: int = GRID_PAGE) -> range:
    """The layers the all-heads grid shows with ``layer`` selected: its block of ``page`` layers."""
    start = (layer // page) * page
    return range(start, min(n_layers, start + page))


def attention_grid(patterns: np.ndarray, labels: Sequence[str], *, n_kv_heads: int,
                   causal: bool = True, layers: Sequence[int] | None = None, layer_names: Sequence[int] | None = None,
                   n_layers: int | None = None, sink_hidden: bool = False) -> go.Figure:
    """Layers × heads as small maps in one heatmap. ``patterns`` (L, H, T, T), or (L, H, T, T - 1) with
    ``sink_hidden``; ``layers`` the indices into ``patterns`` to show (default all); ``layer_names`` the model's
    numbers for those layers (default the indices) when ``patterns`` holds one page of a deeper model.

    The maps are tiled into a single matrix with a blank line between them (one trace, so 30 layers ×
    9 heads still draws quickly); hover names the layer, head, query and key.
    """
    p = np.asarray(patterns, dtype=float)
    n_keys = len(labels) - (1 if sink_hidden else 0)
    if p.ndim != 4 or p.shape[2] != len(labels) or p.shape[3] != n_keys:
        raise ValueError(f"patterns must be (layers, heads, {len(labels)}, {n_keys}), got {p.shape}.")
    n_given = p.shape[0]
    shown = list(range(n_given)) if layers is None else [int(x) for x in layers]
    if not shown or min(shown) < 0 or max(shown) >= n_given:
        raise ValueError(f"layers must be within 0..{n_given - 1}, got {shown}.")
    total = n_given if n_layers is None else int(n_layers)  # the model's depth, for the title
    p = p[shown]
    if layer_names is not None:
        shown = [int(x) for x in layer_names]
        if len(shown) != len(p):
            raise ValueError(f"layer_names gives {len(shown)} layers for {len(p)} shown.")
    key_labels = list(labels[1:]) if sink_hidden else list(labels)
    L, H, T, S = p.shape
    gap = 1
    step, kstep = T + gap, S + gap
    big = np.full((L * step - gap, H * kstep - gap), np.nan)
    for layer in range(L):
        for head in range(H):
            big[layer * step:layer * step + T, head * kstep:head * kstep + S] = p[layer, head]
    # What one update may send to the browser is bounded (2 MB, with the other figures): small grids name the
    # tokens on hover (not a 2-layer last page of 4 heads at 64 tokens: 32,768 labels would weigh 2.8 MB),
    # mid-size ones send float32 weights and int8 indices (8 bytes a cell, about 1.3 MB at 120,000 cells once
    # base64-encoded), and bigger ones (a page of 6-8 layers x 9 heads x 64 tokens) send each weight as one byte,
    # in steps of 1/254, with hover off; the single-head map always has exact values.
    cells = L * H * T * S
    if cells > COMPACT_CELLS:
        fig = go.Figure(_compact_heatmap(big, SINK_COLORBAR if sink_hidden else WEIGHT_COLORBAR))
        note = " · overview in steps of 1/254: pick a head for exact values"
    else:
        if cells <= LABELLED_CELLS:
            custom = np.empty(big.shape, dtype=object)
            custom[:] = ""
            for layer in range(L):
                hl = [head_label(head, H, n_kv_heads) for head in range(H)]
                for head in range(H):
                    r0, c0 = layer * step, head * kstep
                    for t in range(T):
                        for s in range(S):
                            custom[r0 + t, c0 + s] = (f"layer {shown[layer]} · {hl[head]}<br>query {labels[t]}<br>"
                                                      f"key {key_labels[s]}")
            hover = "%{customdata}"
        else:
            custom = np.full(big.shape + (4,), -1, dtype=np.int8)  # T <= 127 here (64-token prompts)
            for layer in range(L):
                for head in range(H):
                    r0, c0 = layer * step, head * kstep
                    custom[r0:r0 + T, c0:c0 + S] = np.stack(np.broadcast_arrays(
                        shown[layer], head, np.arange(T)[:, None], np.arange(S)[None, :] + (T - S)), axis=-1)
            hover = "layer %{customdata[0]} · head %{customdata[1]}<br>query %{customdata[2]} → key %{customdata[3]}"
        fig = go.Figure(go.Heatmap(
            z=big.astype(np.float32), customdata=custom, colorscale=SEQUENTIAL, zmin=WEIGHT_RANGE[0],
            zmax=WEIGHT_RANGE[1], colorbar=colorbar(SINK_COLORBAR if sink_hidden else WEIGHT_COLORBAR),
            hoverongaps=False,
            hovertemplate=hover + "<br>weight %{z:.4f}<extra></extra>", xgap=0, ygap=0,
        ))
        note = ""
    view = "causal" if causal else "bidirectional view"
    which = (f"All {total} layers" if L == total else
             f"Layers {shown[0]}–{shown[-1]} of {total}" if shown == list(range(shown[0], shown[-1] + 1)) else
             f"{L} of {total} layers")
    sink = f" · {SINK_NOTE}" if sink_hidden else ""
    base_layout(fig, f"{which} × {H} heads · attention weights ({view}){sink}{note}",
                height=int(min(1400, max(320, 150 + 1000 * L / H))))
    centres_x = [h * kstep + (S - 1) / 2 for h in range(H)]
    centres_y = [layer * step + (T - 1) / 2 for layer in range(L)]
    fig.update_xaxes(title_text="head (each small map: key →)", tickvals=centres_x,
                     ticktext=[head_label(h, H, n_kv_heads) for h in range(H)], showgrid=False, zeroline=False)
    fig.update_yaxes(title_text="layer (each small map: query ↓)", tickvals=centres_y,
                     ticktext=[f"layer {layer}" for layer in shown], autorange="reversed", showgrid=False,
                     zeroline=False, scaleanchor="x", constrain="domain")
    return fig


def _compact_heatmap(big: np.ndarray, colorbar_title: str = WEIGHT_COLORBAR) -> go.Heatmap:
    """Weights as bytes: 0 marks the blank gaps (white), 1..255 the weights 0..1 in steps of 1/254."""
    levels = np.where(np.isnan(big), 0, 1 + np.rint(np.nan_to_num(big) * 254)).astype(np.uint8)
    ramp = sample_colorscale(SEQUENTIAL, 11)
    colorscale = [[0.0, "white"], [0.5 / 255, "white"]] + [
        [(1 + 254 * i / 10) / 255, c] for i, c in enumerate(ramp)]
    ticks = [0, 0.25, 0.5, 0.75, 1.0]
    return go.Heatmap(
        z=levels, colorscale=colorscale, zmin=0, zmax=255, hoverinfo="skip", xgap=0, ygap=0,
        colorbar=colorbar(colorbar_title, tickvals=[1 + 254 * t for t in ticks],
                      ticktext=[f"{t:g}" for t in ticks]),
    )


def head_scores_figure(
    scores: Mapping[str, np.ndarray],
    *,
    n_kv_heads: int,
    selected: tuple[int, int] | None = None,
    subtitle: str = "",
) -> go.Figure:
    """One (layers, heads) heatmap per score side by side, 0..1, the selected head outlined."""
    names = list(scores)
    if not names:
        raise ValueError("no head scores to draw.")
    L, H = np.asarray(scores[names[0]]).shape
    # Side-by-side axes laid out by hand, one shared y axis: make_subplots cost tens of milliseconds, paid on
    # every layer or head switch. The titles are annotations, placed as make_subplots places them.
    fig = go.Figure()
    n, spacing = len(names), 0.06
    width = (1 - spacing * (n - 1)) / n
    for i, name in enumerate(names):
        x0 = i * (width + spacing)
        # automargin: the margins grow to hold whole head labels (rotated, 16 px in projector mode)
        fig.update_layout({f"xaxis{'' if i == 0 else i + 1}": dict(domain=[x0, x0 + width], anchor="y",
                                                                    type="category", tickangle=-45,
                                                                    automargin=True)})
        fig.add_annotation(text=SCORE_TITLES.get(name, name), x=x0 + width / 2, y=1.0, xref="paper", yref="paper",
                           xanchor="center", yanchor="bottom", showarrow=False, font=dict(size=16))
    heads = [head_label(h, H, n_kv_heads) for h in range(H)]
    layers = [f"layer {layer}" for layer in range(L)]
    for i, name in enumerate(names):
        z = np.asarray(scores[name], dtype=float)
        if z.shape != (L, H):
            raise ValueError(f"score {name!r} has shape {z.shape}, expected {(L, H)}.")
        xaxis = "x" if i == 0 else f"x{i + 1}"
        fig.add_trace(go.Heatmap(
            z=z, x=heads, y=layers, coloraxis="coloraxis", xaxis=xaxis, yaxis="y",
            hovertemplate=f"{SCORE_TITLES.get(name, name)} score<br>%{{y}} · %{{x}}<br>%{{z:.3f}}<extra></extra>",
        ))
        if selected is not None:
            layer, head = selected
            fig.add_trace(go.Scatter(
                x=[heads[head]], y=[layers[layer]], mode="markers", showlegend=False, hoverinfo="skip",
                marker=dict(symbol="square-open", size=22, color="#e4572e", line=dict(width=3)), xaxis=xaxis,
                yaxis="y",
            ))
    fig.update_yaxes(type="category", autorange="reversed", automargin=True)
    fig.update_layout(coloraxis=dict(colorscale=SEQUENTIAL, cmin=0, cmax=1,
                                     colorbar=colorbar("score (0–1)")))
    title = "Head scores · mean attention weight where each head type looks"
    if subtitle:
        title += f"<br><sup>{subtitle}</sup>"
    base_layout(fig, title, height=auto_height(L, per_row=34, lo=380, hi=900))  # room for the rotated labels
    fig.update_layout(margin=dict(t=90))
    return fig


def gqa_figure(n_heads: int, n_kv_heads: int) -> go.Figure:
    """Query heads (top) joined to the key/value head each reads (bottom), one colour per KV group."""
    fig = go.Figure()
    group = n_heads // n_kv_heads
    qx = np.arange(n_heads, dtype=float)
    kvx = np.array([j * group + (group - 1) / 2 for j in range(n_kv_heads)])
    for h in range(n_heads):
        j = kv_head_of(h, n_heads, n_kv_heads)
        fig.add_trace(go.Scatter(x=[qx[h], kvx[j]], y=[1, 0], mode="lines", showlegend=False, hoverinfo="skip",
                                 line=dict(color=QUALITATIVE[j % len(QUALITATIVE)], width=2)))
    fig.add_trace(go.Scatter(
        x=qx, y=np.ones(n_heads), mode="markers+text", text=[f"Q{h}" for h in range(n_heads)],
        textposition="top center", name="query heads",
        marker=dict(size=18, symbol="square", color=[QUALITATIVE[kv_head_of(h, n_heads, n_kv_heads) % 10]
                                                     for h in range(n_heads)]),
        hovertemplate="query head %{text}<extra></extra>",
    ))
    fig.add_trace(go.Scatter(
        x=kvx, y=np.zeros(n_kv_heads), mode="markers+text", text=[f"KV{j}" for j in range(n_kv_heads)],
        textposition="bottom center", name="key/value heads",
        marker=dict(size=24, symbol="diamond", color=[QUALITATIVE[j % 10] for j in range(n_kv_heads)]),
        hovertemplate="key/value head %{text}<extra></extra>",
    ))
    kind = ("multi-head (every query head has its own K/V)" if n_kv_heads == n_heads else
            "multi-query (one K/V for all)" if n_kv_heads == 1 else
            f"grouped-query: {group} query heads share each K/V head")
    base_layout(fig, f"{n_heads} query heads → {n_kv_heads} key/value heads · {kind}", height=260)
    fig.update_xaxes(visible=False, range=[-0.8, n_heads - 0.2])
    fig.update_yaxes(visible=False, range=[-0.6, 1.6])
    fig.update_layout(showlegend=False, margin=dict(l=20, r=20, t=60, b=20))
    return fig
