"""Every tab's opening example, computed once, into the page itself.

Each tab opens on an example computed by the code shown: its registered view (``explorer/links.py``) and the
panels' own ``demo.load`` events. Run per visitor, those were 16 events per page load, and a class of 40 opening
the page at once queued 640 of them behind one another on the same two cores, to compute the same answers.

Here each one runs once, when the app is built, on the shipped default model, through Gradio's own processing
(``Blocks.process_api``: the same pre- and post-processing a browser's request gets, in the order the page
would have run them), and its answer is written into the components as their initial values. The page then
arrives with every figure in it and sends nothing until the visitor asks for something; the answers are still
live (computed by this code, on this machine, at start-up), never stored files. The panels' ``demo.load``
events lose their page-load trigger (they stay callable by name); a link's settings re-run its own tab only
(``explorer/links.py``).

    open_in_page(demo, first)   run the events ``first`` and everything chained after them; write the answers
    page_load_roots(demo)       the events the page's load triggers on the server
    detach_page_loads(demo)     take the page-load trigger off them (after open_in_page)
"""
from __future__ import annotations

import asyncio
import threading
import time

import gradio as gr
from pydantic import BaseModel


def chain_of(demo: gr.Blocks, first: list[int]) -> list[int]:
    """``first`` and, breadth first, every event chained (``.then`` / ``.success``) after one of them."""
    chosen = list(first)
    i = 0
    while i < len(chosen):
        chosen += [j for j, fn in demo.fns.items() if fn.trigger_after == chosen[i] and fn.fn is not None
                   and j not in chosen]
        i += 1
    return chosen


def page_load_roots(demo: gr.Blocks) -> list[int]:
    """The events the page's load runs on the server (front-end-only ones, with no function, left out)."""
    return [i for i, fn in demo.fns.items() if fn.fn is not None and any(t[1] == "load" for t in fn.targets)]


def _written(block, sent, state) -> None:
    """Make ``sent`` (what Gradio would send the browser for ``block``) the block's initial value and props."""
    if block.stateful:
        if block._id in state.state_data:
            block.value = state.state_data[block._id]
        return
    if isinstance(sent, BaseModel):
        sent = sent.model_dump()
    if isinstance(sent, dict) and sent.get("__type__") == "update":
        for key, v in sent.items():
            if key == "__type__":
                continue
            if isinstance(v, BaseModel):
                v = v.model_dump()
            if key != "value":
                # a later update in a session starts from constructor_args: keep them in step
                block.constructor_args[key] = v
            setattr(block, key, v)
        return
    block.value = sent


def _run(coro):
    """Run ``coro`` to completion, also when the caller is inside an event loop (a test's, say)."""
    box: dict = {}

    def target():
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="opening-examples")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def open_in_page(demo: gr.Blocks, first: list[int]) -> dict[str, float]:
    """Run each event of ``first`` and of its chain, in the page's order, with the components' initial values,
    writing each answer into the components. Returns the seconds each event took, by name.

    A failure is the app's own bug (an opening example must always compute): raised, so the app does not start
    with an empty tab."""
    from gradio.state_holder import SessionState

    async def run_all() -> dict[str, float]:
        taken: dict[str, float] = {}
        for i in chain_of(demo, first):
            fn = demo.fns[i]
            state = SessionState(demo)
            inputs = []
            for block in fn.inputs:
                inputs.append(None if block.stateful else getattr(block, "value", None))
            t0 = time.perf_counter()
            answer = await demo.process_api(fn, inputs, state=state, in_event_listener=False)  # no event: gr.Info only logs
            taken[fn.api_name or fn.name] = time.perf_counter() - t0
            for block, sent in zip(fn.outputs, answer["data"]):
                _written(block, sent, state)
        return taken

    return _run(run_all())


def detach_page_loads(demo: gr.Blocks, roots: list[int]) -> None:
    """The events ``roots`` no longer run on page load (their answers are in the page); callable by name still."""
    for i in roots:
        fn = demo.fns[i]
        fn.targets = [t for t in fn.targets if t[1] != "load"]
