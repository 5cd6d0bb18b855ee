"""The phone page of a class room: a page of its own (a few KB, no Gradio bundle) and two small routes, served by
this ASGI middleware beside Gradio on the same server, never through Gradio's queue.

    GET  /vote?code=CODE   the page (explorer/web/page/phone.html, its CSS inlined) and /vote/phone.js
    GET  /vote/api/state   ?code=&voter=[&seen=KEY&wait=1]: the room's question, whether it is revealed, this phone's
                           vote; with ``wait`` the answer is held (at most ``WAIT_SECONDS``) until the question or
                           its reveal changes from ``seen``: a long poll, so a new question reaches every phone
                           within ``TICK_SECONDS`` of the teacher asking it
    POST /vote/api/vote    {"code", "qid", "choice", "voter"}: one vote, answered with the same view
    GET  /?join=CODE       the old join link (printed QR codes): redirected to ``vote?code=CODE``

A voter is the random id the phone's browser keeps (explorer/web/page/phone.js, in localStorage): a reload, a
second tab or a second scan on that browser changes its vote instead of adding one. The id is all the server
knows of a phone; the room's limits on new voters per network address (``explorer.state.rooms``) apply when a
phone first opens a room (``Rooms.admit``), from the same client address as the queue's caps
(``explorer.web.clients.address_of``, ``EXPLORER_PROXY_HOPS``).

It sits inside ``RequestLimit`` (explorer/web/middleware.py), so a body is bounded there first; its own bodies
are at most ``BODY_BYTES``. Per client address, at most ``ADDRESS_IN_FLIGHT`` requests at once and
``ADDRESS_RATE`` a second (bursts of ``ADDRESS_BURST``): a campus of 150 phones behind one address fits, a
script's loop is answered 429 with a sentence. Each handler holds the rooms' guard for microseconds and never
waits for a model: the tally and the votes have their own path.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import time
from collections import OrderedDict
from urllib.parse import parse_qs, quote

from explorer.state import rooms as room_store
from explorer.web import page
from explorer.web.clients import address_of
from explorer.web.groups import env_int

PATH = "/vote"
WAIT_SECONDS = 20.0  # a long poll's longest hold: under the idle timeouts of common proxies (30-60 s)
TICK_SECONDS = 0.2  # how often the held polls' rooms are looked at for a change
BODY_BYTES = 1024
MAX_WAITS = env_int("EXPLORER_PHONE_WAITS", 4000)  # polls held at once on this process; beyond: answered at once
ADDRESS_IN_FLIGHT = env_int("EXPLORER_PHONE_ADDRESS_CAP", 256)
ADDRESS_RATE, ADDRESS_BURST = 40.0, 400.0
MAX_ADDRESSES = 20_000
TIMES = os.environ.get("EXPLORER_PHONE_TIMES", "")  # a file for the bench: see ``Timings``
LAG_TICK = 0.05  # how often, with TIMES, this event loop's lateness is written down
RETRY_SECONDS = 3  # what a refused or unheld poll tells the phone to wait before the next
_VOTER = re.compile(r"^[A-Za-z0-9_-]{16,64}$")
LETTERS = "ABCDEF"

BUSY = ("Your network address sent this server too many requests at once: your phone tries again by itself in a "
        "few seconds.")
TOO_BIG = "A vote is a few bytes: this request was larger than 1 KB and was not read."
NO_VOTER = "This page has no voter id (it is kept in your browser's storage): reload the page."


def _asset(name: str) -> bytes:
    return page.text(name).encode("utf-8")


def _page() -> tuple[bytes, bytes]:
    """(the page's HTML with its style sheet inlined, the script); the script's URL carries its hash, so a
    browser may keep it for a day and still fetch a new one after an update."""
    js = _asset("phone.js")
    version = hashlib.sha256(js).hexdigest()[:12]
    html = page.text("phone.html").replace("$STYLE", page.text("phone.css")).replace("$VERSION", version)
    return html.encode("utf-8"), js


HTML, JS = _page()


def view(store, code: str, voter: str | None, message: str | None = None) -> dict:
    """What a phone shows: ``state`` question / revealed / ended, ``key`` (changes when the question or its
    reveal does), the question's id, text and choices, this voter's choice (``mine``) and one sentence."""
    now = store.phone_view(code, voter)
    if now is None:
        return {"state": "ended", "key": "ended", "code": code,
                "message": message or "The room has ended. Thank you for voting!"}
    q, revealed, mine = now
    if revealed:
        said = "Look at the screen: the answer is on the projector. Votes are closed for this question."
    elif mine is not None:
        said = f"Your vote: {LETTERS[mine]} {q.choices[mine]}. You can change it until the teacher reveals."
    else:
        said = "Tap your answer. You can change it until the teacher reveals."
    return {"state": "revealed" if revealed else "question", "key": f"{q.qid}:{int(revealed)}", "code": code,
            "qid": q.qid, "text": q.text, "choices": list(q.choices), "mine": mine, "message": message or said}


def key_of(store, code: str) -> str:
    now = store.phone_view(code, None)
    return "ended" if now is None else f"{now[0].qid}:{int(now[1])}"


class Waits:
    """The long polls held on this process, by room code: one task looks at those rooms every ``TICK_SECONDS``
    and wakes a room's polls when its key changes (the teacher's page changes rooms from a worker thread)."""

    def __init__(self, store) -> None:
        self.store = store
        self.rooms: dict[str, list] = {}  # code -> [key when the first poll came, asyncio.Event, polls held]
        self.held = 0
        self._task: asyncio.Task | None = None

    async def wait(self, code: str, seen: str, timeout: float) -> None:
        entry = self.rooms.get(code)
        if entry is None:
            entry = self.rooms[code] = [key_of(self.store, code), asyncio.Event(), 0]
        if entry[0] != seen:  # the phone is behind: answered at once
            if entry[2] == 0:
                del self.rooms[code]
            return
        if self._task is None or self._task.done() or self._task.get_loop() is not asyncio.get_running_loop():
            self._task = asyncio.get_running_loop().create_task(self._watch())
        entry[2] += 1
        self.held += 1
        try:
            await asyncio.wait_for(entry[1].wait(), timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            entry[2] -= 1
            self.held -= 1
            if entry[2] == 0 and self.rooms.get(code) is entry:
                del self.rooms[code]

    async def _watch(self) -> None:
        while self.rooms:
            await asyncio.sleep(TICK_SECONDS)
            for code, entry in list(self.rooms.items()):
                if key_of(self.store, code) != entry[0]:
                    del self.rooms[code]  # the next polls start from the new key
                    entry[1].set()


class Timings:
    """With ``EXPLORER_PHONE_TIMES`` set (explorer/bench/vote.py sets it): each phone request's arrival in this
    middleware and its answer, and how late this event loop runs, appended to that file as lines
    ``vote|state ARRIVED ANSWERED QID`` and ``lag WHEN LATE -`` (time.monotonic seconds, one clock for every process
    of the machine), so that the bench can tell a vote's seconds on the server from those before and after it."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "a", buffering=1)
        self.task: asyncio.Task | None = None

    def note(self, kind: str, arrived: float, qid) -> None:
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._lag())
        self.file.write(f"{kind} {arrived:.6f} {time.monotonic():.6f} {qid}\n")

    async def _lag(self) -> None:
        while True:
            t = time.monotonic()
            await asyncio.sleep(LAG_TICK)
            self.file.write(f"lag {t:.6f} {max(0.0, time.monotonic() - t - LAG_TICK):.6f} -\n")


