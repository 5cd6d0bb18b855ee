"""Ask the class: a question with choices the model's run made, phones vote, the projector tallies and reveals.

Two pieces:

``ask_section(demo, tab, question_fn, inputs)``, inside a tab: "Ask the class" computes a question from the tab's
current inputs (``explorer.probes.questions``), opens a room (``explorer.state.rooms``) and shows its join link
(text and QR code) and short code; a ``gr.Timer`` redraws the tally about every second while the room is open;
"Reveal" shows the model's value for each choice beside the class's share, with one sentence; "Close" ends the
room. The room's secret lives only in this page's ``gr.State``: a voter's page cannot reveal or close. Ask also
sends the browser's lecturer id (``page_url.js``), so a reloaded page asks in the same room; the timer keeps
asking after the reveal (more slowly), since a room whose page stops asking ends (``explorer.state.rooms``).

``build_join(demo)``, at the top of the page: shown alone when the URL carries ``?join=CODE`` (or ``?join=`` to
type the code), as on a phone: the question and one big button per choice, nothing else. One vote per browser
session per question, changeable until the reveal; a timer picks up the teacher's next question.
"""
from __future__ import annotations

import base64
import html
import io
import re
from urllib.parse import urlsplit

import gradio as gr

from explorer.figures.vote import tally_figure
from explorer.probes import questions as qs
from explorer.state import rooms as room_store
from explorer.state import session
from explorer.web.clients import address_of_request
from explorer.web.groups import CLASS, VIEW, lane
from explorer.web.join_link import join_base
from explorer.web.page import script
from lens.device import gpu

from .errors import user_errors
from .heads import HOWS, parse_heads

TALLY_SECONDS = 1.0  # the projector's tally redraw
HEARTBEAT_SECONDS = 30.0  # after the reveal: the page still asks now and then, which keeps its room alive
POLL_SECONDS = 3.0  # a phone looks for the teacher's next question
MAX_URL = 200
_URL_PATH = re.compile(r"^[A-Za-z0-9/._~-]*$")
_HOST = re.compile(r"^[A-Za-z0-9.-]+(:\d{1,5})?$|^\[[0-9A-Fa-f:]+\](:\d{1,5})?$")

JOIN_JS = script("join.js")  # on page load: ?join=... shows the vote view alone and joins the room in the link
JOIN_CODE_JS = script("join_code.js")  # Join sends the typed code, or the link's when nothing is typed
PAGE_URL_JS = script("page_url.js")  # Ask sends the browser's lecturer id and the page's own address
_LECTURER = re.compile(r"^[A-Za-z0-9_-]{16,64}$")


def page_base(raw, request: gr.Request | None) -> str:
    """The page's address to build the join link on: the browser's (checked: http(s), a host and a plain path, no
    query), else the request's; never anything else a visitor could inject into the QR code or the text."""
    if isinstance(raw, str) and len(raw) <= MAX_URL:
        parts = urlsplit(raw)
        if (parts.scheme in ("http", "https") and _HOST.match(parts.netloc or "") and _URL_PATH.match(parts.path)
                and not parts.query and not parts.fragment):
            return f"{parts.scheme}://{parts.netloc}{parts.path or '/'}"
    headers = getattr(request, "headers", None) or {}
    host = str(headers.get("x-forwarded-host") or headers.get("host") or "")
    proto = "https" if str(headers.get("x-forwarded-proto", "")).startswith("https") else "http"
    return f"{proto}://{host}/" if _HOST.match(host) else "/"


def qr_image(text: str) -> str:
    """The QR code of ``text`` as an ``<img>`` of a PNG that segno draws, inlined as base64: the only markup is ours
    (shown by a Markdown: an image or HTML component would take uploads, and the app takes none: see
    explorer/web/middleware.py)."""
    import segno

    buf = io.BytesIO()
    segno.make(text, error="m").save(buf, kind="png", scale=10, border=2)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return (f'<img src="data:image/png;base64,{data}" alt="QR code of the join link" '
            'style="width: 260px; height: 260px; image-rendering: pixelated">')


def _letter(i: int) -> str:
    return chr(65 + i)


_MARKDOWN = re.compile(r"([\\`*_{}\[\]#|~$!])")


def as_text(text: str) -> str:
    """Text from a prompt or the model's tokens as a Markdown shows it: as written (``<i>I</i>`` in angle
    brackets, ``*a*`` with its stars), never as markup."""
    return _MARKDOWN.sub(r"\\\1", html.escape(str(text), quote=False))


