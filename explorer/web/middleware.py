"""The HTTP side of a public Space, as ASGI middleware around Gradio's app (``launch(app_kwargs=app_kwargs())``):

    PageCache        the page and its configuration rendered once, served from memory with each request's root
                     URL (and gzipped): explorer.web.page_cache
    RequestLimit     every request's body bounded before it is parsed (uploads by UploadLimit)
    UploadLimit      Gradio's upload route bounded per request, or refused when no component takes files;
                     Gradio's recording route refused (no component records audio)
    SecurityHeaders  a Content-Security-Policy, frame-ancestors and nosniff on every response
    BrowserSessions  which sessions opened Gradio's heartbeat (a browser tab or Gradio's client), and when: the
                     sweeper keeps those longer than a script's (explorer.web.sweeper), and the queue gives one
                     opened a while ago a turn of its own within its address (gradio_adapter.cap_queue); and
                     which have a reader of their answers open (the queue drops events nobody reads:
                     gradio_adapter.drop_unread)
    PhoneRoutes      a class room's phone page and its vote routes, beside Gradio (explorer.web.hall), inside
                     RequestLimit

``explorer.web.serving.apply`` sets ``ACCEPTS_FILES`` from the built app (``takes_files``).
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from urllib.parse import parse_qs

import gradio as gr

from explorer.web.groups import env_int
from explorer.web.page_cache import PageCache


#: Set by ``apply``: whether any component of the app takes files (none does: then no upload is accepted).
ACCEPTS_FILES = False
#: With a component that takes files: the most one upload request may carry (all its files together).
UPLOAD_REQUEST_BYTES = 2 * 2**20

#: Set by ``apply``: whether a component of the app records audio (none does: Gradio's route is then refused).
ACCEPTS_RECORDINGS = False
RECORDING_REFUSED = "This app records no audio: nothing can be sent here."

UPLOAD_REFUSED = ("This app takes no files: nothing can be uploaded here. Type or paste your text into the page "
                  "instead.")


def records_audio(demo: gr.Blocks) -> bool:
    """Whether a component of ``demo`` records audio (Gradio's ``process_recording`` route serves only those)."""
    return any(isinstance(block, gr.Audio) for block in demo.blocks.values())


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
        if scope["type"] == "http" and scope["method"] == "POST" and \
                scope["path"].rstrip("/").endswith("/process_recording") and not ACCEPTS_RECORDINGS:
            return await _plain(send, 403, RECORDING_REFUSED)
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


#: The most one request's body may carry on any route but uploads: a queue join carrying the longest text a control
#: takes (100,000 characters: 0.4 MB as a browser sends it, 1.2 MB at worst \u-escaped) fits, a 25 MB one does not.
REQUEST_BYTES = env_int("EXPLORER_REQUEST_BYTES", 2 * 2**20, lo=64 * 1024)


def request_refused(limit: int) -> str:
    return (f"A request to this server may carry at most {limit / 2**20:.1f} MB: send a shorter text (the text boxes "
            "take at most 100,000 characters).")


class RequestLimit:
    """ASGI middleware: the body of every request but an upload (``UploadLimit``) is read here, at most
    ``REQUEST_BYTES`` of it, before the app parses any of it. A body that declares a larger length is refused
    with 413 unread; one that streams past the limit is refused as soon as it does, the rest never read. Gradio
    parses and keeps a queue join's whole body while the event waits, so without this a script's 25 MB joins
    each held 50 MB for as long as they waited."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS") or \
                scope["path"].rstrip("/").endswith("/upload"):
            return await self.app(scope, receive, send)
        limit = REQUEST_BYTES
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            return await _plain(send, 413, request_refused(limit))
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left: nothing to answer
                return None
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > limit:
                return await _plain(send, 413, request_refused(limit))
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


async def _plain(send, status: int, text: str) -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


#: What the page needs and nothing more: Gradio's own scripts and styles (inline ones too: the page's configuration
#: and Svelte's styles), images as data: and blob: URLs (Plotly's downloads), the queue's event streams and
#: websockets to this same origin, fonts from here; embedding by this origin and Hugging Face (a Space's page
#: shows the app in an iframe), by nobody else.
CONTENT_SECURITY_POLICY = "; ".join([
    "default-src 'self'",
    "script-src 'self' 'unsafe-inline' 'unsafe-eval' blob:",
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data: blob:",
    "font-src 'self' data:",
    "media-src 'self' data: blob:",
    "connect-src 'self' ws: wss: blob: data:",
    "worker-src 'self' blob:",
    "object-src 'none'",
    "base-uri 'self'",
    "form-action 'self'",
    "frame-ancestors 'self' https://huggingface.co https://*.huggingface.co https://*.hf.space",
])
SECURITY_HEADERS = [(b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"strict-origin-when-cross-origin")]


class SecurityHeaders:
    """ASGI middleware: ``SECURITY_HEADERS`` on every HTTP response (those the app set itself are kept)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def with_headers(message):
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                have = {k.lower() for k, _ in headers}
                headers += [(k, v) for k, v in SECURITY_HEADERS if k not in have]
                message = {**message, "headers": headers}
            await send(message)

        return await self.app(scope, receive, with_headers)


class BrowserSessions:
    """ASGI middleware that notes each session hash opening Gradio's heartbeat route (a browser tab does, and
    so does Gradio's own client; a script posting to the queue does not), and when it first did, in a bounded
    record."""
    MAX = 20_000
    #: A session that opened its heartbeat at least this long ago is established: the queue gives it a turn of
    #: its own among its address's sessions, where fresh ids (a script rotating them) share one turn.
    ESTABLISHED_SECONDS = 10.0
    _seen: "OrderedDict[str, float]" = OrderedDict()  # session hash -> when first noted (monotonic)
    _reading: dict[str, int] = {}  # session hash -> answer streams (Gradio's /queue/data) open now
    _installed = False  # whether an app runs behind this middleware (else every session counts as read)
    _guard = threading.Lock()

    def __init__(self, app) -> None:
        self.app = app
        BrowserSessions._installed = True

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if "/heartbeat/" in path:
            self.note(path.rstrip("/").rsplit("/", 1)[-1])
        elif path.endswith("/queue/data"):
            found = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("session_hash")
            if found:
                key = found[0][:128]
                with self._guard:
                    self._reading[key] = self._reading.get(key, 0) + 1
                try:
                    return await self.app(scope, receive, send)
                finally:
                    with self._guard:
                        left = self._reading.pop(key, 1) - 1
                        if left > 0:
                            self._reading[key] = left
        return await self.app(scope, receive, send)

    @classmethod
    def reading(cls, session_hash: str) -> bool:
        """Whether a reader of ``session_hash``'s answers is open now (True when no app runs behind this
        middleware: then nothing is known, and nothing may be dropped for it)."""
        return not cls._installed or session_hash in cls._reading

    @classmethod
    def note(cls, session_hash: str) -> None:
        key = session_hash[:128]
        with cls._guard:
            cls._seen[key] = cls._seen.get(key, time.monotonic())
            cls._seen.move_to_end(key)
            while len(cls._seen) > cls.MAX:
                cls._seen.popitem(last=False)

    @classmethod
    def has_browser(cls, session_hash: str) -> bool:
        """Whether ``session_hash`` opened the heartbeat (a page or Gradio's client holds it)."""
        return session_hash in cls._seen

    @classmethod
    def established(cls, session_hash: str) -> bool:
        """Whether ``session_hash`` opened the heartbeat at least ``ESTABLISHED_SECONDS`` ago."""
        first = cls._seen.get(session_hash)
        return first is not None and time.monotonic() - first >= cls.ESTABLISHED_SECONDS

    @classmethod
    def forget(cls, session_hash: str) -> None:
        with cls._guard:
            cls._seen.pop(session_hash, None)


def app_kwargs() -> dict:
    """For ``launch(app_kwargs=...)``: security headers, browser sessions noted, the upload and request limits,
    the phone page and the page cache, as Starlette middleware (the first listed is the outermost)."""
    from starlette.middleware import Middleware

    from explorer.web.hall import PhoneRoutes

    return {"middleware": [Middleware(SecurityHeaders), Middleware(BrowserSessions), Middleware(UploadLimit),
                           Middleware(RequestLimit), Middleware(PhoneRoutes), Middleware(PageCache)]}
