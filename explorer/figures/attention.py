"""Attention figures: one head's weights, every layer × head at once, head scores, GQA groups.

Inputs are NumPy arrays of attention weights (rows: queries, columns: keys; each row sums to 1) and the
token labels from ``common.token_labels``. Colour range fixed at 0..1 so heads compare.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.colors import sample_colorscale

from .common import (FLAT_BAR, FLAT_COLORBAR, FONT, KEY_AXIS, PHONE_WIDTH, PROJECTOR_TEXT, QUALITATIVE, QUERY_AXIS,
                     SEQUENTIAL, WEIGHT_COLORBAR, WEIGHT_RANGE, auto_height, base_layout, base_parts, colorbar,
                     figure_of, head_label, heatmap_figure, kv_head_of, merged, text_px, thinned, tick_step,
                     title_lines, token_axes_layout, top_title, wrap_title)

SCORE_TITLES = {
    "previous_token": "previous-token",
    "induction": "induction",
    "first_token": "sink (first token)",
    "duplicate_token": "duplicate-token",
}


SINK_NOTE = "sink hidden: key 0 removed, each row renormalised"
SINK_COLORBAR = "share of the weight not on key 0 (0–1)"
COMPACT_CELLS = 120_000  # above this many weights the grid goes out as one byte a weight (see attention_grid)
GRID_PAGE = 8  # layers per page of the all-heads grid: 8 rows of maps stay legible at any model depth


def attention_title(layer: int, head: int, n_heads: int, n_kv_heads: int, *, causal: bool = True,
                    sink_hidden: bool = False) -> str:
    view = "" if causal else " · bidirectional view (mask removed)"
    sink = f" · {SINK_NOTE}" if sink_hidden else ""
    return f"Layer {layer} · {head_label(head, n_heads, n_kv_heads)} · attention weights{view}{sink}"


HEATMAP_WIDTH = 720  # px the Attention tab gives the chosen head's map at 1280 (its wider column of two)


def _every_token_part(x_labels: Sequence[str], y_labels: Sequence[str], height: int,
                      width: int = HEATMAP_WIDTH) -> dict:
    """A tick for every token that fits (Plotly's own thinning of category ticks keeps about ten, and slanted
    labels overlap): a smaller font past 24 tokens, keys upright, every k-th label where neighbours drawn at the
    projector's 16 px would touch in a ``width`` × ``height`` figure. The page script thins both axes again at
    the size drawn."""
    size = 12 if max(len(x_labels), len(y_labels)) <= 24 else 9
    return merged(token_axes_layout(x_labels, y_labels, width=width, height=height),
                  {"xaxis": {"tickfont": {"size": size}}, "yaxis": {"tickfont": {"size": size}}})


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
    own = _every_token_part(keys, labels, height)
    if window is not None and len(labels) > window:
        own["shapes"] = [dict(type="path", path=window_edge_path(len(labels), window, 1 if sink_hidden else 0),
                              line=dict(color="white", width=2, dash="dash"), xref="x", yref="y")]
    return heatmap_figure(
        weights, keys, labels,
        title=title,
        x_title=KEY_AXIS + (" · key 0 hidden" if sink_hidden else ""), y_title=QUERY_AXIS, height=height,
        width=HEATMAP_WIDTH, colorbar_title=SINK_COLORBAR if sink_hidden else WEIGHT_COLORBAR, hoverongaps=False,
        layout=own,
    )


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
    # What one update may send to the browser is bounded (2 MB, with the other figures): up to COMPACT_CELLS the
    # weights go out as float32 and the hover names the tokens from the axes' labels (one per row and column, not
    # one per cell: 80 bytes a cell made the shipped model's opening grid 340 KB of labels); bigger grids (a page of
    # 6-8 layers x 9 heads x 64 tokens) send each weight as one byte, in steps of 1/254, with hover off; the
    # single-head map always has exact values.
    cells = L * H * T * S
    labelled: dict = {}  # the axes' type where they carry the labels the hover reads
    if cells > COMPACT_CELLS:
        trace = _compact_heatmap(big, SINK_COLORBAR if sink_hidden else WEIGHT_COLORBAR)
        note = " · overview in steps of 1/254: pick a head for exact values"
    else:
        labelled = {"type": "category"}
        rows = _tiled_labels([[f"layer {layer} · query {labels[t]}" for t in range(T)] for layer in shown])
        cols = _tiled_labels([[f"{head_label(head, H, n_kv_heads)} · key {key}" for key in key_labels]
                              for head in range(H)])
        trace = go.Heatmap(
            z=big.astype(np.float32), x=cols, y=rows, colorscale=SEQUENTIAL, zmin=WEIGHT_RANGE[0],
            zmax=WEIGHT_RANGE[1], colorbar=colorbar(SINK_COLORBAR if sink_hidden else WEIGHT_COLORBAR),
            hoverongaps=False, hovertemplate="%{y}<br>%{x}<br>weight %{z:.4f}<extra></extra>", xgap=0, ygap=0,
        )
        note = ""
    view = "causal" if causal else "bidirectional view"
    which = (f"All {total} layers" if L == total else
             f"Layers {shown[0]}–{shown[-1]} of {total}" if shown == list(range(shown[0], shown[-1] + 1)) else
             f"{L} of {total} layers")
    sink = f" · {SINK_NOTE}" if sink_hidden else ""
    centres_x = [h * kstep + (S - 1) / 2 for h in range(H)]
    centres_y = [layer * step + (T - 1) / 2 for layer in range(L)]
    return figure_of(
        [trace],
        base_parts(f"{which} × {H} heads · attention weights ({view}){sink}{note}",
                   height=int(min(1400, max(320, 150 + 1000 * L / H)))),
        {"xaxis": dict(title={"text": "head (each small map: key →)"}, tickvals=centres_x,
                       ticktext=[head_label(h, H, n_kv_heads) for h in range(H)], showgrid=False, zeroline=False,
                       **labelled),
         "yaxis": dict(title={"text": "layer (each small map: query ↓)"}, tickvals=centres_y,
                       ticktext=[f"layer {layer}" for layer in shown], autorange="reversed", showgrid=False,
                       zeroline=False, scaleanchor="x", constrain="domain", **labelled)})


def _tiled_labels(blocks: list[list[str]]) -> list[str]:
    """One axis of the tiled grid: each small map's labels, a blank between maps. Each blank is a different run of
    zero-width spaces, since a category axis merges equal labels; the ticks sit at numeric positions, as before."""
    out: list[str] = []
    for i, block in enumerate(blocks):
        out += ["\u200b" * i] if i else []
        out += block
    if len(set(out)) != len(out):
        raise ValueError("the grid's token labels must be unique: give token_labels(tokens), which number them.")
    return out


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


SCORES_WIDTH = 720  # px the Attention tab gives the head scores at 1280 (its wider column of two)
PANEL_TITLE = 14  # px of each score's title above its panel


def _score_columns(names: Sequence[str], H: int, width: float) -> int:
    """How many score panels stand side by side at ``width`` px: as many as keep each panel wide enough for its
    title at PANEL_TITLE px and its heads at 12 px apart; the rest fold into further rows."""
    need = max(max(text_px(SCORE_TITLES.get(n, n), PANEL_TITLE) for n in names) + 12, 12 * H)
    room = width - 80 - 20 - 80  # the layer labels, the right margin, the colour bar
    for cols in range(len(names), 1, -1):
        if (room - 0.04 * room * (cols - 1)) / cols >= need:
            return cols
    return 1


def _scores_layout(names: Sequence[str], L: int, H: int, heads: list[str], layers: list[str], title: str,
                   width: float, tick_px: float, tallest: int = 540) -> dict:
    """The panels' axes, titles and height for ``width`` px: a panel per score, folded into rows, each panel
    tall enough for its layers (every ``k``-th layer labelled where ``tick_px`` labels would touch)."""
    n = len(names)
    cols = _score_columns(names, H, width)
    rows = -(-n // cols)
    title = wrap_title(title, width - 20)
    panel_h = int(min(tallest, max(150, 18 * L)))
    gap_y = 70  # px between rows of panels: the head axis and the next row's titles
    top = 36 + 24 * title_lines(title)
    plot_h = rows * panel_h + (rows - 1) * gap_y
    layout: dict = {"height": top + plot_h + 60, "margin": {"t": top, "b": 60, "l": 80, "r": 20},
                    "title": top_title(title), "annotations": []}
    gap_x = 0.04
    w = (1 - gap_x * (cols - 1)) / cols
    shown_layers = thinned(layers, tick_step(L, panel_h, tick_px))
    for i, name in enumerate(names):
        r, c = divmod(i, cols)
        x0 = c * (w + gap_x)
        y1 = 1 - r * (panel_h + gap_y) / plot_h
        y0 = y1 - panel_h / plot_h
        suffix = "" if i == 0 else str(i + 1)
        layout[f"xaxis{suffix}"] = dict(domain=[x0, x0 + w], anchor=f"y{suffix}", type="category", tickangle=0,
                                        tickmode="array", tickvals=heads, ticktext=[str(h) for h in range(H)],
                                        title=dict(text="head", standoff=4))
        layout[f"yaxis{suffix}"] = dict(domain=[max(0.0, y0), min(1.0, y1)], anchor=f"x{suffix}", type="category",
                                        autorange="reversed", automargin=True, tickmode="array",
                                        tickvals=shown_layers, ticktext=shown_layers, showticklabels=c == 0)
        layout["annotations"].append(dict(text=SCORE_TITLES.get(name, name), x=x0 + w / 2, y=min(1.0, y1),
                                          xref="paper", yref="paper", xanchor="center", yanchor="bottom",
                                          showarrow=False, font=dict(size=PANEL_TITLE)))
    return layout


def head_scores_figure(
    scores: Mapping[str, np.ndarray],
    *,
    n_kv_heads: int,
    selected: tuple[int, int] | None = None,
    subtitle: str = "",
    width: int = SCORES_WIDTH,
) -> go.Figure:
    """One (layers, heads) heatmap per score, 0..1, the selected head outlined. The panels stand side by side as
    far as ``width`` px allows and fold into rows after that (a phone gets one a row, ``layout.meta.narrow``);
    heads are numbered on the axis (hover names their KV head), a deep model's layers labelled every k-th."""
    names = list(scores)
    if not names:
        raise ValueError("no head scores to draw.")
    L, H = np.asarray(scores[names[0]]).shape
    # Axes laid out by hand: make_subplots cost tens of milliseconds, paid on every layer or head switch.
    traces = []
    heads = [head_label(h, H, n_kv_heads) for h in range(H)]
    layers = [f"layer {layer}" for layer in range(L)]
    for i, name in enumerate(names):
        z = np.asarray(scores[name], dtype=float)
        if z.shape != (L, H):
            raise ValueError(f"score {name!r} has shape {z.shape}, expected {(L, H)}.")
        axes = dict(xaxis="x" if i == 0 else f"x{i + 1}", yaxis="y" if i == 0 else f"y{i + 1}")
        traces.append(go.Heatmap(
            z=z, x=heads, y=layers, coloraxis="coloraxis", **axes,
            hovertemplate=f"{SCORE_TITLES.get(name, name)} score<br>%{{y}} · %{{x}}<br>%{{z:.3f}}<extra></extra>",
        ))
        if selected is not None:
            layer, head = selected
            traces.append(go.Scatter(
                x=[heads[head]], y=[layers[layer]], mode="markers", showlegend=False, hoverinfo="skip",
                marker=dict(symbol="square-open", size=22, color="#e4572e", line=dict(width=3)), **axes,
            ))
    title = "Head scores · mean attention weight where each head type looks"
    if subtitle:
        title += f"<br><sup>{subtitle}</sup>"
    narrow = _scores_layout(names, L, H, heads, layers, title, PHONE_WIDTH, FONT["size"], tallest=320)
    narrow["margin"].update(l=70, r=10, b=narrow["margin"]["b"] + FLAT_BAR)
    narrow.update(height=narrow["height"] + FLAT_BAR, coloraxis={"colorbar": FLAT_COLORBAR})  # beside: 156 px panels
    return figure_of(traces, base_parts(title),
                     {"coloraxis": dict(colorscale=SEQUENTIAL, cmin=0, cmax=1, colorbar=colorbar("score (0–1)"))},
                     _scores_layout(names, L, H, heads, layers, title, width, PROJECTOR_TEXT),
                     {"meta": {"narrow": narrow}})


