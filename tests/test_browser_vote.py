"""Ask the class in a real browser (Debian's Chromium, headless): the projector page at 1280x720 asks, phones at
390x844 join by link and by typed code, the tally redraws by itself (gr.Timer), Reveal shows the model beside the
class. Screenshots go to artifacts/screenshots/ (and assets/screenshots/ with EXPLORER_SCREENSHOTS_TO_ASSETS=1)."""
from __future__ import annotations

import os

import pytest
from gradio_client import Client

from tests.test_browser import ARTIFACTS, ASSETS, BROWSER_MARKS, _save_small_png, browser  # noqa: F401 (fixture)

pytestmark = BROWSER_MARKS


def _shot(page, name: str, *, full: bool = False) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    png = page.screenshot(full_page=full)
    (ARTIFACTS / name).write_bytes(png)
    if os.environ.get("EXPLORER_SCREENSHOTS_TO_ASSETS") == "1":
        _save_small_png(png, ASSETS / name)


def test_projector_asks_phones_vote_the_tally_redraws_and_reveals(app_url, browser):  # noqa: F811
    errors: list[str] = []
    teacher = browser.new_page(viewport={"width": 1280, "height": 720})
    teacher.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    teacher.goto(app_url + "?present=1", wait_until="domcontentloaded")
    teacher.get_by_text("Ask the class: which token comes next?").click(timeout=60_000)
    teacher.locator("#ask-walkthrough-go").click()
    link = teacher.locator("#ask-walkthrough-link textarea, #ask-walkthrough-link input").first
    teacher.wait_for_function("() => { const e = document.querySelector('#ask-walkthrough-link textarea, "
                              "#ask-walkthrough-link input'); return e && e.value.includes('?join='); }",
                              timeout=120_000)
    url = link.input_value()
    code = url.rsplit("=", 1)[1]
    assert url == f"{app_url}?join={code}"
    assert teacher.locator("#ask-walkthrough-qr img").count() == 1
    assert teacher.evaluate("() => document.querySelector('#ask-walkthrough-qr img').naturalWidth") > 200

    # a phone opens the link: the question and its choices, nothing else, no sideways scrolling
    phone = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True,
                             has_touch=True)
    phone.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    phone.goto(url, wait_until="domcontentloaded")
    phone.locator("#join-choice-0").wait_for(state="visible", timeout=60_000)
    assert phone.locator("#join-question textarea").input_value().startswith("Which token")
    for hidden in ("#header-row", ".tabs", "#glossary"):
        assert not phone.locator(hidden).first.is_visible()
    assert phone.evaluate("() => document.documentElement.scrollWidth") <= 390
    choices = [phone.locator(f"#join-choice-{i}") for i in range(6) if phone.locator(f"#join-choice-{i}").is_visible()]
    assert 2 <= len(choices) <= 6 and all(c.bounding_box()["height"] >= 56 for c in choices)
    choices[1].click()
    phone.wait_for_function("() => (document.querySelector('#join-status textarea') || {}).value"
                            "?.startsWith('Your vote: B')", timeout=30_000)
    phone.wait_for_timeout(800)  # the pressed button's own pending state passes
    _shot(phone, "vote-phone.png")

    # a second phone types the code instead
    typed = browser.new_page(viewport={"width": 390, "height": 844})
    typed.goto(app_url + "?join=", wait_until="domcontentloaded")
    typed.locator("#join-code textarea, #join-code input").first.fill(code.lower(), timeout=60_000)
    typed.locator("#join-go").click()
    typed.locator("#join-choice-0").wait_for(state="visible", timeout=30_000)
    typed.locator("#join-choice-0").click()

    # more of the class votes through the API; the projector's tally redraws by itself
    for i in range(10):
        v = Client(app_url, verbose=False)
        v.predict(code, api_name="/class_join")
        v.predict(api_name=f"/class_vote_{[0, 0, 1, 1, 1, 1, 2, 0, 1, 3][i] % len(choices)}")
    teacher.wait_for_function("() => (document.querySelector('#ask-walkthrough-counts') || {}).innerText"
                              "?.includes('12 votes')", timeout=30_000)
    teacher.locator("#ask-walkthrough").scroll_into_view_if_needed()
    teacher.evaluate("() => document.querySelector('#ask-walkthrough').scrollIntoView({block: 'start'})")
    teacher.wait_for_timeout(500)
    _shot(teacher, "vote-projector-live.png")

    teacher.locator("#ask-walkthrough-reveal").click()
    teacher.wait_for_function("() => (document.querySelector('#ask-walkthrough-counts') || {}).innerText"
                              "?.includes('the model gave it')", timeout=30_000)
    teacher.wait_for_timeout(500)
    _shot(teacher, "vote-projector-reveal.png")
    phone.wait_for_function("() => (document.querySelector('#join-status textarea') || {}).value"
                            "?.includes('votes are closed')", timeout=30_000)
    assert not [e for e in errors if "favicon" not in e], errors


def _ask_in_browser(page, app_url: str) -> str:
    page.goto(app_url, wait_until="domcontentloaded")
    page.get_by_text("Ask the class: which token comes next?").click(timeout=60_000)
    page.locator("#ask-walkthrough-go").click()
    page.wait_for_function("() => { const e = document.querySelector('#ask-walkthrough-link textarea, "
                           "#ask-walkthrough-link input'); return e && e.value.includes('?join='); }",
                           timeout=120_000)
    return page.locator("#ask-walkthrough-link textarea, #ask-walkthrough-link input").first.input_value()


def test_a_reload_asks_in_the_same_room_and_a_loopback_server_says_phones_cannot_reach_it(app_url, browser):  # noqa: F811
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    teacher = context.new_page()
    first = _ask_in_browser(teacher, app_url)
    assert len(teacher.evaluate("() => localStorage.getItem('explorer-lecturer')")) == 48
    reach = teacher.locator("#ask-walkthrough-reach")
    assert "Phones cannot open this link" in reach.inner_text() and "GRADIO_SERVER_NAME=0.0.0.0" in reach.inner_text()
    assert _ask_in_browser(teacher, app_url) == first  # reloaded: the page's state is gone, its browser id is not
    other_context = browser.new_context()
    other = other_context.new_page()  # another browser: a room of its own
    assert _ask_in_browser(other, app_url) != first
    for page in (teacher, other):
        page.locator("#ask-walkthrough-close").click()
        page.wait_for_function("() => (document.querySelector('#ask-walkthrough-counts') || {}).innerText"
                               "?.includes('The room is closed')", timeout=30_000)
    context.close()
    other_context.close()
