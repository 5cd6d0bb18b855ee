"""The HTTP side of a public Space, as ASGI middleware around Gradio's app (``launch(app_kwargs=app_kwargs())``):

    PageCache     the page and its configuration built once, served from memory (and gzipped)
    UploadLimit   Gradio's upload route bounded per request, or refused when no component takes files

``explorer.web.serving.apply`` sets ``ACCEPTS_FILES`` from the built app (``takes_files``).
"""
from __future__ import annotations

import gzip

import gradio as gr


class PageCache:
    """ASGI middleware: the page itself (``GET /``, with Gradio's configuration inside) and ``GET /config`` are
    built once per (path, page, host and proxy headers) and served from memory.

    Gradio builds both afresh for every visitor, which costs a class opening the page at once dearly, yet they
    are the same for every visitor of this app (no login, no per-user layout), so a copy is served; responses
    that set a cookie or are not a plain 200 are never kept. A kept copy is also gzipped once, and sent gzipped
    to a browser that accepts it, since the page carries every opening figure.
    """
    PATHS = ("/", "/config", "/gradio_api/config")
    KEY_HEADERS = (b"host", b"x-forwarded-host", b"x-forwarded-proto", b"x-forwarded-port", b"x-forwarded-prefix",
                   b"x-forwarded-for-root", b"forwarded")
    MAX_ENTRIES = 32

    def __init__(self, app) -> None:
        self.app = app
        self._kept: dict[tuple, tuple[dict, bytes, bytes | None]] = {}  # key -> (start, body, gzipped body)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET" or scope["path"] not in self.PATHS:
            return await self.app(scope, receive, send)
        from urllib.parse import parse_qsl

        headers = dict(scope.get("headers") or [])
        if b"authorization" in headers:
            return await self.app(scope, receive, send)
        query = tuple(sorted((k, v) for k, v in parse_qsl(scope.get("query_string", b"").decode("latin-1"))
                             if k in ("page", "deep_link")))
        key = (scope["path"], scope.get("root_path", ""), query, tuple(headers.get(h) for h in self.KEY_HEADERS))
        kept = self._kept.get(key)
        if kept is not None:
            start, body, zipped = kept
            if zipped is not None and b"gzip" in headers.get(b"accept-encoding", b"").lower():
                start, body = _gzipped_start(start, len(zipped)), zipped
            await send(start)
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return None
        captured: dict = {}
        chunks: list[bytes] = []

        async def capture(message):
            if message["type"] == "http.response.start":
                captured.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    names = {k.lower() for k, _ in captured.get("headers", [])}
                    if captured.get("status") == 200 and b"set-cookie" not in names and \
                            len(self._kept) < self.MAX_ENTRIES:
                        body = b"".join(chunks)
                        zipped = None if b"content-encoding" in names else gzip.compress(body, 6)
                        self._kept[key] = (dict(captured), body, zipped)
            await send(message)

        return await self.app(scope, receive, capture)


def _gzipped_start(start: dict, length: int) -> dict:
    """A response start message for the gzipped body of ``length`` bytes."""
    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() not in (b"content-length", b"vary")]
    headers += [(b"content-encoding", b"gzip"), (b"content-length", str(length).encode()),
                (b"vary", b"Accept-Encoding")]
    return {**start, "headers": headers}


#: Set by ``apply``: whether any component of the app takes files (none does: then no upload is accepted).
ACCEPTS_FILES = False
#: With a component that takes files: the most one upload request may carry (all its files together).
UPLOAD_REQUEST_BYTES = 2 * 2**20

UPLOAD_REFUSED = ("This app takes no files: nothing can be uploaded here. Type or paste your text into the page "
                  "instead.")


def takes_files(demo: gr.Blocks) -> bool:
    """Whether a component of ``demo`` accepts files from a visitor (it has an upload event)."""
    return any("upload" in {str(getattr(e, "event_name", e)) for e in getattr(block, "EVENTS", [])}
               for block in demo.blocks.values())


class UploadLimit:
    """ASGI middleware on Gradio's upload route, which exists whether or not a component takes files, and whose
    own limit (``max_file_size``) is per file, so one request could carry 1,000 files. With no component that
    takes files (this app), every upload is refused before a byte is written; otherwise a request larger than
    ``UPLOAD_REQUEST_BYTES`` in all is refused, by its declared length or as it streams."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].rstrip("/").endswith("/upload"):
            return await self.app(scope, receive, send)
        if not ACCEPTS_FILES:
            return await _plain(send, 403, UPLOAD_REFUSED)
        limit = UPLOAD_REQUEST_BYTES
        sentence = (f"One upload may carry at most {limit // 2**20} MB in all: send fewer or smaller files.")
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is None or not declared.isdigit() or int(declared) > limit:
            return await _plain(send, 413, sentence)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:  # longer than it said: stop reading it
                raise RuntimeError("upload longer than its declared length")
            return message

        return await self.app(scope, counted, send)


async def _plain(send, status: int, text: str) -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def app_kwargs() -> dict:
    """For ``launch(app_kwargs=...)``: the page cache and the upload limit, as Starlette middleware."""
    from starlette.middleware import Middleware

    return {"middleware": [Middleware(UploadLimit), Middleware(PageCache)]}
