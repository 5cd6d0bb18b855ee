"""The one place the app reaches into Gradio's internals: what no public API does, each named and checked.

Everything else uses Gradio's public API (``queue(max_size=, default_concurrency_limit=)``, ``concurrency_id`` and
``concurrency_limit`` on listeners). What is left is here, and only here (tests/test_gradio_boundary.py fails when
another module assigns to a Gradio object or names one of these internals):

    queue_of(demo)                         the queue ``demo.queue()`` made
    keep_sessions_with_events(demo)        Gradio's per-session message books never drop a session with events
                                           pending, and an event whose session they dropped is dropped, not fatal
    cap_queue(demo, rules)                 per session and per client address: caps, one long job, fair order
    cap_per_session(demo, cap, refusal)    at most ``cap`` of one session's events in the queue at once
    tag_requests_with_client(demo, set)    each handler runs with its request's client address known
    sentence_for_bad_values(demo, say)     Gradio's check of a sent value against its component, as a sentence
    compute_summary_every(demo, n)         Gradio's timing summary recomputed after ``n`` events, not after each
    configs_on_demand(demo)                a new session's copy of a component's configuration made when first used
    set_group(demo, i, group, limit)       a concurrency group for an event registered without one
    event_group(demo, i)                   the group and limit an event has
    default_group(fn)                      the group Gradio gives ``fn``'s listeners registered without one
    server_events(demo)                    every event that runs a function on the server, by id: its name
    events_after(demo, first)              ``first`` and the events chained after them
    page_load_events(demo)                 the events the page's load runs on the server
    detach_page_loads(demo, events)        those events no longer run on page load (callable by name still)
    event_name(demo, i)                    an event's API name (or its function's name)
    event_function(demo, api_name)         the function an event runs (the benchmark calls it directly)
    answer_into_page(demo, i)              run an event as a browser's request would be, its answer the page's own
    set_initial(block, sent)               a built component's initial value or properties
    update_props(component)                what a component returned as an update carries
    sessions_last_used(demo), session_values(demo, s), fresh_state_value(demo, s, key), events_held(demo, s),
    forget_session(demo, s)                what Gradio keeps per session, read and dropped (explorer.web.sweeper)

At import the installed Gradio is checked (``check_gradio``): a changed shape of anything used here stops the app
with a sentence naming it; another version with every shape intact gets a warning naming ``TESTED_GRADIO``.
"""
from __future__ import annotations

import contextlib
import datetime
import inspect
import types
import warnings
import weakref
from collections import OrderedDict
from typing import Any, Callable, NamedTuple

import gradio as gr

#: The Gradio this module was written against and tested with (README's ``sdk_version`` for the Space).
TESTED_GRADIO = "6.31.0"

try:
    from gradio.block_function import BlockFunction
    from gradio.blocks import Blocks
    from gradio.queueing import Event, EventQueue, Queue
    from gradio.state_holder import SessionState, StateHolder
    from gradio.utils import LRUCache
except ImportError as exc:  # a module moved: say which version this was written for
    raise RuntimeError(f"Gradio {gr.__version__} lacks a module explorer/web/gradio_adapter.py uses ({exc}); it was "
                       f"tested with {TESTED_GRADIO}: install gradio=={TESTED_GRADIO} or update the adapter.") from exc

#: The classes whose methods and attributes are used here.
CLASSES = {"Blocks": Blocks, "Queue": Queue, "BlockFunction": BlockFunction, "StateHolder": StateHolder,
           "SessionState": SessionState, "LRUCache": LRUCache}
