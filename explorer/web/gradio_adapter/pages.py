"""The root URL Gradio writes into its page and configuration for a request, read as Gradio reads it.

    page_root(scope)   the root URL for an ASGI HTTP scope of ``/``, ``/config`` or ``/gradio_api/config``;
                       None when the request's headers name no valid address
"""
from __future__ import annotations

from explorer.web.gradio_adapter.checks import get_root_url

#: The route path Gradio's handler of each page path passes when it computes the root URL.
ROUTES = {"/": "/", "/config": "/config", "/gradio_api/config": "/config"}


def page_root(scope: dict) -> str | None:
    """The root URL Gradio would write into the answer to ``scope`` (its ``get_root_url``: X-Forwarded-Host, else
    the Host, https when X-Forwarded-Proto says so, the scope's root path); None when Gradio could not read one."""
    from starlette.requests import Request

    path = scope.get("path", "/")
    try:
        return get_root_url(Request(scope), ROUTES.get(path, path), scope.get("root_path") or None)
    except Exception:  # noqa: BLE001 - a Host httpx cannot parse: Gradio would answer it with an error
        return None