GQA_WIDTH = 480  # px the Attention tab gives this figure at 1280 (its narrower column of two)


def gqa_figure(n_heads: int, n_kv_heads: int, *, width: int = GQA_WIDTH) -> go.Figure:
    """Query heads (top) joined to the key/value head each reads (bottom), one colour per KV group; the title
    wrapped to ``width`` px (and to a phone's in ``layout.meta.narrow``)."""
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
    title = f"{n_heads} query heads → {n_kv_heads} key/value heads · {kind}"
    wrapped = wrap_title(title, width - 30)  # the title on as many lines as the column's width needs
    base_layout(fig, wrapped, height=236 + 24 * title_lines(wrapped))
    fig.update_xaxes(visible=False, range=[-0.8, n_heads - 0.2])
    fig.update_yaxes(visible=False, range=[-0.6, 1.6])
    fig.update_layout(showlegend=False, margin=dict(l=20, r=20, t=36 + 24 * title_lines(wrapped), b=20),
                      title=top_title(wrapped))
    phone = wrap_title(title, PHONE_WIDTH - 30)
    fig.update_layout(meta={"narrow": {"title": top_title(phone), "height": 236 + 24 * title_lines(phone),
                                       "margin": {"t": 36 + 24 * title_lines(phone)}}})
    return fig