#: Methods wrapped or called here: the parameters they must start with, and whether they must be coroutines.
METHODS: dict[str, tuple[tuple[str, ...], bool]] = {
    "Blocks.preprocess_data": (("self", "block_fn", "inputs", "state", "explicit_call"), True),
    "Blocks.process_api": (("self", "block_fn", "inputs", "state"), True),
    "Queue.push": (("self", "body", "request", "username"), True),
    "Queue.send_message": (("self", "event", "event_message"), False),
    "Queue.clean_events": (("self",), True),
    "LRUCache.__setitem__": (("self", "key", "value"), False),
    "StateHolder.delete_state": (("self", "session_id"), False),
    "StateHolder.__getitem__": (("self", "session_id"), False),
    "SessionState.__init__": (("self", "blocks"), False),
}
#: Instance attributes read or written here, by the class that sets them, with the type each must have.
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "Queue": ("pending_event_ids_session:dict", "pending_messages_per_session:LRUCache", "event_ids_to_events:dict",
              "event_queue_per_concurrency_id:dict", "ANAYLTICS_CACHE_FREQUENCY:int"),
    "BlockFunction": ("fn", "inputs:list", "outputs:list", "targets:list", "trigger_after", "api_name", "name",
                      "concurrency_limit", "concurrency_id:str"),
    "StateHolder": ("session_data:dict", "time_last_used:dict", "lock"),
    "SessionState": ("config_values:dict", "blocks_config", "state_data:dict"),
}
_KINDS = {"dict": dict, "list": list, "int": int, "str": str, "LRUCache": LRUCache}


def default_group(fn: Callable) -> str:
    """The concurrency group Gradio gives a listener of ``fn`` registered without a ``concurrency_id``: one per
    function, so a wrapper of ``fn`` given this group waits with ``fn``'s own events."""
    return str(id(fn))


def _probe_handler() -> None:
    """A listener's function for the throwaway BlockFunction below."""


def _instances() -> dict[str, Any]:
    """One throwaway instance of each class whose attributes are used here (no server, no queue started)."""
    return {"Queue": Queue(live_updates=False, concurrency_count=1, update_intervals=1, max_size=None, blocks=None),
            "BlockFunction": BlockFunction(_probe_handler, [], [], False, False, False, [(None, "load")], 0),
            "StateHolder": StateHolder(), "SessionState": SessionState(_probe_blocks())}


def _probe_blocks() -> Any:
    """What ``SessionState`` reads of a Blocks: its page configuration (no component) and its components."""
    with gr.Blocks() as probe:
        pass
    return probe


def shape_problems() -> list[str]:
    """What differs, in the installed Gradio, from the shapes this module relies on; empty when all match."""
    problems: list[str] = []
    for name, (wanted, coroutine) in METHODS.items():
        cls, _, attr = name.partition(".")
        method = getattr(CLASSES[cls], attr, None)
        if not callable(method):
            problems.append(f"{name} is not callable")
            continue
        got = tuple(inspect.signature(method).parameters)
        if got[:len(wanted)] != wanted:
            problems.append(f"{name} takes ({', '.join(got)}), not ({', '.join(wanted)}, ...)")
        if coroutine and not inspect.iscoroutinefunction(method):
            problems.append(f"{name} is no longer a coroutine function")
    try:
        made = _instances()
    except Exception as exc:  # noqa: BLE001 - a changed constructor is one more problem to name
        return problems + [f"Queue, BlockFunction, StateHolder or SessionState cannot be made as before ({exc})"]
    for cls, attributes in ATTRIBUTES.items():
        for spec in attributes:
            attr, _, kind = spec.partition(":")
            if not hasattr(made[cls], attr):
                problems.append(f"{cls} has no attribute {attr}")
            elif kind and not isinstance(getattr(made[cls], attr), _KINDS[kind]):
                problems.append(f"{cls}.{attr} is a {type(getattr(made[cls], attr)).__name__}, not a {kind}")
    books = made["Queue"].pending_messages_per_session
    if not isinstance(getattr(books, "max_size", None), int):
        problems.append("Queue.pending_messages_per_session no longer has an int max_size")
    event = Event(None, made["BlockFunction"], None, None)
    for attr in ("_id", "session_hash", "concurrency_id", "request", "alive"):
        if not hasattr(event, attr):
            problems.append(f"Event has no attribute {attr}")
    if not isinstance(getattr(EventQueue("probe", 1), "queue", None), list):
        problems.append("EventQueue.queue is no longer a list")
    if made["BlockFunction"].concurrency_id != default_group(_probe_handler):
        problems.append("a listener registered without concurrency_id is no longer in its function's own group")
    probe = gr.Markdown("before", render=False)
    if not isinstance(probe.constructor_args, dict) or probe.constructor_args.get("value") != "before":
        problems.append("a component's constructor_args no longer holds its constructor's arguments")
    probe.value = "after"
    if probe.get_config().get("value") != "after":
        problems.append("a component's configuration is no longer read from its attributes (get_config)")
    if not isinstance(getattr(gr.State, "stateful", None), property):
        problems.append("State.stateful is no longer a property")
    return problems


