"""Between a tab's controls and its handler: values a control sends, read with a sentence naming the field when
they are wrong; the layer and head choices a dropdown offers; the outputs an event fills, by field name.
"""
from __future__ import annotations

import math

from explorer.panels.errors import shown


def outputs_of(result: type, **components) -> list:
    """An event's output components in the order of its handler's named result (a NamedTuple), given by name:
    the one place a result's fields meet the components that show them. Raises TypeError when a field is
    missing or unknown, so a handler and its outputs cannot drift apart."""
    return list(result(**components))


def as_number(value, name: str, *, finite: bool = True) -> float:
    """A number typed in a box or sent through the API; ValueError naming the field otherwise.

    ``finite=False`` lets ±inf through for fields whose own range check says more than "finite" would.
    """
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be a number, got {shown(value)}.") from None
    if math.isnan(x):
        raise ValueError(f"{name} must be a number, got NaN.")
    if finite and math.isinf(x):
        raise ValueError(f"{name} must be a finite number, got {shown(value)}.")
    return x


def as_whole(value, name: str, lo: int, hi: int) -> int:
    """A whole number in [lo, hi] (3.0 counts, 3.5, inf and NaN do not); ValueError naming the range otherwise."""
    x = as_number(value, name, finite=False)
    if not x.is_integer() or not lo <= x <= hi:
        raise ValueError(f"{name} must be a whole number from {lo} to {hi}, got {shown(value)}.")
    return int(x)


def as_index(value, n: int, what: str) -> int:
    """A layer/head index from a dropdown or an API call; ValueError naming the valid range."""
    try:
        i = int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: JSON Infinity
        raise ValueError(f"{what} must be a whole number between 0 and {n - 1}, got {shown(value)}.") from None
    if isinstance(value, float) and value != i:
        raise ValueError(f"{what} must be a whole number between 0 and {n - 1}, got {shown(value)}.")
    if not 0 <= i < n:  # 1e308 is a whole number with 309 digits: quoted as 1e+308
        raise ValueError(f"{what} must be between 0 and {n - 1} for this model, got {shown(value)}.")
    return i


def layer_choices(n_layers: int) -> list[tuple[str, int]]:
    return [(f"layer {i}", i) for i in range(n_layers)]


def head_choices(n_heads: int, n_kv_heads: int) -> list[tuple[str, int]]:
    from explorer.figures.common import head_label

    return [(head_label(h, n_heads, n_kv_heads), h) for h in range(n_heads)]
