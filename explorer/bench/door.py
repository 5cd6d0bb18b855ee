"""What a stranger's bytes and headers cost ``python app.py`` (issue 42): page requests naming new hosts, 25 MB
bodies, and a compressed soak of mixed abuse beside a visitor's questions. Loopback clients, bounded loops; the
server runs in its own process (``explorer.bench.server``). Used by ``python -m explorer.bench`` (the door
rows) and tests/test_door_soak.py.

    python -m explorer.bench.door [SECONDS]   the door rows alone, printed as JSON (a soak of SECONDS, default 300)
"""
from __future__ import annotations

import socket
import threading
import time
import urllib.parse
import uuid
from typing import Any

from .flood import API, fetch_plan, flood

#: The soak's addresses, as one trusted proxy forwards them (``EXPLORER_PROXY_HOPS=1``).
FLOODER, VICTIM = "10.66.0.1", "10.77.0.1"
#: The soak's server: one trusted proxy hop, and visitors' idle sessions and own models freed after 30 s (the
#: 30-minute default compressed as the soak is), so that the memory the abuse held can come back within it.
SOAK_ENV = {"EXPLORER_PROXY_HOPS": "1", "EXPLORER_SESSION_IDLE_MINUTES": "0.5",
            "EXPLORER_API_SESSION_IDLE_MINUTES": "0.5"}