def check_gradio() -> None:
    """Raise RuntimeError naming what changed when a shape used here differs; warn when only the version does."""
    problems = shape_problems()
    if problems:
        raise RuntimeError(f"Gradio {gr.__version__} differs from {TESTED_GRADIO} (the version "
                           f"explorer/web/gradio_adapter.py was tested with) where the app relies on it: "
                           f"{'; '.join(problems)}. Install gradio=={TESTED_GRADIO} or update the adapter.")
    if gr.__version__ != TESTED_GRADIO:
        warnings.warn(f"Gradio {gr.__version__} is installed; explorer/web/gradio_adapter.py was tested with "
                      f"{TESTED_GRADIO}. Its shape checks pass: run tests/test_gradio_adapter.py before serving a "
                      "class.", stacklevel=2)


check_gradio()


# --- the queue --------------------------------------------------------------------------------------------------

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
    import asyncio

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


def cap_queue(demo: gr.Blocks, rules: QueueRules) -> None:
    """At each join: at most ``rules.session_cap`` of a session's events and ``rules.client_cap`` of a client
    address's in the queue at once, and at most one long job (an event of ``rules.long_groups``) per session;
    then the new event takes its fair place in its group's line: round robin by client address (a client's
    n-th waiting event goes after every other client's n-th), so one client's flood of fresh sessions waits
    behind everyone else's next request, where Gradio's line is first come first served."""
    queue = queue_of(demo)
    push = queue.push
    clients: dict[str, str] = {}  # event id -> client address, for the events in the queue

    def held(ids) -> list:
        return [queue.event_ids_to_events[i] for i in list(ids or ()) if i in queue.event_ids_to_events]

    async def push_within_rules(body, request, username):
        session = body.session_hash
        fn = demo.fns.get(body.fn_index) if isinstance(body.fn_index, int) and body.fn_index >= 0 else None
        if fn is None or fn.fn is None:
            return False, rules.unknown_refusal, "error"
        if rules.on_join is not None and session:
            rules.on_join(session)
        for gone in [i for i in clients if i not in queue.event_ids_to_events]:
            del clients[gone]
        client = rules.client_of(request)
        ids = queue.pending_event_ids_session.get(session) if session else None
        mine = held(ids)
        if len(ids or ()) >= rules.session_cap:
            return False, rules.session_refusal, "queue_full"
        if sum(1 for c in clients.values() if c == client) >= rules.client_cap:
            return False, rules.client_refusal, "queue_full"
        if fn.concurrency_id in rules.long_groups and \
                any(e.concurrency_id in rules.long_groups for e in mine):
            return False, rules.long_refusal, "queue_full"
        ok, answer, kind = await push(body, request, username)
        if ok and isinstance(answer, str) and answer in queue.event_ids_to_events:
            clients[answer] = client
            _fair_place(queue, queue.event_ids_to_events[answer], clients)
        return ok, answer, kind

    queue.push = push_within_rules


def _fair_place(queue: Queue, event, clients: dict[str, str]) -> None:
    """Move ``event`` (last in its group's line) before the first waiting event of a later round: its round
    is how many of its client's events wait before it."""
    line = queue.event_queue_per_concurrency_id.get(event.concurrency_id)
    if line is None or not line.queue or line.queue[-1] is not event:
        return
    seen: dict[str, int] = {}
    rounds = []
    for e in line.queue:
        c = clients.get(e._id, e.session_hash)
        rounds.append(seen.get(c, 0))
        seen[c] = rounds[-1] + 1
    mine = rounds[-1]
    for i, r in enumerate(rounds[:-1]):
        if r > mine:
            line.queue.insert(i, line.queue.pop())
            return


