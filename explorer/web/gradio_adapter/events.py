"""The app's events as Gradio holds them, and the page's opening: which events run on page load, what they answer
written into the page.

    server_events(demo)                    every event that runs a function on the server, by id: its name
    event_name(demo, i)                    an event's API name (or its function's name)
    event_function(demo, api_name)         the function an event runs (the benchmark calls it directly)
    event_outputs(demo, i)                 an event's output components
    event_lane(demo, i)                    the concurrency group and limit an event was registered with
    events_after(demo, first)              ``first`` and the events chained after them
    page_load_events(demo)                 the events the page's load runs on the server
    detach_page_loads(demo, events)        those events no longer run on page load (callable by name still)
    answer_into_page(demo, i)              run an event as a browser's request would be, its answer the page's own
    set_initial(block, sent)               a built component's initial value or properties
    rebuild_page_config(demo)              the page configuration rebuilt from the components' current values
"""
from __future__ import annotations

from typing import Callable

import gradio as gr

from explorer.web.gradio_adapter.checks import SessionState


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


def event_lane(demo: gr.Blocks, i: int) -> tuple[str, int | str | None, Callable | None]:
    """(concurrency group, limit, function) event ``i`` was registered with; limit "default" when the listener
    named none (the queue's default then applies)."""
    fn = demo.fns[i]
    return fn.concurrency_id, fn.concurrency_limit, fn.fn


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


def rebuild_page_config(demo: gr.Blocks) -> None:
    """The page configuration Gradio sends from now on, rebuilt from the components' current values."""
    demo.config = demo.get_config_file()
