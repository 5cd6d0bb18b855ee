"""Ask the class: a question with choices the model's run made, phones vote, the projector tallies and reveals.

Two pieces:

``ask_section(demo, tab, question_fn, inputs)``, inside a tab: "Ask the class" computes a question from the tab's
current inputs (``explorer.probes.questions``), opens a room (``explorer.state.rooms``) and shows its join link
(text and QR code) and short code; a ``gr.Timer`` redraws the tally about every second while the room is open;
"Reveal" shows the model's value for each choice beside the class's share, with one sentence; "Close" ends the
room. The room's secret lives only in this page's ``gr.State``: a voter's page cannot reveal or close.

One room per lecture: the first "Ask the class" of a page opens it, and every later question, from any section or
tab of the same page, is asked in it (same code, same join link), so phones that joined once get each new question
by themselves. Ask also sends the browser's lecturer id (``page_url.js``, kept in localStorage), so a reloaded
page asks in the same room too. The section that asked last polls the tally (more slowly after the reveal), which
keeps the room alive: a room whose page stops asking ends (``explorer.state.rooms``). "Close the room" ends it;
"Tallies as CSV" gives every question's counts (nothing about a voter).

The phones vote on a page of their own, beside Gradio and outside its queue (``explorer.web.hall``: the join link
``…/vote?code=CODE``; the old ``?join=CODE`` links are redirected there).
"""
from __future__ import annotations

import base64
import csv
import html
import io
import re
import tempfile
import weakref
from pathlib import Path
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
MAX_URL = 200
_URL_PATH = re.compile(r"^[A-Za-z0-9/._~-]*$")
_HOST = re.compile(r"^[A-Za-z0-9.-]+(:\d{1,5})?$|^\[[0-9A-Fa-f:]+\](:\d{1,5})?$")

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


MAX_KEPT = 200  # questions of closed rooms a page keeps for its CSV


def _kept(owner) -> dict:
    """What a page keeps across its rooms: the tallies of closed rooms and the model's values per question."""
    owner = owner if isinstance(owner, dict) else {}
    return {"past": list(owner.get("past", []))[-MAX_KEPT:], "answers": dict(owner.get("answers", {}))}


# --- the teacher's page ---------------------------------------------------------------------------------------

def lecturer_key(browser) -> str | None:
    """The room's owner for this browser's Ask, whatever the tab (one room per lecture: a reload of the page asks
    in the same room), or None when the page sent no usable id (an API client: a room each time)."""
    return browser if isinstance(browser, str) and _LECTURER.match(browser) else None


def ask_handler(question_fn, tab: str = "", demo: gr.Blocks | None = None):
    """The Ask button's handler: ``(*values, owner, browser, page_url)`` -> (QR, link, code, figure, counts, timer,
    owner, reach). The page's open room is reused (its phones get the question by themselves), else this
    browser's (after a reload); a new one opens when there is none or it has ended. ``demo`` tells where the
    server listens, for a join link phones can open."""
    @user_errors
    @gpu(30)
    def ask(*args, request: gr.Request = None):
        *values, owner, browser, raw_url = args
        question = question_fn(*values)  # the model runs here, holding no room lock
        store = room_store.rooms
        code = secret = None
        kept = _kept(owner)
        if isinstance(owner, dict) and "code" in owner:
            try:
                qid = store.ask(owner["code"], owner["secret"], question.text, question.choices)
                code, secret = owner["code"], owner["secret"]
            except ValueError:  # the room ended: open a new one
                code = None
        if code is None:
            code, secret, qid = store.open(question.text, question.choices, owner=lecturer_key(browser),
                                           address=address_of_request(request))
        kept["answers"][qid] = (question.value_name, tuple(question.values))
        owner = {"code": code, "secret": secret, "question": question, "version": -1, "tab": tab, **kept}
        base, reach = join_base(page_base(raw_url, request), getattr(demo, "server_name", None),
                                share_url=getattr(demo, "share_url", None))
        link = f"{base}vote?code={code}"
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
    if not t.revealed:
        return _figure(q, t, False), _teacher_text(t.text, t), gr.skip()
    # revealed, perhaps from another section: this one slows to the heartbeat that keeps the room alive
    return _figure(q, t, True), _revealed_text(q, t), gr.Timer(HEARTBEAT_SECONDS, active=True)


def tally_handler(tab: str | None):
    """``tally`` for the section of ``tab``: it stops redrawing once another section asked the room's question."""
    @user_errors
    def section_tally(owner):
        if isinstance(owner, dict) and "code" in owner and owner.get("tab") != tab:
            return (gr.skip(), "The room's current question was asked in another section of this page: its tally "
                    "is there (same room, same code).", gr.Timer(active=False))
        return tally(owner)
    return section_tally


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
    kept = _kept(owner)
    try:  # the tallies stay with this page for its CSV; the server keeps nothing of the room
        kept["past"] = (kept["past"] + room_store.rooms.tallies(owner["code"], owner["secret"]))[-MAX_KEPT:]
    except ValueError:
        pass
    room_store.rooms.close(owner["code"], owner["secret"])
    return ("", "", gr.Markdown("", visible=False), None, "The room is closed: the server keeps nothing of it "
            "(this page keeps its tallies for the CSV until you leave it).", gr.Timer(active=False), kept)