def cap_per_session(demo: gr.Blocks, cap: int, refusal: str,
                    on_join: Callable[[str], None] | None = None) -> None:
    """At most ``cap`` of one session's events in the queue at once (``cap_queue`` with only this rule)."""
    cap_queue(demo, QueueRules(cap, 10**9, frozenset(), lambda request: "", refusal, refusal, refusal,
                               "That event does not exist in this app.", on_join))


def tag_requests_with_client(demo: gr.Blocks, set_client: Callable[[Any], Any]) -> None:
    """Each handler runs with ``set_client(request)`` called first in its task (a context variable set there
    reaches the handler's worker thread, which copies the task's context), and its token reset after."""
    process = demo.process_api

    async def process_with_client(block_fn, inputs, state=None, request=None, *args, **kwargs):
        first = request[0] if isinstance(request, list) and request else request
        reset = set_client(first)
        try:
            return await process(block_fn, inputs, state, request, *args, **kwargs)
        finally:
            if reset is not None:
                reset()

    demo.process_api = process_with_client


def sentence_for_bad_values(demo: gr.Blocks, say: Callable[[str | None, Exception], str]) -> None:
    """Gradio checks each sent value against its component before any handler runs, and answers a bad one with a
    bare "Error" or a message that echoes the whole value: answer ``say(api_name, exception)`` instead."""
    preprocess = demo.preprocess_data

    async def preprocess_with_sentence(block_fn, inputs, state, explicit_call=False):
        try:
            _text_boxes_get_text(block_fn, inputs)
            return await preprocess(block_fn, inputs, state, explicit_call)
        except Exception as exc:  # noqa: BLE001 - every failure here is a value the page would never send
            raise gr.Error(say(block_fn.api_name, exc), print_exception=False) from None

    demo.preprocess_data = preprocess_with_sentence


def _text_boxes_get_text(block_fn, inputs) -> None:
    """A Textbox passes whatever was sent through ``str()``: a script's ``Infinity`` or ``{}`` would reach the
    handler as the prompt "inf" or "{}". Only text (or nothing) is a Textbox's value."""
    for block, value in zip(block_fn.inputs or [], inputs or []):
        if isinstance(block, gr.Textbox) and value is not None and not isinstance(value, str):
            raise ValueError(f"{block.label or 'a text box'} must be text, not a {type(value).__name__}")


def compute_summary_every(demo: gr.Blocks, events: int) -> None:
    """Gradio recomputes its per-function timing summary (a pandas group-by over the last 10,000 events) after
    every event: have it do so after ``events``, unless ``GRADIO_ANALYTICS_CACHE_FREQUENCY`` says otherwise."""
    import os

    if not os.environ.get("GRADIO_ANALYTICS_CACHE_FREQUENCY"):
        queue_of(demo).ANAYLTICS_CACHE_FREQUENCY = events


class _ConfigsOnDemand(dict):
    """A session's copies of component configurations (``SessionState.config_values``), each made when first read
    or written. Gradio reads them only for a component an event updates, and all of them for its own
    deep-link button, which iterates (``items``) and so still gets every one."""

    def __init__(self, state: SessionState, ids) -> None:
        super().__init__()
        self._state, self._ids = state, ids

    def __missing__(self, key: int) -> dict:
        config = self[key] = self._state.blocks_config.config_for_block(key, [], self._state.blocks_config.blocks[key])
        return config

    def items(self):
        for key in self._ids:
            if key in self._state.blocks_config.blocks and not dict.__contains__(self, key):
                self.__missing__(key)
        return super().items()


_ON_DEMAND: "weakref.WeakSet[gr.Blocks]" = weakref.WeakSet()


