"""At the door of the served app (issue 42): a large join refused before it is read, inputs checked when they join
the queue, one address's share of each lane, and the page the same as Gradio's own for any address it names.

The app runs in this process (tests/conftest.py's ``app_url``); the clients speak HTTP to it on loopback.
"""
from __future__ import annotations

import json
import socket
import time
import urllib.parse

import pytest

from tests.hostile import (  # noqa: F401 - fixtures are found by their names here
    hub_local_only, served,
)

pytestmark = pytest.mark.usefixtures("served")


def _config(app_url: str) -> dict:
    import httpx

    return httpx.get(app_url + "config", timeout=30).json()


def _fn(config: dict, api_name: str) -> int:
    return next(d["id"] for d in config["dependencies"] if d.get("api_name") == api_name)


def _raw_post(app_url: str, path: str, declared: int, sent: bytes, timeout: float = 10.0) -> tuple[int, str]:
    """A POST declaring ``declared`` body bytes that sends only ``sent``, then reads the answer: a server that
    waits for the whole body before answering times out here."""
    url = urllib.parse.urlsplit(app_url)
    with socket.create_connection((url.hostname, url.port), timeout=timeout) as conn:
        conn.sendall(f"POST {path} HTTP/1.1\r\nHost: {url.hostname}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {declared}\r\n\r\n".encode() + sent)
        answer = b""
        deadline = time.monotonic() + timeout
        while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < 40:
            if time.monotonic() > deadline:
                break
            chunk = conn.recv(65536)
            if not chunk:
                break
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]) if head else 0, body.decode(errors="replace")


def test_a_25_mb_join_is_refused_with_413_before_its_body_is_read(app_url):
    fn = _fn(_config(app_url), "lora_finetune")
    start = json.dumps({"fn_index": fn, "session_hash": "big-body", "data": [8, 16, ["q_proj"], "x"]}).encode()
    status, text = _raw_post(app_url, "/gradio_api/queue/join", 25 * 2**20, start + b"x" * 60_000)
    assert status == 413 and "at most 2.0 MB" in text, (status, text[:300])


@pytest.mark.parametrize("path", ["", "config"])
@pytest.mark.parametrize("headers", [
    {"Host": "class.example"},
    {"Host": "laptop.local:7860"},
    {"Host": "127.0.0.1", "X-Forwarded-Host": "abc-space.hf.space", "X-Forwarded-Proto": "https"},
])
def test_the_kept_page_with_its_root_substituted_is_gradios_own_page(app_url, path, headers):
    """Gradio's own answer (a request with credentials goes past the page cache) against the cached copy rendered
    for the placeholder address with this request's root URL substituted: the same bytes, but for the code
    snippets of the inlined API description."""
    import httpx

    from explorer.web import gradio_adapter as adapter

    kept = httpx.get(app_url + path, headers=headers, timeout=60)
    own = httpx.get(app_url + path, headers={**headers, "Authorization": "Bearer none"}, timeout=60)
    assert kept.status_code == own.status_code == 200
    assert "explorer-page.invalid" not in kept.text
    assert kept.content == adapter.without_code_snippets(own.content)


def _inlined_api_info(html: str) -> dict:
    start = html.index("<script>window.gradio_api_info = ") + len("<script>window.gradio_api_info = ")
    return json.loads(html[start:html.index(";</script>", start)])


def test_the_page_inlines_every_endpoints_parameters_and_the_api_page_still_gets_the_snippets(app_url):
    """What the browser's client reads of the inlined API description (each endpoint's parameters and returns) is
    Gradio's own; the snippets, which only the "Use via API" page shows, it fetches from /gradio_api/info."""
    import httpx

    page = httpx.get(app_url, timeout=60).text
    own = httpx.get(app_url, headers={"Authorization": "Bearer none"}, timeout=60).text
    inlined, gradios = _inlined_api_info(page), _inlined_api_info(own)
    assert len(page) < len(own) - 30_000 and page.count(app_url.rstrip("/")) <= 2
    assert inlined["named_endpoints"].keys() == gradios["named_endpoints"].keys() and inlined["named_endpoints"]
    for name, endpoint in gradios["named_endpoints"].items():
        assert "code_snippets" in endpoint and "code_snippets" not in inlined["named_endpoints"][name]
        assert {**endpoint, "code_snippets": None} == {**inlined["named_endpoints"][name], "code_snippets": None}
    info = httpx.get(app_url + "gradio_api/info", timeout=60).json()
    assert all(e["code_snippets"]["python"].startswith("from gradio_client") for e in info["named_endpoints"].values())


def test_a_fine_tune_text_over_the_limit_is_refused_when_it_joins_not_when_it_runs(app_url):
    import httpx

    fn = _fn(_config(app_url), "lora_finetune")
    values = [8, 16, ["q_proj", "v_proj"], "x" * 150_000, 20, None, 60, None]
    r = httpx.post(app_url + "gradio_api/queue/join", timeout=30,
                   json={"data": values, "fn_index": fn, "session_hash": "long-text"})
    assert r.status_code == 422 and "longer than 100,000 characters" in r.text, (r.status_code, r.text[:300])
    shown = [v for v in r.json()["detail"] if not v["is_valid"]]
    assert len(shown) == 1 and len(r.json()["detail"]) == len(values)  # one message, at the text box
