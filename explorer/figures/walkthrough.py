"""Walkthrough figures: one small figure per step of a token's trip through the decoder, and the logit lens.

Pure functions: NumPy arrays and strings in, plotly figures out (no torch modules, no gradio). Signed vectors
(activations, q, k, v, scores) use a diverging scale centred on 0, each panel with its own symmetric range
and colour bar; probabilities and attention weights a sequential scale fixed at 0..1. Rows are listed top
down (query/head 0 on top); hover shows each value to float32 precision.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .common import (DIVERGING, FLAT_BAR, FLAT_COLORBAR, FONT, PAGE_WIDTH, PHONE_WIDTH, PROJECTOR_TEXT, SEQUENTIAL,
                     WEIGHT_RANGE, base_layout, base_parts, colorbar, display_token, figure_of, phone_layout,
                     symmetric_range, text_px, title_lines, token_ticks, top_title, wrap_title)

VALUE_FORMAT = ".7g"  # float32 carries about 7 significant digits
STEP_WIDTH = 720  # px the walkthrough gives a step's figure at 1280 (its wider column of two)
PROB_COLORBAR = "probability (0–1)"
MASKED_TEXT = "−∞ (masked: a later token)"


@dataclass(frozen=True)
class Panel:
    """One heatmap of a stacked figure: z (rows, columns), a label per row, optional labels per column."""

    title: str
    z: np.ndarray
    rows: Sequence[str]
    columns: Sequence[str] | None = None
    x_title: str = "dimension"


def next_token_label(token: str, token_id: int) -> str:
    """``"Anna · id 52"``: unique even when two ids read the same."""
    return f"{display_token(token)} · id {int(token_id)}"


def stacked_heatmaps(panels: Sequence[Panel], *, title: str, value_name: str = "value",
                     probabilities: bool = False, masked_text: str | None = None) -> go.Figure:
    """Panels one above the other, each with its own colour bar beside it.

    probabilities: sequential 0..1 for every panel; otherwise diverging, centred on 0, ±max|z| per panel.
    masked_text: non-finite cells (masked scores, -inf) are left blank on a grey background and hover with this.
    """
    if not panels:
        raise ValueError("no panels to draw.")
    zs = [np.asarray(p.z, dtype=np.float32) for p in panels]
    for p, z in zip(panels, zs):
        if z.ndim != 2 or z.shape[0] != len(p.rows) or (p.columns is not None and z.shape[1] != len(p.columns)):
            raise ValueError(f"panel {p.title!r}: z has shape {z.shape}, labels need "
                             f"({len(p.rows)}, {len(p.columns) if p.columns is not None else 'any'}).")
    heights = [50 + 18 * max(2, z.shape[0]) for z in zs]
    fig = make_subplots(rows=len(panels), cols=1, subplot_titles=[p.title for p in panels],
                        row_heights=heights, vertical_spacing=min(0.3, 70 / sum(heights + [70])))
    for i, (p, z) in enumerate(zip(panels, zs)):
        finite = np.isfinite(z)
        shown = np.where(finite, z, np.nan).astype(np.float32)
        x = list(p.columns) if p.columns is not None else np.arange(z.shape[1])
        axis = f"coloraxis{i + 1 if i else ''}"
        kwargs = {}
        if masked_text is not None and not finite.all():
            # Masked cells carry words, not a number: hover reads the text of each cell.
            kwargs["customdata"] = np.where(finite, np.char.mod("%.7g", z.astype(np.float64)), masked_text)
            hover = f"{value_name} %{{customdata}}"
        else:
            hover = f"{value_name} %{{z:{VALUE_FORMAT}}}"
        fig.add_trace(go.Heatmap(
            z=shown, x=x, y=list(p.rows), coloraxis=axis, hoverongaps=False, xgap=0, ygap=1,
            hovertemplate=f"%{{y}}<br>{p.x_title} %{{x}}<br>{hover}<extra>{p.title}</extra>", **kwargs,
        ), row=i + 1, col=1)
        fig.update_yaxes(type="category", autorange="reversed", row=i + 1, col=1)
        # named columns (the keys) upright, every k-th labelled that stands apart at projector size
        fig.update_xaxes(title_text=p.x_title, row=i + 1, col=1,
                         **({"tickangle": -90, **token_ticks(list(p.columns), STEP_WIDTH - 200)}
                            if p.columns is not None else {}))
    base_layout(fig, wrap_title(title, STEP_WIDTH - 20), height=int(110 + sum(heights) + 70 * len(panels)))
    axes = {}  # one layout update for every colour axis: plotly validates each update_layout call anew
    for i, z in enumerate(zs):
        domain = fig.layout[f"yaxis{i + 1 if i else ''}"].domain
        bar = colorbar(value_name if not probabilities else PROB_COLORBAR,
                   y=(domain[0] + domain[1]) / 2, len=max(0.12, domain[1] - domain[0]), yanchor="middle",
                   thickness=14)
        if probabilities:
            axis = dict(colorscale=SEQUENTIAL, cmin=WEIGHT_RANGE[0], cmax=WEIGHT_RANGE[1], colorbar=bar)
        else:
            m = symmetric_range(z[np.isfinite(z)])
            axis = dict(colorscale=DIVERGING, cmin=-m, cmax=m, cmid=0.0, colorbar=bar)
        axes[f"coloraxis{i + 1 if i else ''}"] = axis
    if masked_text is not None:
        axes["plot_bgcolor"] = "#d9d9d9"
    fig.update_layout(axes)
    narrow = _stacked_phone(fig, panels)
    for i, p in enumerate(panels):
        if p.columns is not None:
            narrow[f"xaxis{i + 1 if i else ''}"] = token_ticks(list(p.columns), PHONE_WIDTH - 180, FONT["size"])
    fig.update_layout(meta={"narrow": narrow})
    return fig


def _stacked_phone(fig: go.Figure, panels: Sequence[Panel]) -> dict:
    """``phone_layout`` with room for the panels on a 358 px page: thinner colour bars, row names such as "head 0
    (KV 0)" on two lines and the figure taller, for a plot area of at least 200 px each way (it was 149×136)."""
    narrow = phone_layout(fig, left=60, right=0)
    for i, p in enumerate(panels):
        suffix = i + 1 if i else ""
        narrow[f"coloraxis{suffix}"] = {"colorbar": {"thickness": 8, "xpad": 4}}
        if any(" (" in str(r) for r in p.rows) and len(p.rows) <= 16:
            narrow[f"yaxis{suffix}"] = {"tickmode": "array", "tickvals": list(p.rows),
                                        "ticktext": [str(r).replace(" (", "<br>(", 1) for r in p.rows]}
    if len(panels) == 1:  # its bar flat under the figure: upright, a small model's "−0.02" ticks left 196 px
        narrow["coloraxis"] = {"colorbar": FLAT_COLORBAR}
        narrow["margin"].update(b=narrow["margin"].get("b", 70) + FLAT_BAR, r=10)
    height = narrow.get("height", fig.layout.height) + (FLAT_BAR if len(panels) == 1 else 0)
    narrow["height"] = height + max(0, 300 - (height - narrow["margin"]["t"] - narrow["margin"].get("b", 70)))
    return narrow


