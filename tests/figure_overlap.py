"""Where a figure's text would collide, estimated from the figure object alone (no browser): tick labels along
each axis at the tick font size drawn, subplot titles (annotations in one row) against each other, and the title
against the figure's right edge. Character widths are estimated at 0.6 font heights (Plotly's sans-serif, lower
case and digits); a label's height is its font size.

The tick choice follows Plotly: an axis with ``tickmode="array"`` labels its ``tickvals``; a category axis left to
Plotly labels every ``k``-th category so that ticks stand ``round(1.2 × font)`` px apart, whatever the width of
its labels (which is why long labels at -45° overlap).
"""
from __future__ import annotations

import html
import math
import re

CHAR = 0.6
DEFAULT_MARGIN = dict(l=80, r=80, t=100, b=80)


def text_width(text, size: float) -> float:
    """The widest line's width in px."""
    return max(CHAR * size * len(html.unescape(re.sub(r"<[^>]+>", "", line))) for line in str(text).split("<br>"))


def _merged(a, b):
    if not isinstance(a, dict) or not isinstance(b, dict):
        return b
    out = dict(a)
    for k, v in b.items():
        out[k] = _merged(a.get(k), v)
    return out


def page_wrapped_title(layout: dict, window: int) -> dict:
    """The page's fallback under 640 px (plotly_wrappers.js wrapTitle): lines broken at " · "."""
    title = layout.get("title") or {}
    text = title.get("text") if isinstance(title, dict) else title
    if not isinstance(text, str):
        return layout
    size = ((title.get("font") or {}).get("size") if isinstance(title, dict) else None) or \
        1.4 * ((layout.get("font") or {}).get("size") or 12)
    fit = max(16, math.floor((window - 64) / (0.55 * size)))
    lines = []
    for line in text.split("<br>"):
        plain = re.sub(r"<[^>]+>", "", line)
        if len(plain) <= fit:
            lines.append(line)
            continue
        out: list[str] = []
        for part in line.split(" · "):
            if out and len(re.sub(r"<[^>]+>", "", out[-1] + " · " + part)) <= fit:
                out[-1] += " · " + part
            else:
                out.append(part)
        lines.append("<br>".join(out))
    return dict(layout, title=dict(title if isinstance(title, dict) else {}, text="<br>".join(lines)))


def drawn_layout(fig, *, phone: bool) -> tuple[list, dict]:
    """The figure's data and layout as the page draws them: on a phone with its ``meta.narrow`` merged in (or its
    title wrapped by the page when it has none)."""
    d = fig.to_plotly_json() if hasattr(fig, "to_plotly_json") else fig
    layout = dict(d["layout"])
    if phone:
        narrow = (layout.get("meta") or {}).get("narrow")
        layout = _merged(layout, narrow) if narrow else page_wrapped_title(layout, 390)
    return list(d["data"]), layout


def _categories(data: list, axis_id: str) -> list:
    letter = axis_id[0]
    seen, out = set(), []
    for t in data:
        if (t.get(f"{letter}axis") or letter) != axis_id:
            continue
        values = t.get(letter)
        for v in values if isinstance(values, (list, tuple)) else []:  # numbers come as typed arrays
            if isinstance(v, str) and v not in seen:
                seen.add(v)
                out.append(v)
    return out