def configs_on_demand(demo: gr.Blocks) -> None:
    """A new session of ``demo`` starts without its copy of every component's configuration: Gradio makes them all
    at a session's first event, on the server's event loop, and a class of 40 arriving at once waits for 40 copies
    of a page of hundreds of components (about a third of the server's work for 40 first questions)."""
    _ON_DEMAND.add(demo)
    if getattr(SessionState.__init__, "_on_demand", False):
        return
    original = SessionState.__init__

    def __init__(self, blocks, *args, **kwargs):
        if blocks not in _ON_DEMAND:
            return original(self, blocks, *args, **kwargs)
        # Gradio's own initialisation, with no component to copy, then the copies made on demand
        bare = types.SimpleNamespace(default_config=blocks.default_config, blocks={})
        try:
            original(self, bare, *args, **kwargs)
        except AttributeError:  # a Gradio whose initialisation reads more of the Blocks: its own way, eagerly
            return original(self, blocks, *args, **kwargs)
        self.config_values = _ConfigsOnDemand(self, list(blocks.blocks))

    __init__._on_demand = True
    SessionState.__init__ = __init__


def set_group(demo: gr.Blocks, i: int, group: str, limit: int | None) -> None:
    """Event ``i`` runs in concurrency group ``group`` of ``limit`` at a time, as if registered with
    ``concurrency_id=group, concurrency_limit=limit`` (for events whose module does not pass them itself)."""
    fn = demo.fns[i]
    fn.concurrency_limit = limit
    fn.concurrency_id = group


def event_group(demo: gr.Blocks, i: int) -> tuple[str, int | str | None]:
    """(concurrency group, limit) event ``i`` was registered with (limit "default": the queue's default)."""
    fn = demo.fns[i]
    return fn.concurrency_id, fn.concurrency_limit


# --- events and the page --------------------------------------------------------------------------------------

def server_events(demo: gr.Blocks) -> dict[int, str]:
    """Every event that runs a function on the server, by id: its name (``event_name``)."""
    return {i: event_name(demo, i) for i, fn in demo.fns.items() if fn.fn is not None}


def event_name(demo: gr.Blocks, i: int) -> str:
    fn = demo.fns[i]
    return fn.api_name or fn.name


def event_function(demo: gr.Blocks, api_name: str) -> Callable:
    """The function the server runs for the event named ``api_name``; KeyError when there is none."""
    for fn in demo.fns.values():
        if fn.api_name == api_name and fn.fn is not None:
            return fn.fn
    raise KeyError(f"the app has no endpoint /{api_name}")


def event_outputs(demo: gr.Blocks, i: int) -> list:
    """The output components of event ``i``."""
    return list(demo.fns[i].outputs)


def rebuild_page_config(demo: gr.Blocks) -> None:
    """The page configuration Gradio sends from now on, rebuilt from the components' current values."""
    demo.config = demo.get_config_file()


def events_after(demo: gr.Blocks, first: list[int]) -> list[int]:
    """``first`` and, breadth first, every server event chained (``.then`` / ``.success``) after one of them."""
    chosen = list(first)
    i = 0
    while i < len(chosen):
        chosen += [j for j, fn in demo.fns.items() if fn.trigger_after == chosen[i] and fn.fn is not None
                   and j not in chosen]
        i += 1
    return chosen


def page_load_events(demo: gr.Blocks) -> list[int]:
    """The events the page's load runs on the server (front-end-only ones, with no function, left out)."""
    return [i for i, fn in demo.fns.items() if fn.fn is not None and any(t[1] == "load" for t in fn.targets)]


def detach_page_loads(demo: gr.Blocks, events: list[int]) -> None:
    """``events`` no longer run on page load (their answers are in the page); callable by name still."""
    for i in events:
        fn = demo.fns[i]
        fn.targets = [t for t in fn.targets if t[1] != "load"]


