"""One address's share of the queue and each event's values checked at join (issue 42), under the app's own rules
(``serving.queue_rules``) on a small app whose handlers wait on a gate: what is held stays held while a flood
arrives. Loopback only; every flood is a bounded loop of joins."""
from __future__ import annotations

import threading
import time
import uuid

import gradio as gr
import pytest

from explorer.web import gradio_adapter as adapter
from explorer.web import serving
from explorer.web.groups import FINETUNE, VIEW, lane

GATE = threading.Event()


def _hold(text):
    GATE.wait(30)
    return "done"


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    import socket

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FORWARDED_ALLOW_IPS", "127.0.0.1")  # uvicorn's default trust, which the app must undo
        with gr.Blocks() as demo:
            text = gr.Textbox(label="Your text")
            short = gr.Textbox(label="Short", max_length=50)
            out = gr.Textbox()
            gr.Button().click(_hold, [text], [out], api_name="long_job", **lane(FINETUNE))
            gr.Button().click(_hold, [text], [out], api_name="look", **lane(VIEW))
            gr.Button().click(_hold, [short], [out], api_name="short_look", **lane(VIEW))
        demo.queue(**serving.QUEUE)
        adapter.keep_sessions_with_events(demo)
        adapter.cap_queue(demo, serving.queue_rules())
        serving.trust_no_proxy_headers()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
        config = {d["api_name"]: d["id"] for d in demo.get_config_file()["dependencies"] if d.get("api_name")}
        try:
            yield demo, f"http://127.0.0.1:{port}/", config
        finally:
            GATE.set()
            demo.close()


@pytest.fixture()
def app(gated):
    """The gated app, its gate closed during the test and opened after it until every held event has ended."""
    demo = gated[0]
    GATE.clear()
    yield gated
    GATE.set()
    deadline = time.monotonic() + 30
    while adapter.queue_of(demo).event_ids_to_events and time.monotonic() < deadline:
        time.sleep(0.1)


def _flood(url: str, fn: int, n: int, data: list, headers_of=lambda i: {}) -> list[tuple[int, str]]:
    import httpx

    out = []
    deadline = time.monotonic() + 120
    with httpx.Client(timeout=30) as http:
        for i in range(n):
            if time.monotonic() > deadline:
                break
            r = http.post(url + "gradio_api/queue/join", headers=headers_of(i),
                          json={"data": data, "fn_index": fn, "session_hash": f"s{i}-{uuid.uuid4().hex[:6]}"})
            out.append((r.status_code, r.text))
    return out


@pytest.mark.slow
def test_300_long_joins_from_one_address_leave_only_its_lane_share_queued(app):
    demo, url, fns = app
    answers = _flood(url, fns["long_job"], 300, ["fine-tune me"])
    accepted = [a for a in answers if a[0] == 200]
    assert len(answers) == 300 and len(accepted) == serving.CLIENT_LONG_CAP == 4, answers[:6]
    refused = {text for code, text in answers if code != 200}
    assert all(code == 503 for code, _ in answers if code != 200)
    assert any("4 finetune requests waiting or running" in t and "try again in a minute" in t for t in refused)


def test_rotating_forwarded_addresses_at_hops_0_are_one_address(app):
    demo, url, fns = app
    from explorer.web import clients

    assert clients.PROXY_HOPS == 0
    answers = _flood(url, fns["long_job"], 300, ["fine-tune me"],
                     headers_of=lambda i: {"X-Forwarded-For": f"10.9.{i // 200}.{i % 200 + 1}"})
    assert sum(code == 200 for code, _ in answers) == serving.CLIENT_LONG_CAP, answers[:6]


def test_views_from_one_address_get_a_larger_share_and_a_class_fits(app):
    demo, url, fns = app
    answers = _flood(url, fns["look"], serving.CLIENT_LANE_CAP + 20, ["a question"])
    accepted = sum(code == 200 for code, _ in answers)
    assert accepted == serving.CLIENT_LANE_CAP >= 40 * 3, accepted  # a class of 40 opening a link: 3 views each
    assert any("try again in a few seconds" in text for code, text in answers if code != 200)


@pytest.mark.parametrize("api, data, said", [
    ("long_job", ["x" * 150_000], "longer than 100,000 characters"),
    ("short_look", ["y" * 51], "longer than 50 characters"),
    ("look", [["a"] * 20_000], "10,000 items"),
    ("look", "not a list", "not a list"),
])
def test_values_over_a_controls_limit_are_refused_at_join_and_nothing_is_stored(app, api, data, said):
    demo, url, fns = app
    answers = _flood(url, fns[api], 1, data)
    assert answers[0][0] in (400, 422) and said in answers[0][1], answers  # 422: shown at that input
    assert not adapter.queue_of(demo).event_ids_to_events
