"""The queue: Gradio's per-session message books kept sound, and each join capped and placed fairly.

    queue_of(demo)                         the queue ``demo.queue()`` made
    keep_sessions_with_events(demo)        the books never drop a session with events pending, and an event whose
                                           session they dropped is dropped, not fatal
    cap_queue(demo, rules)                 per session and per client address: caps (in all and per lane), one
                                           long job, each event's inputs checked, fair order (by address, then
                                           by session within an address)
    cap_per_session(demo, cap, refusal)    at most ``cap`` of one session's events in the queue at once
    drop_unread(demo, reading, grace_s, …)  an event nobody reads the answers of is dropped before it runs
    events_held(demo, session)             how many of a session's events are queued or running
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from typing import Any, Callable, NamedTuple

import gradio as gr

from explorer.web.gradio_adapter.checks import LRUCache, ProcessCompletedMessage, Queue


def queue_of(demo: gr.Blocks) -> Queue:
    """The queue ``demo.queue()`` made; RuntimeError when it has not been called."""
    queue = getattr(demo, "_queue", None)
    if queue is None:
        raise RuntimeError("demo.queue() must be called first: the queue is set up after it.")
    return queue


class SessionBooks(LRUCache):
    """Gradio's per-session message books (``Queue.pending_messages_per_session``, an LRU of 2,000 sessions in
    Gradio 6.31) that, when full, drop the least recently used session holding no pending event rather than
    the least recently used one: Gradio's own drops a session whose events are still queued, and the next
    estimate sent to that event raises KeyError inside the queue's loop, which stops the queue for everyone."""

    def __init__(self, max_size: int, pending: dict) -> None:
        super().__init__(max_size)
        self._pending = pending  # the queue's pending_event_ids_session: session hash -> event ids

    def __setitem__(self, key, value) -> None:
        if key not in self and len(self) >= self.max_size:
            idle = next((k for k in self if not self._pending.get(k)), None)
            if idle is not None:  # room from a session nothing is waiting for; else Gradio's own choice
                OrderedDict.__delitem__(self, idle)
        super().__setitem__(key, value)


def keep_sessions_with_events(demo: gr.Blocks) -> int:
    """Gradio's per-session message books keep every session with an event pending (``SessionBooks``), and a
    message for an event whose session they no longer hold drops that session's events instead of raising
    inside the queue's loop (a KeyError there stops the queue: every later join is answered "Queue is
    stopped."). The queue's ``max_size`` is lowered to half the books' size when larger, so the sessions of
    events that finished but were never read keep room there too. Returns the books' size."""
    queue = queue_of(demo)
    old = queue.pending_messages_per_session
    books = SessionBooks(old.max_size, queue.pending_event_ids_session)
    for key, value in old.items():
        OrderedDict.__setitem__(books, key, value)
    queue.pending_messages_per_session = books
    send = queue.send_message

    def send_or_drop(event, event_message):
        if event.session_hash in books:
            return send(event, event_message)
        if event.alive:  # nobody can be told anything about it: drop the session's events, once
            event.alive = False
            with contextlib.suppress(RuntimeError):  # no running loop: nothing queued to drop either
                asyncio.get_running_loop().create_task(queue.clean_events(session_hash=event.session_hash))
        return None

    queue.send_message = send_or_drop
    if queue.max_size is None or queue.max_size > books.max_size // 2:
        queue.max_size = books.max_size // 2
    return books.max_size


def session_books_size(demo: gr.Blocks) -> int:
    """How many sessions Gradio's per-session message books hold."""
    return queue_of(demo).pending_messages_per_session.max_size


