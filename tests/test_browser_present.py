"""Projector mode's presented figure (explorer/web/page/present.js) in a real browser: a lesson link's figure and an
action's result take the window, keep what they show, and Esc brings the page back; without projector mode an
action's result is scrolled into view."""
from tests.headless import BROWSER_MARKS, _open, _wait_idle, browser  # noqa: F401 (fixture)

pytestmark = BROWSER_MARKS

HEATMAP = ("tab=attention&prompt=Tom%20gave%20the%20red%20ball%20to%20Anna.%20Anna%20gave%20the%20red%20ball%20to%20Tom."
           "&layer=0&head=3&focus=heatmap")
SHOWN = """(sel) => { const gd = document.querySelector(sel + ' .js-plotly-plot'); const r = gd.getBoundingClientRect();
    return {top: r.top, bottom: r.bottom, height: r.height, width: r.width, z: JSON.stringify(gd.data[0].z),
            title: gd.querySelector('.gtitle').textContent}; }"""


def _settled(page):
    for _ in range(3):
        page.wait_for_timeout(700)
        _wait_idle(page)
    page.wait_for_timeout(1000)


def _landed(browser, query, **size):  # noqa: F811 (fixture)
    page = browser.new_page(viewport=size or {"width": 1280, "height": 720})
    page.goto(query, wait_until="domcontentloaded")
    page.wait_for_function("() => document.body.dataset.focused", timeout=180_000)
    _settled(page)
    return page


def test_a_lesson_link_presents_its_figure_with_the_same_content_and_esc_brings_the_page_back(app_url, browser):  # noqa: F811
    plain = _landed(browser, f"{app_url}?{HEATMAP}")
    sent = plain.evaluate(SHOWN, "#attention-heatmap")
    assert not plain.evaluate("() => document.body.classList.contains('presenting')")  # only in projector mode
    plain.close()
    page = _landed(browser, f"{app_url}?{HEATMAP}&present=1")
    assert page.evaluate("() => document.body.classList.contains('presenting')")
    prompt = page.locator("#tab-attention").get_by_label("Prompt").first
    assert not page.locator("#header-row").is_visible() and not prompt.is_visible()
    assert page.get_by_role("tab", name="Attention", exact=True).is_visible()  # the tab bar stays
    shown = page.evaluate(SHOWN, "#attention-heatmap")
    focused = page.evaluate("() => Math.max(...document.body.dataset.focused.split(' ')"
                            ".map(id => document.getElementById(id).getBoundingClientRect().bottom))")
    assert shown["top"] >= 0 and 720 - 40 <= focused <= 720, (shown, focused)  # the figure and its sentence fill it
    assert shown["width"] >= sent["width"], (shown, sent)  # the controls' column folded away beside it
    assert shown["z"] == sent["z"] and shown["title"] == sent["title"]  # the same data and title
    page.keyboard.press("Escape")
    page.wait_for_timeout(1000)
    assert page.locator("#header-row").is_visible() and prompt.is_visible()
    assert not page.locator("#present-exit").is_visible()
    assert page.evaluate(SHOWN, "#attention-heatmap")["z"] == sent["z"]
    page.close()


def test_an_actions_figure_is_presented_in_projector_mode_and_the_button_brings_the_page_back(app_url, browser):  # noqa: F811
    page, panel = _open(browser, f"{app_url}?tab=attention&present=1", tab="attention")
    panel.get_by_role("button", name="Show attention", exact=True).click()
    _settled(page)
    assert page.evaluate("() => document.body.classList.contains('presenting')")
    shown = page.evaluate(SHOWN, "#attention-heatmap")
    assert shown["top"] >= 0 and 720 - 40 <= shown["bottom"] <= 720, shown  # it fills the window
    page.locator("#present-exit").click()
    page.wait_for_timeout(800)
    assert not page.evaluate("() => document.body.classList.contains('presenting')")
    assert panel.get_by_role("button", name="Show attention", exact=True).is_visible()
    page.close()


def test_without_projector_mode_an_actions_result_is_scrolled_into_view(app_url, browser):  # noqa: F811
    page, panel = _open(browser, f"{app_url}?tab=lora", tab="lora")
    button = panel.get_by_role("button", name="Compare", exact=True)
    button.evaluate("(b) => b.scrollIntoView({block: 'start'})")  # the figure beside it starts above the window
    page.wait_for_timeout(500)
    before = page.locator("#lora-compare").bounding_box()
    assert before["y"] < 0 or before["y"] + before["height"] > 720, before  # not wholly in view: the test means something
    b = button.bounding_box()
    page.mouse.click(b["x"] + b["width"] / 2, b["y"] + b["height"] / 2)  # a visitor's click, with no scrolling of its own
    _settled(page)
    box = page.locator("#lora-compare").bounding_box()
    assert box["y"] >= -1 and box["y"] + box["height"] <= 721, box
    assert not page.evaluate("() => document.body.classList.contains('presenting')")
    page.close()
