"""The page's own CSS and JavaScript, kept as files in this folder and handed to Gradio through its public API.

- ``css_paths()``: the style sheets, for ``launch(css_paths=...)`` (page.css, vote.css, deck.css).
- ``head()``: plotly_wrappers.js, then present.js, as one ``<script>`` for ``launch(head=...)``: it runs before the
  app mounts, so its wrappers exist before the first figure is drawn. plotly_wrappers.js is the one script that
  wraps Plotly or reads its private fields; every other script calls the functions it puts on ``window`` (``explorerSaveTab``, ``explorerFit``, ...).
- ``script(name, **values)``: a listener's or ``demo.load``'s ``js=``: the file's text, each ``$NAME`` in it
  replaced by ``values[NAME]`` written as JSON.
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
STYLES = ("page.css", "vote.css", "deck.css")
#: The one script allowed to wrap Plotly's functions and read its private fields (tests/test_page_assets.py).
PLOTLY_WRAPPERS = "plotly_wrappers.js"
#: The head's scripts, in order, in one ``<script>``: present.js (projector mode's presented figure) calls the wrappers.
HEAD_SCRIPTS = (PLOTLY_WRAPPERS, "present.js")
_PLACEHOLDER = re.compile(r"\$([A-Z][A-Z0-9_]*)\b")


@functools.cache
def _text(name: str) -> str:
    path = HERE / name
    if path.parent != HERE or not path.is_file():
        raise ValueError(f"{name!r} is not one of the page's files: the files are in {HERE}.")
    return path.read_text(encoding="utf-8")


def css_paths() -> list[str]:
    return [str(HERE / name) for name in STYLES]


def head() -> str:
    texts = [_text(name) for name in HEAD_SCRIPTS]
    for name, text in zip(HEAD_SCRIPTS, texts):
        if "</script" in text.lower():
            raise ValueError(f"{name} must not contain '</script': it would end its <script> tag early.")
    return "<script>\n" + "\n".join(texts) + "</script>"


def script(name: str, **values) -> str:
    """The JS of ``name`` (a file of this folder) with each ``$NAME`` replaced by ``json.dumps(values[NAME])``;
    ValueError when a value is given for no placeholder or a placeholder is left without one."""
    text = _text(name)
    found = set(_PLACEHOLDER.findall(text))
    if set(values) != found:
        raise ValueError(f"{name} takes the values {sorted(found)}, given {sorted(values)}: give exactly those.")
    return _PLACEHOLDER.sub(lambda m: json.dumps(values[m.group(1)]), text)


def text(name: str) -> str:
    """The text of ``name``, a file of this folder, as it is (the phone page's HTML, CSS and script)."""
    return _text(name)
