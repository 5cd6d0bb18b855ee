"""Shared pieces of every figure: token labels, head labels, colour scales, provenance lines, heatmaps.

Pure functions: lists and NumPy arrays in, plotly objects out. No torch modules, no gradio.

Token labels are ``"{i}·{token}"``: the position makes every label unique, so a prompt that repeats a
word keeps one row per token (Plotly merges equal category labels). Heatmaps put query 0 at the top.
"""
from __future__ import annotations

import html
import re
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

TEMPLATE = "explorer"
#: The trace types the figures draw: the template keeps plotly_white's look for these alone.
DRAWN_TRACES = ("bar", "heatmap", "histogram", "scatter")


def _lean_template(base: str = "plotly_white") -> go.layout.Template:
    """``base`` without its defaults for trace types and subplots no figure here draws (3-D scenes, maps, polar
    and ternary axes, carpets): every figure carries its template, and those were two thirds of it (about 4.5 of
    7 KB, some 250 KB of the page's opening figures). What the figures draw looks the same."""
    full = pio.templates[base].to_plotly_json()
    layout = {k: v for k, v in full["layout"].items() if k not in ("polar", "ternary", "scene", "geo")}
    return go.layout.Template(layout=layout, data={k: v for k, v in full["data"].items() if k in DRAWN_TRACES})


pio.templates[TEMPLATE] = _lean_template()
# Every figure's template, given as Plotly's default: a new figure then takes it without validating it again,
# where ``update_layout(template=...)`` deep-copies and validates the whole template (about 50 ms a figure on
# 2 cores, most of a cached attention view's time); the figure's JSON is the same.
pio.templates.default = TEMPLATE

SEQUENTIAL = "Viridis"  # weights and probabilities, fixed range 0..1
DIVERGING = "RdBu_r"  # signed values, centred on 0 (red positive, blue negative)
QUALITATIVE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf"]
WEIGHT_RANGE = (0.0, 1.0)
WEIGHT_COLORBAR = "attention weight (0–1)"
QUERY_AXIS = "query token (asking)"
KEY_AXIS = "key token (looked at)"
FONT = dict(family="Inter, system-ui, sans-serif", size=12)
# The sizes a figure lays itself out for (its labels at the largest size drawn: projector mode's 16 px ticks)
PROJECTOR_TEXT = 16
TITLE_TEXT = 1.4 * FONT["size"]  # Plotly's title size for the figure's font
PROJECTOR_SUBTITLE = 14  # px: projector mode draws a title's <sup> subtitle at the title's size (the page script)
CHAR_EM = 0.6  # a label character's mean width in font heights (Plotly's sans-serif, lower case and digits)
PAGE_WIDTH = 1240  # px a full-width figure gets in a 1280 px window (the page's gutters off)
PHONE_WIDTH = 358  # px a figure gets on a 390 px phone
MODEL_COLUMN = 720  # px: the Model tab's figure column in a 1280 px window (the layout audit's measure)


def display_token(s: str, limit: int = 16) -> str:
    """A token as it should read in a label: whitespace made visible, HTML shown as text, at most ``limit``
    characters (the last one an ellipsis when cut)."""
    s = str(s)
    if s.strip() == "":
        s = s.replace("\n", "↵").replace("\t", "⇥").replace(" ", "␣") or "∅"
    else:
        s = s.strip(" ").replace("\n", "↵").replace("\t", "⇥")
    if len(s) > limit:
        s = s[:max(1, limit - 1)] + "…"
    # Plotly renders a few HTML tags in text; entities keep "<b>" in a prompt literal.
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def token_labels(tokens: Sequence[str]) -> list[str]:
    """Unique labels ``"{i}·{token}"``, one per token, even when tokens repeat."""
    return [f"{i}·{display_token(t)}" for i, t in enumerate(tokens)]


def kv_head_of(head: int, n_heads: int, n_kv_heads: int) -> int:
    """The key/value head a query head reads under grouped-query attention."""
    return head // (n_heads // n_kv_heads)


