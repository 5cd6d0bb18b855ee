"""The class's votes as bars, and after the reveal the model's value for each choice beside them.

Pure: lists in, a plotly Figure out. Choices are the app's words and the model's tokens; Plotly renders a few
HTML tags in text, so they are escaped here.
"""
from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from .common import QUALITATIVE, base_layout


def _text(s: str) -> str:
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def tally_figure(choices: Sequence[str], counts: Sequence[int], *, title: str, model_values: Sequence[float] | None = None,
                 value_name: str = "probability", height: int = 360) -> go.Figure:
    """Horizontal bars, the first choice on top: the class's share of votes in % (count on each bar); with
    ``model_values``, the model's value for each choice (in %, same axis) beside them."""
    labels = [f"{chr(65 + i)}  {_text(c)}" for i, c in enumerate(choices)]
    total = sum(counts)
    share = [100.0 * n / total if total else 0.0 for n in counts]
    fig = go.Figure(go.Bar(y=labels, x=share, orientation="h", name=f"the class ({total} votes)",
                           marker_color=QUALITATIVE[0], text=[f"{n} · {s:.0f}%" for n, s in zip(counts, share)],
                           textposition="auto", hovertemplate="%{y}: %{x:.1f}% of the votes<extra></extra>"))
    if model_values is not None:
        fig.add_bar(y=labels, x=[100.0 * v for v in model_values], orientation="h", name=f"the model ({value_name})",
                    marker_color=QUALITATIVE[1], text=[f"{v:.2f}" for v in model_values], textposition="outside",
                    cliponaxis=False,
                    hovertemplate="%{y}: %{x:.2f}%<extra>the model</extra>")
    fig.update_layout(barmode="group", legend=dict(orientation="h", x=1, xanchor="right", y=1.0, yanchor="bottom"),
                      bargap=0.25)
    fig.update_xaxes(range=[0, 100], title="% of votes" + (f" · the model's {value_name} × 100" if model_values
                                                            is not None else ""))
    fig.update_yaxes(autorange="reversed", automargin=True)
    fig = base_layout(fig, _text(title), height=height)
    return fig.update_layout(margin=dict(l=140, r=30, t=70, b=60))  # the choices' labels in full at the left
