"""Reading what gradio_client returns for a gr.Plot: the plotly figure dict and its arrays as NumPy."""
from __future__ import annotations

import base64
import json

import numpy as np


def fig(payload) -> dict:
    """A gr.Plot value from gradio_client -> the plotly figure dict."""
    assert payload["type"] == "plotly"
    return json.loads(payload["plot"])


def arr(value) -> np.ndarray:
    """A plotly JSON array: a plain list (None -> NaN), or plotly's typed array {"dtype", "bdata" (base64), "shape"}."""
    if isinstance(value, dict) and "bdata" in value:
        a = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = value.get("shape")
        return a.reshape([int(n) for n in str(shape).split(",")]) if shape else a
    if value and isinstance(value[0], list):
        return np.array([[np.nan if v is None else v for v in row] for row in value], dtype=float)
    return np.array([np.nan if v is None else v for v in value], dtype=float)
