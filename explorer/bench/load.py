"""A classroom on loopback: ``python app.py`` in its own process, and many sessions opening the page at once.

Each session does what a browser does when the page opens: it gets the page (Gradio's configuration inside, with
every tab's opening example already in it: explorer/web/opening.py), joins the queue with the events the page sends on
opening (none for a plain URL; for a link, the click of its tab's hidden link trigger and the events chained after
it: explorer/web/links.py), reading the answers from the session's event stream, and then asks the Attention tab one
question of its own (a prompt no other session sent). The server runs in a subprocess
(``explorer.bench.server``); the events a page sends, and the client that sends them, are
``explorer.bench.page_client``.

Used by ``python -m explorer.bench`` (the load rows) and by tests/test_load.py (the 64-session test), so the
client is written once.

    with served_app({"EXPLORER_SESSION_IDLE_MINUTES": "0.1"}) as server:
        room = classroom(server.url, 64)       # page-ready and attention latencies, refusals, failures
        server.rss_bytes()                     # the server process's resident memory (VmRSS)
"""
from __future__ import annotations

import statistics
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from .page_client import PagePlan, with_retry, fetch_plan, run_events
from .server import served_app

# --- a class at once ------------------------------------------------------------------------------------

ATTENTION_PROMPTS = ["Tom gave the red ball to Anna.", "The cat sat on the mat. The dog sat on the log.",
                     "Once upon a time there was a little girl who liked to play.",
                     "Anna found a blue kite in the garden and gave it to Tom."]


def attention_values(plan: PagePlan, i: int, own: bool = True) -> list:
    """The Attention tab's inputs for session ``i``: a prompt of its own (no two sessions send the same), or,
    with ``own=False``, one of the four ``ATTENTION_PROMPTS`` the class was given."""
    values = list(plan.values[plan.fn_of("attention")])
    given = ATTENTION_PROMPTS[i % len(ATTENTION_PROMPTS)]
    values[0] = f"{given} Student {i} asks." if own else given
    return values


@dataclass
class SessionResult:
    page_seconds: float | None  # every page-load event answered, or None
    attention_seconds: float | None
    refused: list[str]
    failed: list[str]


def one_session(url: str, plan: PagePlan, i: int, deadline: float, start: threading.Barrier | None = None,
                tag: str = "student", own_prompt: bool = True) -> SessionResult:
    """One visitor: the page (its HTML with the configuration, then every page-load event), then one attention
    request. Static files (scripts, styles) are left out: a browser caches them, and Gradio serves them as files."""
    import httpx

    session_hash = f"{tag}-{i}-{uuid.uuid4().hex[:8]}"
    with httpx.Client(timeout=60) as http:
        if start is not None:
            start.wait(timeout=max(1.0, deadline - time.monotonic()))
        t0 = time.monotonic()
        # the page itself, Gradio's configuration inside (what a browser's first request gets)
        page_url = url + (f"?{plan.query}" if plan.query else "")
        with_retry(lambda: http.get(page_url, timeout=max(1.0, deadline - time.monotonic()))).raise_for_status()
        page = run_events(http, url, session_hash, plan, plan.first, {}, deadline)
        complete = not page.refused and not page.failed and len(page.done) == plan.events
        page_seconds = time.monotonic() - t0 if complete else None
        fn = plan.fn_of("attention")
        t1 = time.monotonic()
        ask = run_events(http, url, session_hash, plan, [fn], {fn: attention_values(plan, i, own_prompt)}, deadline,
                         follow=False)
        attention_seconds = time.monotonic() - t1 if fn in ask.done else None
    return SessionResult(page_seconds, attention_seconds, page.refused + ask.refused, page.failed + ask.failed)


def quantiles(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50": None, "p95": None, "max": None}
    xs = sorted(xs)
    p95 = xs[min(len(xs) - 1, max(0, int(round(0.95 * len(xs) + 0.5)) - 1))]  # nearest rank
    return {"p50": statistics.median(xs), "p95": p95, "max": xs[-1]}


def classroom(url: str, n: int, *, timeout: float = 120.0, tag: str = "student",
              own_prompts: bool = True, query: str = "") -> dict[str, Any]:
    """``n`` sessions open the page at the same moment (threads released together), then each asks one
    attention question (a prompt of its own, or with ``own_prompts=False`` one of four the class shares).
    With ``query`` they all open the same link (``tab=...&...``), as a class given a link by its teacher.
    Page-ready and attention latencies in seconds (p50, p95, max), refusals and failures counted (the first
    few quoted), wall time."""
    import httpx

    plan = fetch_plan(url, query)
    page_bytes = len(httpx.get(url + (f"?{query}" if query else ""), timeout=60).content)
    deadline = time.monotonic() + timeout
    start = threading.Barrier(n)
    results: list[SessionResult | BaseException] = [None] * n  # type: ignore[list-item]

    def run(i: int) -> None:
        try:
            results[i] = one_session(url, plan, i, deadline, start, tag, own_prompts)
        except BaseException as exc:  # noqa: BLE001 - reported below, per session
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1.0, deadline + 10 - time.monotonic()))
    wall = time.monotonic() - t0
    crashed = [f"session {i}: {type(r).__name__}: {r}"[:300] for i, r in enumerate(results)
               if isinstance(r, BaseException) or r is None]
    ok = [r for r in results if isinstance(r, SessionResult)]
    refused = [m for r in ok for m in r.refused]
    failed = [m for r in ok for m in r.failed] + crashed
    pages = [r.page_seconds for r in ok if r.page_seconds is not None]
    asks = [r.attention_seconds for r in ok if r.attention_seconds is not None]
    return {"clients": n, "query": query, "page_bytes": page_bytes, "events_per_page": plan.events, "page_ready_seconds": quantiles(pages),
            "attention_seconds": quantiles(asks), "pages_ready": len(pages), "attention_answered": len(asks),
            "refused": len(refused), "failed": len(failed), "examples": (refused + failed)[:5],
            "wall_seconds": wall}


