"""A classroom on loopback: ``python app.py`` in its own process, and many sessions opening the page at once.

Each session does what a browser does when the page opens: it gets the page (Gradio's configuration inside, with
every tab's opening example already in it: explorer/opening.py), joins the queue with the events the page sends on
opening (none for a plain URL; for a link, the click of its tab's hidden link trigger and the events chained after
it: explorer/links.py), reading the answers from the session's event stream, and then asks the Attention tab one
question of its own (a prompt no other session sent). The server runs in a subprocess so that the clients'
threads do not share its interpreter (and its GIL).

Used by ``python -m explorer.bench`` (the load rows) and by tests/test_load.py (the 64-session test), so the
client is written once.

    with served_app({"EXPLORER_SESSION_IDLE_MINUTES": "0.1"}) as server:
        room = classroom(server.url, 64)       # page-ready and attention latencies, refusals, failures
        server.rss_bytes()                     # the server process's resident memory (VmRSS)
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
API = "gradio_api/"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` (VmRSS from /proc), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS line")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time process ``pid`` has used so far (from /proc), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def rss_bytes(self) -> int:
        return rss_bytes(self.pid)

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


@contextlib.contextmanager
def served_app(env: dict[str, str] | None = None, *, start_timeout: float = 180.0):
    """``python app.py`` on a free loopback port, with ``env`` added to this process's environment; stopped
    (terminated, then killed) on exit."""
    import httpx

    port = free_port()
    log = Path(tempfile.mkstemp(prefix="explorer-app-", suffix=".log")[1])
    full_env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "GRADIO_SERVER_NAME": "127.0.0.1",
                "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "app.py"], cwd=REPO, env=full_env, stdout=out,
                                   stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}/", process, log)
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"app.py exited with {process.returncode}:\n{server.log_tail()}")
            try:
                if httpx.get(server.url + "config", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"app.py did not answer within {start_timeout:.0f} s:\n{server.log_tail()}")
            time.sleep(0.5)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)
        log.unlink(missing_ok=True)


# --- what a browser sends when the page opens -----------------------------------------------------------

@dataclass
class PagePlan:
    """The page-load events of the app's configuration: the first ones, and who follows whom."""
    first: list[int]
    followers: dict[int, list[tuple[int, bool]]]  # fn id -> [(next fn id, only after a success)]
    values: dict[int, list]  # fn id -> the inputs' values a fresh page sends
    api_names: dict[int, str | None]
    query: str = ""  # the page's query string (a link's settings), sent with the page and each event

    @property
    def events(self) -> int:
        """How many server events one page load runs."""
        seen, todo = set(), list(self.first)
        while todo:
            fn = todo.pop()
            if fn not in seen:
                seen.add(fn)
                todo += [f for f, _ in self.followers.get(fn, [])]
        return len(seen)

    def fn_of(self, api_name: str) -> int:
        for fn, name in self.api_names.items():
            if name == api_name:
                return fn
        raise KeyError(f"the app has no event named {api_name!r}")


RESERVED_KEYS = ("present", "__theme")  # a URL with only these carries no link (explorer.links.LINK_JS)


def page_plan(config: dict, query: str = "") -> PagePlan:
    """Read the events a page opened at ``?query`` sends from the app's ``/config``, as the browser does: every
    event triggered by the page's load that runs on the server; when the query carries a link, the click of
    the linked tab's hidden trigger (``apply-link-<tab>``, or ``apply-link`` for a tab the app does not have:
    explorer.links.LINK_JS); then every event chained (``.then``/``.success``) after one of those. Inputs are
    the components' initial values; a ``gr.State`` is sent as null (the server keeps its value)."""
    from urllib.parse import parse_qsl

    components = {c["id"]: c for c in config["components"]}
    deps = {d["id"]: d for d in config["dependencies"]}

    def value(i):
        c = components[i]
        return None if c["type"] == "state" else c.get("props", {}).get("value")

    first = [d["id"] for d in deps.values() if any(t[1] == "load" for t in d["targets"]) and d["backend_fn"]]
    params = dict(parse_qsl(query))
    if any(k not in RESERVED_KEYS for k in params):
        by_elem = {c.get("props", {}).get("elem_id"): i for i, c in components.items()}
        trigger = by_elem.get(f"apply-link-{params.get('tab', '')}", by_elem.get("apply-link"))
        first += [d["id"] for d in deps.values() if [trigger, "click"] in [list(t) for t in d["targets"]]]
    followers: dict[int, list[tuple[int, bool]]] = {}
    for d in deps.values():
        if d.get("trigger_after") is not None and d["backend_fn"]:
            followers.setdefault(d["trigger_after"], []).append((d["id"], bool(d.get("trigger_only_on_success"))))
    values = {fn: [value(i) for i in d["inputs"]] for fn, d in deps.items()}
    return PagePlan(first, followers, values, {fn: d.get("api_name") for fn, d in deps.items()}, query)