class QueueRules(NamedTuple):
    """What ``cap_queue`` enforces at each join; a refusal is answered like a full queue (HTTP 503)."""
    session_cap: int  # events of one session in the queue at once (queued or running)
    client_cap: int  # events of one client address in the queue at once
    long_groups: frozenset  # concurrency groups of long jobs: one session holds at most one of them
    client_of: Callable[[Any], str]  # the client address of a Starlette request
    session_refusal: str
    client_refusal: str
    long_refusal: str
    unknown_refusal: str  # a join naming no event of the app (Gradio answers it with HTTP 500)
    on_join: Callable[[str], None] | None = None  # runs first on every join, with the session hash
    lane_of: Callable[[str], str] | None = None  # a concurrency group's lane name
    lane_cap: Callable[[str], int] | None = None  # events of one client address in a lane at once
    lane_refusal: Callable[[str, int], str] | None = None  # the sentence for a lane's cap (lane name, cap)
    # (api name, the input components, the values) -> None, or the index of the input refused (None: the whole)
    # and a sentence
    check_values: Callable[[str | None, list, Any], tuple[int | None, str] | None] | None = None
    # whether a session has a turn of its own among its address's sessions (None: one turn per address); fresh
    # ids share one, so rotating them gains nothing
    established: Callable[[str], bool] | None = None


def cap_queue(demo: gr.Blocks, rules: QueueRules) -> None:
    """At each join: the event's values checked (``rules.check_values``) before anything is stored; at most
    ``rules.session_cap`` of a session's events and ``rules.client_cap`` of a client address's in the queue at
    once, and ``rules.lane_cap(lane)`` of that address's in each lane, whatever session ids it sends (counted
    apart for its established sessions, ``rules.established``, and its fresh ids); at most one
    long job (an event of ``rules.long_groups``) per session; then the new event takes its fair place in its
    group's line (``_fair_order``): round robin by client address, and within an address by session, where
    Gradio's line is first come first served."""
    queue = queue_of(demo)
    push = queue.push
    clients: dict[str, str] = {}  # event id -> client address, for the events in the queue
    lanes: dict[str, str] = {}  # event id -> its lane, for the same events
    turns: dict[str, str] = {}  # event id -> whose turn it waits for within its address ("": the fresh ids')

    def held(ids) -> list:
        return [queue.event_ids_to_events[i] for i in list(ids or ()) if i in queue.event_ids_to_events]

    async def push_within_rules(body, request, username):
        session = body.session_hash
        fn = demo.fns.get(body.fn_index) if isinstance(body.fn_index, int) and body.fn_index >= 0 else None
        if fn is None or fn.fn is None:
            return False, rules.unknown_refusal, "error"
        if rules.check_values is not None:
            problem = rules.check_values(fn.api_name, list(fn.inputs), body.data)
            if problem is not None:
                return _refused_value(len(fn.inputs), *problem)
        if rules.on_join is not None and session:
            rules.on_join(session)
        for gone in [i for i in clients if i not in queue.event_ids_to_events]:
            del clients[gone]
            lanes.pop(gone, None)
            turns.pop(gone, None)
        client = rules.client_of(request)
        lane = rules.lane_of(fn.concurrency_id) if rules.lane_of is not None else fn.concurrency_id
        ids = queue.pending_event_ids_session.get(session) if session else None
        mine = held(ids)
        if len(ids or ()) >= rules.session_cap:
            return False, rules.session_refusal, "queue_full"
        turn = session if session and rules.established is not None and rules.established(session) else ""
        # an address's fresh ids and its established sessions have a cap each: a flood of fresh ids cannot
        # refuse the pages behind the same address
        alike = [i for i, c in clients.items() if c == client and (turns.get(i, "") == "") == (turn == "")]
        if len(alike) >= rules.client_cap:
            return False, rules.client_refusal, "queue_full"
        if rules.lane_cap is not None:
            cap = rules.lane_cap(lane)
            if sum(1 for i in alike if lanes.get(i) == lane) >= cap:
                refusal = rules.lane_refusal(lane, cap) if rules.lane_refusal is not None else rules.client_refusal
                return False, refusal, "queue_full"
        if fn.concurrency_id in rules.long_groups and \
                any(e.concurrency_id in rules.long_groups for e in mine):
            return False, rules.long_refusal, "queue_full"
        ok, answer, kind = await push(body, request, username)
        if ok and isinstance(answer, str) and answer in queue.event_ids_to_events:
            clients[answer] = client
            lanes[answer] = lane
            turns[answer] = turn
            _fair_order(queue, queue.event_ids_to_events[answer], clients, turns)
        return ok, answer, kind

    queue.push = push_within_rules


