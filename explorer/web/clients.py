"""Who a request came from: the client's network address, for the caps per client (explorer.web.serving) and for
each address's share of visitors' own models (``with_client``: explorer.state.clients).

Directly on the network (a laptop in a classroom), the address is the connection's peer. Behind a reverse proxy
(a Hugging Face Space), every connection comes from the proxy, which appends the address it saw to
``X-Forwarded-For``; the entries before that are whatever the client itself sent and cannot be trusted. So the
address is the entry ``PROXY_HOPS`` from the right: the one the nearest trusted proxy wrote.

    EXPLORER_PROXY_HOPS   how many proxies in front of the app append to X-Forwarded-For (default: 1 on a Space,
                          where ``SPACE_ID`` is set; else 0, and the header is ignored, so no client can pick
                          its own address by sending one)
"""
from __future__ import annotations

import functools
import inspect
import os
import typing
from typing import Callable

import gradio as gr

from explorer.state import clients as state_clients


def _proxy_hops() -> int:
    default = 1 if os.environ.get("SPACE_ID") else 0
    try:
        return max(0, int(os.environ.get("EXPLORER_PROXY_HOPS", "") or default))
    except ValueError:  # a bad setting must not stop the app: trust nothing forwarded
        return 0


PROXY_HOPS = _proxy_hops()


def trust_no_proxy_headers(env=None) -> None:
    """Tell uvicorn (its Config reads ``FORWARDED_ALLOW_IPS`` when ``launch`` makes it) to trust no peer's
    forwarded headers: by default it rewrites a loopback peer's address from X-Forwarded-For, so with
    ``PROXY_HOPS`` 0 any local client could name its own address. ``address_of`` alone applies the hops."""
    (os.environ if env is None else env)["FORWARDED_ALLOW_IPS"] = ""


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


#: One wrapper per function, so the listeners of ``with_client(fn)`` share one concurrency group, as ``fn``'s would.
_WRAPPERS: dict[Callable, Callable] = {}


def with_client(fn: Callable) -> Callable:
    """``fn`` (a function or a generator function) run with its request's client address known
    (``explorer.state.clients.current()``): Gradio passes the request to the parameter annotated ``gr.Request``
    this adds last. Called without a request (tests, the benchmark), ``fn`` runs as it is, as "local"."""
    if fn not in _WRAPPERS:
        _WRAPPERS[fn] = _wrapped(fn)
    return _WRAPPERS[fn]


def _wrapped(fn: Callable) -> Callable:
    signature = inspect.signature(fn)
    request = inspect.Parameter("client_request", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                annotation=gr.Request)
    if any(p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in signature.parameters.values()):
        raise TypeError(f"{fn.__name__} takes *args or keyword-only parameters: with_client cannot add its request")

    def split(args, kwargs):
        if "client_request" in kwargs:
            return args, {k: v for k, v in kwargs.items() if k != "client_request"}, kwargs["client_request"]
        if args and isinstance(args[-1], gr.Request):  # Gradio passes it last, after any gr.Progress
            return args[:-1], kwargs, args[-1]
        return args, kwargs, None

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            args, kwargs, req = split(args, kwargs)
            address = address_of_request(req) if req is not None else state_clients.current()
            steps = fn(*args, **kwargs)
            try:
                while True:  # each step may run in another worker thread: the address is set for each
                    token = state_clients.CURRENT.set(address)
                    try:
                        value = next(steps)
                    except StopIteration as stop:
                        return stop.value
                    finally:
                        state_clients.CURRENT.reset(token)
                    yield value
            finally:
                steps.close()
    elif inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(f"{fn.__name__} is async: with_client takes plain functions and generator functions")
    else:
        @functools.wraps(fn)
        def run(*args, **kwargs):
            args, kwargs, req = split(args, kwargs)
            if req is None:
                return fn(*args, **kwargs)
            token = state_clients.CURRENT.set(address_of_request(req))
            try:
                return fn(*args, **kwargs)
            finally:
                state_clients.CURRENT.reset(token)

    run.__signature__ = signature.replace(parameters=[*signature.parameters.values(), request])
    try:
        hints = typing.get_type_hints(fn)
    except (NameError, TypeError):  # annotations that do not resolve: Gradio would see none either
        hints = {}
    run.__annotations__ = {**hints, "client_request": gr.Request}
    return run
