"""The phone page's routes (explorer.web.hall) on a room store of their own, through Starlette's test client: the
page is small and loads no inline script, one browser's voter id votes once however often it reloads, a long poll
returns with the teacher's next question, the old ?join= link is redirected, bodies and per-address floods are
refused with sentences, and the room's limits on new voters per address hold on this path."""
from __future__ import annotations

import csv
import io
import re
import threading
import time

import pytest
from starlette.testclient import TestClient

from explorer.panels import vote as panel
from explorer.state import rooms as R
from explorer.web import hall

CHOICES = ("“ball”", "“kite”", "“cat”", "“to”")


async def _nothing(scope, receive, send):  # what Gradio would answer: here, nothing the phone routes should reach
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        return await send({"type": "lifespan.shutdown.complete"})
    await send({"type": "http.response.start", "status": 404, "headers": []})
    await send({"type": "http.response.body", "body": b"gradio"})


@pytest.fixture()
def room(monkeypatch):
    store = R.Rooms(max_votes=200)
    code, secret, qid = store.open("Which token comes next?", CHOICES)
    routes = hall.PhoneRoutes(_nothing, store=store)
    with TestClient(routes) as client:
        yield store, code, secret, qid, client, routes


def voter(i: int) -> str:
    return f"voter{i:04d}" + "x" * 16


def state(client, code, v, **more):
    return client.get("/vote/api/state", params={"code": code, "voter": v, **more}).json()


def cast(client, code, qid, choice, v, **headers):
    return client.post("/vote/api/vote", json={"code": code, "qid": qid, "choice": choice, "voter": v},
                       headers=headers).json()


def test_the_page_is_small_and_loads_its_script_from_this_server(room):
    *_, client, _ = room
    page = client.get("/vote?code=ABCDEF")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert len(page.content) < 8_000
    scripts = re.findall(r"<script([^>]*)>", page.text)
    assert scripts == [f' src="vote/phone.js?v={hashlib_version()}" defer']  # no inline script
    assert "ABCDEF" not in page.text  # the code from the link is read by the script, never written into markup
    js = client.get(f"/vote/phone.js?v={hashlib_version()}")
    assert js.status_code == 200 and "textContent" in js.text and "innerHTML" not in js.text
    assert client.get("/other").text == "gradio"  # the rest goes on to Gradio


def hashlib_version() -> str:
    import hashlib

    return hashlib.sha256(hall.JS).hexdigest()[:12]


