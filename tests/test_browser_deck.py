"""The intro deck driven as a lecturer drives it: Chromium at 1280×720 in projector mode, ``?lesson=intro``, every
step in turn (the arrow key, the Next button), on the shipped model and on a model at SmolLM2-135M's shape (30
layers, random weights, written once into the test session's model root). Each step must show its figure, fully in
the window above the deck's bar, with no error, the position "k / N" and the loaded model's name; its "Ask the class"
must open a room.

Phones: ``on_question`` is where each question step is asked; once the light phone page and the one room per
lecture exist, it is the place to join phones at the first question and check that every later one reaches them.
"""
from __future__ import annotations

import pytest

from explorer.web import link_model
from tests.headless import ARTIFACTS, BROWSER_MARKS, _wait_idle, browser  # noqa: F401 (fixture)

pytestmark = BROWSER_MARKS
WIDTH, HEIGHT = 1280, 720


@pytest.fixture(scope="module")
def smol_shape(model_root) -> str:
    """A SmolLM2-135M-shape folder (random weights, the shipped tokenizer) under the app's model root: its id."""
    from explorer.bench.flood import write_smol_shape_folder

    folder = model_root / "smol-shape"
    if not (folder / "config.json").is_file():
        write_smol_shape_folder(folder)
    return folder.name


def _settled(page, k: int) -> None:
    page.wait_for_function(f"() => document.body.dataset.lessonStep === '{k}' && document.body.dataset.focused",
                           timeout=600_000)
    for _ in range(3):  # a later answer redraws the figure: the page places it again
        page.wait_for_timeout(700)
        _wait_idle(page, timeout_ms=600_000)
    page.wait_for_timeout(800)


def on_question(page, step) -> None:
    """The step's "Ask the class": its tab's room opens with a code (phones join here once rooms are shared)."""
    page.locator("#lesson-ask").click()
    page.locator(f"#ask-{step.tab}-code").wait_for(state="visible", timeout=300_000)
    assert len(page.locator(f"#ask-{step.tab}-code").inner_text().strip()) == 6


def drive(browser, url: str, model_name: str, tag: str) -> None:  # noqa: F811 (fixture name)
    lesson = link_model.deck("intro")
    n = len(lesson.steps)
    page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.goto(url, wait_until="domcontentloaded")
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
            on_question(page, step)
        if k < n:  # the arrow key, and now and then the button
            page.locator("#lesson-next").click() if k % 4 == 0 else page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")  # past the last step: it stays
    page.wait_for_timeout(500)
    assert page.locator("#lesson-position").inner_text().strip() == f"{n} / {n}"
    assert not errors, "\n".join(errors)
    page.close()


def test_the_intro_deck_on_the_shipped_model_at_1280x720_in_projector_mode(app_url, browser):  # noqa: F811
    from explorer.state.folders import default_model_name

    drive(browser, f"{app_url}?lesson=intro&present=1", default_model_name(), "shipped")


def test_the_intro_deck_on_a_smollm2_shape_model_at_1280x720_in_projector_mode(app_url, browser, smol_shape):  # noqa: F811
    drive(browser, f"{app_url}?lesson=intro&present=1&model={smol_shape}", f"{smol_shape} (local)", "smol")
