"""A lecture hall votes: ``python app.py`` in its own process, one teacher's page asks, 200 phones vote through the
phone page's own requests (explorer/web/hall.py), 120 of them behind one campus address.

The server runs with ``EXPLORER_PROXY_HOPS=1``, and every phone names its address in X-Forwarded-For as a proxy
would: 120 phones the same campus address, 80 an address each. The teacher's session asks the walkthrough's
question (``ask_class_walkthrough``) and polls the tally once a second as its page's ``gr.Timer`` does
(``class_tally_walkthrough``), on raw queue routes (``explorer.bench.page_client``). The phones run in processes
of their own (``explorer.bench.phones``: plain HTTP/1.1, each phone its own connections): each opens the page (HTML
and script) within ``RAMP_SECONDS`` (a hall scanning the QR code), joins, then holds a long poll and votes a human
pause after each question reaches it; a tenth reload the page before they vote again (one vote per browser: the
count must not move).

Three questions, all in the one room: the first while the phones join; the second with the server otherwise idle;
the third while ``VISITORS`` other sessions ask the Attention tab one question after another. Per question: each
vote's ack (sent to answered), each phone's wait for the question (the teacher's ask answered to the phone's poll
answered), the projector's tally after the last ack (to the end of the first tally poll showing every vote),
whether its counts equal the phones' final choices, and where an ack's seconds went: the phone processes' own
loop lag, and with ``times`` (the server's ``EXPLORER_PHONE_TIMES`` file, explorer/web/hall.py) each vote's
time on the server from arrival to answer and the server's own loop lag.

    with served_app({"EXPLORER_PROXY_HOPS": "1", "EXPLORER_PHONE_TIMES": path}) as server:
        result = lecture_hall(server.url, times=path)
"""
from __future__ import annotations

import json
import re
import threading
import time
import uuid
from typing import Any

from .load import attention_values, quantiles
from .page_client import fetch_plan, run_events
from .phones import Hall
from .server import served_app

PHONES, CAMPUS, VISITORS = 200, 120, 40
RAMP_SECONDS = 30.0  # the hall scans the QR code: 120 campus phones in 30 s stay under 60 new voters per 10 s
TICK_SECONDS = 1.0  # explorer.panels.vote.TALLY_SECONDS
_VOTES = re.compile(r"\*\*(\d+) votes?\*\*")


def _tally(data) -> tuple[int | None, list[int] | None]:
    """(the total, the counts per choice) a tally answer shows; (None, None) when it sent nothing new."""
    text = json.dumps(data) if data is not None else ""
    found = _VOTES.search(text)
    counts = None
    for value in data or []:
        plot = value.get("plot") if isinstance(value, dict) else None
        if isinstance(plot, str):
            bars = json.loads(plot)["data"][0]
            counts = [int(str(t).split(" ")[0]) for t in bars.get("text") or []]
    return (int(found.group(1)) if found else None), counts


class Teacher:
    """The projector's page: asks in its one room and polls the tally every second in a thread."""

    def __init__(self, url: str, deadline: float) -> None:
        self.url, self.deadline = url, deadline
        self.plan = fetch_plan(url)
        self.session = f"bench-teacher-{uuid.uuid4().hex[:8]}"
        self.ask_fn, self.tally_fn = self.plan.fn_of("ask_class_walkthrough"), self.plan.fn_of("class_tally_walkthrough")
        self.polls: list[tuple[float, float, int | None, list[int] | None]] = []  # (started, answered, total, counts)
        self.stop = threading.Event()
        self.code: str | None = None
        self.errors: list[str] = []
        self.lock = threading.Lock()  # one session reads one event stream at a time: an ask waits for the poll

    def ask(self, prompt: str) -> float | None:
        """Ask ``prompt``'s question; when it was sent (monotonic: the teacher pressed Ask), or None when it was
        not answered."""
        import httpx

        values = list(self.plan.values[self.ask_fn])
        values[0], values[-1] = prompt, self.url
        with self.lock, httpx.Client(timeout=120) as http:
            sent = time.monotonic()
            out = run_events(http, self.url, self.session, self.plan, [self.ask_fn], {self.ask_fn: values},
                             self.deadline, follow=False, keep_outputs=True)
        if self.ask_fn not in out.done:
            return None
        link = next(v for v in out.outputs[self.ask_fn] if isinstance(v, str) and "vote?code=" in v)
        self.code = link.rsplit("=", 1)[1]
        return sent

    def poll(self) -> None:
        import httpx

        total, counts = 0, None
        with httpx.Client(timeout=120) as http:
            while not self.stop.is_set() and time.monotonic() < self.deadline:
                with self.lock:
                    t0 = time.monotonic()
                    out = run_events(http, self.url, self.session, self.plan, [self.tally_fn],
                                     {self.tally_fn: [None]}, self.deadline, follow=False, keep_outputs=True)
                self.errors += out.failed + out.refused
                if self.tally_fn in out.done:
                    try:
                        shown, by_choice = _tally(out.outputs.get(self.tally_fn))
                    except (ValueError, KeyError, IndexError, TypeError) as exc:
                        self.errors.append(f"tally: {exc!r}")
                        shown, by_choice = None, None
                    total = total if shown is None else shown  # an unchanged tally sends nothing
                    counts = counts if by_choice is None else by_choice
                    self.polls.append((t0, time.monotonic(), total, counts))
                time.sleep(max(0.0, TICK_SECONDS - (time.monotonic() - t0)))

    def shown_after(self, t: float, total: int) -> tuple[float | None, list[int] | None]:
        """When the first tally poll begun after ``t`` showing ``total`` votes was answered, and its counts."""
        for started, answered, shown, counts in self.polls:
            if started >= t and shown == total:
                return answered, counts
        return None, None


