"""The installed Gradio checked, at import, against every shape of its internals this package uses.

    shape_problems()   what differs from the shapes relied on here; empty when all match
    check_gradio()     RuntimeError naming what changed; a warning naming ``TESTED_GRADIO`` when only the version does
    default_group(fn)  the concurrency group Gradio gives ``fn``'s listeners registered without one

The other modules of the package import Gradio's internals from here, so they are checked before any is used.
"""
from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable

import gradio as gr

#: The Gradio this package was written against and tested with (README's ``sdk_version`` for the Space).
TESTED_GRADIO = "6.31.0"

try:
    from gradio.block_function import BlockFunction
    from gradio.blocks import Blocks
    from gradio.components.plot import PlotData
    from gradio.queueing import Event, EventQueue, Queue
    from gradio.route_utils import get_root_url
    from gradio.routes import toorjson
    from gradio.server_messages import ProcessCompletedMessage
    from gradio.state_holder import SessionState, StateHolder
    from gradio.utils import LRUCache
except ImportError as exc:  # a module moved: say which version this was written for
    raise RuntimeError(f"Gradio {gr.__version__} lacks a module explorer/web/gradio_adapter uses ({exc}); it was "
                       f"tested with {TESTED_GRADIO}: install gradio=={TESTED_GRADIO} or update the adapter.") from exc

__all__ = ["BlockFunction", "Blocks", "Event", "EventQueue", "LRUCache", "PlotData", "ProcessCompletedMessage",
           "Queue", "SessionState", "StateHolder", "TESTED_GRADIO", "check_gradio", "default_group", "get_root_url",
           "shape_problems", "toorjson"]

#: The classes whose methods and attributes are used here.
CLASSES = {"Blocks": Blocks, "Queue": Queue, "BlockFunction": BlockFunction, "StateHolder": StateHolder,
           "SessionState": SessionState, "LRUCache": LRUCache}
#: Methods wrapped, overridden or called: the parameters they must start with, and whether they must be coroutines.
METHODS: dict[str, tuple[tuple[str, ...], bool]] = {
    "Blocks.preprocess_data": (("self", "block_fn", "inputs", "state", "explicit_call"), True),
    "Blocks.process_api": (("self", "block_fn", "inputs", "state"), True),
    "Queue.push": (("self", "body", "request", "username"), True),
    "Queue.send_message": (("self", "event", "event_message"), False),
    "Queue.clean_events": (("self",), True),
    "Queue.get_events": (("self",), False),
    "LRUCache.__setitem__": (("self", "key", "value"), False),
    "StateHolder.delete_state": (("self", "session_id"), False),
    "StateHolder.__getitem__": (("self", "session_id"), False),
    "SessionState.__init__": (("self", "blocks"), False),
}
#: Instance attributes read or written, by the class that sets them, with the type each must have.
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "Queue": ("pending_event_ids_session:dict", "pending_messages_per_session:LRUCache", "event_ids_to_events:dict",
              "event_queue_per_concurrency_id:dict", "max_size"),
    "BlockFunction": ("fn", "inputs:list", "outputs:list", "targets:list", "trigger_after", "api_name", "name",
                      "concurrency_limit", "concurrency_id:str"),
    "StateHolder": ("session_data:dict", "time_last_used:dict", "lock", "blocks"),
    "SessionState": ("config_values:dict", "blocks_config", "state_data:dict"),
    "Blocks": ("fns:dict", "blocks:dict", "state_holder:StateHolder", "config:dict", "default_config"),
}
_KINDS = {"dict": dict, "list": list, "int": int, "str": str, "LRUCache": LRUCache, "StateHolder": StateHolder}


def default_group(fn: Callable) -> str:
    """The concurrency group Gradio gives a listener of ``fn`` registered without a ``concurrency_id``: one per
    function, so a wrapper of ``fn`` given this group waits with ``fn``'s own events."""
    return str(id(fn))


def _probe_handler() -> None:
    """A listener's function for the throwaway Blocks below."""


def _probe_blocks() -> Any:
    """A Blocks with one listener, built (no server, no queue: making one costs a second web app)."""
    with gr.Blocks() as probe:
        gr.Button().click(_probe_handler, None, None, api_name="probe")
    return probe


def _empty_blocks() -> Any:
    """What ``SessionState`` reads of a Blocks: its page configuration (no component) and its components."""
    with gr.Blocks() as probe:
        pass
    return probe


def _instances() -> dict[str, Any]:
    """One throwaway instance of each class whose attributes are used here (no server, no queue started)."""
    return {"Queue": Queue(live_updates=False, concurrency_count=1, update_intervals=1, max_size=None, blocks=None),
            "BlockFunction": BlockFunction(_probe_handler, [], [], False, False, False, [(None, "load")], 0),
            "StateHolder": StateHolder(), "SessionState": SessionState(_empty_blocks())}


def _method_problems() -> list[str]:
    problems = []
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
    return problems


def _attribute_problems(made: dict[str, Any]) -> list[str]:
    problems = []
    for cls, attributes in ATTRIBUTES.items():
        if made[cls] is None:
            continue
        for spec in attributes:
            attr, _, kind = spec.partition(":")
            if not hasattr(made[cls], attr):
                problems.append(f"{cls} has no attribute {attr}")
            elif kind and not isinstance(getattr(made[cls], attr), _KINDS[kind]):
                problems.append(f"{cls}.{attr} is a {type(getattr(made[cls], attr)).__name__}, not a {kind}")
    return problems


