"""Sentences for a visitor kept short and free of server paths and long numbers (``explorer.panels.errors`` re-uses
them)."""
from __future__ import annotations

import re


def short(message: str, limit: int = 600) -> str:
    """A message that echoes what the user sent, cut to a readable length (a 20,000-character prompt stays out)."""
    return message if len(message) <= limit else message[:limit - 1] + "…"


_SERVER_PATH = re.compile(r"(?<![\w/.:~-])/(?:[\w.~+-]+/)+([\w.~+-]*)")


def no_paths(message: str) -> str:
    """``message`` with every absolute server path cut to its last part (``/srv/app/assets/m/config.json`` reads
    ``…/config.json``): a visitor has no use for the server's folders, and a stranger should not learn them."""
    return _SERVER_PATH.sub(lambda m: "…/" + m.group(1) if m.group(1) else "…/", message)


_LONG_NUMBER = re.compile(r"\d{21,}")


def short_numbers(message: str) -> str:
    """``message`` with every run of more than 20 digits quoted by its first 8 and its length (a 400-digit layer
    number reads ``12345678… (400 digits)``): an echo of what was sent, not a page of it."""
    return _LONG_NUMBER.sub(lambda m: f"{m.group(0)[:8]}… ({len(m.group(0))} digits)", message)
