"""A class votes: ``python app.py`` in its own process, one teacher asks, 40 phones vote within the same second.

The teacher's session asks the walkthrough's question (``ask_class_walkthrough``) and then polls the tally once a
second, as its page's ``gr.Timer`` does (``class_tally_walkthrough``). Each phone is its own session: it joins the
room first (``class_join``), then all wait at a barrier and each votes after a random delay inside one second
(``class_vote_<i>``). Meanwhile a fourth kind of session asks the Attention tab one question after another.

A phone's time is from just before its vote is sent to the end of the first tally poll that began after the
server answered the vote (the vote is counted before the answer, so that poll includes it): what the projector
shows, as late as the timer can show it. Clients are raw queue clients (``explorer.bench.page_client``).

    with served_app() as server:
        result = class_vote(server.url, 40)
"""
from __future__ import annotations

import json
import random
import re
import threading
import time
import uuid
from typing import Any

from .load import quantiles, attention_values
from .page_client import fetch_plan, run_events
from .server import served_app

VOTERS = 40
TICK_SECONDS = 1.0  # explorer.panels.vote.TALLY_SECONDS
_VOTES = re.compile(r"\*\*(\d+) votes?\*\*")


def _total(data) -> int | None:
    found = _VOTES.search(json.dumps(data)) if data is not None else None
    return int(found.group(1)) if found else None


def class_vote(url: str, n: int = VOTERS, *, timeout: float = 120.0, seed: int = 0) -> dict[str, Any]:
    import httpx

    plan = fetch_plan(url)
    deadline = time.monotonic() + timeout
    ask_fn, tally_fn, join_fn = (plan.fn_of(name) for name in ("ask_class_walkthrough", "class_tally_walkthrough",
                                                               "class_join"))
    teacher = f"bench-teacher-{uuid.uuid4().hex[:8]}"
    ask_values = list(plan.values[ask_fn])
    ask_values[-1] = url  # the page's address, which the browser's JS sends
    with httpx.Client(timeout=60) as http:
        asked = run_events(http, url, teacher, plan, [ask_fn], {ask_fn: ask_values}, deadline, follow=False,
                           keep_outputs=True)
    if ask_fn not in asked.done:
        return {"failed": asked.failed + asked.refused}
    link = next(v for v in asked.outputs[ask_fn] if isinstance(v, str) and "?join=" in v)
    code = link.rsplit("=", 1)[1]
    n_choices = len(re.findall(r"“", json.dumps(asked.outputs[ask_fn][3]))) or 2  # bars of the tally figure

    rng = random.Random(seed)
    delays = [rng.uniform(0.0, 1.0) for _ in range(n)]
    choices = [rng.randrange(min(n_choices, 6)) for _ in range(n)]
    start = threading.Barrier(n + 1)
    submitted: dict[int, float] = {}
    acked: dict[int, float] = {}
    failed: list[str] = []

    def phone(i: int) -> None:
        session = f"bench-phone-{i}-{uuid.uuid4().hex[:8]}"
        with httpx.Client(timeout=60) as http:
            joined = run_events(http, url, session, plan, [join_fn], {join_fn: [code, None]}, deadline, follow=False)
            failed.extend(joined.failed + joined.refused)
            try:
                start.wait(timeout=60)
            except threading.BrokenBarrierError:
                return
            time.sleep(delays[i])
            fn = plan.fn_of(f"class_vote_{choices[i]}")
            t0 = time.monotonic()
            out = run_events(http, url, session, plan, [fn], {fn: [None]}, deadline, follow=False)
            if fn in out.done:
                submitted[i], acked[i] = t0, t0 + out.done[fn]
            failed.extend(out.failed + out.refused)

    polls: list[tuple[float, float, int]] = []  # (started, answered, total shown)
    stop = threading.Event()

    def projector() -> None:
        shown = 0
        with httpx.Client(timeout=60) as http:
            while not stop.is_set() and time.monotonic() < deadline:
                t0 = time.monotonic()
                out = run_events(http, url, teacher, plan, [tally_fn], {tally_fn: [None]}, deadline, follow=False,
                                 keep_outputs=True)
                if tally_fn in out.done:
                    total = _total(out.outputs.get(tally_fn))
                    shown = shown if total is None else total  # an unchanged tally sends nothing
                    polls.append((t0, t0 + out.done[tally_fn], shown))
                time.sleep(max(0.0, TICK_SECONDS - (time.monotonic() - t0)))

    attention_seconds: list[float] = []

    def attention() -> None:
        fn = plan.fn_of("attention")
        with httpx.Client(timeout=60) as http:
            i = 0
            while not stop.is_set() and time.monotonic() < deadline:
                out = run_events(http, url, f"bench-attention-{uuid.uuid4().hex[:8]}", plan, [fn],
                                 {fn: attention_values(plan, 20_000 + i)}, deadline, follow=False)
                if fn in out.done:
                    attention_seconds.append(out.done[fn])
                i += 1

    phones = [threading.Thread(target=phone, args=(i,), daemon=True) for i in range(n)]
    others = [threading.Thread(target=projector, daemon=True), threading.Thread(target=attention, daemon=True)]
    for t in phones + others:
        t.start()
    time.sleep(0.5)  # the attention requests are running
    try:
        start.wait(timeout=60)
    except threading.BrokenBarrierError:
        failed.append("the phones did not all join within 60 s")
    for t in phones:
        t.join(timeout=max(1.0, deadline - time.monotonic()))
    last_ack = max(acked.values(), default=time.monotonic())
    while time.monotonic() < min(deadline, last_ack + 3 * TICK_SECONDS + 5):
        if any(started >= last_ack for started, _, _ in polls):
            break
        time.sleep(0.1)
    stop.set()
    for t in others:
        t.join(timeout=30)
    seconds = []
    for i, t_ack in acked.items():
        shown_at = next((answered for started, answered, _ in polls if started >= t_ack), None)
        if shown_at is not None:
            seconds.append(shown_at - submitted[i])
    final = polls[-1][2] if polls else None
    first = min(submitted.values(), default=None)
    all_shown = next((answered for _, answered, total in polls if total == n), None)
    return {"voters": n, "counted": len(acked), "shown": len(seconds), "final_tally": final,
            "exact": final == n and len(acked) == n,
            "submit_to_shown_seconds": quantiles(seconds),
            "all_shown_after_first_submit": None if all_shown is None or first is None else all_shown - first,
            "vote_window_seconds": (max(submitted.values()) - first) if submitted else None,
            "attention_requests_meanwhile": len(attention_seconds),
            "attention_seconds": quantiles(attention_seconds), "failed": failed}


def describe(r: dict[str, Any]) -> str:
    q = r.get("submit_to_shown_seconds") or {}
    p50, p95 = q.get("p50"), q.get("p95")
    return (f"{r.get('counted')} of {r.get('voters')} votes counted, tally {r.get('final_tally')}; submit to shown "
            f"p50 {p50 if p50 is None else round(p50, 2)} s, p95 {p95 if p95 is None else round(p95, 2)} s; "
            f"{r.get('attention_requests_meanwhile')} attention requests meanwhile; failed: {r.get('failed')[:3]}")


def bench_vote(n: int = VOTERS, *, log=print) -> dict[str, Any]:
    """The benchmark's class-vote row: a fresh ``python app.py``, one warm-up question, then the class."""
    with served_app() as server:
        class_vote(server.url, 2, seed=1)  # warm-up: the first forward of the walkthrough's question
        result = class_vote(server.url, n)
    log(f"vote: {describe(result)}")
    return result