def vectors_figure(vectors: Mapping[str, np.ndarray], *, title: str, shared: bool = False,
                   x_title: str = "dimension") -> go.Figure:
    """Named vectors as one-row heatmap strips. shared: one panel and one colour range for all (vectors
    that add up, like x, o and x + o); otherwise a panel and colour range each."""
    names = list(vectors)
    if shared:
        z = np.stack([np.asarray(vectors[n], dtype=np.float32) for n in names])
        panels = [Panel(f"{' + '.join(names[:-1])} = {names[-1]} · one colour range" if len(names) == 3 else
                        f"{' · '.join(names)} · one colour range", z, names, x_title=x_title)]
    else:
        panels = [Panel(f"{n} · {np.asarray(v).shape[0]} numbers", np.asarray(v, dtype=np.float32)[None], [n],
                        x_title=x_title) for n, v in vectors.items()]
    return stacked_heatmaps(panels, title=title)


def heads_figure(blocks: Mapping[str, np.ndarray], head_rows: Mapping[str, Sequence[str]], *,
                 title: str) -> go.Figure:
    """Per-head vectors: each block (heads, D) one panel, rows named by ``head_rows[name]``."""
    panels = [Panel(f"{name} · {np.asarray(z).shape[0]} × {np.asarray(z).shape[1]}", np.asarray(z, dtype=np.float32),
                    list(head_rows[name]), x_title="dimension in the head") for name, z in blocks.items()]
    return stacked_heatmaps(panels, title=title)


