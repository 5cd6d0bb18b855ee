"""Who a request came from: the client's network address, for the caps per client (explorer.web.serving).

Directly on the network (a laptop in a classroom), the address is the connection's peer. Behind a reverse proxy
(a Hugging Face Space), every connection comes from the proxy, which appends the address it saw to
``X-Forwarded-For``; the entries before that are whatever the client itself sent and cannot be trusted. So the
address is the entry ``PROXY_HOPS`` from the right: the one the nearest trusted proxy wrote.

    EXPLORER_PROXY_HOPS   how many proxies in front of the app append to X-Forwarded-For (default: 1 on a Space,
                          where ``SPACE_ID`` is set; else 0, and the header is ignored, so no client can pick
                          its own address by sending one)
"""
from __future__ import annotations

import os


def _proxy_hops() -> int:
    default = 1 if os.environ.get("SPACE_ID") else 0
    try:
        return max(0, int(os.environ.get("EXPLORER_PROXY_HOPS", "") or default))
    except ValueError:  # a bad setting must not stop the app: trust nothing forwarded
        return 0


PROXY_HOPS = _proxy_hops()


def address_of(headers, peer: str | None, hops: int | None = None) -> str:
    """The client's address: the peer, or with ``hops`` trusted proxies the ``hops``-th entry of
    X-Forwarded-For from the right (the peer when the header has fewer entries than that)."""
    hops = PROXY_HOPS if hops is None else hops
    if hops > 0:
        forwarded = headers.get("x-forwarded-for") if headers is not None else None
        entries = [e.strip() for e in (forwarded or "").split(",") if e.strip()]
        if len(entries) >= hops:
            return entries[-hops][:64]
    return (peer or "unknown")[:64]


def address_of_request(request) -> str:
    """``address_of`` for a Starlette/FastAPI request or a ``gr.Request`` (None: "unknown")."""
    if request is None:
        return "unknown"
    client = getattr(request, "client", None)
    return address_of(getattr(request, "headers", None), getattr(client, "host", None))