def _refused_value(inputs: int, index: int | None, sentence: str) -> tuple:
    """A join's answer refusing one input's value as Gradio's validators do (HTTP 422: the page shows the
    sentence at that input, Gradio's client raises it), or the whole event's values (HTTP 400)."""
    if index is None or not 0 <= index < inputs:
        return False, sentence, "error"
    return False, [{"__type__": "validate", "is_valid": i != index, "message": sentence if i == index else ""}
                   for i in range(inputs)], "validator_error"


def _fair_order(queue: Queue, event, clients: dict[str, str], turns: dict[str, str]) -> None:
    """Order the line ``event`` just joined (last in it) round robin at two levels: by client address (an
    address's n-th waiting event goes after every other address's n-th), and within an address by turn (each
    established session has its own, the address's fresh ids share one), so a classmate behind a flooder's
    address waits for a round or two, not for the flood. Stable: events in the same round keep their order."""
    line = queue.event_queue_per_concurrency_id.get(event.concurrency_id)
    if line is None or not line.queue or line.queue[-1] is not event:
        return
    events = list(line.queue)
    seen: dict[tuple, int] = {}
    by_client: dict[str, list[tuple[int, int]]] = {}  # address -> (round of its turn, place in line)
    for i, e in enumerate(events):
        client = clients.get(e._id, e.session_hash)
        key = (client, turns.get(e._id, ""))
        by_client.setdefault(client, []).append((seen.get(key, 0), i))
        seen[key] = seen.get(key, 0) + 1
    rounds = [0] * len(events)
    for waiting in by_client.values():
        for n, (_, i) in enumerate(sorted(waiting)):
            rounds[i] = n
    line.queue[:] = [events[i] for i in sorted(range(len(events)), key=lambda i: (rounds[i], i))]


def cap_per_session(demo: gr.Blocks, cap: int, refusal: str,
                    on_join: Callable[[str], None] | None = None) -> None:
    """At most ``cap`` of one session's events in the queue at once (``cap_queue`` with only this rule)."""
    cap_queue(demo, QueueRules(cap, 10**9, frozenset(), lambda request: "", refusal, refusal, refusal,
                               "That event does not exist in this app.", on_join))


def drop_unread(demo: gr.Blocks, reading: Callable[[str], bool], grace_s: float, sentence: str) -> None:
    """Before the queue takes its next events, drop each waiting event that joined at least ``grace_s`` seconds
    ago while no reader of its session's answers (Gradio's ``/queue/data`` stream) is open: nobody would see what
    it computes. A page and Gradio's client open that stream as they join, and Gradio already drops the events
    of a stream that closes; what is left is a script that joins and never reads, holding a place in the line
    and then a worker. A reader that opens later is told why, in ``sentence``."""
    queue = queue_of(demo)
    take = queue.get_events

    def take_read():
        now = time.monotonic()
        for line in list(queue.event_queue_per_concurrency_id.values()):
            for event in [e for e in line.queue if now - e.enqueue_time >= grace_s and not reading(e.session_hash)]:
                line.queue.remove(event)
                queue.event_ids_to_events.pop(event._id, None)
                queue.send_message(event, ProcessCompletedMessage(
                    output={"error": sentence, "visible": True, "title": "Not run"}, title="Not run", success=False))
                event.alive = False
                ids = queue.pending_event_ids_session.get(event.session_hash)
                if ids is not None:
                    ids.discard(event._id)
                    if not ids:
                        queue.pending_event_ids_session.pop(event.session_hash, None)
        return take()

    queue.get_events = take_read


def events_held(demo: gr.Blocks, session_hash: str) -> int:
    """How many of the session's events are in the queue (queued or running). Gradio's own count also keeps
    events that finished until their answer is read, which a script that never reads them never does."""
    queue = getattr(demo, "_queue", None)
    if queue is None:
        return 0
    return sum(1 for i in list(queue.pending_event_ids_session.get(session_hash) or ())
               if i in queue.event_ids_to_events)