def _wait_for(condition, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def lecture_hall(url: str, n: int = PHONES, campus: int = CAMPUS, visitors: int = VISITORS, *,
                 timeout: float = 300.0, seed: int = 0, ramp: float = RAMP_SECONDS, cpu=None,
                 round_seconds: float = 60.0, times: str | None = None) -> dict[str, Any]:
    """The three questions (see the module docstring); per question its measurements, and the whole run's.
    ``cpu``: the server's CPU seconds so far (``Server.cpu_seconds``), to say what each question cost it;
    ``round_seconds``: how long a question waits for every phone's vote (a test on a loaded machine waits longer);
    ``times``: the server's ``EXPLORER_PHONE_TIMES`` file, to split each ack into the server's share and the rest."""
    import os

    deadline = time.monotonic() + timeout
    teacher = Teacher(url, deadline)
    prompts = ["Tom gave the red ball to Anna. Anna gave the red ball to",
               "The cat sat on the mat. The dog sat on the",
               "Lucy found a blue kite. Lucy gave the blue kite to"]
    asked = [teacher.ask(prompts[0])]
    if asked[0] is None:
        return {"failed": ["the teacher's first question was not answered"]}
    threading.Thread(target=teacher.poll, daemon=True).start()
    hall = Hall(url, teacher.code, n, campus, seed, ramp)
    hall.start()
    qids: list[int] = []
    rounds: dict[str, dict[str, Any]] = {}
    busy = threading.Event()
    attention_seconds: list[float] = []
    visiting: list[threading.Thread] = []

    def visitor(i: int) -> None:
        import httpx

        fn = teacher.plan.fn_of("attention")
        with httpx.Client(timeout=120) as http:
            j = 0
            while busy.is_set() and time.monotonic() < deadline:
                try:
                    out = run_events(http, url, f"bench-visitor-{i}-{j}-{uuid.uuid4().hex[:6]}", teacher.plan, [fn],
                                     {fn: attention_values(teacher.plan, 30_000 + 100 * i + j)}, deadline,
                                     follow=False)
                except httpx.HTTPError as exc:
                    teacher.errors.append(f"visitor: {type(exc).__name__}")
                    continue
                if fn in out.done:
                    attention_seconds.append(out.done[fn])
                j += 1

    for name, prompt in (("join", None), ("idle", prompts[1]), ("busy", prompts[2])):
        if name == "busy":
            busy.set()
            for i in range(visitors):
                visiting.append(threading.Thread(target=visitor, args=(i,), daemon=True))
                visiting[-1].start()
            time.sleep(3.0)  # the attention questions are running
        cpu_before, wall_before = (cpu() if cpu else None), time.monotonic()
        at = asked[0] if prompt is None else teacher.ask(prompt)
        if at is None:
            rounds[name] = {"failed": "the teacher's question was not answered"}
            continue
        wait = ramp + round_seconds if prompt is None else round_seconds
        _wait_for(lambda: any(q not in qids for q in hall.seen), min(deadline, time.monotonic() + wait))
        fresh = [q for q in hall.seen if q not in qids]
        if not fresh:
            rounds[name] = {"failed": "no phone saw the question"}
            continue
        qid = max(fresh)
        qids.append(qid)
        _wait_for(lambda: len(hall.final.get(qid, {})) >= n - hall.lost and not hall.pending,
                  min(deadline, time.monotonic() + wait))
        final, last = dict(hall.final.get(qid, {})), hall.last_ack.get(qid, time.monotonic())
        _wait_for(lambda: teacher.shown_after(last, len(final))[0] is not None, min(deadline, time.monotonic() + 15))
        shown_at, counts = teacher.shown_after(last, len(final))
        expected = [0] * (len(counts) if counts else 6)
        for choice in final.values():
            if choice < len(expected):
                expected[choice] += 1
        rounds[name] = {
            "question": qid, "votes": len(hall.acks.get(qid, [])), "voters": len(final),
            "ack_seconds": quantiles(hall.acks.get(qid, [])),
            "ask_to_phone_seconds": None if prompt is None else quantiles(
                [t - at for t in hall.seen.get(qid, {}).values()]),
            "tally_after_last_vote": None if shown_at is None else shown_at - last,
            "tally_counts": counts, "expected_counts": expected, "exact": counts == expected and len(final) == n,
            "attention_answered": len(attention_seconds) if name == "busy" else 0,
            **_where(hall, qid, times),
            "server_cpu_seconds": None if cpu is None else cpu() - cpu_before,
            "wall_seconds": time.monotonic() - wall_before, "load_average": os.getloadavg()[0]}
    busy.clear()
    for t in visiting:
        t.join(timeout=max(1.0, deadline - time.monotonic()))
    hall.finish()
    teacher.stop.set()
    return {"phones": n, "campus": campus, "visitors": visitors, "joined": len(hall.joined), "rounds": rounds,
            "attention_seconds": quantiles(attention_seconds), "refused_429": hall.refused, "waited": hall.waited,
            "retried": hall.retried,
            "failed": hall.failed[:20] + teacher.errors[:20], "failures": len(hall.failed) + len(teacher.errors),
            "tally_polls": len(teacher.polls), "last_polls": [p[2:] for p in teacher.polls[-3:]]}


def _where(hall: Hall, qid: int, times: str | None) -> dict[str, Any]:
    """Where question ``qid``'s acks went, from its first phone seeing it to its last ack: the phone processes'
    worst loop lag (s: how late a 50 ms tick ran), and from the server's ``times`` file each vote's seconds from
    arrival in the middleware to its answer, and the server loop's worst and total lag over the same span."""
    start = min(hall.seen.get(qid, {}).values(), default=0.0)
    end = hall.last_ack.get(qid, start)
    out: dict[str, Any] = {"phones_lag_max": max((late for t, late in list(hall.lags) if start <= t <= end),
                                                 default=None)}
    if times:
        votes, lags = [], []
        with open(times) as f:
            for line in f:
                kind, a, b, q = line.split()
                if kind == "vote" and q == str(qid):
                    votes.append(float(b) - float(a))
                elif kind == "lag" and start <= float(a) <= end:
                    lags.append(float(b))
        out.update(server_vote_seconds=quantiles(votes), server_lag_max=max(lags, default=None),
                   server_lag_seconds=sum(lags))
    return out


def describe(r: dict[str, Any]) -> str:
    parts = []
    for name, q in (r.get("rounds") or {}).items():
        a, v = q.get("ack_seconds") or {}, q.get("server_vote_seconds") or {}
        parts.append(f"{name}: ack p95 {a.get('p95')} (on the server p95 {v.get('p95')}), tally "
                     f"{q.get('tally_after_last_vote')}, exact {q.get('exact')}")
    return f"{r.get('joined')} of {r.get('phones')} phones joined; " + "; ".join(parts) + f"; failed: {r.get('failed')[:3]}"


def bench_vote(n: int = PHONES, *, log=print) -> dict[str, Any]:
    """The benchmark's lecture-hall row: a fresh ``python app.py`` behind one trusted proxy hop, then the hall."""
    import tempfile
    from pathlib import Path

    times = Path(tempfile.mkstemp(prefix="explorer-phone-times-", suffix=".txt")[1])
    try:
        with served_app({"EXPLORER_PROXY_HOPS": "1", "EXPLORER_PHONE_TIMES": str(times)}) as server:
            result = lecture_hall(server.url, n, cpu=server.cpu_seconds, times=str(times))
    finally:
        times.unlink(missing_ok=True)
    log(f"vote: {describe(result)}")
    return result