def _counts_text(t: room_store.Tally) -> str:
    minutes = max(1, round(t.seconds_left / 60))
    state = "answer revealed, votes closed" if t.revealed else "voting open"
    text = f"**{t.total} vote{'s' if t.total != 1 else ''}** · {state} · the room ends in {minutes} min."
    if t.refused:
        text += (f"\n\n⚠️ {t.refused} new voter(s) were turned away because one network address sent more than "
                 f"{room_store.rooms.new_voters_per_window} in {room_store.NEW_VOTER_WINDOW:g} s, or more than its "
                 "share of the room: a script, not a class behind one network, votes like that.")
    return text


def _teacher_text(question_text: str, t: room_store.Tally, *more: str) -> str:
    """The teacher's counts: the question (its prompt's text shown as text), the tally, then ``more``."""
    return "\n\n".join([as_text(question_text), _counts_text(t), *more])


def reveal_sentence(question: qs.Question, counts) -> str:
    """One sentence: the class's most chosen answer and its share, and the model's value for it."""
    total = sum(counts)
    if not total:
        return f"Nobody voted. {question.answer}"
    top = max(range(len(counts)), key=lambda i: counts[i])
    share = 100 * counts[top] / total
    choice = question.choices[top]
    if question.kind == "knockout":
        return f"{share:.0f} % of you chose {_letter(top)} ({choice}). {question.answer}"
    return (f"{share:.0f} % of you chose {_letter(top)} {choice}; the model gave it {question.values[top]:.2f}. "
            f"{question.answer}")


def _figure(question: qs.Question, t: room_store.Tally, revealed: bool):
    title = ("The class beside the model" if revealed else "The class's votes (live)")
    return tally_figure(question.choices, t.counts, title=title,
                        model_values=question.values if revealed else None, value_name=question.value_name)


def _owned(owner) -> dict:
    if not isinstance(owner, dict) or "code" not in owner:
        raise ValueError("No question is open on this page: press \"Ask the class\" first.")
    return owner


# --- the teacher's page ---------------------------------------------------------------------------------------

def lecturer_key(browser, tab: str) -> str | None:
    """The room's owner for this browser's Ask in ``tab`` (a reload of the page asks in the same room), or None
    when the page sent no usable id (an API client: a room each time)."""
    return f"{browser}/{tab}" if isinstance(browser, str) and _LECTURER.match(browser) else None


def ask_handler(question_fn, tab: str = "", demo: gr.Blocks | None = None):
    """Ask's handler; ``demo`` tells where the server listens, for a join link phones can open."""
    @user_errors
    @gpu(30)
    def ask(*args, request: gr.Request = None):
        *values, owner, browser, raw_url = args
        question = question_fn(*values)  # the model runs here, holding no room lock
        store = room_store.rooms
        code = secret = None
        if isinstance(owner, dict) and "code" in owner:
            try:
                store.ask(owner["code"], owner["secret"], question.text, question.choices)
                code, secret = owner["code"], owner["secret"]
            except ValueError:  # the room ended: open a new one
                code = None
        if code is None:
            code, secret, _ = store.open(question.text, question.choices, owner=lecturer_key(browser, tab),
                                         address=address_of_request(request))
        owner = {"code": code, "secret": secret, "question": question, "version": -1}
        base, reach = join_base(page_base(raw_url, request), getattr(demo, "server_name", None),
                                share_url=getattr(demo, "share_url", None))
        link = f"{base}?join={code}"
        tally = store.tally(code, secret)
        owner["version"] = tally.version
        return (qr_image(link), link, gr.Markdown(code, visible=True), _figure(question, tally, False),
                _teacher_text(question.text, tally), gr.Timer(TALLY_SECONDS, active=True), owner,
                gr.Markdown(reach or "", visible=bool(reach)))
    return ask


def _revealed_text(q: qs.Question, t: room_store.Tally) -> str:
    return _teacher_text(t.text, t, f"**{as_text(reveal_sentence(q, t.counts))}**")


@user_errors
def tally(owner):
    """The timer's redraw: the live counts, sent only when they changed. Asking is also what keeps the room
    alive: a page gone for the grace time lets it end."""
    if not isinstance(owner, dict) or "code" not in owner:
        return gr.skip(), gr.skip(), gr.Timer(active=False)
    try:
        t = room_store.rooms.tally(owner["code"], owner["secret"])
    except ValueError as exc:
        return gr.skip(), str(exc), gr.Timer(active=False)
    if t.version == owner.get("version"):
        return gr.skip(), gr.skip(), gr.skip()
    owner["version"] = t.version  # this page's own state, changed in place: it holds where its drawing stands
    q = owner["question"]
    text = _revealed_text(q, t) if t.revealed else _teacher_text(t.text, t)
    return _figure(q, t, t.revealed), text, gr.skip()


