"""What Gradio keeps per session: its copies of the page's configuration made on demand, its values read and
dropped (``explorer.web.sweeper``).

    configs_on_demand(demo)              a new session's copy of a component's configuration made when first used
    sessions_last_used(demo)             each session kept, with when it was last used
    session_values(demo, s)              the ``gr.State`` values a session holds
    fresh_state_value(demo, s, key)      a state's value for the session, made from its default when new
    forget_session(demo, s)              what Gradio keeps for a session, dropped
"""
from __future__ import annotations

import contextlib
import datetime
import types
from typing import Any

import gradio as gr

from explorer.web.gradio_adapter.checks import SessionState, StateHolder


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


def _session_on_demand(blocks: gr.Blocks) -> SessionState:
    """A new session of ``blocks``: Gradio's own initialisation with no component to copy, the copies on demand."""
    bare = types.SimpleNamespace(default_config=blocks.default_config, blocks={})
    try:
        state = SessionState(bare)
    except AttributeError:  # a Gradio whose initialisation reads more of the Blocks: its own way, eagerly
        return SessionState(blocks)
    state.config_values = _ConfigsOnDemand(state, list(blocks.blocks))
    return state


class _OnDemandHolder(StateHolder):
    """One app's session holder whose new sessions copy the page's configuration on demand."""

    def __getitem__(self, session_id: str) -> SessionState:
        if session_id not in self.session_data:
            self.session_data[session_id] = _session_on_demand(self.blocks)
        return super().__getitem__(session_id)


def configs_on_demand(demo: gr.Blocks) -> None:
    """A new session of ``demo`` starts without its copy of every component's configuration: Gradio makes them all
    at a session's first event, on the server's event loop, and a class of 40 arriving at once waits for 40 copies
    of a page of hundreds of components (about a third of the server's work for 40 first questions).

    Only ``demo``'s current session holder changes; ``launch`` makes a new one, so call it again after launch
    (``explorer.web.serving`` does at each join: a check, then nothing)."""
    holder = getattr(demo, "state_holder", None)
    if holder is not None and type(holder) is StateHolder:
        holder.__class__ = _OnDemandHolder


def _holder(demo: gr.Blocks) -> StateHolder | None:
    return getattr(demo, "state_holder", None)  # set by demo.queue() and again by launch


def sessions_last_used(demo: gr.Blocks) -> dict[str, datetime.datetime]:
    """Each session Gradio keeps (before the first request: none), with when it was last used."""
    holder = _holder(demo)
    return dict(holder.time_last_used) if holder is not None else {}


def session_values(demo: gr.Blocks, session_hash: str) -> dict[int, Any]:
    """The ``gr.State`` values a session holds, by component id (none for an unknown session)."""
    holder = _holder(demo)
    state = holder.session_data.get(session_hash) if holder is not None else None
    return dict(state.state_data) if state is not None else {}


def fresh_state_value(demo: gr.Blocks, session_hash: str, key: int) -> Any:
    """The session's value of the state component ``key``, made from its default when the session is new; None
    before ``demo.queue()`` or for an unknown component."""
    holder = _holder(demo)
    if holder is None:
        return None
    with contextlib.suppress(KeyError, TypeError):
        return holder[session_hash][key]
    return None


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
