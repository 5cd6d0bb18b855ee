"""The queue's caps and its fair order (``gradio_adapter.cap_queue``) on a tiny app, without a server: per session,
per client address and per lane, one long job per session, round robin by address and, within an address, by
session (issue 43)."""
from __future__ import annotations

import asyncio
import types

from explorer.web import gradio_adapter as adapter
from tests.test_gradio_adapter import _by_name, _tiny


def _rules(**kw):
    base = dict(session_cap=5, client_cap=3, long_groups=frozenset({"long"}), client_of=lambda request: request,
                session_refusal="session", client_refusal="client", long_refusal="long", unknown_refusal="unknown")
    return adapter.QueueRules(**{**base, **kw})


def _pushing_queue(demo):
    """The demo's queue with a push that files each event in its group's line, as Gradio's does."""
    from gradio.queueing import Event, EventQueue

    queue = adapter.queue_of(demo)

    async def push(body, request, username):
        fn = demo.fns[body.fn_index]
        event = Event(body.session_hash, fn, None, None)
        queue.event_queue_per_concurrency_id.setdefault(fn.concurrency_id, EventQueue(fn.concurrency_id, 1))
        queue.event_queue_per_concurrency_id[fn.concurrency_id].queue.append(event)
        queue.event_ids_to_events[event._id] = event
        queue.pending_event_ids_session.setdefault(body.session_hash, set()).add(event._id)
        return True, event._id, "success"

    queue.push = push
    return queue


def test_caps_per_client_address_whatever_session_ids_it_sends():
    demo, _ = _tiny()
    queue = _pushing_queue(demo)
    adapter.cap_queue(demo, _rules())
    fn = _by_name(demo)["other"]
    join = lambda session, client: asyncio.run(queue.push(types.SimpleNamespace(session_hash=session, fn_index=fn),
                                                          client, None))
    answers = [join(f"rotating-{i}", "10.0.0.1") for i in range(5)]
    assert [a[0] for a in answers] == [True, True, True, False, False]
    assert answers[-1] == (False, "client", "queue_full")
    assert join("victim", "10.0.0.2")[0]
    assert join("x", "10.0.0.1", ) == (False, "client", "queue_full")
    assert asyncio.run(queue.push(types.SimpleNamespace(session_hash="s", fn_index=999), "a", None)) == \
        (False, "unknown", "error")


def test_a_flooding_client_waits_behind_everyone_elses_next_request():
    """Round robin by client within a line: the victim's first event goes before the flooder's second."""
    demo, _ = _tiny()
    queue = _pushing_queue(demo)
    adapter.cap_queue(demo, _rules(client_cap=100, session_cap=100))
    fn = _by_name(demo)["other"]
    for i in range(6):
        asyncio.run(queue.push(types.SimpleNamespace(session_hash=f"flood-{i}", fn_index=fn), "flooder", None))
    asyncio.run(queue.push(types.SimpleNamespace(session_hash="victim", fn_index=fn), "victim", None))
    line = queue.event_queue_per_concurrency_id[demo.fns[fn].concurrency_id].queue
    assert [e.session_hash for e in line][:3] == ["flood-0", "victim", "flood-1"]


def test_a_classmate_behind_a_flooders_address_waits_a_round_not_the_flood():
    """Within one address, each established session has a turn of its own and fresh ids share one: rotating ids
    gain nothing, and a classmate's page behind the same address goes second, not after the flood."""
    demo, _ = _tiny()
    queue = _pushing_queue(demo)
    adapter.cap_queue(demo, _rules(client_cap=100, session_cap=100, established=lambda s: s.startswith("page")))
    fn = _by_name(demo)["other"]
    join = lambda session, client: asyncio.run(queue.push(types.SimpleNamespace(session_hash=session, fn_index=fn),
                                                          client, None))
    for i in range(6):
        join(f"flood-{i}", "campus")
    join("page-classmate", "campus")
    join("other-address", "home")
    line = queue.event_queue_per_concurrency_id[demo.fns[fn].concurrency_id].queue
    assert [e.session_hash for e in line][:4] == ["flood-0", "other-address", "page-classmate", "flood-1"]
    join("page-classmate", "campus")  # the classmate's second question takes turns with the fresh ids' second
    assert [e.session_hash for e in line][3:6] == ["flood-1", "page-classmate", "flood-2"]


def test_a_flood_of_fresh_ids_fills_its_addresss_cap_but_not_its_pages():
    demo, _ = _tiny()
    queue = _pushing_queue(demo)
    adapter.cap_queue(demo, _rules(client_cap=3, established=lambda s: s.startswith("page")))
    fn = _by_name(demo)["other"]
    join = lambda session: asyncio.run(queue.push(types.SimpleNamespace(session_hash=session, fn_index=fn),
                                                  "campus", None))
    assert [join(f"fresh-{i}")[0] for i in range(4)] == [True, True, True, False]
    assert [join(f"page-{i}")[0] for i in range(4)] == [True, True, True, False]  # its pages' own cap


def test_one_long_job_per_session():
    demo, _ = _tiny()
    i = _by_name(demo)["long_job"]
    queue = _pushing_queue(demo)
    adapter.cap_queue(demo, _rules(client_cap=100))
    join = lambda session: asyncio.run(queue.push(types.SimpleNamespace(session_hash=session, fn_index=i), "c", None))
    assert join("a")[0] and join("b")[0]
    assert join("a") == (False, "long", "queue_full")


def test_a_session_is_established_some_seconds_after_its_heartbeat_opened(monkeypatch):
    from explorer.web.middleware import BrowserSessions

    clock = [1000.0]
    monkeypatch.setattr("explorer.web.middleware.time.monotonic", lambda: clock[0])
    BrowserSessions.forget("tab")
    assert not BrowserSessions.established("tab")
    BrowserSessions.note("tab")
    clock[0] += BrowserSessions.ESTABLISHED_SECONDS - 1
    BrowserSessions.note("tab")  # a reconnect keeps the first time
    assert BrowserSessions.has_browser("tab") and not BrowserSessions.established("tab")
    clock[0] += 1
    assert BrowserSessions.established("tab")
    BrowserSessions.forget("tab")