def key_row_figure(values: np.ndarray, keys: Sequence[str], heads: Sequence[str], *, title: str,
                   weights: bool = False) -> go.Figure:
    """One query's row against the keys, one row per head: scores (diverging; -inf cells blank and grey,
    hover saying they are masked) or attention weights (sequential 0..1)."""
    values = np.asarray(values, dtype=np.float32)
    panel = Panel(f"{values.shape[0]} heads × {values.shape[1]} keys", values, list(heads), list(keys),
                  x_title="key token (looked at)")
    if weights:
        return stacked_heatmaps([panel], title=title, value_name="attention weight", probabilities=True)
    return stacked_heatmaps([panel], title=title, value_name="scaled score",
                            masked_text=MASKED_TEXT if not np.isfinite(values).all() else None)


def stream_figure(stream: np.ndarray, rms: np.ndarray, rows: Sequence[str], *, title: str,
                  expanded: int | None = None) -> go.Figure:
    """The residual stream (L + 1, C) before layer 0 and after each layer, beside each state's RMS (L + 1,);
    the expanded layer's output outlined."""
    stream = np.asarray(stream, dtype=np.float32)
    rms = np.asarray(rms, dtype=np.float32)
    n, C = stream.shape
    if len(rows) != n or rms.shape != (n,):
        raise ValueError(f"the stream has {n} states: give {n} row labels and {n} RMS values.")
    m = symmetric_range(stream)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.8, 0.2], shared_yaxes=True, horizontal_spacing=0.03,
                        subplot_titles=[f"{n} states × {C} dimensions", "RMS of the state"])
    fig.add_trace(go.Heatmap(
        z=stream, y=list(rows), coloraxis="coloraxis", xgap=0, ygap=1,
        hovertemplate="after %{y}<br>dimension %{x}<br>activation %{z:" + VALUE_FORMAT + "}<extra></extra>",
    ), row=1, col=1)
    fig.add_trace(go.Bar(x=rms, y=list(rows), orientation="h", marker_color="#7f7f7f", showlegend=False,
                         hovertemplate="after %{y}<br>RMS %{x:" + VALUE_FORMAT + "}<extra></extra>"), row=1, col=2)
    fig.update_yaxes(type="category", autorange="reversed")
    fig.update_yaxes(title_text="residual stream after", row=1, col=1)
    fig.update_xaxes(title_text="dimension", row=1, col=1)
    fig.update_xaxes(title_text="RMS", rangemode="tozero", row=1, col=2)
    fig.update_layout(coloraxis=dict(colorscale=DIVERGING, cmin=-m, cmax=m, cmid=0.0,
                                     colorbar=colorbar("activation", thickness=14,
                                                   x=1.02)),
                      showlegend=False)
    if expanded is not None:
        fig.add_shape(type="rect", xref="x", yref="y", x0=-0.5, x1=C - 0.5, y0=expanded + 0.5,
                      y1=expanded + 1.5, line=dict(color="#e4572e", width=3))
    base_layout(fig, title, height=int(min(1000, max(280, 150 + 24 * n))))
    fig.update_layout(meta={"narrow": phone_layout(fig)})
    return fig


def top_tokens_figure(tokens: Sequence[str], ids: Sequence[int], values: Sequence[float], *, title: str,
                      probabilities: bool = True, note: str = "") -> go.Figure:
    """Horizontal bars, most likely first (top): probabilities on a fixed 0..1 axis coloured on the
    sequential scale, or logits (signed)."""
    values = np.asarray(values, dtype=np.float32)
    labels = [next_token_label(t, i) for t, i in zip(tokens, ids)]
    if len(labels) != len(values):
        raise ValueError(f"{len(labels)} tokens for {len(values)} values.")
    if probabilities:
        marker = dict(color=values, colorscale=SEQUENTIAL, cmin=0, cmax=1,
                      colorbar=colorbar(PROB_COLORBAR, thickness=14))
        text = [f"{100 * float(v):.2f}%" for v in values]
        hover = "%{y}<br>probability %{x:" + VALUE_FORMAT + "}<extra></extra>"
    else:
        marker = dict(color="#1f77b4")
        text = [f"{float(v):.3f}" for v in values]
        hover = "%{y}<br>logit %{x:" + VALUE_FORMAT + "}<extra></extra>"
    fig = go.Figure(go.Bar(x=values, y=labels, orientation="h", marker=marker, text=text, textposition="auto",
                           hovertemplate=hover))
    base_layout(fig, title + (f"<br><sup>{note}</sup>" if note else ""), height=int(160 + 30 * len(labels)))
    fig.update_yaxes(type="category", autorange="reversed", title_text="next token (rank order)")
    if probabilities:
        fig.update_xaxes(range=[0, 1], title_text="probability")
    else:
        fig.update_xaxes(title_text="logit (unnormalised score)")
    return fig


