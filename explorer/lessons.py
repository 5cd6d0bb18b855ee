"""Lessons as data: a deck of steps that the projector (or a student) steps through, read from ``lessons/<name>.toml``.

A deck is a title and an ordered list of steps; each step has a ``title``, a ``tab`` and its ``settings`` (the keys
that ``?tab=`` links take), the ``focus`` name of the figure it presents, a ``text`` of two to four sentences and,
optionally, a ``question`` (the kind of "Ask the class" question the step's tab asks on its settings). A number the
text quotes is written as a ``{placeholder}``, filled from the loaded model when the step opens
(``explorer.probes.lesson_numbers`` names them), so that one deck stays true on every model.

This module reads and checks the file alone (shape and types, each error naming the step and the field);
``check_links`` checks a deck against the app's tabs, link keys and figure names. docs/decks.md is the guide.
"""
from __future__ import annotations

import re
import string
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

FOLDER = Path(__file__).resolve().parent.parent / "lessons"
NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
MAX_STEPS = 60
MAX_TEXT = 1200  # characters of a step's text
#: The question each tab's "Ask the class" asks (explorer.panels.vote.ask_section), by the kind a deck names.
QUESTION_TABS = {"next_token": "walkthrough", "attention": "attention", "knockout": "experiments"}
STEP_FIELDS = {"title", "tab", "settings", "focus", "text", "question", "minutes"}


@dataclass(frozen=True)
class Step:
    title: str
    tab: str
    focus: str
    text: str
    settings: dict[str, str] = field(default_factory=dict)
    question: str | None = None  # a kind of QUESTION_TABS
    minutes: float | None = None


@dataclass(frozen=True)
class Lesson:
    name: str
    title: str
    steps: tuple[Step, ...]


def placeholders(text: str) -> list[str]:
    """The ``{names}`` a text quotes, in order (``{{`` and ``}}`` are literal braces)."""
    try:
        return [name for _, name, spec, conv in string.Formatter().parse(text) if name is not None]
    except ValueError as exc:
        raise ValueError(f"its braces do not pair up ({exc}): write a number as {{name}}, a brace as {{{{ or }}}}")


def _where(name: str, k: int, step: dict) -> str:
    title = step.get("title") if isinstance(step, dict) else None
    return f"lessons/{name}.toml, step {k + 1}" + (f" ({str(title)[:40]!r})" if isinstance(title, str) else "")


def _text_field(step: dict, key: str, where: str, *, limit: int = 200) -> str:
    value = step.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: the field {key!r} must be a non-empty text.")
    if len(value) > limit:
        raise ValueError(f"{where}: the field {key!r} is longer than {limit} characters.")
    return value.strip()


def parse(name: str, data: dict) -> Lesson:
    """A deck from the TOML's table; ValueError with a sentence naming the step and the field that is wrong."""
    if not NAME.match(name):
        raise ValueError(f"A lesson's name is 1-40 lowercase letters, digits, '-' or '_', got {name[:40]!r}.")
    title = data.get("title")
    if not isinstance(title, str) or not title.strip():
        raise ValueError(f"lessons/{name}.toml: the deck needs a 'title' (a text) at the top.")
    raw = data.get("steps")
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"lessons/{name}.toml: the deck needs steps, each a [[steps]] table.")
    if len(raw) > MAX_STEPS:
        raise ValueError(f"lessons/{name}.toml: {len(raw)} steps, at most {MAX_STEPS}.")
    steps = []
    for k, step in enumerate(raw):
        where = _where(name, k, step)
        if not isinstance(step, dict):
            raise ValueError(f"{where}: a step is a [[steps]] table.")
        unknown = sorted(set(step) - STEP_FIELDS)
        if unknown:
            raise ValueError(f"{where}: unknown field {unknown[0]!r}; a step takes {', '.join(sorted(STEP_FIELDS))}.")
        text = _text_field(step, "text", where, limit=MAX_TEXT)
        try:
            placeholders(text)
        except ValueError as exc:
            raise ValueError(f"{where}: the field 'text': {exc}.") from None
        settings = step.get("settings", {})
        if not isinstance(settings, dict) or any(not isinstance(v, (str, int, float)) or isinstance(v, bool)
                                                 for v in settings.values()):
            raise ValueError(f"{where}: the field 'settings' must be a table of texts and numbers (key = value).")
        question = step.get("question")
        if question is not None and question not in QUESTION_TABS:
            raise ValueError(f"{where}: the field 'question' must be one of {', '.join(QUESTION_TABS)}.")
        minutes = step.get("minutes")
        if minutes is not None and (isinstance(minutes, bool) or not isinstance(minutes, (int, float))
                                    or not 0 < minutes <= 120):
            raise ValueError(f"{where}: the field 'minutes' must be a number of minutes between 0 and 120.")
        steps.append(Step(title=_text_field(step, "title", where), tab=_text_field(step, "tab", where, limit=40),
                          focus=_text_field(step, "focus", where, limit=40), text=text,
                          settings={str(key): _setting(v) for key, v in settings.items()}, question=question,
                          minutes=minutes))
    return Lesson(name, title.strip(), tuple(steps))


