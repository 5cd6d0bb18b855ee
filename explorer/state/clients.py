"""Which client (network address) the request being handled came from, for caps per client.

``explorer.web.clients.with_client`` sets ``CURRENT`` around the run of each handler that needs it, from the
address of the request Gradio passes it (as ``explorer.web.clients.address_of`` reads it). Outside a request it
is "local" (tests, the benchmark, start-up).
"""
from __future__ import annotations

import contextvars

CURRENT: "contextvars.ContextVar[str]" = contextvars.ContextVar("explorer_client", default="local")


def current() -> str:
    """The address of the client whose request runs now ("local" outside a request)."""
    return CURRENT.get()