LENS_CHARS = 7  # characters of a token in a lens cell (hover has it whole): 16 px text fits a projector's cell
LENS_TEXT = 12  # px of the cells' text; the page script draws it at 16 px in projector mode
LENS_PHONE_CHARS = 5  # ... and on a phone's 358 px
LENS_DEEP = 16  # rows past this: two columns of layers, each with its last layer on top
LENS_ROW_DEEP = 20  # px a row of a deep model's lens: the 16 px cell text still fits


def lens_figure(rows: Sequence[str], tokens: Sequence[Sequence[str]], ids: np.ndarray, probs: np.ndarray,
                final_token: str, final_probs: np.ndarray, *, title: str) -> go.Figure:
    """The logit lens: per row (embedding, then each layer's output) the top-k tokens written in cells
    coloured by probability, and beside them the probability of the model's final top token."""
    ids = np.asarray(ids)
    probs = np.asarray(probs, dtype=np.float32)
    final_probs = np.asarray(final_probs, dtype=np.float32)
    n, k = probs.shape
    if ids.shape != (n, k) or len(rows) != n or len(tokens) != n or final_probs.shape != (n,):
        raise ValueError(f"the lens needs {n} rows of {k} tokens, ids and probabilities and {n} final probabilities.")
    # cell text at most LENS_CHARS characters: at the projector's 16 px a longer token runs into its neighbour
    text = [[display_token(t, LENS_CHARS) for t in row] for row in tokens]
    custom = [[f"{display_token(t)} · id {int(i)}" for t, i in zip(trow, irow)] for trow, irow in zip(tokens, ids)]
    shown = display_token(final_token)
    if n > LENS_DEEP:
        return _two_column_lens(list(rows), list(tokens), text, custom, probs, final_probs, shown, title=title)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.8, 0.2], shared_yaxes=True, horizontal_spacing=0.03,
                        subplot_titles=[f"top {k} tokens if the model stopped here", f"P({shown})"])
    fig.add_trace(go.Heatmap(
        z=probs, x=[f"#{j + 1}" for j in range(k)], y=list(rows), text=text, texttemplate="%{text}",
        textfont=dict(size=LENS_TEXT),
        customdata=custom, coloraxis="coloraxis", xgap=1, ygap=1,
        hovertemplate="%{y} · rank %{x}<br>%{customdata}<br>probability %{z:" + VALUE_FORMAT + "}<extra></extra>",
    ), row=1, col=1)
    fig.add_trace(go.Heatmap(
        z=final_probs[:, None], x=[shown], y=list(rows), coloraxis="coloraxis", xgap=1, ygap=1,
        text=[[f"{100 * float(p):.1f}%"] for p in final_probs], texttemplate="%{text}",
        textfont=dict(size=LENS_TEXT),
        hovertemplate="%{y}<br>P(" + shown + ") %{z:" + VALUE_FORMAT + "}<extra></extra>",
    ), row=1, col=2)
    fig.update_yaxes(type="category", autorange="reversed")  # a shallow lens reads top down, like the other steps
    fig.update_yaxes(title_text="residual stream after", row=1, col=1)
    fig.update_xaxes(type="category")
    fig.update_layout(coloraxis=dict(colorscale=SEQUENTIAL, cmin=0, cmax=1,
                                     colorbar=colorbar(PROB_COLORBAR, thickness=14)))
    base_layout(fig, wrap_title(title, PAGE_WIDTH - 20), height=int(min(1100, max(300, 150 + 26 * n))))
    narrow = phone_layout(fig, left=70, right=4, scale_off=True)
    # a phone: no colour bar (the cells carry their numbers), the top tokens given all but the last column
    narrow.update(xaxis={"domain": [0, 0.8]}, xaxis2={"domain": [0.82, 1]}, coloraxis={"showscale": False})
    narrow["height"] = narrow.get("height", fig.layout.height) + 80  # its wrapped title left the rows 170 px
    # a phone's cells are 45 px wide: tokens cut to 5 characters at 11 px there, or they run into each other
    short = {"text": [[display_token(t, LENS_PHONE_CHARS) for t in row] for row in tokens], "textfont": {"size": 11}}
    fig.update_layout(meta={"narrow": narrow, "narrow_traces": [short, {"textfont": {"size": 11}}]})
    return fig