def head_label(head: int, n_heads: int, n_kv_heads: int) -> str:
    """``"head 3 (KV 1)"``; plain ``"head 3"`` when every query head has its own KV head."""
    if n_kv_heads == n_heads:
        return f"head {head}"
    return f"head {head} (KV {kv_head_of(head, n_heads, n_kv_heads)})"


def provenance_text(device: str, dtype: str, torch_version: str, kind: str = "measured") -> str:
    """``"measured · cpu · float32 · torch 2.13.0"``: where a number came from."""
    return f"{kind} · {device} · {dtype} · torch {torch_version}"


def base_parts(title: str, *, height: int | None = None, width: int | None = None) -> dict:
    """Every figure's title, font and margins (and its size where given), as a layout part for ``figure_of``."""
    part: dict = {"title": {"text": title, "x": 0.01, "xanchor": "left"}, "font": FONT,
                  "margin": {"l": 70, "r": 20, "t": 60, "b": 70}}
    if height is not None:
        part["height"] = height
    if width is not None:
        part["width"] = width
    return part


def base_layout(fig: go.Figure, title: str, *, height: int | None = None, width: int | None = None) -> go.Figure:
    fig.update_layout(merged(_template_part(), base_parts(title, height=height, width=width)))
    return fig


def _template_part() -> dict:
    # someone changed Plotly's default: set ours the slow way
    return {} if pio.templates.default == TEMPLATE else {"template": TEMPLATE}


def merged(*parts: dict) -> dict:
    """Layout parts merged in order as successive ``update_layout`` calls merge them: a nested dict key by key,
    anything else (a list of annotations, an array) replaced. The parts are left as they were."""
    out: dict = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict):
                value = merged(out[key], value) if isinstance(out.get(key), dict) else merged(value)
            out[key] = value
    return out


def figure_of(traces: Sequence, *parts: dict) -> go.Figure:
    """A figure built once from its traces and its layout's parts (``merged``): Plotly re-walks the whole layout on
    each ``update_layout`` of a built figure, so a figure laid out in five of them cost a class's Attention answers
    most of their server time; built at once it validates each value once (bench/notes/figures.md)."""
    return go.Figure(data=list(traces), layout=merged(_template_part(), *parts))


def heatmap_trace(
    z: np.ndarray,
    x_labels: Sequence[str],
    y_labels: Sequence[str],
    *,
    colorbar_title: str = WEIGHT_COLORBAR,
    zmin: float | None = WEIGHT_RANGE[0],
    zmax: float | None = WEIGHT_RANGE[1],
    colorscale: str = SEQUENTIAL,
    zmid: float | None = None,
    x_name: str = "key",
    y_name: str = "query",
    value_name: str = "weight",
    value_format: str = ".4f",
    showscale: bool = True,
    **kwargs,
) -> go.Heatmap:
    """One heatmap trace with exact values on hover (``query 3·the → key 1·cat: weight 0.4213``)."""
    z = np.asarray(z, dtype=float)
    if z.ndim != 2 or z.shape != (len(y_labels), len(x_labels)):
        raise ValueError(f"z has shape {z.shape}, labels need ({len(y_labels)}, {len(x_labels)}).")
    trace = go.Heatmap(
        z=z, x=list(x_labels), y=list(y_labels), colorscale=colorscale, zmin=zmin, zmax=zmax, zmid=zmid,
        colorbar=colorbar(colorbar_title) if showscale else None,
        showscale=showscale,
        hovertemplate=f"{y_name} %{{y}}<br>{x_name} %{{x}}<br>{value_name} %{{z:{value_format}}}<extra></extra>",
        **kwargs,
    )
    return trace


