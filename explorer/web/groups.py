"""The queue's lanes, declared by each listener where it is registered: ``run.click(fn, ..., **lane(MEASURE))``.

Gradio runs each handler function one request at a time unless told otherwise, so a class of 40 waits in
series on an idle second core. Each listener names its lane by what its handler holds, and a lane's line never
waits behind another lane's:

    VIEW        cached opening examples, hooked forward passes on small models, predictions: each function in its
                own group (Gradio's default), ``VIEW_CONCURRENCY`` at a time; runs on one model still serialise on
                its model lock (explorer.state.locks)
    GENERATION  text generation: streams token by token; two at a time
    MEASURE     measurements (memory sweeps, the formats comparison, experiment sweeps): one at a time, since two
                on the same cores would time each other
    FINETUNE    LoRA fine-tuning: one at a time
    TRAIN       watching the Training tab's live run: the server trains one run at a time on one thread
                (explorer.jobs.live_training) and every watcher's stream mostly sleeps, so many watch side by side
    PLAY        the memory lab's Play: sleeps between frames, so many run side by side
    CLASS       a class room's votes and tallies: microseconds each, many side by side

A session holds at most one event of the long lanes (``LONG_GROUPS``) at once (``explorer.web.serving``). Events
whose handler runs in the page (no server function) take no lane: they never reach the queue.

    lane(which, same_as=None)   the listener arguments (Gradio's ``concurrency_id``/``concurrency_limit``)
    undeclared(demo)            the server listeners that name no lane; ``check_lanes`` raises naming them
    lane_of(demo, api_name)     the lane an event runs in, by name
    lane_name(group)            the lane of a concurrency group (views' groups: "view")
"""
from __future__ import annotations

import os
from typing import Callable, NamedTuple

import gradio as gr

from explorer.web import gradio_adapter as adapter


def env_int(name: str, default: int, lo: int = 1) -> int:
    try:
        return max(lo, int(os.environ.get(name, "") or default))
    except ValueError:  # a bad setting must not stop the app from starting
        return default


#: Cheap views run this many at a time per function.
VIEW_CONCURRENCY = env_int("EXPLORER_VIEW_CONCURRENCY", 4)


class Lane(NamedTuple):
    name: str
    limit: int
    long: bool  # a long job: a session holds at most one of these at once


VIEW = Lane("view", VIEW_CONCURRENCY, False)
GENERATION = Lane("generation", 2, True)
MEASURE = Lane("measure", 1, True)
FINETUNE = Lane("finetune", 1, True)
# not long: watching holds no model, and a class behind one address must not meet the long lanes' per-address cap
TRAIN = Lane("train", 16, False)
PLAY = Lane("play", 16, False)
CLASS = Lane("class", 16, False)
LANES = (VIEW, GENERATION, MEASURE, FINETUNE, TRAIN, PLAY, CLASS)
#: The concurrency groups of long jobs.
LONG_GROUPS = frozenset(lane.name for lane in LANES if lane.long)
_SHARED = {lane.name: lane for lane in LANES if lane is not VIEW}  # lanes that are one concurrency group each


def lane_name(group: str) -> str:
    """The lane of a concurrency group: a shared lane's own name, else "view" (every view function's group)."""
    return _SHARED[group].name if group in _SHARED else VIEW.name


def lane(which: Lane, same_as: Callable | None = None) -> dict:
    """The listener arguments that put an event in the lane ``which``: ``run.click(fn, ..., **lane(VIEW))``. A view
    given ``same_as`` (the handler a cached wrapper calls) waits in that handler's own group, with its events."""
    if which is VIEW:
        group = {} if same_as is None else {"concurrency_id": adapter.default_group(same_as)}
        return {**group, "concurrency_limit": VIEW.limit}
    return {"concurrency_id": which.name, "concurrency_limit": which.limit}


def _lane_of_event(demo: gr.Blocks, i: int) -> Lane | None:
    group, limit, fn = adapter.event_lane(demo, i)
    if group in _SHARED:
        return _SHARED[group] if limit == _SHARED[group].limit else None
    # a view's group is a function's own (Gradio's default, or the handler a wrapper names); "default": no lane named
    return VIEW if group.isdigit() and limit == VIEW.limit else None


def undeclared(demo: gr.Blocks) -> list[str]:
    """The names of the events that run on the server and were registered without ``**lane(...)``."""
    return sorted(name for i, name in adapter.server_events(demo).items() if _lane_of_event(demo, i) is None)


def check_lanes(demo: gr.Blocks) -> None:
    """ValueError naming every server listener registered without a lane (``serving.apply`` calls it first)."""
    missing = undeclared(demo)
    if missing:
        raise ValueError(f"{len(missing)} listener(s) name no lane: {', '.join(missing)}. Register each with "
                         "**lane(VIEW) (or GENERATION, MEASURE, FINETUNE, TRAIN, PLAY, CLASS) from explorer.web.groups.")


def lane_of(demo: gr.Blocks, api_name: str) -> str | None:
    """The name of the lane the event ``api_name`` runs in (None: no lane declared); KeyError for no such event."""
    for i, name in adapter.server_events(demo).items():
        if name == api_name:
            found = _lane_of_event(demo, i)
            return found.name if found is not None else None
    raise KeyError(f"the app has no endpoint /{api_name}")