def _two_column_lens(rows: list[str], tokens: Sequence[Sequence[str]], text: list, custom: list, probs: np.ndarray,
                     final_probs: np.ndarray, shown: str, *, title: str) -> go.Figure:
    """A deep model's lens in two columns of layers, the later half on the left and each column's last layer on
    top: the layers where the prediction appears are the first read, and 31 rows keep room for 16 px cell text in
    a projector's 720 px window (in one column they needed ~620 px of plot where the window leaves ~465). A phone
    stacks the columns (``layout.meta.narrow``). Every row, token and probability is the one-column lens's."""
    n, k = probs.shape
    split = n // 2
    blocks = [slice(split, n), slice(0, split)]
    ranks = [f"#{j + 1}" for j in range(k)]
    axes = [("x", "x2", "y"), ("x3", "x4", "y2")]
    traces = []
    for (rank_x, final_x, y), rows_of in zip(axes, blocks):
        names = rows[rows_of]
        traces += [
            go.Heatmap(z=probs[rows_of], x=ranks, y=names, text=text[rows_of], texttemplate="%{text}",
                       textfont=dict(size=LENS_TEXT), customdata=custom[rows_of], coloraxis="coloraxis", xgap=1,
                       ygap=1, xaxis=rank_x, yaxis=y,
                       hovertemplate="%{y} · rank %{x}<br>%{customdata}<br>probability %{z:" + VALUE_FORMAT
                                     + "}<extra></extra>"),
            go.Heatmap(z=final_probs[rows_of, None], x=[shown], y=names, coloraxis="coloraxis", xgap=1, ygap=1,
                       text=[[f"{100 * float(p):.1f}%"] for p in final_probs[rows_of]], texttemplate="%{text}",
                       textfont=dict(size=LENS_TEXT), xaxis=final_x, yaxis=y,
                       hovertemplate="%{y}<br>P(" + shown + ") %{z:" + VALUE_FORMAT + "}<extra></extra>"),
        ]
    titles = (f"top {k} tokens if the model stopped here", f"P({shown})")

    def panels(plot: float, column: float, gap: float, size: float, stacked: bool) -> dict:
        """The axes and the panels' titles for a plot ``plot`` px wide: columns side by side, or ``stacked``."""
        out: dict = {"annotations": []}
        upper = (n - split) / n  # the later half's share of a stacked plot's height
        for c, (rank_x, final_x, y) in enumerate(axes):
            x0 = 0.0 if stacked else c * (column + gap)
            cut = x0 + 0.8 * (column - 0.02)
            spans = {rank_x: (x0, cut), final_x: (cut + 0.02, x0 + column)}
            for axis, (a, b) in spans.items():
                out["xaxis" + axis[1:]] = dict(domain=[a, b], anchor=y, type="category",
                                               showticklabels=not stacked or c == 1)
            rows_y = [0, 1] if not stacked else [1 - upper + 0.005, 1] if c == 0 else [0, 1 - upper - 0.005]
            out["yaxis" + y[1:]] = dict(domain=rows_y, anchor=rank_x, type="category", automargin=True)
            if stacked and c == 1:
                continue  # one pair of titles over the stacked column
            for axis, words in zip((rank_x, final_x), titles):
                a, b = spans[axis]
                out["annotations"].append(dict(
                    text=wrap_title(words, (b - a) * plot - 8, size), x=(a + b) / 2, y=1.0, xref="paper",
                    yref="paper", xanchor="center", yanchor="bottom", showarrow=False, font=dict(size=size)))
        out["yaxis"]["title"] = {"text": "residual stream after (last layer on top)"}
        return out

    def top_margin(wrapped: str, parts: dict, line: float) -> int:
        return int(36 + 24 * title_lines(wrapped) + line * max(title_lines(a["text"]) for a in parts["annotations"]))

    plot = PAGE_WIDTH - 200  # the figure less the row names, the y title and the colour bar
    gap = (max(text_px(r, PROJECTOR_TEXT) for r in rows) + 30) / plot  # room for the right column's row names
    layout = panels(plot, (1 - gap) / 2, gap, PROJECTOR_TEXT, stacked=False)
    wrapped = wrap_title(title, PAGE_WIDTH - 20)
    top = top_margin(wrapped, layout, 20)
    bar = colorbar(PROB_COLORBAR, thickness=14)
    layout.update(coloraxis=dict(colorscale=SEQUENTIAL, cmin=0, cmax=1, colorbar=bar),
                  margin={"t": top}, title=top_title(wrapped), height=top + 70 + LENS_ROW_DEEP * (n - split))
    # a phone: the later half above the earlier in one column, no colour bar (the cells carry their numbers)
    narrow = panels(PHONE_WIDTH - 74, 1.0, 0.0, 11, stacked=True)
    phone = wrap_title(title, PHONE_WIDTH - 20)
    narrow_top = top_margin(phone, narrow, 16)
    narrow.update(coloraxis={"showscale": False}, title=top_title(phone), height=narrow_top + 80 + 22 * n,
                  margin={"t": narrow_top, "l": 70, "r": 4})
    # a phone's cells are 45 px wide: tokens cut to 5 characters at 11 px there, or they run into each other
    short = [{"text": [[display_token(t, LENS_PHONE_CHARS) for t in row] for row in tokens[rows_of]],
              "textfont": {"size": 11}} for rows_of in blocks]
    small = {"textfont": {"size": 11}}
    return figure_of(traces, base_parts(wrapped), layout,
                     {"meta": {"narrow": narrow, "narrow_traces": [short[0], small, short[1], small]}})