def heatmap_figure(
    z: np.ndarray,
    x_labels: Sequence[str],
    y_labels: Sequence[str],
    *,
    title: str,
    x_title: str = KEY_AXIS,
    y_title: str = QUERY_AXIS,
    height: int | None = None,
    width: int = PAGE_WIDTH,
    layout: dict | None = None,
    **trace_kwargs,
) -> go.Figure:
    """A single heatmap with categorical axes (one row per label, row 0 at the top), laid out for ``width`` px:
    the title wrapped to it, every ``k``-th token labelled that stands apart at projector size; a phone's layout
    in ``layout.meta.narrow``; ``layout``: a caller's own layout part, merged last."""
    wrapped = wrap_title(title, width - 20)
    top = 36 + 24 * title_lines(wrapped)
    drawn = height or 450  # Plotly's own height where none is given
    phone = wrap_title(title, PHONE_WIDTH - 20)
    narrow = {"title": top_title(phone), "margin": {"t": 36 + 24 * title_lines(phone), "l": 60}}
    narrow.update(token_axes_layout(x_labels, y_labels, width=PHONE_WIDTH, height=drawn,
                                    top=narrow["margin"]["t"], font_px=FONT["size"]))
    return figure_of(
        [heatmap_trace(z, x_labels, y_labels, **trace_kwargs)],
        base_parts(wrapped, height=height), {"margin": {"t": top}, "title": top_title(wrapped)},
        {"xaxis": {"title": {"text": x_title}}, "yaxis": {"title": {"text": y_title}, "autorange": "reversed"}},
        token_axes_layout(x_labels, y_labels, width=width, height=drawn, top=top),
        # "top": the top margin meant (Gradio raises a titled figure's to 100 px for its label; the page puts it back)
        {"meta": {"narrow": narrow, "top": top}}, layout or {})


def phone_layout(fig: go.Figure, *, size: float = FONT["size"], left: float = 70, right: float = 20,
                 scale_off: bool = False) -> dict:
    """A figure's layout on a phone (``layout.meta.narrow``, merged in by the page under 640 px): its title and
    each subplot title wrapped between words to the width it has there (a subplot title to the column of its x
    axis), the top margin grown by the lines added. ``scale_off``: the phone layout hides the colour bar."""
    bar = fig.layout.coloraxis.showscale is not False and (
        any(k.startswith("coloraxis") for k in fig.layout.to_plotly_json())
        or any(t.type == "heatmap" and t.showscale is not False for t in fig.data))
    plot = PHONE_WIDTH - left - right - (90 if bar and not scale_off else 0)  # a colour bar takes this much
    notes = [a.to_plotly_json() for a in fig.layout.annotations or ()]
    titles = [a for a in notes if a.get("xref") == "paper" and a.get("yref") == "paper"]
    domains = [tuple(fig.layout[k].domain or (0, 1)) for k in fig.layout if k.startswith("xaxis") and fig.layout[k]]
    wrapped, extra = [], 0
    for a in notes:
        if a not in titles:
            wrapped.append(a)
            continue
        columns = [d for d in domains if d[0] - 1e-6 <= a["x"] <= d[1] + 1e-6] or [(0.0, 1.0)]
        room = min(d[1] - d[0] for d in columns) * plot - 8
        lines = _wrap_words(str(a["text"]), room, size)
        extra = max(extra, len(lines) - 1) if a.get("y", 1) >= 0.98 else extra
        wrapped.append(dict(a, text="<br>".join(lines), font=dict(a.get("font") or {}, size=size)))
    text = fig.layout.title.text or ""
    phone = wrap_title(text, PHONE_WIDTH - 20)
    grown = 22 * (title_lines(phone) - title_lines(text)) + 14 * extra
    top = (fig.layout.margin.t if fig.layout.margin.t is not None else 100) + grown
    # (hung from the top: centred in the margin, a title of several lines ran down onto the subplot titles)
    layout = {"title": top_title(phone), "margin": {"t": top, "l": left, "r": right}, "annotations": wrapped}
    if fig.layout.height:
        layout["height"] = fig.layout.height + grown
    return layout