def _behaviour_problems(made: dict[str, Any]) -> list[str]:
    problems = []
    books = made["Queue"].pending_messages_per_session
    if not isinstance(getattr(books, "max_size", None), int):
        problems.append("Queue.pending_messages_per_session no longer has an int max_size")
    event = Event(None, made["BlockFunction"], None, None)
    for attr in ("_id", "session_hash", "concurrency_id", "request", "alive", "enqueue_time"):
        if not hasattr(event, attr):
            problems.append(f"Event has no attribute {attr}")
    if not isinstance(getattr(EventQueue("probe", 1), "queue", None), list):
        problems.append("EventQueue.queue is no longer a list")
    if made["BlockFunction"].concurrency_id != default_group(_probe_handler):
        problems.append("a listener registered without concurrency_id is no longer in its function's own group")
    if "self.get_events()" not in inspect.getsource(Queue.start_processing):
        problems.append("Queue.start_processing no longer takes its next events through self.get_events()")
    if "self._queue = queueing.Queue(" not in inspect.getsource(Blocks.queue):
        problems.append("Blocks.queue() no longer keeps the queue it makes as the Blocks' _queue")
    fns = getattr(made["Blocks"], "fns", {}) if made["Blocks"] is not None else {"": None}
    if not all(isinstance(fn, BlockFunction) for fn in fns.values()) or \
            [fn.api_name for fn in fns.values()] != ["probe"]:
        problems.append("Blocks.fns no longer holds one BlockFunction per listener")
    probe = gr.Markdown("before", render=False)
    if not isinstance(probe.constructor_args, dict) or probe.constructor_args.get("value") != "before":
        problems.append("a component's constructor_args no longer holds its constructor's arguments")
    probe.value = "after"
    if probe.get_config().get("value") != "after":
        problems.append("a component's configuration is no longer read from its attributes (get_config)")
    config = getattr(made["SessionState"], "blocks_config", None)
    if not callable(getattr(config, "config_for_block", None)) or not isinstance(getattr(config, "blocks", None), dict):
        problems.append("a session's blocks_config no longer has config_for_block and a blocks dict")
    if not isinstance(getattr(gr.State, "stateful", None), property):
        problems.append("State.stateful is no longer a property")
    payload = PlotData(type="plotly", plot="{}")
    if gr.Plot(render=False).postprocess(payload) is not payload:
        problems.append("gr.Plot no longer passes a PlotData(type=, plot=) on as it is")
    problems += _root_problems()
    return problems


def _root_problems() -> list[str]:
    """The page's root URL read from the headers as the page cache (explorer.web.page_cache) substitutes it."""
    from starlette.requests import Request

    def root(headers: dict, path: str, route: str) -> str:
        scope = {"type": "http", "method": "GET", "scheme": "http", "path": path, "root_path": "", "query_string": b"",
                 "server": ("127.0.0.1", 7860), "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}
        return get_root_url(Request(scope), route, None)

    wanted = [({"host": "a.example"}, "/", "/", "http://a.example"),
              ({"host": "a.example"}, "/config", "/config", "http://a.example"),
              ({"host": "a", "x-forwarded-host": "b.example", "x-forwarded-proto": "https"}, "/", "/",
               "https://b.example")]
    try:
        if all(root(h, path, route) == want for h, path, route, want in wanted):
            return []
    except Exception:  # noqa: BLE001 - a changed signature is the same problem
        pass
    return ["route_utils.get_root_url no longer reads the root URL from Host, X-Forwarded-Host and -Proto"]


def shape_problems() -> list[str]:
    """What differs, in the installed Gradio, from the shapes this package relies on; empty when all match."""
    problems = _method_problems()
    try:
        made = _instances()
    except Exception as exc:  # noqa: BLE001 - a changed constructor is one more problem to name
        return problems + [f"Queue, BlockFunction, StateHolder or SessionState cannot be made as before ({exc})"]
    try:
        made["Blocks"] = _probe_blocks()
        made["StateHolder"] = getattr(made["Blocks"], "state_holder", None) or made["StateHolder"]  # set_blocks ran
    except Exception as exc:  # noqa: BLE001 - the same, for a Blocks with one listener; the rest still checked
        problems.append(f"a Blocks with one listener cannot be built as before ({exc})")
        made["Blocks"] = None
    return problems + _attribute_problems(made) + _behaviour_problems(made)


def check_gradio() -> None:
    """Raise RuntimeError naming what changed when a shape used here differs; warn when only the version does."""
    problems = shape_problems()
    if problems:
        raise RuntimeError(f"Gradio {gr.__version__} differs from {TESTED_GRADIO} (the version "
                           f"explorer/web/gradio_adapter was tested with) where the app relies on it: "
                           f"{'; '.join(problems)}. Install gradio=={TESTED_GRADIO} or update the adapter.")
    if gr.__version__ != TESTED_GRADIO:
        warnings.warn(f"Gradio {gr.__version__} is installed; explorer/web/gradio_adapter was tested with "
                      f"{TESTED_GRADIO}. Its shape checks pass: run tests/test_gradio_adapter.py before serving a "
                      "class.", stacklevel=2)


check_gradio()
