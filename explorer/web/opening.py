"""Every tab's opening example, computed once, into the page itself.

Each tab opens on an example computed by the code shown: its registered view (``explorer/web/links.py``) and the
panels' own ``demo.load`` events. Computed per visitor, a class opening the page at once would queue the same
answers many times over on the same cores, so each is computed once.

Here each one runs once, when the app is built, on the shipped default model, through Gradio's own processing
(the same pre- and post-processing a browser's request gets, in the order the page would have run them:
``gradio_adapter.answer_into_page``), and its answer is written into the components as their initial values. The
page then arrives with every figure in it and sends nothing until the visitor asks for something; the answers are
still live (computed by this code, on this machine, at start-up), never stored files. The panels' ``demo.load``
events lose their page-load trigger (they stay callable by name); a link's settings re-run its own tab only
(``explorer/web/links.py``).

    open_in_page(demo, first)   run the events ``first`` and everything chained after them; write the answers
    in_tab(demo, events, tab)   those of ``events`` whose answers land in ``tab`` (the page's first tab goes first
                                when ``python app.py`` computes the openings after the server answers)
"""
from __future__ import annotations

import asyncio
import threading
import time

import gradio as gr

from explorer.state.openings import pinning
from explorer.web import gradio_adapter as adapter


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


def in_tab(demo: gr.Blocks, events: list[int], tab) -> list[int]:
    """Those of ``events`` with an output inside the layout block ``tab`` (a ``gr.Tab``), in their order."""
    inside: set[int] = set()
    stack = [tab]
    while stack:
        block = stack.pop()
        inside.add(block._id)
        stack += list(getattr(block, "children", []))
    return [i for i in events if any(b._id in inside for b in adapter.event_outputs(demo, i))]


def open_in_page(demo: gr.Blocks, first: list[int], skip: frozenset[int] = frozenset(),
                 failed: dict[str, BaseException] | None = None) -> dict[str, float]:
    """Run each event of ``first`` and of its chain (but those in ``skip``, already run), in the page's order, with
    the components' initial values, writing each answer into the components. Returns the seconds each event took,
    by name.

    A failure is the app's own bug (an opening example must always compute): raised, so the app does not start
    with an empty tab; with ``failed`` given, noted there by event name instead, and the next event run."""

    async def run_all() -> dict[str, float]:
        taken: dict[str, float] = {}
        with pinning():  # these answers are the page's own: kept for good (explorer.state.openings)
            for i in adapter.events_after(demo, first):
                if i in skip:
                    continue
                t0 = time.perf_counter()
                try:
                    await adapter.answer_into_page(demo, i)
                except Exception as exc:  # noqa: BLE001 - the caller asked to be told and to go on
                    if failed is None:
                        raise
                    failed[adapter.event_name(demo, i)] = exc
                    continue
                taken[adapter.event_name(demo, i)] = time.perf_counter() - t0
        return taken

    return _run(run_all())