@user_errors
def reveal(owner):
    owner = _owned(owner)
    t = room_store.rooms.reveal(owner["code"], owner["secret"])
    owner["version"] = t.version
    q = owner["question"]
    return _figure(q, t, True), _revealed_text(q, t), gr.Timer(HEARTBEAT_SECONDS, active=True)


@user_errors
def close(owner):
    owner = _owned(owner)
    room_store.rooms.close(owner["code"], owner["secret"])
    return ("", "", gr.Markdown("", visible=False), None, "The room is closed: nothing of it is kept.",
            gr.Timer(active=False), None)


def ask_section(demo: gr.Blocks, tab: str, question_fn, inputs: list, *, what: str) -> None:
    """An "Ask the class" accordion in ``tab``: ``question_fn(*values of inputs)`` returns a ``Question``."""
    with gr.Accordion(f"Ask the class: {what}", open=False, elem_id=f"ask-{tab}"):
        gr.Markdown("Students predict on their phones before the model answers: **Ask** opens a room with "
                    "choices computed from the model for the settings above, **Reveal** shows the model's answer "
                    f"beside the votes. Rooms last {room_store.ROOM_MINUTES:g} minutes, at most "
                    f"{room_store.MAX_VOTES} votes each.")
        with gr.Row():
            ask = gr.Button("Ask the class", variant="primary", elem_id=f"ask-{tab}-go")
            show = gr.Button("Reveal the model's answer", elem_id=f"ask-{tab}-reveal")
            end = gr.Button("Close the room", elem_id=f"ask-{tab}-close")
        with gr.Row():
            with gr.Column(scale=1, min_width=240):
                qr = gr.Markdown(elem_id=f"ask-{tab}-qr")
                code_md = gr.Markdown(visible=False, elem_classes="room-code", elem_id=f"ask-{tab}-code")
                link = gr.Textbox(label="Join link", interactive=False, buttons=["copy"], max_lines=1,
                                  elem_id=f"ask-{tab}-link",
                                  info="Scan the QR code or open the link on a phone; or open this page with ?join= "
                                       "and type the room code. One vote per phone, changeable until you reveal.")
            with gr.Column(scale=2):
                plot = gr.Plot(label="Votes", elem_id=f"ask-{tab}-tally")
                counts = gr.Markdown(elem_id=f"ask-{tab}-counts")
        reach = gr.Markdown(visible=False, elem_id=f"ask-{tab}-reach")  # when phones cannot open the link
        browser = gr.Textbox(visible=False)  # this browser's lecturer id (page_url.js)
        page_url = gr.Textbox(visible=False)
        owner = gr.State(None)  # {"code", "secret", "question", "version"}: the room's key stays on the server
        timer = gr.Timer(TALLY_SECONDS, active=False)
    ask.click(ask_handler(question_fn, tab, demo), [*inputs, owner, browser, page_url],
              [qr, link, code_md, plot, counts, timer, owner, reach], js=PAGE_URL_JS, api_name=f"ask_class_{tab}",
              **lane(VIEW))
    timer.tick(tally, [owner], [plot, counts, timer], api_name=f"class_tally_{tab}", show_progress="hidden",
               **lane(CLASS))
    show.click(reveal, [owner], [plot, counts, timer], api_name=f"class_reveal_{tab}", **lane(CLASS))
    end.click(close, [owner], [qr, link, code_md, plot, counts, timer, owner], api_name=f"class_close_{tab}",
              **lane(CLASS))


# --- a voter's phone ---------------------------------------------------------------------------------------------

def _voter_key(request: gr.Request | None) -> str:
    key = getattr(request, "session_hash", None)
    if not key:
        raise ValueError("This page has no session: reload it.")
    return str(key)


def _question_updates(q: room_store.Question, chosen: int | None = None) -> list:
    return [gr.Button(value=f"{_letter(i)}  {q.choices[i]}" if i < len(q.choices) else "",
                      visible=i < len(q.choices), variant="primary" if i == chosen else "secondary")
            for i in range(room_store.MAX_CHOICES)]


@user_errors
def join(code, voter, request: gr.Request = None):
    q = room_store.rooms.join(code, _voter_key(request), address=address_of_request(request))
    typed = room_store.normalize(code)
    return (q.text, *_question_updates(q), "Tap your answer. You can change it until the teacher reveals.",
            {"code": typed, "qid": q.qid}, gr.Timer(active=True))


