"""The benchmark's phones (explorer/bench/phones.py) against the phone routes alone (explorer.web.hall on a room store
of their own, served by uvicorn on a loopback port): plain HTTP/1.1 phones join, vote, reload and vote again, follow
the next question after the server closed their idle connections, and the tally equals the choices the server
confirmed to them; the server's timing file (``EXPLORER_PHONE_TIMES``) names every vote's question."""
from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import uvicorn

from explorer.bench import phones as P
from explorer.bench import vote as bench
from explorer.state import rooms as R
from explorer.web import clients, hall
from tests.test_hall import _nothing  # the stand-in for Gradio behind the phone routes

CHOICES = ("ball", "kite", "cat", "to")


@pytest.fixture()
def served(monkeypatch, tmp_path):
    """(the store, its room's code and secret and first question, the routes' URL, the timing file)."""
    times = tmp_path / "times.txt"
    monkeypatch.setattr(hall, "TIMES", str(times))
    monkeypatch.setattr(clients, "PROXY_HOPS", 1)
    monkeypatch.setattr(P, "PAUSE", (0.01, 0.2))
    store = R.Rooms(max_votes=200)
    code, secret, qid = store.open("Which token comes next?", CHOICES)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # idle connections closed after 1 s: the phones must open new ones between questions, as after uvicorn's 5 s;
    # held polls are dropped 1 s after the end, not kept for their 20 s
    server = uvicorn.Server(uvicorn.Config(hall.PhoneRoutes(_nothing, store=store), host="127.0.0.1", port=port,
                                           log_level="warning", timeout_keep_alive=1,
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    yield store, code, secret, qid, f"http://127.0.0.1:{port}/", times
    server.should_exit = True
    thread.join(timeout=10)


def _wait(condition, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the phones did not finish voting"
        time.sleep(0.05)


def _expected(final: dict[int, int], k: int) -> tuple[int, ...]:
    counts = [0] * k
    for choice in final.values():
        counts[choice] += 1
    return tuple(counts)


def test_phones_on_one_loop_vote_follow_the_next_question_and_match_the_tally(served):
    store, code, secret, qid, url, times = served
    phones = [{"i": i, "address": P.CAMPUS_ADDRESS if i < 8 else f"198.51.100.{i}", "voter": f"phone{i:04d}" * 3,
               "start": 0.02 * i} for i in range(12)]
    events: list[list] = []

    async def run() -> None:
        crowd = P.Phones(url, code, phones, seed=1, emit=events.append)
        task = asyncio.ensure_future(crowd.run())
        finals: dict[int, dict[int, int]] = {}

        async def all_voted(q: int) -> None:
            while True:
                finals[q] = {e[2]: e[3] for e in events if e[0] == "ack" and e[1] == q}
                pending = sum(e[1] for e in events if e[0] == "pending")
                if len(finals[q]) == len(phones) and not pending:
                    return
                assert not task.done(), events[-5:]
                await asyncio.sleep(0.05)

        await asyncio.wait_for(all_voted(qid), 60)
        assert store.tally(code, secret).counts == _expected(finals[qid], 4)
        await asyncio.sleep(1.5)  # every idle connection is closed by now
        q2 = store.ask(code, secret, "And now?", ("yes", "no", "maybe"))
        await asyncio.wait_for(all_voted(q2), 60)
        assert store.tally(code, secret).counts == _expected(finals[q2], 3)
        crowd.done.set()
        await asyncio.wait_for(task, 30)

    asyncio.run(run())
    trouble = [e for e in events if e[0] in ("failed", "lost", "count")]  # a reconnection is silent, not a retry
    assert not trouble, trouble
    assert len({e[1] for e in events if e[0] == "joined"}) == len(phones)
    lines = [line.split() for line in times.read_text().splitlines()]
    voted = [line for line in lines if line[0] == "vote"]
    assert {line[3] for line in voted} == {str(qid), str(qid + 1)}
    assert all(float(b) >= float(a) for _, a, b, _ in voted)
    assert any(line[0] == "lag" for line in lines)


@pytest.mark.slow
def test_phone_processes_report_every_ack_and_the_bench_splits_it_with_the_server_file(served):
    store, code, secret, qid, url, times = served
    crowd = P.Hall(url, code, n=40, campus=25, seed=3, ramp=2.0, processes=2)
    crowd.start()
    try:
        _wait(lambda: len(crowd.final.get(qid, {})) == 40 and not crowd.pending)
        q2 = store.ask(code, secret, "And now?", ("yes", "no"))
        _wait(lambda: len(crowd.final.get(q2, {})) == 40 and not crowd.pending)
    finally:
        crowd.finish()
    assert not crowd.failed and crowd.refused == 0 and len(crowd.joined) == 40, crowd.failed
    assert store.tally(code, secret).counts == _expected(crowd.final[q2], 2)
    assert len(crowd.acks[q2]) >= 40  # a reload's second vote changes the count, never adds to it
    where = bench._where(crowd, q2, str(times))
    assert where["server_vote_seconds"]["p50"] is not None and where["phones_lag_max"] is not None
