"""The queue's lanes: which concurrency group (and limit) each event runs in, by its API name.

    group_of(api_name)        (group, limit); (None, VIEW_CONCURRENCY) for a view in its function's own group
    concurrency(api_name)     the listener arguments that put an event in its group (``**concurrency(name)``)

``explorer.web.serving`` explains the lanes and applies them to events registered without theirs.
"""
from __future__ import annotations

import os

from explorer.web import gradio_adapter as adapter


def env_int(name: str, default: int, lo: int = 1) -> int:
    try:
        return max(lo, int(os.environ.get(name, "") or default))
    except ValueError:  # a bad setting must not stop the app from starting
        return default


#: Cheap views run this many at a time per group.
VIEW_CONCURRENCY = env_int("EXPLORER_VIEW_CONCURRENCY", 4)


# (api_name prefix, group, limit); first match wins, anything unmatched is a view.
GROUPS: list[tuple[str, str, int | None]] = [
    ("memory_compare", "measure", 1),
    ("formats", "measure", 1),
    ("experiment_sweep", "measure", 1),
    ("generate", "generation", 2),
    ("lora_finetune", "finetune", 1),
    ("memory_trace_play", "play", 16),
]
#: The lanes of long jobs: a session holds at most one event of these at once.
LONG_GROUPS = frozenset({"measure", "generation", "finetune"})


def group_of(api_name: str | None) -> tuple[str | None, int | None]:
    """(concurrency group, limit) for an event; (None, VIEW_CONCURRENCY) keeps the event its own group."""
    for prefix, group, limit in GROUPS:
        if (api_name or "").startswith(prefix):
            return group, limit
    return None, VIEW_CONCURRENCY


def concurrency(api_name: str, handler=None) -> dict:
    """The listener arguments that put the event ``api_name`` in its group: ``run.click(fn, ..., api_name=name,
    **concurrency(name))``. A view takes the queue's default limit in its function's group (Gradio's default);
    a listener given a wrapper of ``handler`` (a cached opening) names ``handler``, to wait in its group."""
    group, limit = group_of(api_name)
    if group is not None:
        return {"concurrency_id": group, "concurrency_limit": limit}
    return {} if handler is None else {"concurrency_id": adapter.default_group(handler)}