class Door:
    """Per client address: requests in flight and a token bucket, in a bounded record."""

    def __init__(self) -> None:
        self.seen: "OrderedDict[str, list]" = OrderedDict()  # address -> [in flight, tokens, when refilled]

    def enter(self, address: str) -> bool:
        now = time.monotonic()
        entry = self.seen.pop(address, None) or [0, ADDRESS_BURST, now]
        self.seen[address] = entry
        while len(self.seen) > MAX_ADDRESSES:
            self.seen.popitem(last=False)
        entry[1] = min(ADDRESS_BURST, entry[1] + (now - entry[2]) * ADDRESS_RATE)
        entry[2] = now
        if entry[0] >= ADDRESS_IN_FLIGHT or entry[1] < 1:
            return False
        entry[0] += 1
        entry[1] -= 1
        return True

    def leave(self, address: str) -> None:
        entry = self.seen.get(address)
        if entry is not None:
            entry[0] = max(0, entry[0] - 1)


class PhoneRoutes:
    """ASGI middleware serving the phone page and its routes (see the module docstring); the rest goes on to
    Gradio. ``store``: the rooms (explorer.state.rooms.rooms unless a test gives its own)."""

    def __init__(self, app, store=None) -> None:
        self.app = app
        self.store = store
        self.waits: Waits | None = None
        self.door = Door()
        self.known: "OrderedDict[str, None]" = OrderedDict()  # codes a join accepted (polls count no guess)
        self.timings = Timings(TIMES) if TIMES else None

    def _store(self):
        return self.store if self.store is not None else room_store.rooms

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        method = scope.get("method", "")
        if path == "/" and method in ("GET", "HEAD") and b"join" in scope.get("query_string", b""):
            query = parse_qs(scope["query_string"].decode("latin-1"), keep_blank_values=True)
            if "join" in query:
                code = re.sub(r"[^A-Za-z0-9 -]", "", (query["join"] or [""])[0])[:16]
                target = f"vote?code={quote(code)}" if code else "vote"
                return await _send(send, 303, b"", "text/plain", [(b"location", target.encode())])
        if path != PATH and not path.startswith(PATH + "/"):
            return await self.app(scope, receive, send)
        if path == PATH + "/":
            return await _send(send, 308, b"", "text/plain", [(b"location", b"../vote")])
        if method in ("GET", "HEAD") and path == PATH:
            return await _send(send, 200, HTML, "text/html; charset=utf-8", [(b"cache-control", b"no-cache")])
        if method in ("GET", "HEAD") and path == PATH + "/phone.js":
            return await _send(send, 200, JS, "text/javascript; charset=utf-8",
                               [(b"cache-control", b"public, max-age=86400")])
        if path not in (PATH + "/api/state", PATH + "/api/vote"):
            return await _json(send, 404, {"state": "error", "message": "No such page: open the link on the "
                                                                       "projector again."})
        arrived = time.monotonic()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        address = address_of(headers, (scope.get("client") or (None,))[0])
        if not self.door.enter(address):
            return await _json(send, 429, {"state": "wait", "message": BUSY, "retry": RETRY_SECONDS})
        try:
            if path.endswith("/state") and method == "GET":
                query = {k: v[0] for k, v in parse_qs(scope.get("query_string", b"").decode("latin-1")).items()}
                status, body = await self.state(query, address)
            elif path.endswith("/vote") and method == "POST":
                status, body = await self.vote(receive, address)
            else:
                status, body = 405, {"state": "error", "message": "Use the page's own buttons to vote."}
        finally:
            self.door.leave(address)
        await _json(send, status, body)
        if self.timings is not None:
            self.timings.note(path.rsplit("/", 1)[1], arrived, body.get("qid"))

    def _join(self, raw_code, voter: str, address: str, first: bool) -> tuple[str | None, dict | None]:
        """(the code, None) when the room is open to this phone, else (None, the error answer). A code no join
        accepted yet goes through ``Rooms.join``, where wrong codes are counted as guesses."""
        store, key = self._store(), f"phone:{voter}"
        try:
            code = room_store.normalize(raw_code)
            if code not in self.known:
                store.join(code, key, address=address)
                self.known[code] = None
                while len(self.known) > 4 * room_store.MAX_ROOMS:
                    self.known.popitem(last=False)
        except ValueError as exc:
            return None, {"state": "error", "message": str(exc)}
        if first and store.phone_view(code, None) is not None:
            try:
                store.admit(code, key, address)
            except ValueError as exc:  # too many new voters from this address: the phone's vote tries again
                return code, {**view(store, code, key, str(exc)), "retry": 5}
        return code, None

    async def state(self, query: dict, address: str) -> tuple[int, dict]:
        voter = query.get("voter", "")
        if not _VOTER.match(voter):
            return 400, {"state": "error", "message": NO_VOTER}
        seen = query.get("seen", "")
        code, refused = self._join(query.get("code", ""), voter, address, first=not seen)
        if refused is not None:
            return 200, refused
        store = self._store()
        if query.get("wait") == "1" and seen:
            self.waits = self.waits or Waits(store)
            if self.waits.held >= MAX_WAITS:
                return 200, {**view(store, code, f"phone:{voter}"), "retry": RETRY_SECONDS}
            await self.waits.wait(code, seen, WAIT_SECONDS)
        return 200, view(store, code, f"phone:{voter}")

    async def vote(self, receive, address: str) -> tuple[int, dict]:
        body = await _body(receive)
        if body is None:
            return 413, {"state": "error", "message": TOO_BIG}
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            return 400, {"state": "error", "message": "A vote is a small JSON object: reload the page and tap again."}
        voter = data.get("voter")
        if not isinstance(voter, str) or not _VOTER.match(voter):
            return 400, {"state": "error", "message": NO_VOTER}
        code, refused = self._join(data.get("code"), voter, address, first=False)
        if refused is not None:
            return 200, refused
        store = self._store()
        try:
            store.vote(code, f"phone:{voter}", data.get("qid"), data.get("choice"), address=address)
            message = None
        except ValueError as exc:
            message = str(exc).replace("here it is; vote again", "here it is: tap your answer")
        return 200, view(store, code, f"phone:{voter}", message)


async def _body(receive) -> bytes | None:
    """The request's body, or None once it passes ``BODY_BYTES`` (the rest is not read)."""
    chunks, seen = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b""
        chunks.append(message.get("body", b""))
        seen += len(chunks[-1])
        if seen > BODY_BYTES:
            return None
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _json(send, status: int, body: dict) -> None:
    await _send(send, status, json.dumps(body).encode("ascii"), "application/json",
                [(b"cache-control", b"no-store")])


async def _send(send, status: int, body: bytes, kind: str, headers: list) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", kind.encode()), (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body, "more_body": False})
