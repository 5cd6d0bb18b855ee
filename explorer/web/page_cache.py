"""The page and its configuration, rendered once and served from memory whatever address a request names.

Gradio builds ``GET /`` and ``GET /config`` afresh for every visitor (0.15-0.25 s of CPU each on 2 cores), yet
they are the same for every visitor of this app (no login, no per-user layout) except for one string: the root
URL, which Gradio reads from the Host, X-Forwarded-Host and X-Forwarded-Proto headers. So the page is rendered
once per path and query, for a placeholder address (``PLACEHOLDER_HOST``), and each request gets that copy with
its own root URL substituted (computed by Gradio's own function: ``gradio_adapter.page_root``). A request naming
an address never seen before costs a substitution (about a millisecond), renders nothing and pushes no kept page
out; one naming no valid address is refused with 400 and a sentence.

The kept copy is also split at the placeholder and each piece deflated once, so a browser that accepts gzip gets
the pieces joined around its own root URL, deflated on the spot (bytes), without compressing the page again; the
gzipped answer is then kept for that root (a bounded number of bytes, least recently served out first). The page
names its root URL once: Gradio also wrote it into four code snippets per endpoint of the API description it
inlines, which the browser never reads there (``gradio_adapter.without_code_snippets``), so they are left out.
"""
from __future__ import annotations

import asyncio
import re
import struct
import zlib
from collections import OrderedDict
from urllib.parse import parse_qsl

from explorer.web import gradio_adapter as adapter

#: The address pages are rendered for: a reserved name (RFC 2606), so it never names a real host.
PLACEHOLDER_HOST = b"explorer-page.invalid"
#: Headers Gradio reads the root URL from: dropped from the render, so the kept copy names only the placeholder.
ORIGIN_HEADERS = (b"host", b"x-forwarded-host", b"x-forwarded-proto", b"x-gradio-server", b"forwarded")
#: A root URL safe to write into the page's HTML and JSON as it is (no quote, backslash, angle bracket or space).
SAFE_ROOT = re.compile(r"https?://[A-Za-z0-9.\-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~\-/]*)?|https?://\[[0-9A-Fa-f:.]+\]"
                       r"(:[0-9]{1,5})?(/[A-Za-z0-9._~\-/]*)?")
BAD_HOST = ("This server answers only requests naming a plain host name (letters, digits, dots and dashes, and "
            "maybe a port) in Host or X-Forwarded-Host: check the address you opened.")


def _deflated(data: bytes) -> bytes:
    """``data`` as raw deflate blocks ending on a byte boundary (a sync flush), with no reference to anything
    before it: such pieces can be joined in any order into one deflate stream."""
    packer = zlib.compressobj(6, zlib.DEFLATED, -15)
    return packer.compress(data) + packer.flush(zlib.Z_SYNC_FLUSH)


_FINAL_BLOCK = zlib.compressobj(6, zlib.DEFLATED, -15).flush()  # an empty last block: ends the deflate stream
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # no name, no time, unknown OS


class Kept:
    """One rendered answer: its start message, its body split at the placeholder's root URL, each piece deflated."""

    def __init__(self, start: dict, body: bytes, placeholder_root: str) -> None:
        self.start = start
        self.placeholder = placeholder_root.encode()
        self.pieces = body.split(self.placeholder)
        self.deflated = [_deflated(p) for p in self.pieces]

    def body(self, root: bytes) -> bytes:
        return root.join(self.pieces)

    def gzipped(self, root: bytes, body: bytes) -> bytes:
        """``body`` (``self.body(root)``) gzipped from the kept pieces: only ``root`` is deflated now."""
        middle = _deflated(root)
        stream = middle.join(self.deflated)
        return b"".join((_GZIP_HEADER, stream, _FINAL_BLOCK,
                         struct.pack("<II", zlib.crc32(body), len(body) & 0xFFFFFFFF)))


def _start(start: dict, length: int, gzipped: bool) -> dict:
    """A response start message for a body of ``length`` bytes (gzipped or not)."""
    drop = (b"content-length", b"vary", b"content-encoding")
    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() not in drop]
    headers.append((b"content-length", str(length).encode()))
    if gzipped:
        headers += [(b"content-encoding", b"gzip"), (b"vary", b"Accept-Encoding")]
    return {**start, "headers": headers}


