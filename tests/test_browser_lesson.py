"""Every link of docs/lesson.md's lesson plan, opened as a lecturer would: Chromium at 1280×720 in projector mode.

Each link lands on its figure (``focus=<name>``, explorer/web/links.py): no error toast, and the figure with its
sentence fully inside the window, with no scrolling.
"""
import re
from pathlib import Path

import pytest

from tests.test_browser import BROWSER_MARKS, _wait_idle, browser  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parent.parent
LESSON = (ROOT / "docs" / "lesson.md").read_text()
LINKS = re.findall(r"`\?([^`]+)`", LESSON[LESSON.index("## A 50-minute lesson"):])
IDS = [str(i + 1) + "-" + re.search(r"tab=(\w+)", q)[1] + ("-" + q.split("focus=")[1] if "focus=" in q else "")
       for i, q in enumerate(LINKS)]

pytestmark = BROWSER_MARKS


def test_the_lesson_has_its_links():
    assert len(LINKS) >= 12 and all("focus=" in q for q in LINKS)


@pytest.mark.parametrize("query", LINKS, ids=IDS)
def test_each_lesson_link_lands_on_its_figure_at_1280x720_in_projector_mode(app_url, browser, query):
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.goto(f"{app_url}?{query}&present=1", wait_until="domcontentloaded")
    page.wait_for_function("() => document.body.dataset.focused", timeout=180_000)
    for _ in range(3):  # any later answer redraws the figure: the page places it again
        page.wait_for_timeout(700)
        _wait_idle(page)
    page.wait_for_timeout(1000)
    toasts = page.locator(".toast-body.error")
    assert toasts.count() == 0, f"error toast: {toasts.first.inner_text()}"
    assert not page.locator("#link-notice").is_visible(), "a lesson link gave a notice"
    ids = page.evaluate("() => document.body.dataset.focused").split()
    assert ids
    for element_id in ids:
        box = page.locator(f"#{element_id}").bounding_box()
        assert box is not None, element_id
        inside = box["y"] >= 0 and box["y"] + box["height"] <= 720 and box["x"] >= 0 and box["x"] + box["width"] <= 1280
        assert inside, f"{element_id} outside the 1280×720 window: {box}"
        plot = page.locator(f"#{element_id} .js-plotly-plot")
        if plot.count():
            assert plot.first.bounding_box()["height"] >= 240, f"{element_id}: figure shrunk below 240 px"
    assert not errors, "\n".join(errors)
    page.close()
