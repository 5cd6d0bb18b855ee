"""The phones of a lecture hall (explorer/bench/vote.py), as light as the phones are: each phone speaks plain
HTTP/1.1 over asyncio streams on connections of its own (one for its long poll, one for the page and its votes, as a
browser keeps several to one server), and the phones run in processes of their own beside the teacher's and the
visitors' threads, so that a vote's ack measures the server, not a shared client pool or a busy client interpreter.

This file runs as a script in each phone process (``python explorer/bench/phones.py``: the standard library only,
so a phone process imports neither torch nor the app). Its first line of stdin gives the phones; it writes what
happens as JSON lines on stdout; a line ``stop`` (or the end of stdin) stops it. ``Hall`` starts the processes and
gathers their lines in this process:

    hall = Hall(url, code, n=200, campus=120, seed=0, ramp=30.0); hall.start(); ...; hall.finish()
"""
from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlencode, urlsplit

CAMPUS_ADDRESS = "203.0.113.7"
PAUSE = (0.5, 3.0)  # a student's pause between seeing the question and tapping, seconds
PROCESSES = 2  # phone processes: each loop stays far below a core's work (its worst lag is reported)
LAG_TICK = 0.05  # how often each phone process looks at how late its own loop runs


class Connection:
    """One keep-alive HTTP/1.1 connection, opened on first use and again once the server has closed it (uvicorn
    closes idle ones after 5 s); a request that fails on a reused connection before any answer is sent once more on
    a new one, as browsers do."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def request(self, method: str, target: str, headers: dict, body: bytes = b"") -> tuple[int, dict, bytes]:
        lines = [f"{method} {target} HTTP/1.1", f"host: {self.host}:{self.port}", f"content-length: {len(body)}",
                 *(f"{k}: {v}" for k, v in headers.items())]
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        while True:
            reused = self.writer is not None and not self.reader.at_eof()
            if not reused:
                self.close()
                self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            try:
                self.writer.write(data)
                return await self._answer()
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                self.close()
                if not reused or getattr(exc, "partial", b""):
                    raise

    async def _answer(self) -> tuple[int, dict, bytes]:
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split()[1])
        headers = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            if name:
                headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            chunks = []
            while size := int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16):
                chunks.append(await self.reader.readexactly(size + 2))
            await self.reader.readuntil(b"\r\n")
            body = b"".join(c[:-2] for c in chunks)
        else:
            body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, headers, body


class Phones:
    """Some phones of the hall on this process's event loop; ``emit`` gets each event as a list."""

    def __init__(self, url: str, code: str, phones: list[dict], seed: int, emit) -> None:
        parts = urlsplit(url)
        self.base, self.code, self.phones, self.emit = parts.path.rstrip("/") + "/", code, phones, emit
        self.rng = random.Random(seed)
        self.poll_conn = [Connection(parts.hostname, parts.port) for _ in phones]
        self.page_conn = [Connection(parts.hostname, parts.port) for _ in phones]
        self.done = asyncio.Event()

    async def _request(self, k: int, method: str, path: str, *, poll: bool = False, query: dict | None = None,
                       payload: dict | None = None) -> dict | None:
        conn = (self.poll_conn if poll else self.page_conn)[k]
        target = self.base + path + ("?" + urlencode(query) if query else "")
        headers = {"x-forwarded-for": self.phones[k]["address"], "accept": "*/*"}
        body = b""
        if payload is not None:
            body, headers["content-type"] = json.dumps(payload).encode(), "application/json"
        for attempt in range(2):  # a dropped connection is tried again once, a second later, as the page does
            try:
                status, got, data = await conn.request(method, target, headers, body)
                break
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                conn.close()
                if attempt:
                    self.emit(["failed", f"{path}: {type(exc).__name__}"])
                    return None
                self.emit(["count", "retried"])
                await asyncio.sleep(1.0)
        if status == 429:
            self.emit(["count", "refused"])
        if got.get("content-type", "").startswith("application/json"):
            return json.loads(data)
        return {} if status == 200 else None

    async def _open(self, k: int) -> dict | None:
        await self._request(k, "GET", "vote", query={"code": self.code})
        await self._request(k, "GET", "vote/phone.js")
        return await self._request(k, "GET", "vote/api/state", query={"code": self.code, "voter": self.phones[k]["voter"]})

    async def _vote(self, k: int, s: dict) -> None:
        self.emit(["pending", 1])
        try:
            await self._votes(k, s)
        finally:
            self.emit(["pending", -1])

    async def _votes(self, k: int, s: dict) -> None:
        i, qid = self.phones[k]["i"], s["qid"]
        await asyncio.sleep(self.rng.uniform(*PAUSE))
        choice = self.rng.randrange(len(s["choices"]))
        for attempt in range(2 if self.rng.random() < 0.1 else 1):
            if attempt:  # a reload: the page and a join again, the same id in the browser's storage, a new choice
                await self._open(k)
                choice = (choice + 1) % len(s["choices"])
            vote = {"code": self.code, "qid": qid, "choice": choice, "voter": self.phones[k]["voter"]}
            t0 = time.monotonic()
            answer = await self._request(k, "POST", "vote/api/vote", payload=vote)
            if answer and "wait a few seconds" in str(answer.get("message")):  # as the page asks: again, later
                self.emit(["count", "waited"])
                await asyncio.sleep(5.0)
                t0 = time.monotonic()
                answer = await self._request(k, "POST", "vote/api/vote", payload=vote)
            if answer and answer.get("qid") == qid and answer.get("mine") == choice:
                now = time.monotonic()
                self.emit(["ack", qid, i, choice, now - t0, now])
            else:
                self.emit(["failed", f"vote {i}: {(answer or {}).get('message')}"])

    async def phone(self, k: int) -> None:
        i = self.phones[k]["i"]
        await asyncio.sleep(self.phones[k]["start"])
        if self.done.is_set():
            return
        s = await self._open(k)
        if not s or s.get("state") != "question":
            self.emit(["lost", i, f"join {i}: {(s or {}).get('message')}"])
            return
        self.emit(["joined", i, time.monotonic()])
        voted, tasks = set(), []
        while not self.done.is_set():
            if s.get("state") == "question" and s["qid"] not in voted:
                voted.add(s["qid"])
                self.emit(["seen", s["qid"], i, time.monotonic()])
                tasks.append(asyncio.ensure_future(self._vote(k, s)))
            poll = asyncio.ensure_future(self._request(
                k, "GET", "vote/api/state", poll=True,
                query={"code": self.code, "voter": self.phones[k]["voter"], "seen": s["key"], "wait": "1"}))
            stop = asyncio.ensure_future(self.done.wait())
            await asyncio.wait({poll, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not poll.done():
                poll.cancel()
                break
            stop.cancel()
            answer = poll.result()
            if answer is None or answer.get("state") in ("error", "ended"):
                await asyncio.sleep(1.0)
                continue
            if answer.get("retry"):
                await asyncio.sleep(answer["retry"])
            if answer.get("state") in ("question", "revealed"):  # a 429's "wait" keeps the question, as the page does
                s = answer
        for task in tasks:
            task.cancel()
        self.poll_conn[k].close()
        self.page_conn[k].close()

    async def _lag(self) -> None:
        while not self.done.is_set():
            t = time.monotonic()
            await asyncio.sleep(LAG_TICK)
            self.emit(["lag", t, max(0.0, time.monotonic() - t - LAG_TICK)])

    async def run(self) -> None:
        lag = asyncio.ensure_future(self._lag())
        await asyncio.gather(*(self.phone(k) for k in range(len(self.phones))))
        lag.cancel()


def main() -> None:
    """A phone process: the phones from stdin's first line, events on stdout, until ``stop``."""
    config = json.loads(sys.stdin.readline())
    out = sys.stdout

    def emit(event: list) -> None:
        out.write(json.dumps(event) + "\n")
        out.flush()

    async def run() -> None:
        phones = Phones(config["url"], config["code"], config["phones"], config["seed"], emit)
        loop = asyncio.get_running_loop()

        def stop_on_stdin() -> None:
            for line in sys.stdin:
                if line.strip() == "stop":
                    break
            loop.call_soon_threadsafe(phones.done.set)

        threading.Thread(target=stop_on_stdin, daemon=True).start()
        await phones.run()

    asyncio.run(run())
    emit(["end"])


class Hall:
    """The hall's phones over ``processes`` processes, their events gathered here (read by explorer/bench/vote.py):
    ``seen`` qid -> phone -> when its poll brought the question; ``acks`` qid -> each vote's ack (s); ``final`` qid ->
    phone -> its last choice the server confirmed; ``last_ack`` qid -> when its last vote was answered; ``lags``
    (when, how late) each phone loop's tick ran. Times are ``time.monotonic()``, one clock for every process."""

    def __init__(self, url: str, code: str, n: int, campus: int, seed: int, ramp: float,
                 processes: int = PROCESSES) -> None:
        self.url, self.code, self.n, self.seed, self.processes = url, code, n, seed, max(1, min(processes, n))
        rng = random.Random(seed)
        starts = sorted(rng.uniform(0, ramp) for _ in range(n))
        address = [CAMPUS_ADDRESS if i < campus else f"198.51.{100 + (i - campus) // 250}.{(i - campus) % 250 + 1}"
                   for i in range(n)]
        self.phones = [{"i": i, "address": address[i], "voter": uuid.uuid4().hex, "start": starts[i]}
                       for i in range(n)]
        self.lost = 0  # phones that could not join
        self.joined: dict[int, float] = {}
        self.seen: dict[int, dict[int, float]] = {}
        self.acks: dict[int, list[float]] = {}
        self.final: dict[int, dict[int, int]] = {}
        self.last_ack: dict[int, float] = {}
        self.lags: list[tuple[float, float]] = []
        self.pending = 0  # votes decided or on their way
        self.retried = self.waited = self.refused = 0  # dropped connections, told to wait, answered 429
        self.failed: list[str] = []
        self.guard = threading.Lock()
        self.procs: list[subprocess.Popen] = []
        self.readers: list[threading.Thread] = []

    def _apply(self, event: list) -> None:
        kind = event[0]
        with self.guard:
            if kind == "ack":
                _, qid, i, choice, seconds, at = event
                self.acks.setdefault(qid, []).append(seconds)
                self.last_ack[qid] = max(at, self.last_ack.get(qid, at))
                self.final.setdefault(qid, {})[i] = choice
            elif kind == "seen":
                self.seen.setdefault(event[1], {})[event[2]] = event[3]
            elif kind == "pending":
                self.pending += event[1]
            elif kind == "lag":
                self.lags.append((event[1], event[2]))
            elif kind == "joined":
                self.joined[event[1]] = event[2]
            elif kind == "lost":
                self.lost += 1
                self.failed.append(event[2])
            elif kind == "failed":
                self.failed.append(event[1])
            elif kind == "count":
                setattr(self, event[1], getattr(self, event[1]) + 1)

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self._apply(json.loads(line))

    def start(self) -> None:
        script = Path(__file__).resolve()
        for p in range(self.processes):
            proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    text=True, bufsize=1)
            proc.stdin.write(json.dumps({"url": self.url, "code": self.code, "seed": self.seed * 1000 + p,
                                         "phones": self.phones[p::self.processes]}) + "\n")
            proc.stdin.flush()
            self.procs.append(proc)
            self.readers.append(threading.Thread(target=self._read, args=(proc,), daemon=True))
            self.readers[-1].start()

    def finish(self) -> None:
        for proc in self.procs:
            try:
                proc.stdin.write("stop\n")
                proc.stdin.close()
            except OSError:
                pass
        for proc, reader in zip(self.procs, self.readers):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
                self.failed.append("phones: a phone process did not stop within 30 s")
            reader.join(timeout=10)
            if proc.returncode:
                self.failed.append(f"phones: a phone process exited with {proc.returncode}")


if __name__ == "__main__":
    main()