def overlaps(fig, *, width: int, phone: bool = False, tick_px: float | None = None) -> list[str]:
    """Each collision as a sentence (empty: none). ``width``: the px the figure gets; ``tick_px``: the tick font
    drawn (default: projector mode's 16 px, or the figure's own on a phone)."""
    data, L = drawn_layout(fig, phone=phone)
    font = (L.get("font") or {}).get("size") or 12
    tick_px = tick_px or (font if phone else max(16, font))
    height = L.get("height") or 450
    m = dict(DEFAULT_MARGIN, **{k: v for k, v in (L.get("margin") or {}).items() if k in "lrtb"})
    problems = []
    plot_w, plot_h = width - m["l"] - m["r"], height - m["t"] - m["b"]
    bars = [t for t in data if t.get("type") == "heatmap" and not t.get("coloraxis")
            and t.get("showscale", True) is not False]
    bars += [k for k in L if re.fullmatch(r"coloraxis\d*", k) and (L[k] or {}).get("showscale", True) is not False]
    if bars:
        plot_w -= 90  # the colour bar, its ticks and its side title take this much of the width
    below = 0.0  # upright or slanted category labels under the plot push its bottom up past the margin
    for key in [k for k in L if re.fullmatch(r"xaxis\d*", k)]:
        ax = L[key] or {}
        angle = abs(float(ax.get("tickangle") or 0)) if ax.get("tickangle") not in (None, "auto") else 0.0
        labels = ax.get("ticktext") if ax.get("tickmode") == "array" else _categories(data, "x" + key[5:])
        if labels and angle:
            below = max(below, max(text_width(t, tick_px) for t in labels) * math.sin(math.radians(angle)))
    plot_h -= max(0.0, below + 30 - m["b"])
    for key in [k for k in L if re.fullmatch(r"[xy]axis\d*", k)]:
        ax = L[key] or {}
        axis_id = key[0] + key[5:]
        size = (ax.get("tickfont") or {}).get("size") or tick_px
        size = max(size, tick_px) if not phone else size
        domain = ax.get("domain") or [0, 1]
        length = (domain[1] - domain[0]) * (plot_w if key[0] == "x" else plot_h)
        cats = _categories(data, axis_id)
        if ax.get("tickmode") == "array":
            shown = [str(v) for v in ax.get("tickvals") or []]
            text = [str(v) for v in ax.get("ticktext") or shown]
            index = {c: i for i, c in enumerate(cats)}
            if cats and all(s in index for s in shown):
                pos = [index[s] for s in shown]
                n = len(cats)
            else:  # numeric tick values
                vals = [float(v) for v in ax.get("tickvals") or []]
                lo, hi = (min(vals), max(vals)) if vals else (0, 1)
                rng = ax.get("range") or [lo - 0.5, hi + 0.5]
                pos, n = [v - rng[0] - 0.5 for v in vals], rng[1] - rng[0]
        elif cats and ax.get("visible", True) is not False and ax.get("showticklabels", True):
            step = max(1, math.ceil(len(cats) / max(1.0, length / round(1.2 * size))))
            pos = list(range(0, len(cats), step))
            text, n = [cats[i] for i in pos], len(cats)
        else:
            continue
        if not pos or n <= 0 or length <= 0:
            continue
        per = length / n
        angle = abs(float(ax.get("tickangle") or 0)) if key[0] == "x" else 0.0
        if key[0] == "x" and ax.get("tickangle") in (None, "auto"):
            angle = 0.0
        for (p1, t1), (p2, t2) in zip(zip(pos, text), list(zip(pos, text))[1:]):
            gap = (p2 - p1) * per
            if key[0] == "y" or angle >= 89:
                need = size
            elif angle <= 1:
                need = (text_width(t1, size) + text_width(t2, size)) / 2
            else:
                need = size / math.sin(math.radians(angle))
            if gap < need:
                problems.append(f"{key}: {t1!r} and {t2!r} {gap:.1f} px apart, need {need:.1f}")
    # subplot titles and other paper-placed text in one row: side by side without touching, inside the figure
    notes = [a for a in L.get("annotations") or [] if a.get("xref") == "paper" and a.get("text")]
    boxes = []
    for a in notes:
        size = (a.get("font") or {}).get("size") or font
        w = max(text_width(line, size) for line in str(a["text"]).split("<br>"))
        x = m["l"] + float(a.get("x", 0.5)) * plot_w
        anchor = a.get("xanchor", "center")
        x0 = x - w / 2 if anchor in ("center", "auto") else x - w if anchor == "right" else x
        boxes.append((x0, x0 + w, round(float(a.get("y", 1)), 2), a["text"]))
        if x0 < -1 or x0 + w > width + 1:
            problems.append(f"annotation {a['text']!r} runs past the figure's edge ({x0:.0f}..{x0 + w:.0f} of {width})")
    for i, (a0, a1, ay, at) in enumerate(boxes):
        for b0, b1, by, bt in boxes[i + 1:]:
            if ay == by and a0 < b1 and b0 < a1:
                problems.append(f"annotations {at!r} and {bt!r} overlap")
    title = L.get("title") or {}
    text = title.get("text") if isinstance(title, dict) else title
    if isinstance(text, str) and text:
        size = ((title.get("font") or {}).get("size") if isinstance(title, dict) else None) or 1.4 * font
        x = float(title.get("x", 0.5) if isinstance(title, dict) else 0.5) * width
        in_sup = False
        for line in text.split("<br>"):
            in_sup = in_sup or "<sup>" in line
            scale = 0.7 if in_sup else 1.0
            in_sup = in_sup and "</sup>" not in line
            if x + text_width(line, size * scale) > width:
                problems.append(f"title line {line!r} runs past the figure's edge")
    return problems