@dataclass
class Outcome:
    """One session's events: when each finished (seconds from the start), refusals and failures, in words."""
    done: dict[int, float] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    outputs: dict[int, Any] = field(default_factory=dict)


def _with_retry(send):
    """``send()``, once more if the connection it reused had been closed by the server (uvicorn closes a
    keep-alive connection idle for 5 s; the request never reached the app, so sending it again is safe)."""
    import httpx

    try:
        return send()
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, httpx.ConnectError):
        return send()


_EVENT_ID = re.compile(r'"event_id":"([^"]+)"')


def run_events(http, url: str, session_hash: str, plan: PagePlan, first: list[int], values: dict[int, list],
               deadline: float, *, follow: bool = True, keep_outputs: bool = False) -> Outcome:
    """Join the queue with ``first`` (and, with ``follow``, each event's followers as it finishes) for one
    session, reading the session's event stream until nothing is pending or ``deadline`` (monotonic) passes.

    The answers' figures are not decoded (the clients share the server's cores): only each message's kind,
    event id and success are read, and a failure's message.
    """
    t0 = time.monotonic()
    out = Outcome()
    pending: dict[str, int] = {}

    def join(fn: int) -> None:
        body = {"data": values.get(fn, plan.values[fn]), "fn_index": fn, "session_hash": session_hash,
                "event_data": None, "trigger_id": None}
        join_url = url + API + "queue/join" + (f"?{plan.query}" if plan.query else "")  # as the browser sends it
        r = _with_retry(lambda: http.post(join_url, json=body,
                                          timeout=max(1.0, deadline - time.monotonic())))
        if r.status_code != 200:
            out.refused.append(f"{plan.api_names.get(fn)}: {r.status_code} {r.text[:200]}")
            return
        pending[r.json()["event_id"]] = fn

    for fn in first:
        join(fn)
    while pending and time.monotonic() < deadline:
        with http.stream("GET", url + API + "queue/data", params={"session_hash": session_hash},
                         timeout=max(1.0, deadline - time.monotonic())) as stream:
            if stream.status_code != 200:
                time.sleep(0.05)
                continue
            for line in stream.iter_lines():
                if not line.startswith("data:"):
                    continue
                head = line[:300]
                if '"msg":"process_completed"' in head:
                    found = _EVENT_ID.search(head)
                    fn = pending.pop(found.group(1), None) if found else None
                    if fn is None:
                        continue
                    ok = line.rstrip().endswith("}") and '"success":true' in line[-400:]
                    if not ok:
                        msg = json.loads(line[5:])
                        ok = bool(msg.get("success"))
                    if ok:
                        out.done[fn] = time.monotonic() - t0
                        if keep_outputs:
                            out.outputs[fn] = json.loads(line[5:])["output"].get("data")
                    else:
                        error = (msg.get("output") or {}).get("error") or msg.get("title") or "no message"
                        out.failed.append(f"{plan.api_names.get(fn)}: {str(error)[:300]}")
                    for nxt, only_on_success in (plan.followers.get(fn, []) if follow else []):
                        if ok or not only_on_success:
                            join(nxt)
                    if not pending:
                        break
                elif '"msg":"close_stream"' in head:
                    break
                elif '"msg":"unexpected_error"' in head:
                    out.failed.append(f"stream: {line[5:300]}")
                    break
                if time.monotonic() > deadline:
                    break
    for fn in pending.values():
        out.failed.append(f"{plan.api_names.get(fn)}: no answer before the deadline")
    return out


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
        _with_retry(lambda: http.get(page_url, timeout=max(1.0, deadline - time.monotonic()))).raise_for_status()
        page = run_events(http, url, session_hash, plan, plan.first, {}, deadline)
        complete = not page.refused and not page.failed and len(page.done) == plan.events
        page_seconds = time.monotonic() - t0 if complete else None
        fn = plan.fn_of("attention")
        t1 = time.monotonic()
        ask = run_events(http, url, session_hash, plan, [fn], {fn: attention_values(plan, i, own_prompt)}, deadline,
                         follow=False)
        attention_seconds = time.monotonic() - t1 if fn in ask.done else None
    return SessionResult(page_seconds, attention_seconds, page.refused + ask.refused, page.failed + ask.failed)


def _quantiles(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50": None, "p95": None, "max": None}
    xs = sorted(xs)
    p95 = xs[min(len(xs) - 1, max(0, int(round(0.95 * len(xs) + 0.5)) - 1))]  # nearest rank
    return {"p50": statistics.median(xs), "p95": p95, "max": xs[-1]}


def fetch_plan(url: str, query: str = "") -> PagePlan:
    import httpx

    r = httpx.get(url + "config", timeout=30)
    r.raise_for_status()
    return page_plan(r.json(), query)


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
    return {"clients": n, "query": query, "page_bytes": page_bytes, "events_per_page": plan.events, "page_ready_seconds": _quantiles(pages),
            "attention_seconds": _quantiles(asks), "pages_ready": len(pages), "attention_answered": len(asks),
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
