"""The intro deck driven as a lecturer drives it: Chromium at 1280×720 in projector mode, ``?lesson=intro``, every
step in turn (the arrow key, the Next button), on the shipped model and on a model at SmolLM2-135M's shape (30
layers, random weights, written once into the test session's model root). Each step must show its figure, fully in
the window above the deck's bar, with no error, the position "k / N" and the loaded model's name; its "Ask the class"
must open a room.

Phones: three phone pages (390x844, each a browser of its own) join the lecture's room once, at the first
question; every later question must reach them without a re-join, and the tally must count their three votes.
"""
from __future__ import annotations

import pytest

from explorer.web import link_model
from tests.headless import ARTIFACTS, BROWSER_MARKS, _wait_idle, browser  # noqa: F401 (fixture)

pytestmark = BROWSER_MARKS
WIDTH, HEIGHT = 1280, 720


BUSY = ".progress-text, .progress-level, .eta-bar, .meta-text, .meta-text-center"


def _quiet(page) -> None:
    """Until no answer is pending on the page, but for a class's live tally (it redraws every second)."""
    page.wait_for_function(f"() => ![...document.querySelectorAll('{BUSY}')].some(e => !e.closest('[id^=\"ask-\"]'))",
                           timeout=600_000)


def _settled(page, k: int) -> None:
    page.wait_for_function(f"() => document.body.dataset.lessonStep === '{k}' && document.body.dataset.focused",
                           timeout=600_000)
    for _ in range(3):  # a later answer redraws the figure: the page places it again
        page.wait_for_timeout(700)
        _quiet(page)
    page.wait_for_timeout(800)


def on_question(browser, page, step, phones: list) -> None:  # noqa: F811 (fixture name)
    """The step's "Ask the class": the lecture's one room asks the step's question; three phones join at the first
    question only, each later one reaches them by itself, and each phone's vote is counted on the projector."""
    before = [p.locator("#question").inner_text() for p in phones]  # before the ask: a push may come at once
    page.locator("#lesson-ask").click()
    link = f"#ask-{step.tab}-link textarea, #ask-{step.tab}-link input"
    page.wait_for_function(f"() => ((document.querySelector('{link}') || {{}}).value || '').includes('vote?code=')",
                           timeout=300_000)
    url = page.locator(link).first.input_value()
    assert len(page.locator(f"#ask-{step.tab}-code").inner_text().strip()) == 6
    if not phones:
        for _ in range(3):
            phone = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
            phone.goto(url, wait_until="domcontentloaded")
            phones.append(phone)
        before = [""] * 3
    else:
        assert all(p.url == phones[0].url for p in phones) and phones[0].url == url, "the room changed: phones re-join"
    for i, phone in enumerate(phones):
        try:
            phone.wait_for_function("(old) => { const q = document.querySelector('#question').textContent; "
                                    "const b = document.querySelector('#choice-0'); return q && q !== old && b && !b.disabled; }",
                                    arg=before[i], timeout=60_000)
        except Exception as e:
            raise AssertionError(f"step {step.title}: phone {i} shows {phone.locator('#question').inner_text()!r}, "
                                 f"{phone.locator('#status').inner_text()!r} (before: {before[i]!r})") from e
        phone.locator(f"#choice-{i % phone.locator('.choice').count()}").click()
        phone.wait_for_function("() => document.querySelector('#status').textContent.startsWith('Your vote:')",
                                timeout=30_000)
    page.wait_for_function(f"() => (document.querySelector('#ask-{step.tab}-counts') || {{}}).innerText"
                           "?.includes('3 votes')", timeout=30_000)


def drive(browser, url: str, model_name: str, tag: str) -> None:  # noqa: F811 (fixture name)
    lesson = link_model.deck("intro")
    n = len(lesson.steps)
    page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.goto(url, wait_until="domcontentloaded")
    phones: list = []
    for k, step in enumerate(lesson.steps, start=1):
        _settled(page, k)
        where = f"{tag} step {k} ({step.tab}, {step.focus})"
        toasts = page.locator(".toast-body.error")
        assert toasts.count() == 0, f"{where}: error toast: {toasts.first.inner_text()}"
        assert not page.locator("#link-notice").is_visible(), f"{where}: {page.locator('#link-notice').input_value()}"
        assert page.locator("#lesson-position").inner_text().strip() == f"{k} / {n}", where
        text = page.locator("#lesson-text").inner_text()
        assert step.title in text and f"Model: {model_name}" in text and "not computable" not in text, (where, text)
        bar = page.locator("#lesson-bar").bounding_box()
        assert bar and bar["y"] + bar["height"] <= HEIGHT + 1, where
        ids = page.evaluate("() => document.body.dataset.focused").split()
        for element_id in ids:
            box = page.locator(f"#{element_id}").bounding_box()
            assert box is not None, f"{where}: {element_id}"
            inside = box["y"] >= 0 and box["y"] + box["height"] <= bar["y"] + 1 and box["x"] >= 0 \
                and box["x"] + box["width"] <= WIDTH
            assert inside, f"{where}: {element_id} not above the deck's bar in the window: {box}, bar {bar}"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"deck-{tag}-{k:02d}-{step.tab}.png"))
        if step.question:
            on_question(browser, page, step, phones)
        if k < n:  # the arrow key, and now and then the button
            page.locator("#lesson-next").click() if k % 4 == 0 else page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")  # past the last step: it stays
    page.wait_for_timeout(500)
    assert page.locator("#lesson-position").inner_text().strip() == f"{n} / {n}"
    assert not errors, "\n".join(errors)
    assert len(phones) == 3, "the deck asked no question"
    asked = [s for s in lesson.steps if s.question][-1].tab
    # the lecture's end, from a tab no longer shown: its room ends on every phone
    page.evaluate(f"() => document.getElementById('ask-{asked}-close').click()")
    for phone in phones:
        phone.wait_for_function("() => document.querySelector('#status').textContent.includes('room has ended')",
                                timeout=40_000)
        phone.close()
    page.close()


