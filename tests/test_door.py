"""At the door (issue 42): request bodies bounded before they are parsed, and pages whose cost does not depend on
the headers a request sends. Middleware alone, on small Starlette apps (no model, no server); the served app's
own answers are checked in tests/test_door_served.py."""
from __future__ import annotations

import gzip

import pytest


def _counting_app(seen: list):
    """A Starlette app that records how many body bytes its route read, and a page that names its root URL the
    way Gradio does (from the Host, X-Forwarded-Host and -Proto headers), counting each render."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse, PlainTextResponse
    from starlette.routing import Route

    from explorer.web import gradio_adapter as adapter

    async def join(request):
        body = await request.body()
        seen.append(len(body))
        return PlainTextResponse(f"read {len(body)} bytes")

    async def page(request):
        seen.append("render")
        root = adapter.page_root(request.scope)
        return HTMLResponse(f'<script>window.config = {{"root":"{root}","api":"{root}/gradio_api"}};</script>'
                            + "<p>the same for everyone</p>" * 2000)

    return Starlette(routes=[Route("/gradio_api/queue/join", join, methods=["POST"]), Route("/", page)])


@pytest.fixture()
def door(monkeypatch):
    from starlette.middleware import Middleware
    from starlette.testclient import TestClient

    from explorer.web import middleware
    from explorer.web.page_cache import PageCache

    monkeypatch.setattr(middleware, "REQUEST_BYTES", 100_000)
    seen: list = []
    app = _counting_app(seen)
    app.user_middleware = [Middleware(middleware.RequestLimit), Middleware(PageCache)]
    with TestClient(app) as client:
        yield client, seen


def test_a_body_over_the_limit_is_refused_with_413_and_never_reaches_the_route(door):
    client, seen = door
    assert client.post("/gradio_api/queue/join", content=b"x" * 50_000).text == "read 50000 bytes"
    declared = client.post("/gradio_api/queue/join", content=b"x" * 250_000)
    assert declared.status_code == 413 and "at most 0.1 MB" in declared.text and "shorter text" in declared.text

    def chunks():  # no declared length: refused as it streams past the limit
        for _ in range(30):
            yield b"y" * 10_000

    streamed = client.post("/gradio_api/queue/join", content=chunks())
    assert streamed.status_code == 413
    assert seen == [50_000], seen  # neither refused body reached the route


def test_a_page_for_a_new_host_is_not_rendered_again_and_names_its_own_root(door):
    client, seen = door
    first = client.get("/", headers={"Host": "class.example"})
    assert first.status_code == 200 and '"root":"http://class.example"' in first.text
    assert seen.count("render") == 1
    for i in range(30):  # new hosts, forwarded hosts and schemes: each answered from the one render
        host = {"Host": f"junk{i}.example:{8000 + i}"} if i % 2 else {"Host": "x", "X-Forwarded-Host": f"f{i}.example",
                                                                      "X-Forwarded-Proto": "https"}
        answer = client.get("/", headers=host)
        want = f"http://junk{i}.example:{8000 + i}" if i % 2 else f"https://f{i}.example"
        assert f'"root":"{want}","api":"{want}/gradio_api"' in answer.text, answer.text[:200]
        assert "explorer-page.invalid" not in answer.text
    assert seen.count("render") == 1


def test_pages_for_new_queries_never_push_the_plain_page_out(door, monkeypatch):
    from explorer.web.page_cache import PageCache

    client, seen = door
    monkeypatch.setattr(PageCache, "MAX_ENTRIES", 4)
    client.get("/", headers={"Host": "a.example"})
    for i in range(10):
        client.get(f"/?deep_link=junk{i}", headers={"Host": "a.example"})
    renders = seen.count("render")
    client.get("/", headers={"Host": "b.example"})
    assert renders == 11 and seen.count("render") == renders  # the plain page was still kept


def test_the_gzipped_page_is_built_from_kept_pieces_and_unzips_to_the_plain_one(door):
    client, _ = door
    for host in ("a.example", "b.example:7860"):
        plain = client.get("/", headers={"Host": host, "Accept-Encoding": "identity"})
        zipped = client.get("/", headers={"Host": host, "Accept-Encoding": "gzip"})
        assert zipped.headers["content-encoding"] == "gzip" and "content-encoding" not in plain.headers
        assert zipped.content == plain.content  # the client un-gzipped it
        assert int(zipped.headers["content-length"]) < len(plain.content) // 5


@pytest.mark.parametrize("host", ['a"b.example', "a<script>", "a b"])
def test_a_host_that_is_no_host_name_is_refused_with_a_sentence(door, host):
    client, seen = door
    answer = client.get("/", headers={"Host": "ok.example", "X-Forwarded-Host": host})
    assert answer.status_code == 400 and "plain host name" in answer.text
    assert "render" not in seen


def test_pieces_joined_around_any_root_make_one_valid_gzip_stream():
    from explorer.web.page_cache import Kept

    body = b"<a href='http://explorer-page.invalid/x'>" + bytes(range(256)) * 50 + b"http://explorer-page.invalid"
    kept = Kept({}, body, "http://explorer-page.invalid")
    for root in (b"http://h.example", b"https://[::1]:8080", b""):
        whole = kept.body(root)
        assert whole == body.replace(b"http://explorer-page.invalid", root)
        assert gzip.decompress(kept.gzipped(root, whole)) == whole


def test_a_roots_gzipped_page_is_kept_and_the_kept_bytes_are_bounded():
    from explorer.web.page_cache import Kept, PageCache

    placeholder = "http://explorer-page.invalid"
    body = b"".join(b"<a href='%s/file=%d'>link %d</a>" % (placeholder.encode(), i, i) for i in range(2000))
    kept, cache = Kept({}, body, placeholder), PageCache(app=None)
    root = b"http://class.example"
    answers = [cache._gzipped(("page",), kept, root) for _ in range(5)]
    assert all(z is answers[0] for z in answers)  # kept, not joined again
    assert gzip.decompress(answers[0]) == kept.body(root)
    cache.ZIPPED_BYTES = 3 * len(answers[0])
    for i in range(20):  # a stranger's junk hosts push kept answers out, within the bound
        cache._gzipped(("page",), kept, b"http://junk%d.example" % i)
        assert cache._zipped_bytes <= cache.ZIPPED_BYTES
    assert cache._zipped_bytes == sum(len(z) for z in cache._zipped.values())
    assert list(cache._zipped)[-1] == (("page",), b"http://junk19.example") and len(cache._zipped) <= 3
