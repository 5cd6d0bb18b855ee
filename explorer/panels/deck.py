"""A lesson deck on screen: ``?lesson=<name>`` (``&step=k``, ``&model=<id>``, ``&present=1``) steps through
``lessons/<name>.toml`` one step at a time.

Each step opens its tab with its settings through the link machinery (``explorer.web.links``: the step's query is
the address's ``lesson`` and ``step``, which the link readers expand), presents its figure (``focus``) as large as
the window leaves beside the deck's bar, and shows its title, its sentences with their numbers computed now from the
loaded model (``explorer.probes.lesson_numbers``), the model's name and the position ("k / N"). Previous / Next (the
buttons, or the arrow keys when no text box has the keyboard) move through the steps without reloading the page;
``lesson-ask`` asks the class the step's question through that tab's own "Ask the class". The model of ``model=`` is
loaded once, when the deck opens, and kept for every step.
"""
from __future__ import annotations

import json

import gradio as gr

from explorer.probes import lesson_numbers
from explorer.state import session
from explorer.web import link_model
from explorer.web.clients import with_client
from explorer.web.groups import VIEW, lane
from explorer.web.page import script

from .errors import user_errors
from .vote import as_text

def step_text(lesson, k: int, state) -> str:
    """The step's title, its sentences with their numbers computed on the session's model, and the model's name."""
    step = lesson.steps[k]
    model, tokenizer, name = session.get_model(state)
    with session.threads_for(model):
        body = lesson_numbers.fill(step.text, model, tokenizer, step.settings, escape=as_text)
    return f"**{as_text(lesson.title)} · {as_text(step.title)}**\n\n{body}\n\n<sup>Model: {as_text(name)}</sup>"


@user_errors
def open_step(state, request: gr.Request = None):
    """The step the address names (``lesson``, ``step``, ``model``): the model loaded if the link asks for another,
    then (state, page model id, notice, position, text, ask button, the step's tab/focus/question as JSON)."""
    query = dict(request.query_params) if request is not None else {}
    state, said, _ = with_client(link_model.ensure_model)(state, query.get("model"), client_request=request)
    expanded, notes, found = link_model.expand_lesson({**query, "lesson": query.get("lesson", "")})
    notes = [said, *notes] if said else notes
    notice = gr.Textbox(value=" ".join(notes), visible=bool(notes))
    if found is None:
        return (state, link_model.page_model_id(state), notice, "–", "", gr.Button(visible=False), "{}")
    lesson, k = found
    step = lesson.steps[k]
    info = {"tab": step.tab, "focus": step.focus, "question": step.question, "step": k + 1, "n": len(lesson.steps)}
    ask = gr.Button(value="Ask the class", visible=True) if step.question else gr.Button(visible=False)
    return (state, link_model.page_model_id(state), notice, f"{k + 1} / {len(lesson.steps)}",
            step_text(lesson, k, state), ask, json.dumps(info))


def build_deck(demo: gr.Blocks, state: gr.State, notice: gr.Textbox) -> gr.Textbox:
    """The deck's bar (shown only for ``?lesson=``: deck.css, deck.js) and its events; returns the hidden box that
    holds the page's model id, which every link the page makes carries (``explorer.web.links``)."""
    page_model = gr.Textbox(value="default", visible="hidden", elem_id="page-model")
    info = gr.Textbox(value="{}", visible="hidden", elem_id="lesson-step")
    opener = gr.Button(visible="hidden", elem_id="lesson-open")
    with gr.Row(elem_id="lesson-bar", equal_height=False):
        prev = gr.Button("← Previous", size="sm", scale=0, min_width=110, elem_id="lesson-prev")
        text = gr.Markdown("", elem_id="lesson-text")
        with gr.Column(scale=0, min_width=150, elem_id="lesson-side"):
            position = gr.Markdown("", elem_id="lesson-position")
            nxt = gr.Button("Next →", variant="primary", size="sm", min_width=110, elem_id="lesson-next")
            ask = gr.Button("Ask the class", visible=False, size="sm", min_width=110, elem_id="lesson-ask")
    opener.click(open_step, [state], [state, page_model, notice, position, text, ask, info],
                 api_name="lesson_step", api_visibility="private", show_progress="hidden", **lane(VIEW, open_step)
                 ).then(None, [info], None, js=script("deck_open.js"), api_name="lesson_show", api_visibility="private")
    decks = {name: len(lesson.steps) for name, lesson in link_model.all_decks().items()}
    prev.click(None, js=script("deck_move.js", BY=-1, DECKS=decks), api_name="lesson_prev", api_visibility="private")
    nxt.click(None, js=script("deck_move.js", BY=1, DECKS=decks), api_name="lesson_next", api_visibility="private")
    ask.click(None, [info], None, js=script("deck_ask.js"), api_name="lesson_ask", api_visibility="private")
    demo.load(None, js=script("deck.js"), api_name="lesson_open", api_visibility="private")
    return page_model