def wait_idle(server, *, quiet: float = 0.15, timeout: float = 300.0) -> float:
    """Wait until the server uses under ``quiet`` of a core over two seconds; the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        cpu = server.cpu_seconds()
        time.sleep(2)
        if (server.cpu_seconds() - cpu) / 2 < quiet:
            break
    return time.monotonic() - t0


def new_host_cost(server, n: int = 30) -> dict[str, Any]:
    """``n`` page requests, each naming a Host (and every other a forwarded host) never seen before: the
    server's CPU seconds per request, and a page request for the usual address before and after (a kept page
    costs milliseconds; one pushed out would cost a render)."""
    import httpx

    own = urllib.parse.urlsplit(server.url).netloc
    with httpx.Client(timeout=60) as http:
        http.get(server.url, headers={"Host": own})  # the usual page, kept
        wait_idle(server)

        def cost(headers: dict) -> tuple[float, int]:
            cpu = server.cpu_seconds()
            r = http.get(server.url, headers=headers)
            return server.cpu_seconds() - cpu, r.status_code

        before, _ = cost({"Host": own})
        cpu = server.cpu_seconds()
        codes = []
        for i in range(n):
            tag = uuid.uuid4().hex[:10]
            headers = {"Host": f"junk-{tag}.example:{1000 + i}"}
            if i % 2:
                headers.update({"X-Forwarded-Host": f"fwd-{tag}.example", "X-Forwarded-Proto": "https",
                                "Forwarded": f"host=f-{tag}", "X-Forwarded-Prefix": f"/{tag}"})
            codes.append(http.get(server.url, headers=headers).status_code)
        per_request = (server.cpu_seconds() - cpu) / n
        after, _ = cost({"Host": own})
    return {"requests": n, "cpu_seconds_per_request": per_request, "statuses": sorted(set(codes)),
            "own_page_cpu_before": before, "own_page_cpu_after": after}


def big_body(url: str, megabytes: int = 25, sent: int = 65_536, timeout: float = 10.0) -> tuple[int, float]:
    """A queue join declaring ``megabytes`` MB that sends only ``sent`` bytes of it: the status answered and
    the seconds until the answer (a server that read the whole body first would time out here: 0)."""
    parts = urllib.parse.urlsplit(url)
    t0 = time.monotonic()
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as conn:
            conn.sendall(f"POST /{API}queue/join HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json"
                         f"\r\nContent-Length: {megabytes * 2**20}\r\n\r\n".encode() + b"x" * sent)
            head = conn.recv(4096)
    except OSError:
        return 0, time.monotonic() - t0
    return (int(head.split()[1]) if head[:5] == b"HTTP/" else 0), time.monotonic() - t0


def soak(server, *, seconds: float = 300.0, settle_s: float = 90.0, ask_every: float = 10.0,
         log=print) -> dict[str, Any]:
    """``seconds`` of mixed abuse from one address (``FLOODER``): fresh-session floods of a cheap view,
    fine-tunes, 25 MB bodies, page requests naming new hosts; meanwhile another address (``VICTIM``) asks the
    Attention tab a new question every ``ask_every`` seconds. The server's RSS before, at its highest, right
    after and ``settle_s`` seconds after the abuse (once the server is idle); every question's answer time."""
    import httpx

    from .flood import answer_seconds

    plan = fetch_plan(server.url)
    att = plan.fn_of("attention")
    values = list(plan.values[att])
    first, _ = answer_seconds(server.url, "attention", values, headers={"X-Forwarded-For": VICTIM})
    wait_idle(server)
    rss_before = server.rss_bytes()
    stop = threading.Event()
    counts: dict[str, int] = {"flood_joins": 0, "flood_accepted": 0, "finetune_joins": 0, "finetune_accepted": 0,
                              "big_bodies": 0, "big_bodies_413": 0, "new_hosts": 0}
    rss_peak = [rss_before]
    guard = threading.Lock()

    def add(key: str, n: int = 1) -> None:
        with guard:
            counts[key] += n

    def flooding() -> None:
        cheap = plan.fn_of("kv_calculator")
        while not stop.is_set():  # flood() counts a failed join as status 0 and returns
            out = flood(server.url, cheap, plan.values[cheap], 50, tag="soak", workers=8,
                        headers={"X-Forwarded-For": FLOODER})
            add("flood_joins", out["joins"])
            add("flood_accepted", out["accepted"])

    def finetunes() -> None:
        ft = plan.fn_of("lora_finetune")
        while not stop.wait(2.0):
            out = flood(server.url, ft, plan.values[ft], 10, tag="soakft", workers=2, read=True,
                        headers={"X-Forwarded-For": FLOODER})  # read: unread fine-tunes would leave unrun
            add("finetune_joins", out["joins"])
            add("finetune_accepted", out["accepted"])

    def bodies_and_hosts() -> None:
        with httpx.Client(timeout=30) as http:
            while not stop.wait(0.5):
                status, _ = big_body(server.url)
                add("big_bodies")
                add("big_bodies_413", status == 413)
                try:
                    http.get(server.url, headers={"Host": f"junk-{uuid.uuid4().hex[:10]}.example"})
                except httpx.HTTPError:  # counted as sent; the soak goes on
                    pass
                add("new_hosts")

    def sampling() -> None:
        while not stop.wait(2.0):
            rss_peak[0] = max(rss_peak[0], server.rss_bytes())

    workers = [threading.Thread(target=f, daemon=True) for f in (flooding, finetunes, bodies_and_hosts, sampling)]
    for w in workers:
        w.start()
    asked: list[float | None] = []
    errors: list[str] = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        values[0] = f"Question {len(asked)} from the visitor: who sat on the mat, and why?"
        try:
            took, failed = answer_seconds(server.url, "attention", values, headers={"X-Forwarded-For": VICTIM},
                                          timeout=60)
        except Exception as exc:  # noqa: BLE001 - a cut stream is an unanswered question, said in the report
            took, failed = None, [f"{type(exc).__name__}: {exc}"[:200]]
        asked.append(took)
        if took is None:
            errors.append(f"question {len(asked) - 1} at {time.monotonic() - t0:.0f} s: {'; '.join(failed)[:200]}")
        time.sleep(max(0.0, ask_every - (took or 0.0)))
    stop.set()
    for w in workers:
        w.join(120)
    rss_after = server.rss_bytes()
    idle_after = wait_idle(server, timeout=240)
    time.sleep(max(0.0, settle_s - idle_after))
    rss_settled = server.rss_bytes()
    answered = [a for a in asked if a is not None]
    log(f"door soak: {seconds:.0f} s, RSS {rss_before / 2**20:.0f} -> peak {rss_peak[0] / 2**20:.0f} -> "
        f"{rss_settled / 2**20:.0f} MiB; visitor answered {len(answered)} of {len(asked)}, slowest "
        f"{max(answered, default=float('nan')):.2f} s")
    return {"seconds": seconds, "settle_seconds": settle_s, "first_answer_seconds": first, **counts,
            "questions": len(asked), "answered": len(answered), "answer_seconds_max": max(answered, default=None),
            "answer_seconds": [None if a is None else round(a, 3) for a in asked], "unanswered": errors[:10],
            "rss_before": rss_before, "rss_peak": rss_peak[0], "rss_after": rss_after, "rss_settled": rss_settled,
            "rss_settled_above_start": rss_settled - rss_before}


def bench_door(*, soak_seconds: float = 300.0, log=print) -> dict[str, Any]:
    """The door rows (issue 42), on a fresh ``python app.py`` each: page requests naming new hosts, a 25 MB join,
    and the soak."""
    from .server import served_app

    out: dict[str, Any] = {}
    with served_app() as server:
        out["new_hosts"] = new_host_cost(server)
        status, took = big_body(server.url)
        out["big_body"] = {"status": status, "answered_seconds": took}
    log(f"door: a new Host costs {out['new_hosts']['cpu_seconds_per_request'] * 1e3:.1f} ms of server CPU; "
        f"a 25 MB join answered {status} in {took:.3f} s")
    with served_app(SOAK_ENV) as server:
        out["soak"] = soak(server, seconds=soak_seconds, log=log)
    return out


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(bench_door(soak_seconds=float(sys.argv[1]) if len(sys.argv) > 1 else 300.0), indent=2))