def _cell(value) -> str:
    """A CSV cell a spreadsheet shows as text: one starting with = + - @ would be read as a formula."""
    text = str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def tallies_csv(tallies, answers: dict) -> str:
    """Each question's counts, one row per choice: the question, the choice, its votes and share, whether it was
    revealed, and the model's value for it. Nothing about a voter: the rooms keep none."""
    out = io.StringIO()
    rows = csv.writer(out)
    rows.writerow(["question", "question_text", "choice", "choice_text", "votes", "share_percent", "revealed",
                   "model_value_name", "model_value"])
    for n, t in enumerate(tallies, 1):
        name, values = answers.get(t.qid, ("", ()))
        for i, (choice, count) in enumerate(zip(t.choices, t.counts)):
            share = f"{100 * count / t.total:.1f}" if t.total else "0.0"
            value = f"{values[i]:.6g}" if i < len(values) else ""
            rows.writerow([n, _cell(t.text), _letter(i), _cell(choice), count, share, "yes" if t.revealed else "no",
                           name, value])
    return out.getvalue()


CSV_DIR = Path(tempfile.gettempdir()) / "explorer-tallies"
MAX_CSV_FILES = 50


@user_errors
def tallies_file(owner):
    """The page's tallies as a CSV file for its download button (the newest ``MAX_CSV_FILES`` kept on disk)."""
    kept = _kept(owner)
    tallies = list(kept["past"])
    if isinstance(owner, dict) and "code" in owner:
        try:
            tallies += room_store.rooms.tallies(owner["code"], owner["secret"])
        except ValueError:
            pass
    if not tallies:
        raise ValueError("No question has been asked on this page yet: press \"Ask the class\" first.")
    CSV_DIR.mkdir(parents=True, exist_ok=True)
    for old in sorted(CSV_DIR.glob("*.csv"), key=lambda p: p.stat().st_mtime)[:-MAX_CSV_FILES]:
        old.unlink(missing_ok=True)
    handle = tempfile.NamedTemporaryFile("w", suffix=".csv", prefix="class-tallies-", dir=CSV_DIR, delete=False,
                                         encoding="utf-8", newline="")
    with handle:
        handle.write(tallies_csv(tallies, kept["answers"]))
    return gr.DownloadButton(value=handle.name, visible=True)


#: Per app: the one page-wide room state every Ask section shares (one room for the lecture).
_ROOMS: "weakref.WeakKeyDictionary[gr.Blocks, gr.State]" = weakref.WeakKeyDictionary()


def page_room(demo: gr.Blocks) -> gr.State:
    """The page's room state, made by the first Ask section built in ``demo``: {"code", "secret", "question",
    "version", "tab", "past", "answers"}; the room's key stays on the server."""
    if demo not in _ROOMS:
        _ROOMS[demo] = gr.State(None)
    return _ROOMS[demo]


def ask_section(demo: gr.Blocks, tab: str, question_fn, inputs: list, *, what: str) -> None:
    """An "Ask the class" accordion in ``tab``: ``question_fn(*values of inputs)`` returns a ``Question``."""
    with gr.Accordion(f"Ask the class: {what}", open=False, elem_id=f"ask-{tab}"):
        gr.Markdown("Students predict on their phones before the model answers: **Ask** shows a question with "
                    "choices computed from the model for the settings above, **Reveal** shows the model's answer "
                    "beside the votes. The page's first question opens a room; later ones, from any tab or after a "
                    f"reload, reuse it, and joined phones get them by themselves. Rooms last {room_store.ROOM_MINUTES:g} "
                    f"minutes, at most {room_store.MAX_VOTES} votes each.")
        with gr.Row():
            ask = gr.Button("Ask the class", variant="primary", elem_id=f"ask-{tab}-go")
            show = gr.Button("Reveal the model's answer", elem_id=f"ask-{tab}-reveal")
            end = gr.Button("Close the room", elem_id=f"ask-{tab}-close")
            table = gr.Button("Tallies as CSV", elem_id=f"ask-{tab}-csv")
            download = gr.DownloadButton("⬇ class-tallies.csv", visible=False, elem_id=f"ask-{tab}-download")
        with gr.Row():
            with gr.Column(scale=1, min_width=240):
                qr = gr.Markdown(elem_id=f"ask-{tab}-qr")
                code_md = gr.Markdown(visible=False, elem_classes="room-code", elem_id=f"ask-{tab}-code")
                link = gr.Textbox(label="Join link", interactive=False, buttons=["copy"], max_lines=1,
                                  elem_id=f"ask-{tab}-link",
                                  info="Scan the QR code or open the link on a phone; or open …/vote and type the "
                                       "room code. One vote per phone, changeable until you reveal.")
            with gr.Column(scale=2):
                plot = gr.Plot(label="Votes", elem_id=f"ask-{tab}-tally")
                counts = gr.Markdown(elem_id=f"ask-{tab}-counts")
        reach = gr.Markdown(visible=False, elem_id=f"ask-{tab}-reach")  # when phones cannot open the link
        browser = gr.Textbox(visible=False)  # this browser's lecturer id (page_url.js)
        page_url = gr.Textbox(visible=False)
        owner = page_room(demo)
        timer = gr.Timer(TALLY_SECONDS, active=False)
    ask.click(ask_handler(question_fn, tab, demo), [*inputs, owner, browser, page_url],
              [qr, link, code_md, plot, counts, timer, owner, reach], js=PAGE_URL_JS, api_name=f"ask_class_{tab}",
              **lane(VIEW))
    timer.tick(tally_handler(tab), [owner], [plot, counts, timer], api_name=f"class_tally_{tab}",
               show_progress="hidden", **lane(CLASS))
    show.click(reveal, [owner], [plot, counts, timer], api_name=f"class_reveal_{tab}", **lane(CLASS))
    end.click(close, [owner], [qr, link, code_md, plot, counts, timer, owner], api_name=f"class_close_{tab}",
              **lane(CLASS))
    table.click(tallies_file, [owner], [download], api_name=f"class_csv_{tab}", **lane(CLASS))


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