async def _plain(send, status: int, text: str) -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class PageCache:
    """ASGI middleware: ``GET /``, ``/config`` and ``/gradio_api/config`` rendered once per (path, root path, page
    query) for the placeholder address and served from memory with the request's root URL in it (and gzipped to a
    browser that accepts it). Responses that set a cookie or are not a plain 200 are never kept; a request with
    credentials goes to Gradio as it is. When ``MAX_ENTRIES`` are kept, a page for a query goes first, never the
    plain page while one for a query is left."""
    PATHS = ("/", "/config", "/gradio_api/config")
    MAX_ENTRIES = 32
    #: The gzipped answers kept for the roots served, at most this many bytes in all (a page is about 0.25 MB).
    ZIPPED_BYTES = 8 * 2**20
    #: Bumped when the page changes after start-up (the opening examples computed after the server answered:
    #: ``explorer.web.serving.start_openings``): copies kept before are no longer served.
    version = 0

    @classmethod
    def page_changed(cls) -> None:
        cls.version += 1

    def __init__(self, app) -> None:
        self.app = app
        self._kept: "OrderedDict[tuple, Kept]" = OrderedDict()
        self._rendering: dict[tuple, asyncio.Lock] = {}  # a class arriving at once waits for one render, not 40
        # (key, root) -> gzipped answer, least recently served first
        self._zipped: "OrderedDict[tuple, bytes]" = OrderedDict()
        self._zipped_bytes = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET" or scope["path"] not in self.PATHS:
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if b"authorization" in headers:
            return await self.app(scope, receive, send)
        root = adapter.page_root(scope)
        if root is None or not SAFE_ROOT.fullmatch(root):
            return await _plain(send, 400, BAD_HOST)
        query = tuple(sorted((k, v) for k, v in parse_qsl(scope.get("query_string", b"").decode("latin-1"))
                             if k in ("page", "deep_link")))
        key = (PageCache.version, scope["path"], scope.get("root_path", ""), query)
        kept = self._kept.get(key)
        if kept is None:
            lock = self._rendering.setdefault(key, asyncio.Lock())
            async with lock:
                kept = self._kept.get(key)
                if kept is None:
                    kept = await self._render(scope, receive, key)
            self._rendering.pop(key, None)
            if kept is None:  # not a page to keep (an error, a cookie): Gradio answers this request itself
                return await self.app(scope, receive, send)
        else:
            self._kept.move_to_end(key)
        if b"gzip" in headers.get(b"accept-encoding", b"").lower() and b"content-encoding" not in \
                {k.lower() for k, _ in kept.start.get("headers", [])}:
            zipped = self._gzipped(key, kept, root.encode())
            await send(_start(kept.start, len(zipped), True))
            await send({"type": "http.response.body", "body": zipped, "more_body": False})
            return None
        body = kept.body(root.encode())
        await send(_start(kept.start, len(body), False))
        await send({"type": "http.response.body", "body": body, "more_body": False})
        return None

    def _gzipped(self, key: tuple, kept: Kept, root: bytes) -> bytes:
        """``kept`` for ``root``, gzipped: kept from an earlier answer, else joined from the deflated pieces."""
        zipped = self._zipped.pop((key, root), None)
        if zipped is None:
            zipped = kept.gzipped(root, kept.body(root))
            self._zipped_bytes += len(zipped)
        self._zipped[(key, root)] = zipped
        while self._zipped_bytes > self.ZIPPED_BYTES and len(self._zipped) > 1:
            self._zipped_bytes -= len(self._zipped.popitem(last=False)[1])
        return zipped

    async def _render(self, scope, receive, key) -> Kept | None:
        """Gradio's answer for the placeholder address, kept under ``key`` (None when it is not one to keep)."""
        headers = [(k, v) for k, v in scope.get("headers") or []
                   if k.lower() not in ORIGIN_HEADERS and k.lower() != b"accept-encoding"]  # kept plain, split below
        placeholder = {**scope, "scheme": "http", "headers": [(b"host", PLACEHOLDER_HOST), *headers]}
        placeholder_root = adapter.page_root(placeholder)
        captured: dict = {}
        chunks: list[bytes] = []

        async def capture(message):
            if message["type"] == "http.response.start":
                captured.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(placeholder, receive, capture)
        names = {k.lower() for k, _ in captured.get("headers", [])}
        if captured.get("status") != 200 or b"set-cookie" in names or placeholder_root is None:
            return None
        kept = Kept(dict(captured), adapter.without_code_snippets(b"".join(chunks)), placeholder_root)
        self._kept[key] = kept
        while len(self._kept) > self.MAX_ENTRIES:  # pages for a query go first: any link may name a new one
            oldest = next((k for k in self._kept if k[3]), next(iter(self._kept)))
            del self._kept[oldest]
        return kept