def stacked_phone(fig: go.Figure, *, panel: int = 260, gap: int = 110) -> dict:
    """``phone_layout`` with side-by-side subplots (``make_subplots(rows=1, cols=n)``) one above another, each
    ``panel`` px tall and the page's width, ``gap`` px between them for the axis labels and the next title."""
    layout = phone_layout(fig)
    n = len([k for k in fig.layout.to_plotly_json() if k.startswith("xaxis")])
    top, bottom = layout["margin"]["t"], (fig.layout.margin.b or 80)
    plot = n * panel + (n - 1) * gap
    layout.update(height=top + plot + bottom)
    tops = []
    for i in range(n):
        suffix = "" if i == 0 else str(i + 1)
        y1 = 1 - i * (panel + gap) / plot
        tops.append(y1)
        layout[f"xaxis{suffix}"] = {"domain": [0, 1]}
        layout[f"yaxis{suffix}"] = {"domain": [max(0.0, y1 - panel / plot), y1]}
    titles = [a for a in layout["annotations"] if a.get("xref") == "paper" and a.get("yref") == "paper"
              and a.get("y", 0) >= 0.98]
    for a, y1 in zip(titles, tops):
        size = (a.get("font") or {}).get("size") or FONT["size"]  # a column the page's width: its lines anew
        a.update(x=0.5, y=y1, text="<br>".join(_wrap_words(unwrapped(a["text"]), PHONE_WIDTH - 100, size)))
    return layout


def token_axes_layout(x_labels: Sequence[str], y_labels: Sequence[str], *, width: float, height: float,
                      top: float = 60, font_px: float = PROJECTOR_TEXT, left: float = 70, suffix: str = "",
                      share: float = 1.0) -> dict:
    """Layout of a token map's two axes for a figure ``width`` × ``height`` px: keys upright under the plot and
    every ``k``-th key and query labelled that stands apart at ``font_px`` (``share``: the part of the plot width
    this map gets beside others; ``suffix``: its axes' number)."""
    longest = max((text_px(t, font_px) for t in x_labels), default=font_px)
    plot_h = height - top - min(220, 40 + longest)  # the title above, the upright key labels below
    plot_w = (width - left - 20 - 90) * share  # the query labels, the right margin, the colour bar
    return {f"xaxis{suffix}": dict(tickangle=-90, **token_ticks(x_labels, plot_w, font_px)),
            f"yaxis{suffix}": token_ticks(y_labels, plot_h, font_px)}


TICK_GAP = 1.2  # labels at least this many font heights apart, centre to centre, so neighbours never touch


def tick_step(n: int, length_px: float, font_px: float, gap: float = TICK_GAP) -> int:
    """Label every ``k``-th of ``n`` evenly spaced ticks along ``length_px`` pixels so that labels of ``font_px``
    stay ``gap`` font heights apart (rotated key labels stack along the x axis the same way)."""
    if n <= 1 or length_px <= 0:
        return 1
    return max(1, int(np.ceil(gap * font_px / (length_px / n))))


def thinned(labels: Sequence[str], step: int) -> list[str]:
    """Every ``step``-th label from the first (the page script thins the same way once it knows the pixels)."""
    return list(labels)[::max(1, int(step))]




def text_px(text: str, size: float) -> float:
    """Estimated width in px of one line of label text (tags dropped, entities read as one character)."""
    return CHAR_EM * size * len(html.unescape(re.sub(r"<[^>]+>", "", str(text))))


