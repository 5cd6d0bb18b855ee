"""The one place the app reaches into Gradio's internals: only what no public API does, each use checked.

Everything else goes through Gradio's public API: ``queue(max_size=, default_concurrency_limit=)``; each
listener's lane as ``concurrency_id``/``concurrency_limit`` where it is registered (``explorer.web.groups``); the
client address from a ``gr.Request`` parameter (``explorer.web.clients.with_client``); the timing summary's
frequency from ``GRADIO_ANALYTICS_CACHE_FREQUENCY`` (``explorer.web.serving``). What is left is here, by concern
(tests/test_gradio_boundary.py fails when another module assigns to a Gradio object or names one of its internals):

    checks     the installed Gradio checked at import against every shape used here (``check_gradio``)
    queue      the per-session message books kept sound; caps per session and client, one long job, fair order;
               events nobody reads dropped before they run
    sessions   a session's configuration copies made on demand; what Gradio keeps per session, read and dropped
    events     the event graph; the page's opening (page loads detached, answers written into the page)
    values     a refused value as a sentence; what an update carries; a Plotly figure sent as JSON text
    pages      the root URL Gradio writes into its page for a request's headers; its inlined API description

The names below are the package's face; each module's docstring says what its functions do.
"""
from __future__ import annotations

from explorer.web.gradio_adapter.checks import TESTED_GRADIO, check_gradio, default_group, shape_problems
from explorer.web.gradio_adapter.events import (answer_into_page, detach_page_loads, event_function, event_lane,
                                                event_name, event_outputs, events_after, page_load_events,
                                                rebuild_page_config, server_events, set_initial)
from explorer.web.gradio_adapter.pages import page_root, without_code_snippets
from explorer.web.gradio_adapter.queue import (QueueRules, SessionBooks, cap_per_session, cap_queue, drop_unread,
                                               events_held, keep_sessions_with_events, queue_of,
                                               session_books_size)
from explorer.web.gradio_adapter.sessions import (configs_on_demand, forget_session, fresh_state_value,
                                                  session_values, sessions_last_used)
from explorer.web.gradio_adapter.values import plotly_payload, sentence_for_bad_values, update_props

__all__ = ["QueueRules", "SessionBooks", "TESTED_GRADIO", "answer_into_page", "cap_per_session", "cap_queue",
           "check_gradio", "configs_on_demand", "default_group", "detach_page_loads", "drop_unread", "event_function",
           "event_lane", "event_name", "event_outputs", "events_after", "events_held", "forget_session",
           "fresh_state_value", "keep_sessions_with_events", "page_load_events", "page_root", "plotly_payload",
           "queue_of", "rebuild_page_config", "sentence_for_bad_values", "server_events", "session_books_size",
           "session_values", "sessions_last_used", "set_initial", "shape_problems", "update_props",
           "without_code_snippets"]