def step_figure(key: str, arrays: Mapping[str, np.ndarray], *, title: str, keys: Sequence[str],
                heads: Sequence[str], kv_heads: Sequence[str], stream_rows: Sequence[str] = (),
                next_tokens: Sequence[str] = (), expanded: int | None = None, note: str = "") -> go.Figure:
    """The figure of one walkthrough step (``explorer.probes.walkthrough.STEP_KEYS``) from that step's arrays.

    keys: the prompt's token labels (``"3·the"``), heads / kv_heads: row labels of the query and key/value
    heads, stream_rows: the residual-stream rows (embedding, layer 0, ...), next_tokens: the text of
    ``arrays["ids"]`` for the final steps.
    """
    a = arrays
    if key in ("embed", "o_proj", "down", "norm1", "norm2", "final_norm", "swiglu"):
        return vectors_figure(a, title=title)
    if key in ("resid1", "resid2"):
        return vectors_figure(a, title=title, shared=True)
    if key == "qkv":
        return heads_figure(a, {"q": heads, "k": kv_heads, "v": kv_heads, "q normed": heads, "k normed": kv_heads},
                            title=title)  # QK-norm's outputs when the family has it
    if key == "rope":
        rows = {"q": heads, "q'": heads, "k": kv_heads, "k'": kv_heads}
        named = {"q": "q before RoPE", "q'": "q after RoPE", "k": "k before RoPE", "k'": "k after RoPE"}
        return heads_figure({named[n]: z for n, z in a.items()}, {named[n]: rows[n] for n in a}, title=title)
    if key == "mix":
        return heads_figure({"z": a["z"]}, {"z": heads}, title=title)
    if key in ("scores", "mask"):
        z = a["scores"]
        return key_row_figure(z, keys[:z.shape[1]], heads, title=title)
    if key == "softmax":
        return key_row_figure(a["weights"], keys[:a["weights"].shape[1]], heads, title=title, weights=True)
    if key == "layers":
        return stream_figure(a["stream"], a["rms"], stream_rows, title=title, expanded=expanded)
    if key == "logits":
        return top_tokens_figure(next_tokens, a["ids"], a["logits"], title=title, probabilities=False, note=note)
    if key == "top":
        return top_tokens_figure(next_tokens, a["ids"], a["probs"], title=title, note=note)
    raise ValueError(f"unknown walkthrough step {key!r}.")
