"""explorer/web/sweeper.py through the adapter: which idle sessions Gradio's books lose, and the notice a visitor
whose own model was freed still gets after their session was dropped (a small Blocks, times given explicitly)."""
from __future__ import annotations

import datetime
import time

import gradio as gr
from gradio.state_holder import StateHolder

from explorer.state.private_models import EVICTED_KEY
from explorer.web import gradio_adapter as adapter
from explorer.web import sweeper


def _launched_demo():
    with gr.Blocks() as demo:
        state = gr.State({"model": None})
        gr.Markdown()
    demo.queue()
    StateHolder().set_blocks(demo)  # what launch() does
    return demo, state


def _session(demo, state, session_hash: str, idle_s: float, value: dict):
    adapter.fresh_state_value(demo, session_hash, state._id).update(value)
    demo.state_holder.time_last_used[session_hash] = datetime.datetime.now() - datetime.timedelta(seconds=idle_s)


def test_idle_sessions_are_dropped_and_a_waiting_notice_is_given_back_on_return(monkeypatch):
    monkeypatch.setattr(sweeper, "RETURNING", type(sweeper.RETURNING)())
    demo, state = _launched_demo()
    _session(demo, state, "active", 10, {})
    _session(demo, state, "gone", 120, {})
    _session(demo, state, "own-model", 120, {"model": "a model"})  # kept up to four times the idle time
    _session(demo, state, "notice-waiting", 120, {EVICTED_KEY: "Your own model was freed."})  # likewise
    _session(demo, state, "own-model-long-gone", 500, {"model": "a model"})
    _session(demo, state, "told-later", 500, {EVICTED_KEY: "Your own model was freed."})
    _session(demo, state, "queued", 120, {})
    adapter.queue_of(demo).pending_event_ids_session["queued"] = {"an event"}
    adapter.queue_of(demo).event_ids_to_events["an event"] = object()  # still queued
    _session(demo, state, "answer-never-read", 120, {})  # a script's: finished, its answer never read
    adapter.queue_of(demo).pending_event_ids_session["answer-never-read"] = {"finished"}

    assert sweeper.forget_idle_sessions(demo, idle_seconds=60, now=time.time()) == 4
    assert set(adapter.sessions_last_used(demo)) == {"active", "own-model", "notice-waiting", "queued"}
    assert sweeper.RETURNING == {"told-later": (state._id, "Your own model was freed.")}

    sweeper.tell_returning_visitor(demo, "told-later")  # its next request joins the queue
    assert adapter.session_values(demo, "told-later") == {state._id: {"model": None,
                                                                      EVICTED_KEY: "Your own model was freed."}}
    assert "told-later" not in sweeper.RETURNING
    sweeper.tell_returning_visitor(demo, "gone")  # nothing waiting: its fresh state is the default
    assert adapter.session_values(demo, "gone") == {}


def test_a_script_session_goes_in_minutes_a_browser_tab_keeps_the_longer_time():
    """A session that never opened Gradio's heartbeat (a script posting to the queue) is dropped after the
    short idle time; one that did (a tab, Gradio's client) after the long one (issue 31)."""
    from explorer.web.middleware import BrowserSessions

    demo, state = _launched_demo()
    _session(demo, state, "script", 90, {})
    _session(demo, state, "tab", 90, {})
    _session(demo, state, "script-just-now", 10, {})
    BrowserSessions.note("tab")
    try:
        assert sweeper.forget_idle_sessions(demo, idle_seconds=30 * 60, now=time.time(), api_idle_seconds=60) == 1
        assert set(adapter.sessions_last_used(demo)) == {"tab", "script-just-now"}
    finally:
        BrowserSessions.forget("tab")