def test_the_intro_deck_on_the_shipped_model_at_1280x720_in_projector_mode(app_url, browser):  # noqa: F811
    from explorer.state.folders import default_model_name

    drive(browser, f"{app_url}?lesson=intro&present=1", default_model_name(), "shipped")


def test_the_intro_deck_on_a_smollm2_shape_model_at_1280x720_in_projector_mode(app_url, browser, smol_shape):  # noqa: F811
    drive(browser, f"{app_url}?lesson=intro&present=1&model={smol_shape}", f"{smol_shape} (local)", "smol")


def test_links_carry_the_model_and_projector_and_test_this_head_stays_in_the_tab(app_url, browser):  # noqa: F811
    """A link's model=<folder> is loaded before its view; Copy link and "Test this head" carry it and present=1;
    "Test this head" opens Experiments in the same browser tab; a model that cannot load is named in a sentence."""
    context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
    page = context.new_page()
    prompt = "Tom gave the red ball to Anna. Anna gave the red ball to"
    page.goto(f"{app_url}?tab=attention&prompt={prompt}&layer=1&head=1&focus=heatmap&model=tiny-local&present=1",
              wait_until="domcontentloaded")
    page.wait_for_function("() => document.body.dataset.focused", timeout=300_000)
    _wait_idle(page)
    page.keyboard.press("Escape")  # projector mode presents the linked figure alone: Esc brings the page back
    page.wait_for_timeout(500)
    assert page.locator("#page-model textarea, #page-model input").first.input_value() == "tiny-local"
    assert page.locator("#header-model input").first.input_value() == "tiny-local"  # the header names it too
    assert "tiny-local (local)" in page.locator("#attention-head-sentence").inner_text() or \
        "tiny-local" in page.locator("#tab-attention").inner_text()
    page.locator("#copy-link").click()
    page.wait_for_function("() => (document.querySelector('#view-link textarea, #view-link input') || {}).value", timeout=30_000)
    copied = page.locator("#view-link textarea, #view-link input").first.input_value()
    assert "tab=attention" in copied and "model=tiny-local" in copied and "present=1" in copied, copied
    page.get_by_text("Test this head").click()
    page.wait_for_function("() => location.search.includes('tab=experiments')", timeout=30_000)
    page.wait_for_function("() => (document.body.dataset.focused || '').includes('experiments-loss')", timeout=300_000)
    _wait_idle(page)
    page.keyboard.press("Escape")
    page.wait_for_timeout(500)
    assert len(context.pages) == 1, "Test this head opened another browser tab"
    url = page.evaluate("() => location.href")
    assert "heads=1.1" in url and "model=tiny-local" in url and "present=1" in url, url
    assert "tiny-local" in page.locator("#experiments-loss-summary").inner_text()
    assert page.locator("#tab-experiments").is_visible()
    page.goto(f"{app_url}?tab=attention&layer=1&model=no-such-folder", wait_until="domcontentloaded")
    page.locator("#link-notice").wait_for(state="visible", timeout=120_000)
    said = page.locator("#link-notice textarea, #link-notice input").first.input_value()
    assert "no-such-folder" in said and "was not loaded" in said and "the page keeps" in said, said
    context.close()


def test_a_student_steps_through_the_deck_on_a_390_px_phone(app_url, browser):  # noqa: F811
    """The same deck link without present=1 on a phone: the bar (its sentences, the position, Previous and Next on
    one row) stays at the bottom of the window, the step's figure is placed above it, nothing scrolls sideways."""
    page = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    page.goto(f"{app_url}?lesson=intro&step=4", wait_until="domcontentloaded")
    for k in (4, 5):
        _settled(page, k)
        bar = page.locator("#lesson-bar").bounding_box()
        assert bar and bar["y"] >= 844 * 0.5 and bar["y"] + bar["height"] <= 844 + 1, (k, bar)
        assert page.locator("#lesson-position").inner_text().strip() == f"{k} / 13"
        buttons = [page.locator(f"#{i}").bounding_box() for i in ("lesson-prev", "lesson-next")]
        assert all(b and b["y"] >= bar["y"] and b["y"] + b["height"] <= 845 for b in buttons), (k, buttons)
        assert abs(buttons[0]["y"] - buttons[1]["y"]) < 8, f"Previous and Next on one row: {buttons}"
        for element_id in page.evaluate("() => document.body.dataset.focused").split():
            box = page.locator(f"#{element_id}").bounding_box()
            assert box and box["y"] >= 0 and box["y"] + box["height"] <= bar["y"] + 1, (k, element_id, box, bar)
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
        if k == 4:
            page.locator("#lesson-next").tap()
    page.close()