def vote_handler(index: int):
    @user_errors
    def vote(voter, request: gr.Request = None):
        if not isinstance(voter, dict) or "code" not in voter:
            raise ValueError("Join a room first: type the code on the projector and press Join.")
        q, choice = room_store.rooms.vote(voter["code"], _voter_key(request), voter["qid"], index,
                                          address=address_of_request(request))
        return (*_question_updates(q, choice),
                f"Your vote: {_letter(choice)} {q.choices[choice]}. You can change it until the teacher reveals.")
    return vote


@user_errors
def poll(voter):
    """A phone's look for the teacher's next question (or the end of the room); nothing sent when nothing changed."""
    skip = [gr.skip()] * (room_store.MAX_CHOICES + 3)
    if not isinstance(voter, dict) or "code" not in voter:
        return (*skip, gr.Timer(active=False))
    now = room_store.rooms.current(voter["code"])
    if now is None:
        return (gr.skip(), *[gr.Button(visible=False)] * room_store.MAX_CHOICES,
                "The room has ended. Thank you for voting!", None, gr.Timer(active=False))
    q, revealed = now
    if q.qid != voter["qid"]:
        return (q.text, *_question_updates(q), "A new question: tap your answer.", {**voter, "qid": q.qid},
                gr.skip())
    if revealed and not voter.get("revealed"):
        return (*[gr.skip()] * (room_store.MAX_CHOICES + 1), "The answer is on the projector: votes are closed.",
                {**voter, "revealed": True}, gr.skip())
    return (*skip, gr.skip())


def build_join(demo: gr.Blocks) -> None:
    """The vote view (hidden unless the URL carries ``?join``): see the module docstring."""
    with gr.Column(elem_id="join-view"):
        gr.Markdown("## Vote")
        with gr.Row():
            code = gr.Textbox(label="Room code (on the projector)", max_lines=1, scale=3, elem_id="join-code",
                              placeholder="e.g. K7M4QX")
            go = gr.Button("Join", variant="primary", scale=1, min_width=90, elem_id="join-go")
        question = gr.Textbox(show_label=False, interactive=False, container=False, lines=2, elem_id="join-question",
                              placeholder="The question appears here.")
        buttons = [gr.Button(visible=False, size="lg", elem_id=f"join-choice-{i}", elem_classes="vote-choice")
                   for i in range(room_store.MAX_CHOICES)]
        status = gr.Textbox(show_label=False, interactive=False, container=False, elem_id="join-status")
        voter = gr.State(None)  # {"code", "qid"}: which room and question this phone answers
        timer = gr.Timer(POLL_SECONDS, active=False)
    go.click(join, [code, voter], [question, *buttons, status, voter, timer], js=JOIN_CODE_JS, api_name="class_join",
             **lane(CLASS))
    code.submit(join, [code, voter], [question, *buttons, status, voter, timer], api_name="class_join_submit",
                api_visibility="undocumented", **lane(CLASS))
    for i, button in enumerate(buttons):
        button.click(vote_handler(i), [voter], [*buttons, status], api_name=f"class_vote_{i}", **lane(CLASS))
    timer.tick(poll, [voter], [question, *buttons, status, voter, timer], api_name="class_poll",
               show_progress="hidden", **lane(CLASS))
    demo.load(None, js=JOIN_JS, api_name="open_join", api_visibility="private")


# --- the questions each tab asks -----------------------------------------------------------------------------------

def _model_ids(prompt, state, max_tokens: int):
    model, tokenizer, _ = session.get_model(state)
    ids, _, _ = session.encode_with_notice(tokenizer, prompt, min(max_tokens, model.config.max_seq_len))
    return model, tokenizer, ids


def next_token_question(prompt, state, max_tokens: int = 64) -> qs.Question:
    model, tokenizer, ids = _model_ids(prompt, state, max_tokens)
    with session.threads_for(model):
        return qs.next_token(model, tokenizer, ids)


def attention_question(prompt, layer, head, state, max_tokens: int = 64) -> qs.Question:
    from .controls import as_index

    model, tokenizer, ids = _model_ids(prompt, state, max_tokens)
    layer = as_index(layer, model.config.n_layers, "layer")
    head = as_index(head, model.config.n_heads, "head")
    with session.threads_for(model):
        return qs.attended_key(model, tokenizer, ids, layer, head)


def knockout_question(prompt, heads, how, state, max_tokens: int = 64) -> qs.Question:
    model, _, ids = _model_ids(prompt, state, max_tokens)
    chosen = parse_heads(heads, model)
    if not chosen:
        raise ValueError("Choose at least one head to knock out, then ask the class.")
    with session.threads_for(model):
        return qs.knockout_effect(model, ids, chosen, how=HOWS.get(how, "zero"))
