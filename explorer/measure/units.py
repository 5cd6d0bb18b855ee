"""Units and the memory budget: bytes parsed and formatted, dtypes and their sizes, and how many bytes one
request may use (``MEMORY_BUDGET_BYTES``, set from ``EXPLORER_MEMORY_BUDGET`` at start-up).
"""
from __future__ import annotations

import os
import re
import warnings

import torch

from lens.device import DTYPES, as_dtype  # noqa: F401 (part of measure's units)

GIB = 2**30
MIB = 2**20

# One request on a 16 GB CPU Space: a quarter of the machine, so a few users and the model itself still fit.
DEFAULT_MEMORY_BUDGET_BYTES = 4 * GIB

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 2**10, "ki": 2**10, "m": 10**6, "mb": 10**6, "mib": MIB,
          "mi": MIB, "g": 10**9, "gb": 10**9, "gib": GIB, "gi": GIB, "t": 10**12, "tb": 10**12, "tib": 2**40,
          "ti": 2**40}


def parse_bytes(text: str | int) -> int:
    """'4294967296', '4GiB', '512 MB' -> bytes. Raises ValueError for anything else."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = _SIZE.match(str(text))
        if not match or (match.group(2) or "").lower() not in _UNITS:
            raise ValueError(f"{text!r} is not a size in bytes: write e.g. 4294967296, 4GiB or 512MB.")
        value = int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])
    if value <= 0:
        raise ValueError(f"a memory budget must be positive, got {text!r}.")
    return value


def bytes_setting(name: str, default: int) -> int:
    """A size in bytes from the environment variable ``name`` ('4GiB', '512MB', ...), or ``default`` when it is
    unset or unreadable (a bad setting must not stop the app from starting)."""
    raw = os.environ.get(name)
    try:
        return parse_bytes(raw) if raw else default
    except ValueError:
        return default


def budget_from_env() -> int:
    raw = os.environ.get("EXPLORER_MEMORY_BUDGET")
    if not raw:
        return DEFAULT_MEMORY_BUDGET_BYTES
    try:
        return parse_bytes(raw)
    except ValueError as exc:  # a bad setting must not stop the app from starting
        warnings.warn(f"EXPLORER_MEMORY_BUDGET ignored ({exc}); using {format_bytes(DEFAULT_MEMORY_BUDGET_BYTES)}.")
        return DEFAULT_MEMORY_BUDGET_BYTES


def format_bytes(n: float | None) -> str:
    """1536 -> '1.5 KiB'. Binary units, three significant figures."""
    if n is None:
        return "—"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} TiB"


#: Bytes one request may use (inputs plus the largest implementation's predicted peak).
#: Override with the environment variable ``EXPLORER_MEMORY_BUDGET`` (bytes, or e.g. ``8GiB``).
MEMORY_BUDGET_BYTES = budget_from_env()


def element_size(dtype: torch.dtype | str) -> int:
    return torch.empty((), dtype=as_dtype(dtype)).element_size()



def resolve_budget(budget_bytes: int | None = None) -> int:
    """``budget_bytes``, or the configured ``MEMORY_BUDGET_BYTES`` when None (read now, so a changed setting counts)."""
    return MEMORY_BUDGET_BYTES if budget_bytes is None else budget_bytes
