"""Uploads, through the real route: refused outright here, and bounded per request where a component takes files.

Shared helpers and fixtures: tests/hostile.py.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tests.hostile import (  # noqa: F401 - fixtures are found by their names here
    hub_local_only, served,
)

pytestmark = pytest.mark.usefixtures("served")  # not an argument: hypothesis would print the model


def _gradio_upload_dir() -> Path:
    import tempfile

    return Path(os.environ.get("GRADIO_TEMP_DIR") or Path(tempfile.gettempdir()) / "gradio")


def _names_under(folder: Path) -> set[str]:
    return {p.name for p in folder.rglob("*")} if folder.exists() else set()


def test_multi_file_uploads_are_refused_before_anything_is_written(app_url):
    """No component of this app takes files, so Gradio's /gradio_api/upload (whose own limit is per file) is
    refused outright: one request of 1,000 files of 1 KB, and one of 100 files of 1 MB, get a sentence and
    leave nothing in Gradio's upload folder."""
    import http.client
    import urllib.parse

    import httpx

    tag = f"probe-{os.getpid()}-{np.random.default_rng().integers(1 << 30)}"
    before = _names_under(_gradio_upload_dir())
    many = [("files", (f"{tag}-{i}.txt", b"x" * 1024, "text/plain")) for i in range(1000)]
    r = httpx.post(app_url + "gradio_api/upload", files=many, timeout=60)
    assert r.status_code == 403 and "takes no files" in r.text, (r.status_code, r.text[:200])

    # 100 files of 1 MB: the refusal comes on the headers, before the 100 MB body is read
    boundary = "explorerboundary"
    part = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"{tag}-big.bin\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode() + b"y" * 2**20 + b"\r\n"
    length = 100 * len(part) + len(f"--{boundary}--\r\n")
    url = urllib.parse.urlsplit(app_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    conn.putrequest("POST", "/gradio_api/upload")
    conn.putheader("Content-Type", f"multipart/form-data; boundary={boundary}")
    conn.putheader("Content-Length", str(length))
    conn.endheaders()
    try:
        conn.send(part)  # the first file; the server answers without reading the rest
    except (BrokenPipeError, ConnectionResetError):
        pass
    answer = conn.getresponse()
    text = answer.read().decode()
    conn.close()
    assert answer.status == 403 and "takes no files" in text, (answer.status, text[:200])
    after = _names_under(_gradio_upload_dir())
    assert not {n for n in after - before if tag in n}, "an upload was written to disk"


def test_with_a_component_that_takes_files_one_request_is_bounded_in_all(monkeypatch):
    """Where a component takes files, one request may carry at most UPLOAD_REQUEST_BYTES in all, whatever
    Gradio's per-file limit allows."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from explorer.web import middleware

    async def upload(request):
        return PlainTextResponse(f"read {len(await request.body())} bytes")

    app = Starlette(routes=[Route("/gradio_api/upload", upload, methods=["POST"])],
                    middleware=[Middleware(middleware.UploadLimit)])
    monkeypatch.setattr(middleware, "ACCEPTS_FILES", True)
    monkeypatch.setattr(middleware, "UPLOAD_REQUEST_BYTES", 10_000)
    with TestClient(app) as client:
        assert client.post("/gradio_api/upload", content=b"z" * 5_000).text == "read 5000 bytes"
        refused = client.post("/gradio_api/upload", content=b"z" * 20_000)
        assert refused.status_code == 413 and "at most" in refused.text
    monkeypatch.setattr(middleware, "ACCEPTS_FILES", False)
    with TestClient(app) as client:
        assert client.post("/gradio_api/upload", content=b"z").status_code == 403
