"""Which client (network address) the request being handled came from, for caps per client.

``explorer.web.gradio_adapter`` sets ``CURRENT`` around each handler's run from the request's address (as
``explorer.web.clients.address_of`` reads it); a handler's worker thread inherits it. Outside a request it is
"local" (tests, the benchmark, start-up).
"""
from __future__ import annotations

import contextvars

CURRENT: "contextvars.ContextVar[str]" = contextvars.ContextVar("explorer_client", default="local")


def current() -> str:
    """The address of the client whose request runs now ("local" outside a request)."""
    return CURRENT.get()
