"""The page Gradio renders: the root URL it writes in for a request, and the API description it inlines.

    page_root(scope)              the root URL for an ASGI HTTP scope of ``/``, ``/config`` or ``/gradio_api/config``;
                                  None when the request's headers name no valid address
    without_code_snippets(html)   the page with its inlined API description lacking the code snippets
"""
from __future__ import annotations

import json

from explorer.web.gradio_adapter.checks import get_root_url, toorjson

#: The route path Gradio's handler of each page path passes when it computes the root URL.
ROUTES = {"/": "/", "/config": "/config", "/gradio_api/config": "/config"}
#: How Gradio's page template (frontend/index.html) inlines the API description for the browser's client.
API_INFO = (b"<script>window.gradio_api_info = ", b";</script>")


def page_root(scope: dict) -> str | None:
    """The root URL Gradio would write into the answer to ``scope`` (its ``get_root_url``: X-Forwarded-Host, else
    the Host, https when X-Forwarded-Proto says so, the scope's root path); None when Gradio could not read one."""
    from starlette.requests import Request

    path = scope.get("path", "/")
    try:
        return get_root_url(Request(scope), ROUTES.get(path, path), scope.get("root_path") or None)
    except Exception:  # noqa: BLE001 - a Host httpx cannot parse: Gradio would answer it with an error
        return None


def without_code_snippets(html: bytes) -> bytes:
    """``html`` with the API description Gradio inlines in it stripped of each endpoint's code snippets, written
    as Gradio writes it (``toorjson``); unchanged when it inlines none. The snippets (Python, JavaScript, curl and
    CLI for each public endpoint, each naming the root URL) are shown only by the "Use via API" page, which
    fetches its own copy from ``/gradio_api/info``; the browser's client reads the endpoints' parameters."""
    start = html.find(API_INFO[0])
    end = html.find(API_INFO[1], start)
    if start < 0 or end < 0:
        return html
    start += len(API_INFO[0])
    try:
        info = json.loads(html[start:end])
    except ValueError:
        return html
    for kind in ("named_endpoints", "unnamed_endpoints"):
        for endpoint in (info.get(kind) or {}).values():
            if isinstance(endpoint, dict):
                endpoint.pop("code_snippets", None)
    return html[:start] + str(toorjson(info)).encode() + html[end:]
