"""Reading a gradio_client answer by the names of the handler's result, not by position."""
from __future__ import annotations

from types import SimpleNamespace


def named(result: type, out, *, state: tuple[str, ...] = ()) -> SimpleNamespace:
    """``out`` (what ``Client.predict`` returned) with the field names of ``result``, the handler's NamedTuple.

    Fields shown by ``gr.State`` components (``state``) never reach API clients, so they are left out.
    """
    fields = [f for f in result._fields if f not in state]
    out = out if isinstance(out, (list, tuple)) else (out,)
    assert len(out) == len(fields), f"{result.__name__}: {len(out)} values for the fields {fields}"
    return SimpleNamespace(**dict(zip(fields, out)))
