"""The model a link carries (``model=<id>``) and the lesson step it names (``lesson=<name>&step=<k>``).

``model=`` loads what the header's model picker may load (the default, a snapshot such as ``default@step-900``, a
folder under the model root, a Hub id when the machine is online), through the same checks and memory budgets
(``explorer.state.checkpoints.load_checkpoint``): a link never loads anything the picker could not. A model that
cannot be loaded leaves the page's model in place, and a sentence says so. The page keeps the id of the model it
shows (``page_model_id``) so that every link it makes carries it.
"""
from __future__ import annotations

from explorer import lessons
from explorer.state import checkpoints, session

MAX_ID = 200
LINK_ID = "link_id"  # the state's key: the model id as a link writes it (what was typed to load it)


def page_model_id(state: dict | None) -> str:
    """The id a link writes for the session's model: "default" for the shipped one."""
    state = state or {}
    if state.get("source", "default") == "default":
        return "default"
    return str(state.get(LINK_ID) or "")


def remember(state: dict, typed) -> dict:
    """After a successful load of ``typed`` (the picker's or a link's text): the id the page's links carry."""
    state[LINK_ID] = "default" if state.get("source", "default") == "default" else str(typed).strip()[:MAX_ID]
    return state


def ensure_model(state: dict | None, wanted) -> tuple[dict, str, bool]:
    """(state, sentence, loaded): ``wanted`` loaded for the session unless it already shows it. On failure the
    state is unchanged and the sentence says why; a link's text is only ever loaded as the picker would load it."""
    state = state if isinstance(state, dict) else session.new_state()
    wanted = str(wanted or "").strip()
    if not wanted or wanted == page_model_id(state):
        return state, "", False
    if len(wanted) > MAX_ID:
        return state, f"The link's model id is longer than {MAX_ID} characters: the page keeps its model.", False
    try:
        model, tokenizer, name, cleaned = checkpoints.load_checkpoint(wanted)
    except (ValueError, OSError) as exc:
        shown = checkpoints.shown_name(wanted[:60])
        return state, (f"The link's model {shown!r} was not loaded ({exc}); the page keeps "
                       f"{state.get('name') or session.default_model_name()}."), False
    if model is None:
        session.reset_to_default(state)
    else:
        session.set_model(state, model, tokenizer, name, cleaned)
    return remember(state, wanted), "", True


def expand_lesson(query: dict) -> tuple[dict, list[str], tuple[lessons.Lesson, int] | None]:
    """A query naming ``lesson=<name>`` (and ``step=<k>``, 1-based) as the step's own ``?tab=`` query, with the
    page's ``present`` and ``model`` kept; (query, sentences on what was wrong, (lesson, index) or None)."""
    if "lesson" not in query:
        return query, [], None
    name = str(query.get("lesson"))
    found = deck(name)
    if found is None:
        shown = ", ".join(all_decks()) or "none"
        return {}, [f"There is no lesson {name[:40]!r}: the lessons are {shown}."], None
    try:
        k = lessons.step_index(found, query.get("step"))
    except ValueError as exc:
        return {}, [f"Ignored the link's {exc}"], None
    kept = {key: query[key] for key in ("present", "model", "__theme") if key in query}
    return {**lessons.step_query(found.steps[k]), **kept}, [], (found, k)


_DECKS: dict | None = None


def all_decks() -> dict[str, lessons.Lesson]:
    """Every deck of lessons/, read once (the server does not start on a malformed one)."""
    global _DECKS
    if _DECKS is None:
        _DECKS = lessons.all_lessons()
    return _DECKS


def deck(name: str) -> lessons.Lesson | None:
    return all_decks().get(name)