def describe(room: dict[str, Any]) -> str:
    """One line for a log: page ready and attention p50/p95/max, refusals."""
    def q(d):
        return "—" if d["p50"] is None else f"{d['p50']:.2f} / {d['p95']:.2f} / {d['max']:.2f} s"

    link = f" at ?{room['query']}" if room.get("query") else ""
    return (f"{room['clients']} sessions{link} ({room['events_per_page']} events each on opening, "
            f"{room.get('page_bytes', 0) / 2**10:.0f} KiB page): page ready "
            f"p50/p95/max {q(room['page_ready_seconds'])}, attention after it {q(room['attention_seconds'])}; "
            f"{room['pages_ready']} pages ready, {room['attention_answered']} attention answers, "
            f"{room['refused']} refused, {room['failed']} failed, in {room['wall_seconds']:.1f} s")


# --- three clients: a sweep, a generation and an attention question at once ------------------------------

SWEEP = [4096, 8, 64, 8, ["naive", "tiled"], True, "float32"]  # seconds of measuring on 2 cores


def attention_beside_measurements(url: str, *, timeout: float = 120.0) -> dict[str, Any]:
    """One client starts a memory sweep, a second a generation, and a third, once both run, asks the
    Attention tab a new question: how long the attention answer took, and whether the sweep was still
    running when it came (the measurements hold no lock the view needs). The sweep is cancelled after."""
    import httpx

    plan = fetch_plan(url)
    deadline = time.monotonic() + timeout
    sweep_fn, gen_fn, att_fn = plan.fn_of("memory_compare"), plan.fn_of("generate"), plan.fn_of("attention")
    gen_values = list(plan.values[gen_fn])
    gen_values[1] = 48  # new tokens
    done: dict[str, float] = {}
    t0 = time.monotonic()

    def client(name: str, fn: int, values: list) -> None:
        with httpx.Client(timeout=60) as http:
            out = run_events(http, url, f"three-{name}-{uuid.uuid4().hex[:8]}", plan, [fn], {fn: values}, deadline,
                             follow=False)
        if fn in out.done:
            done[name] = time.monotonic() - t0

    threads = [threading.Thread(target=client, args=("sweep", sweep_fn, SWEEP), daemon=True),
               threading.Thread(target=client, args=("generate", gen_fn, gen_values), daemon=True)]
    for t in threads:
        t.start()
    time.sleep(1.5)  # both are running now
    asked = time.monotonic() - t0
    values = attention_values(plan, 10_000)
    with httpx.Client(timeout=60) as http:
        out = run_events(http, url, f"three-attention-{uuid.uuid4().hex[:8]}", plan, [att_fn], {att_fn: values},
                         deadline, follow=False)
    answered = time.monotonic() - t0
    sweep_running = "sweep" not in done
    for t in threads:
        t.join(timeout=max(1.0, deadline - time.monotonic()))
    return {"attention_seconds": answered - asked if att_fn in out.done else None,
            "sweep_still_running": sweep_running, "sweep_seconds": done.get("sweep"),
            "generate_seconds": done.get("generate"), "failed": out.failed + out.refused}


#: The link a teacher gives a class in the benchmark's link row: the Attention tab at layer 1, head 2.
CLASS_LINK = "tab=attention&layer=1&head=2"


def bench_load(counts: tuple[int, ...] = (40, 64), *, log=print, link_class: int | None = 40) -> dict[str, Any]:
    """The benchmark's load rows: ``python app.py`` with its default settings, one warm-up visitor (the
    opening examples computed), then each class in ``counts`` opening the page at once (fresh sessions),
    and the three-client check. CPU seconds and resident memory of the server process beside each."""
    out: dict[str, Any] = {"classes": {}}
    with served_app() as server:
        out["cold_start"] = {"answered_seconds": server.answered_seconds, "computed_seconds": server.computed_seconds,
                             "ready_seconds": server.ready_seconds}
        log(f"load: cold start: first page {server.answered_seconds:.1f} s, its first tab's figures computed "
            f"{server.computed_seconds:.1f} s, every tab's {server.ready_seconds:.1f} s after `python app.py`")
        warm = classroom(server.url, 1, tag="warm-up")
        out["warm_up"] = warm
        classes = [(str(n), n, "") for n in counts]
        if link_class:
            classes.append((f"{link_class} via a link", link_class, CLASS_LINK))
        for key, n, query in classes:
            rss, cpu = server.rss_bytes(), server.cpu_seconds()
            room = classroom(server.url, n, timeout=300, tag=f"class-{key.replace(' ', '-')}", query=query)
            room["server_cpu_seconds"] = server.cpu_seconds() - cpu
            room["rss_before"], room["rss_after"] = rss, server.rss_bytes()
            out["classes"][key] = room
            log(f"load: {describe(room)}; server CPU {room['server_cpu_seconds']:.1f} s, RSS "
                f"{rss / 2**20:.0f} -> {room['rss_after'] / 2**20:.0f} MiB")
        out["three_clients"] = attention_beside_measurements(server.url)
        log(f"load: attention beside a sweep and a generation: {out['three_clients']}")
    return out
