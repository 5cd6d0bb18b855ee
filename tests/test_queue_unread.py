"""Work nobody reads leaves the queue (issue 43): an event whose session opens no reader of its answers (Gradio's
``/queue/data`` stream) within the grace is dropped before it runs, while one read in time runs; a reader that
opens later is told why. A small app whose one-wide lane is held by a gated handler; loopback only."""
from __future__ import annotations

import json
import socket
import threading
import time

import gradio as gr
import pytest

from explorer.web import gradio_adapter as adapter
from explorer.web.middleware import BrowserSessions

GATE = threading.Event()
RAN: list[str] = []
SENTENCE = "This request was not run: nobody was listening. Press the button again."


def _work(text: str) -> str:
    RAN.append(text)
    GATE.wait(30)
    return f"done {text}"


@pytest.fixture(scope="module")
def gated():
    from starlette.middleware import Middleware

    with gr.Blocks() as demo:
        text, out = gr.Textbox(), gr.Textbox()
        gr.Button().click(_work, [text], [out], api_name="work", concurrency_limit=1, concurrency_id="work")
    demo.queue()
    adapter.drop_unread(demo, BrowserSessions.reading, 1.0, SENTENCE)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True,
                app_kwargs={"middleware": [Middleware(BrowserSessions)]})
    fn = next(d["id"] for d in demo.get_config_file()["dependencies"] if d.get("api_name") == "work")
    try:
        yield demo, f"http://127.0.0.1:{port}/gradio_api/", fn
    finally:
        GATE.set()
        demo.close()


def _join(http, api: str, fn: int, text: str, session: str) -> str:
    r = http.post(api + "queue/join", json={"data": [text], "fn_index": fn, "session_hash": session})
    assert r.status_code == 200, r.text
    return r.json()["event_id"]


def _read(api: str, session: str, into: list, timeout: float = 60.0) -> threading.Thread:
    """A reader of ``session``'s answers on a thread: each message's JSON into ``into`` until its stream closes."""
    import httpx

    def read() -> None:
        with httpx.Client(timeout=timeout) as http, \
                http.stream("GET", api + "queue/data", params={"session_hash": session}) as stream:
            for line in stream.iter_lines():
                if line.startswith("data:"):
                    message = json.loads(line[5:])
                    into.append(message)
                    if message.get("msg") in ("close_stream", "unexpected_error"):
                        return

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_a_join_nobody_reads_never_runs_and_one_read_in_time_does(gated):
    import httpx

    demo, api, fn = gated
    GATE.clear()
    RAN.clear()
    holder, unread, read = [], [], []
    with httpx.Client(timeout=30) as http:
        _join(http, api, fn, "holder", "holder-session")
        first = _read(api, "holder-session", holder)
        deadline = time.monotonic() + 30
        while RAN != ["holder"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert RAN == ["holder"]  # the lane (one wide) is taken: the next two wait
        _join(http, api, fn, "never read", "unread-session")
        _join(http, api, fn, "read", "read-session")
        second = _read(api, "read-session", read)
        time.sleep(2.0)  # past the grace, both waiting behind the holder: the unread one is dropped meanwhile
        assert adapter.events_held(demo, "unread-session") == 0
        assert adapter.events_held(demo, "read-session") == 1
        GATE.set()
        first.join(30)
        second.join(30)
        assert RAN == ["holder", "read"]  # the unread join was dropped before it ran
        assert [m["output"]["data"] for m in read if m.get("msg") == "process_completed"] == [["done read"]]
        late = _read(api, "unread-session", unread, timeout=15)
        late.join(20)
    said = [m for m in unread if m.get("msg") == "process_completed"]
    assert said and not said[0]["success"] and said[0]["output"]["error"] == SENTENCE, unread
    assert "never read" not in RAN


def test_without_the_middleware_nothing_counts_as_unread(monkeypatch):
    monkeypatch.setattr(BrowserSessions, "_installed", False)
    assert BrowserSessions.reading("any-session")
    monkeypatch.setattr(BrowserSessions, "_installed", True)
    assert not BrowserSessions.reading("any-session")