async def answer_into_page(demo: gr.Blocks, i: int) -> None:
    """Run event ``i`` on its inputs' initial values through Gradio's own processing (``Blocks.process_api``: the
    pre- and post-processing a browser's request gets) and make its answer its outputs' initial values."""
    fn = demo.fns[i]
    state = SessionState(demo)
    inputs = [None if block.stateful else getattr(block, "value", None) for block in fn.inputs]
    answer = await demo.process_api(fn, inputs, state=state, in_event_listener=False)  # no event: gr.Info only logs
    for block, sent in zip(fn.outputs, answer["data"]):
        if block.stateful:
            if block._id in state.state_data:
                block.value = state.state_data[block._id]
        else:
            set_initial(block, sent)


def set_initial(block, sent) -> None:
    """Make ``sent`` (a value as Gradio sends it, or an update of a component's properties) the initial value or
    properties of the built component ``block``: the page is sent what it then holds."""
    from pydantic import BaseModel

    if isinstance(sent, BaseModel):
        sent = sent.model_dump()
    if not (isinstance(sent, dict) and sent.get("__type__") == "update"):
        block.value = sent
        return
    for key, v in sent.items():
        if key == "__type__":
            continue
        if isinstance(v, BaseModel):
            v = v.model_dump()
        if key != "value":
            block.constructor_args[key] = v  # a later update in a session starts from constructor_args
        setattr(block, key, v)


def update_props(component) -> dict:
    """The properties a component returned as an update carries (what Gradio sends for it, before its value)."""
    return dict(component.constructor_args)


# --- what Gradio keeps per session ----------------------------------------------------------------------------

def _holder(demo: gr.Blocks) -> StateHolder | None:
    return getattr(demo, "state_holder", None)  # set when the app is launched


def sessions_last_used(demo: gr.Blocks) -> dict[str, datetime.datetime]:
    """Each session Gradio keeps (before launch: none), with when it was last used."""
    holder = _holder(demo)
    return dict(holder.time_last_used) if holder is not None else {}


def session_values(demo: gr.Blocks, session_hash: str) -> dict[int, Any]:
    """The ``gr.State`` values a session holds, by component id (none for an unknown session)."""
    holder = _holder(demo)
    state = holder.session_data.get(session_hash) if holder is not None else None
    return dict(state.state_data) if state is not None else {}


def fresh_state_value(demo: gr.Blocks, session_hash: str, key: int) -> Any:
    """The session's value of the state component ``key``, made from its default when the session is new; None
    before launch or for an unknown component."""
    holder = _holder(demo)
    if holder is None:
        return None
    with contextlib.suppress(KeyError, TypeError):
        return holder[session_hash][key]
    return None


def events_held(demo: gr.Blocks, session_hash: str) -> int:
    """How many of the session's events are in the queue (queued or running). Gradio's own count also keeps
    events that finished until their answer is read, which a script that never reads them never does."""
    queue = getattr(demo, "_queue", None)
    if queue is None:
        return 0
    return sum(1 for i in list(queue.pending_event_ids_session.get(session_hash) or ())
               if i in queue.event_ids_to_events)


def forget_session(demo: gr.Blocks, session_hash: str) -> None:
    """Drop what Gradio keeps for a session: its ``gr.State`` values (through their delete callbacks), its copy
    of every component's configuration and its place in the queue's books. A later request starts afresh."""
    holder = _holder(demo)
    if holder is not None:
        holder.delete_state(session_hash)
        with holder.lock:
            holder.session_data.pop(session_hash, None)
            holder.time_last_used.pop(session_hash, None)
    queue = getattr(demo, "_queue", None)
    if queue is not None:
        queue.pending_event_ids_session.pop(session_hash, None)
        with contextlib.suppress(KeyError):
            del queue.pending_messages_per_session[session_hash]


def plotly_payload(figure_json: str):
    """What ``gr.Plot`` sends for a Plotly figure given as its JSON text (``gr.Plot`` passes this on as it is), so a
    handler can send a figure it serialised itself without building a plotly ``Figure`` again."""
    from gradio.components.plot import PlotData

    return PlotData(type="plotly", plot=figure_json)