def _setting(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def read(path: Path) -> Lesson:
    """The deck in ``path`` (a .toml file), parsed and checked (ValueError naming the step and field)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"lessons/{path.name} is not valid TOML: {exc}.") from None
    return parse(path.stem, data)


def all_lessons(folder: Path = FOLDER) -> dict[str, Lesson]:
    """Every deck of ``folder`` by name (sorted); a malformed one raises: the app does not start on a broken deck."""
    return {p.stem: read(p) for p in sorted(folder.glob("*.toml"))}


def check_links(lesson: Lesson, keys: dict[str, list[str]], focus: dict[str, list[str]], numbers) -> None:
    """ValueError naming the step and field when a step names a tab, key, figure, question or number the app lacks.
    keys: {tab: link keys}; focus: {tab: figure names}; numbers: the placeholder names that can be filled."""
    for k, step in enumerate(lesson.steps):
        where = f"lessons/{lesson.name}.toml, step {k + 1} ({step.title[:40]!r})"
        if step.tab not in keys:
            raise ValueError(f"{where}: the field 'tab' is {step.tab!r}; the tabs are {', '.join(keys)}.")
        for key in step.settings:
            if key not in keys[step.tab]:
                raise ValueError(f"{where}: the field 'settings' has {key!r}, which the {step.tab} tab does not "
                                 f"take; it takes {', '.join(keys[step.tab]) or 'nothing'}.")
        if step.focus not in focus.get(step.tab, []):
            raise ValueError(f"{where}: the field 'focus' is {step.focus!r}; the {step.tab} tab's figures are "
                             f"{', '.join(focus.get(step.tab, [])) or 'none'}.")
        if step.question and QUESTION_TABS[step.question] != step.tab:
            raise ValueError(f"{where}: the field 'question' is {step.question!r}, which the "
                             f"{QUESTION_TABS[step.question]} tab asks, not the {step.tab} tab.")
        for name in placeholders(step.text):
            if name not in numbers:
                raise ValueError(f"{where}: the field 'text' quotes {{{name}}}, which is not a number the app "
                                 f"computes; the numbers are {', '.join(sorted(numbers))}.")


def step_index(lesson: Lesson, raw) -> int:
    """The 0-based index of a link's ``step=k`` (1-based); ValueError with the range otherwise."""
    n = len(lesson.steps)
    try:
        k = int(str(raw if raw is not None else "1").strip())
    except ValueError:
        raise ValueError(f"step must be a whole number from 1 to {n}, got {str(raw)[:20]!r}.") from None
    if not 1 <= k <= n:
        raise ValueError(f"step must be from 1 to {n} (the lesson {lesson.name!r} has {n} steps), got {k}.")
    return k - 1


def step_query(step: Step) -> dict[str, str]:
    """The ``?tab=`` link query that opens ``step`` (its tab, settings and figure)."""
    return {"tab": step.tab, **step.settings, "focus": step.focus}


def step_link(step: Step) -> str:
    """The step's ``?tab=`` link, percent-encoded as a browser writes it."""
    from urllib.parse import quote, urlencode

    return "?" + urlencode(step_query(step), quote_via=quote, safe=",")


def lesson_markdown(lesson: Lesson) -> str:
    """The deck as docs/lesson.md lists it: one numbered line per step, its link and its text, each number shown
    as the name it is computed under (docs/lesson.md's lesson section is this text: tests/test_lessons.py)."""
    lines = []
    for k, step in enumerate(lesson.steps, start=1):
        text = step.text.format(**{name: f"*{name}*" for name in placeholders(step.text)})
        minutes = f"({step.minutes:g} min) " if step.minutes else ""
        ask = f" Ask the class: `{step.question}`." if step.question else ""
        lines.append(f"{k}. {minutes}**{step.title}**: `{step_link(step)}`\n   {text}{ask}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m explorer.lessons intro: the deck as docs/lesson.md lists it
    import sys

    print(lesson_markdown(read(FOLDER / f"{sys.argv[1] if len(sys.argv) > 1 else 'intro'}.toml")), end="")
