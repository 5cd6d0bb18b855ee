"""What a browser sends when the page opens, as a client on the raw queue routes (no gradio_client, so many
sessions run from one process): ``page_plan`` reads the events from the app's configuration, ``run_events`` joins
the queue with them for one session and reads its event stream. Used by ``explorer.bench.load``.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

API = "gradio_api/"


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


RESERVED_KEYS = ("present", "__theme")  # a URL with only these carries no link (explorer.web.links.link_js)


def page_plan(config: dict, query: str = "") -> PagePlan:
    """Read the events a page opened at ``?query`` sends from the app's ``/config``, as the browser does: every
    event triggered by the page's load that runs on the server; when the query carries a link, the click of
    the linked tab's hidden trigger (``apply-link-<tab>``, or ``apply-link`` for a tab the app does not have:
    explorer.web.links.link_js); then every event chained (``.then``/``.success``) after one of those. Inputs are
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


def with_retry(send):
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
        r = with_retry(lambda: http.post(join_url, json=body,
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


def fetch_plan(url: str, query: str = "") -> PagePlan:
    import httpx

    r = httpx.get(url + "config", timeout=30)
    r.raise_for_status()
    return page_plan(r.json(), query)
