"""Units and the memory budget: bytes parsed and formatted, dtypes and their sizes, and how many bytes one
request may use (``MEMORY_BUDGET_BYTES``, set from ``EXPLORER_MEMORY_BUDGET`` at start-up).
"""
from __future__ import annotations

import os
import warnings

import torch

from lens.device import DTYPES, as_dtype  # noqa: F401 (part of measure's units)
# Bytes parsed and formatted are primitives the shared state reads too: they live there, and are measure's units.
from explorer.state.sizes import GIB, MIB, bytes_setting, format_bytes, parse_bytes  # noqa: F401


# One request on a 16 GB CPU Space: a quarter of the machine, so a few users and the model itself still fit.
DEFAULT_MEMORY_BUDGET_BYTES = 4 * GIB

def budget_from_env() -> int:
    raw = os.environ.get("EXPLORER_MEMORY_BUDGET")
    if not raw:
        return DEFAULT_MEMORY_BUDGET_BYTES
    try:
        return parse_bytes(raw)
    except ValueError as exc:  # a bad setting must not stop the app from starting
        warnings.warn(f"EXPLORER_MEMORY_BUDGET ignored ({exc}); using {format_bytes(DEFAULT_MEMORY_BUDGET_BYTES)}.")
        return DEFAULT_MEMORY_BUDGET_BYTES


#: Bytes one request may use (inputs plus the largest implementation's predicted peak).
#: Override with the environment variable ``EXPLORER_MEMORY_BUDGET`` (bytes, or e.g. ``8GiB``).
MEMORY_BUDGET_BYTES = budget_from_env()


def element_size(dtype: torch.dtype | str) -> int:
    return torch.empty((), dtype=as_dtype(dtype)).element_size()



def resolve_budget(budget_bytes: int | None = None) -> int:
    """``budget_bytes``, or the configured ``MEMORY_BUDGET_BYTES`` when None (read now, so a changed setting counts)."""
    return MEMORY_BUDGET_BYTES if budget_bytes is None else budget_bytes
