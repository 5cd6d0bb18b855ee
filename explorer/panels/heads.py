"""Heads as the Experiments tab and its class question choose them: the dropdown's ``layer.head`` values, parsed
and checked against the model, and the two ways a head is knocked out. Below both ``experiments`` and ``vote``.
"""
from __future__ import annotations

from explorer import interventions as iv
from explorer.figures.common import head_label

HOWS = {"zero (output set to 0)": "zero", "mean (output set to its mean over the prompt)": "mean"}


def head_value(layer: int, head: int) -> str:
    return f"{layer}.{head}"


def head_options(model) -> list[tuple[str, str]]:
    c = model.config
    return [(f"layer {layer} · {head_label(h, c.n_heads, c.n_kv_heads)}", head_value(layer, h))
            for layer in range(c.n_layers) for h in range(c.n_heads)]


def parse_heads(values, model) -> list[tuple[int, int]]:
    """The dropdown's "layer.head" values (or a link's) as (layer, head) pairs, checked against the model."""
    if isinstance(values, str):
        values = [v for v in values.replace(";", ",").split(",") if v.strip()]
    pairs = []
    for v in values or []:
        text = str(v).strip()
        try:
            layer, head = (int(x) for x in text.split("."))
        except ValueError:
            raise ValueError(f"a head is written layer.head (e.g. 1.0), got {text[:40]!r}.") from None
        pairs.append((layer, head))
    return iv.check_heads(model, pairs)