def wrap_title(title: str, width_px: float, size: float = TITLE_TEXT, sep: str = " · ") -> str:
    """``title`` with each line that would run past ``width_px`` broken after its ``sep`` (then between words): each
    break stands for one space, so ``unwrapped(wrap_title(t)) == unwrapped(t)``. A subtitle in ``<sup>`` is broken the
    same way inside its tag, for the larger of its sizes: 0.7 of the title's on a desk, 14 px in projector mode."""
    out = []
    for line in title.split("<br>"):
        sup = line.startswith("<sup>") and line.endswith("</sup>")
        body, scale = (line[5:-6], max(0.7, PROJECTOR_SUBTITLE / size)) if sup else (line, 1.0)
        parts: list[str] = []
        for part in body.split(sep):
            if parts and text_px(parts[-1] + sep + part, size * scale) <= width_px:
                parts[-1] += sep + part
            else:
                if parts:  # the separator stays at the line's end: joined by spaces the title reads as before
                    parts[-1] += sep.rstrip()
                parts.extend(_wrap_words(part, width_px, size * scale))
        joined = "<br>".join(parts)
        out.append(f"<sup>{joined}</sup>" if sup else joined)
    return "<br>".join(out)


def top_title(text: str, size: float = TITLE_TEXT) -> dict:
    """A title hung from the figure's top edge, its lines flowing down into the top margin sized for them (Plotly
    centres a title in the margin: a wrapped one ran into the subplot titles under it). Plotly sets a title of
    several lines about 0.7 of a line higher than one of a single line (measured in Chromium: its top 7 px above
    the figure's edge at 16.8 px), so such a title is padded down by that much more."""
    pad = 8 + (round(0.75 * size) if "<br>" in text else 0)
    return {"text": text, "y": 1, "yref": "container", "yanchor": "top", "pad": {"t": pad}}


def _wrap_words(text: str, width_px: float, size: float) -> list[str]:
    """``text`` on as few lines as hold it at ``width_px``, broken between words (a word alone may run over)."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and text_px(lines[-1] + " " + word, size) <= width_px:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def unwrapped(title: str) -> str:
    """A title's words with its line breaks read as spaces (what ``wrap_title`` leaves unchanged)."""
    return str(title).replace("<br>", " ")


def title_lines(title: str) -> int:
    return title.count("<br>") + 1


def token_ticks(labels: Sequence[str], length_px: float, font_px: float = PROJECTOR_TEXT) -> dict:
    """A token axis labelling every ``k``-th token that stands apart at ``font_px`` along ``length_px`` (keys
    turned upright, so each takes one font height along the axis); hover names every token. The page script
    thins it again at the size drawn (its ticks are their own text, as it expects)."""
    shown = thinned(labels, tick_step(len(labels), length_px, font_px))
    return dict(type="category", tickmode="array", tickvals=shown, ticktext=shown)


def colorbar(title: str, **kwargs) -> dict:
    """Every heatmap's colour bar: its title on the side beside the tick labels, with a pad. Plotly places that
    title after measuring the labels, so the labels must be drawn at the size Plotly knows: projector mode sets
    its 16 px in the figure's layout (explorer/web/page/plotly_wrappers.js), not only in CSS."""
    return dict(title=dict(text=title, side="right"), xpad=14, **kwargs)


def log_ticks(values: Sequence[float | None], unit: str) -> tuple[list[float], list[str]]:
    """Ticks for a log axis over ``values``: each power of ten as ``"10 MiB"``, and 2× and 5× (with the unit too)
    when the values span less than two of them, so the axis never reads ``100 5 2 10 5 2``."""
    v = [float(x) for x in values if x is not None and np.isfinite(x) and x > 0]
    if not v:
        return [], []
    lo, hi = int(np.floor(np.log10(min(v)))), int(np.ceil(np.log10(max(v))))
    decades = [10.0 ** e for e in range(lo, hi + 1)]
    inside = [d for d in decades if min(v) <= d <= max(v)]
    ticks = decades if len(inside) >= 2 else sorted(d * m for d in decades for m in (1, 2, 5))
    return ticks, [f"{_plain(t)} {unit}" for t in ticks]


def _plain(x: float) -> str:
    """1000.0 -> "1,000", 0.01 -> "0.01": numbers as people write them, never 1e+03."""
    return f"{round(x):,}" if x >= 1 else f"{x:.6f}".rstrip("0")