def test_the_old_join_link_is_redirected_to_the_phone_page(room):
    *_, client, _ = room
    r = client.get("/?join=k7m4qx", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "vote?code=k7m4qx"
    r = client.get("/?join=%3Cscript%3E", follow_redirects=False)
    assert r.headers["location"] == "vote?code=script"
    assert client.get("/?join=", follow_redirects=False).headers["location"] == "vote"
    assert client.get("/?tab=attention", follow_redirects=False).text == "gradio"


def test_one_browser_votes_once_however_often_it_reloads(room):
    store, code, secret, qid, client, _ = room
    s = state(client, code.lower(), voter(1))
    assert s["state"] == "question" and s["choices"] == list(CHOICES) and s["mine"] is None and s["code"] == code
    assert cast(client, code, qid, 1, voter(1))["mine"] == 1
    for _ in range(3):  # reloads, a second tab, a second scan: the same id in the browser's storage
        assert state(client, code, voter(1))["mine"] == 1
    answer = cast(client, code, qid, 2, voter(1))
    assert answer["mine"] == 2 and answer["message"].startswith("Your vote: C “cat”")
    cast(client, code, qid, 0, voter(2))
    assert store.tally(code, secret).counts == (1, 0, 1, 0)


def test_a_held_poll_returns_with_the_next_question(room, monkeypatch):
    store, code, secret, qid, client, _ = room
    seen = state(client, code, voter(1))["key"]
    got = {}

    def poll():
        t0 = time.monotonic()
        got["answer"] = state(client, code, voter(1), seen=seen, wait="1")
        got["seconds"] = time.monotonic() - t0

    waiting = threading.Thread(target=poll)
    waiting.start()
    time.sleep(0.6)
    assert "answer" not in got  # held while nothing changes
    qid2 = store.ask(code, secret, "And now?", ("“a”", "“b”"))
    waiting.join(timeout=10)
    assert got["answer"]["qid"] == qid2 and got["answer"]["text"] == "And now?" and got["answer"]["mine"] is None
    assert got["seconds"] < hall.WAIT_SECONDS
    # a vote for the question before: answered with the new one, not counted
    late = cast(client, code, qid, 0, voter(1))
    assert late["qid"] == qid2 and "new question" in late["message"] and store.tally(code, secret).total == 0
    store.reveal(code, secret)
    assert state(client, code, voter(1))["message"].startswith("Look at the screen")
    store.close(code, secret)
    assert state(client, code, voter(1))["state"] == "ended"


def test_bad_requests_get_sentences(room):
    store, code, secret, qid, client, _ = room
    r = client.post("/vote/api/vote", content=b"{" + b" " * 2000 + b"}", headers={"content-type": "application/json"})
    assert r.status_code == 413 and "1 KB" in r.json()["message"]
    assert client.post("/vote/api/vote", content=b"[1]").json()["message"].startswith("A vote is a small JSON")
    assert "voter id" in state(client, code, "short")["message"]
    assert "6 letters and digits" in state(client, "0000", voter(1))["message"]
    assert cast(client, code, qid, 9, voter(1))["message"] == "Choose one of the 4 answers shown."
    assert client.get("/vote/api/nothing").status_code == 404
    # wrong codes are counted as guesses on this path too, per voter id
    for _ in range(R.WRONG_PER_SESSION):
        assert "No open room has the code" in state(client, "ABCDEF", voter(3))["message"]
    assert "wrong room codes" in state(client, "ABCDEF", voter(3))["message"]
    assert "wrong room codes" in cast(client, "ABCDEF", 1, 0, voter(3))["message"]  # a vote is no way round it


def test_the_rooms_limits_per_address_hold_on_this_path(room, monkeypatch):
    store, code, secret, qid, client, _ = room
    monkeypatch.setattr("explorer.web.clients.PROXY_HOPS", 1)
    nat = {"x-forwarded-for": "198.51.100.1, 203.0.113.7"}  # the proxy wrote the last entry; the first is forged
    joined = [client.get("/vote/api/state", params={"code": code, "voter": voter(i)}, headers=nat).json()
              for i in range(R.NEW_VOTERS_PER_ADDRESS + 1)]
    assert all("retry" not in j for j in joined[:-1])
    assert joined[-1]["retry"] and "new voters from your network joined" in joined[-1]["message"]
    other = client.get("/vote/api/state", params={"code": code, "voter": voter(999)},
                       headers={"x-forwarded-for": "198.51.100.1"}).json()
    assert "retry" not in other  # another address is not held back
    for i in range(R.NEW_VOTERS_PER_ADDRESS):
        cast(client, code, qid, i % 4, voter(i), **nat)
    refused = cast(client, code, qid, 0, voter(R.NEW_VOTERS_PER_ADDRESS), **nat)
    assert "not" in refused["message"] or "wait a few seconds" in refused["message"]
    assert store.tally(code, secret).total == R.NEW_VOTERS_PER_ADDRESS and store.tally(code, secret).refused == 2


def test_a_flood_from_one_address_is_answered_429(room, monkeypatch):
    store, code, *_, client, routes = room
    monkeypatch.setattr(hall, "ADDRESS_BURST", 20.0)
    monkeypatch.setattr(hall, "ADDRESS_RATE", 0.01)
    routes.door = hall.Door()
    answers = [client.get("/vote/api/state", params={"code": code, "voter": voter(1)}) for _ in range(25)]
    assert [a.status_code for a in answers].count(429) == 5
    assert answers[-1].json()["message"] == hall.BUSY and answers[-1].json()["retry"] == hall.RETRY_SECONDS
    assert client.get("/vote").status_code == 200  # the page itself is not counted


def test_the_csv_holds_each_questions_counts_and_nothing_about_a_voter(tmp_path, monkeypatch):
    store = R.Rooms(max_votes=200)
    monkeypatch.setattr(R, "rooms", store)
    monkeypatch.setattr(panel, "CSV_DIR", tmp_path)
    code, secret, qid = store.open("Which token comes next?", CHOICES)
    for i, c in enumerate((0, 1, 1, 3)):
        store.vote(code, f"phone:{voter(i)}", qid, c, address="203.0.113.7")
    qid2 = store.ask(code, secret, "=cmd|' /C calc'!A0", ("“a”", "-b"))
    store.vote(code, f"phone:{voter(0)}", qid2, 1, address="203.0.113.7")
    owner = {"code": code, "secret": secret, "answers": {qid: ("probability", (0.5, 0.25, 0.125, 0.125))}}
    out = panel.tallies_file(owner)
    text = open(out.value["path"], encoding="utf-8").read()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [(r["question"], r["choice"], r["votes"]) for r in rows] == [
        ("1", "A", "1"), ("1", "B", "2"), ("1", "C", "0"), ("1", "D", "1"), ("2", "A", "0"), ("2", "B", "1")]
    assert rows[1]["share_percent"] == "50.0" and rows[1]["model_value"] == "0.25" and rows[4]["model_value"] == ""
    assert rows[4]["question_text"].startswith("'=cmd") and rows[5]["choice_text"] == "'-b"  # never a formula
    assert "voter" not in text and "203.0.113" not in text
    closed = panel.close({**owner})[-1]  # after Close the page still has them
    assert store.phone_view(code, None) is None and len(closed["past"]) == 2
    again = panel.tallies_file(closed)
    assert open(again.value["path"], encoding="utf-8").read() == text