def auto_height(n_rows: int, *, per_row: int = 22, lo: int = 360, hi: int = 900) -> int:
    return int(min(hi, max(lo, 140 + per_row * n_rows)))


def symmetric_range(*arrays: np.ndarray) -> float:
    """Largest |value| over the arrays (at least a tiny positive number), for a diverging scale centred on 0."""
    m = max((float(np.nanmax(np.abs(a))) for a in arrays if np.size(a)), default=1.0)
    return m if m > 0 else 1e-12


def parameter_bars(parts: dict[str, int], *, title: str, total: int) -> go.Figure:
    """Parameters by component as horizontal bars with counts and shares."""
    names = list(parts)
    values = [parts[n] for n in names]
    fig = go.Figure(go.Bar(
        x=values, y=names, orientation="h", marker_color=QUALITATIVE[0],
        text=[f"{v:,} ({100 * v / max(total, 1):.1f}%)" for v in values], textposition="auto",
        hovertemplate="%{y}<br>%{x:,} parameters<extra></extra>",
    ))
    # broken for the Model tab's 720 px column; 26 px of height and margin a title line
    title = wrap_title(title, MODEL_COLUMN - 20)
    more = 26 * (title_lines(title) - 1)
    base_layout(fig, title, height=360 + more)
    fig.update_layout(margin=dict(t=60 + more), title=top_title(title))
    fig.update_xaxes(title_text="parameters (count)")
    fig.update_yaxes(title_text="component", autorange="reversed")
    # a phone: taller and the right margin narrower, for a plot area of 200 px each way beside the long names
    narrow = phone_layout(fig, right=10)
    narrow["height"] += 60
    fig.update_layout(meta={"narrow": narrow})
    return fig


def two_maps_phone(fig: go.Figure, title: str, labels: Sequence[str], right_labels: Sequence[str]) -> dict:
    """The two maps' layout for a phone (merged in under 640 px by the page): one above the other, each the
    page's width, the tokens thinned for it and the title on lines that fit."""
    phone = wrap_title(title, PHONE_WIDTH - 20)
    top = 60 + 24 * title_lines(phone)
    side, below, font = 300, 150, FONT["size"]  # px: each map, the upright key labels and the next map's title
    height = top + 2 * side + 2 * below
    plot = height - top - below
    layout: dict = {"height": height, "margin": {"t": top, "b": below, "l": 60, "r": 10},
                    "title": top_title(phone)}
    for k, (suffix, lab) in enumerate((("", labels), ("2", right_labels))):
        y1 = 1 - k * (side + below) / plot
        axes = token_axes_layout(lab, lab, width=PHONE_WIDTH, height=side + top + below, top=top,
                                 font_px=font, left=60, suffix=suffix)
        axes[f"xaxis{suffix}"]["domain"] = [0, 1]
        axes[f"yaxis{suffix}"]["domain"] = [max(0.0, y1 - side / plot), y1]
        layout.update(axes)
    notes = [a.to_plotly_json() for a in fig.layout.annotations]
    layout["annotations"] = [dict(a, x=0.5, y=layout[f"yaxis{s}"]["domain"][1], font=dict(size=13))
                             for a, s in zip(notes, ("", "2"))]
    if fig.layout.coloraxis.colorbar.title.text:  # the shared colour bar laid flat under both: beside them, 120 px maps
        layout["height"] += FLAT_BAR
        layout["margin"]["b"] += FLAT_BAR
        layout["coloraxis"] = {"colorbar": FLAT_COLORBAR}
    return layout


FLAT_BAR = 70  # px a colour bar laid flat under a phone's figure takes, with its ticks and title
FLAT_COLORBAR = dict(orientation="h", x=0.5, xanchor="center", len=1, thickness=10, yref="container", y=0,
                     yanchor="bottom", ypad=8, xpad=0, title=dict(side="bottom"))  # (on top, it lay on the bar)
