"""The app in a real browser: Debian's Chromium driven by Playwright, headless, offline.

Opens the page, visits every tab, waits for a rendered Plotly chart in each, runs each tab's main action,
and fails on any console error or error toast. Screenshots go to artifacts/screenshots/ (git-ignored); the README's
are taken by the layout audit (``python -m tests.layout_audit ... --to-assets``).
"""
import time
from pathlib import Path

# test_browser_vote.py and test_browser_lesson.py import the shared pieces from here as well.
from tests.headless import (ARTIFACTS, ASSETS, BROWSER_MARKS, TABS, _open, _save_small_png, _wait_idle,  # noqa: F401
                            browser)

pytestmark = BROWSER_MARKS


def test_every_tab_renders_runs_and_logs_no_errors(app_url, browser):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.goto(app_url, wait_until="domcontentloaded")
    page.get_by_role("tab", name="Attention").wait_for(timeout=60_000)

    for label, tab_id, button in TABS:
        page.get_by_role("tab", name=label, exact=True).click()
        panel = page.locator(f"#tab-{tab_id}")
        panel.wait_for(state="visible", timeout=30_000)
        plot = panel.locator(".js-plotly-plot").first
        plot.wait_for(state="visible", timeout=120_000)  # the tab's example, computed at page load
        _wait_idle(page)
        if tab_id == "positions":  # an action that changes something: another rope_theta
            panel.get_by_label("rope_theta (θ)").fill("100")
        if button is not None:
            action = panel.get_by_role("button", name=button, exact=True)
        else:
            action = panel.locator("button.primary").first
        action.click()
        for _ in range(3):  # a queued event shows its progress only once it starts: settle, look again
            page.wait_for_timeout(700)
            _wait_idle(page)
        assert panel.locator(".js-plotly-plot").first.is_visible(), f"{label}: no chart after its action"
        toasts = page.locator(".toast-body.error")
        assert toasts.count() == 0, f"{label}: error toast: {toasts.first.inner_text()}"
        # the tab bar at the top of the picture: controls and first figures in view
        page.evaluate("window.scrollTo(0, document.querySelector('[role=tablist]').getBoundingClientRect().top"
                      " + window.scrollY - 8)")
        page.wait_for_timeout(200)
        shot = page.screenshot()
        (ARTIFACTS / f"{tab_id}.png").write_bytes(shot)
    assert not errors, "\n".join(errors)
    page.close()


def test_bad_input_shows_an_error_message_not_a_traceback(app_url, browser):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(app_url, wait_until="domcontentloaded")
    page.get_by_role("tab", name="Attention", exact=True).click()  # the walkthrough is the first tab
    panel = page.locator("#tab-attention")
    panel.locator(".js-plotly-plot").first.wait_for(state="visible", timeout=120_000)
    _wait_idle(page)
    box = panel.get_by_label("Prompt")
    box.fill("   ")
    panel.get_by_role("button", name="Show attention", exact=True).click()
    toast = page.locator(".toast-body.error").first
    toast.wait_for(state="visible", timeout=30_000)
    text = toast.inner_text()
    assert "The prompt is empty" in text and "Traceback" not in text
    page.close()


def test_generated_text_never_splits_a_word_across_lines(app_url, browser):
    # a phone's width: the generated text wraps over many lines
    page, panel = _open(browser, f"{app_url}?tab=generation", tab="generation", width=390, height=844)
    split_words = """(root) => { const out = {words: 0, split: []};
        for (const el of root.querySelectorAll('[data-testid=highlighted-text] .text')) {
          for (const node of el.childNodes) {
            if (node.nodeType !== Node.TEXT_NODE) continue;
            for (const m of node.textContent.matchAll(/\\S+/g)) {
              const r = document.createRange();
              r.setStart(node, m.index);
              r.setEnd(node, m.index + m[0].length);
              const lines = new Set([...r.getClientRects()].filter(b => b.width > 0).map(b => Math.round(b.top)));
              out.words += 1;
              if (lines.size > 1) out.split.push(m[0]);
            }
          }
        }
        return out; }"""
    root = panel.element_handle()
    seen = page.evaluate(split_words, root)
    assert seen["words"] > 30, seen  # the opening example's generated text is there
    assert seen["split"] == [], f"words split across lines: {seen['split']}"
    # the check sees a split when there is one: Gradio's own style (break anywhere) splits some words
    page.add_style_tag(content="#tab-generation [data-testid=highlighted-text] .text {word-break: break-all !important}")
    page.wait_for_timeout(200)
    assert page.evaluate(split_words, root)["split"], "break-all split no word: the check cannot see a split"
    page.close()


def _term_used(term: str, text: str) -> bool:
    import re

    return re.search(rf"(?<![\w|/-]){re.escape(term)}(s|es)?(?![\w|/-])", text, re.IGNORECASE) is not None


def test_every_glossary_term_in_an_intro_is_marked_with_its_definition(app_url, browser):
    import re

    from explorer import glossary

    page, _ = _open(browser, app_url, tab="walkthrough")
    checked = 0
    for label, tab_id, _ in TABS:
        page.get_by_role("tab", name=label, exact=True).click()
        intro = page.locator(f"#tab-{tab_id} .intro")
        intro.wait_for(timeout=30_000)
        text = intro.text_content()
        marks = intro.locator("abbr.term").evaluate_all("els => els.map(e => [e.textContent, e.title])")
        for shown, title in marks:
            assert title in glossary.TERMS.values(), (tab_id, shown, title)
        for term, meaning in glossary.TERMS.items():
            # a use inside a longer term ("logit" in "logit lens") is that term's
            rest = text
            for longer in glossary.TERMS:
                if term.lower() in longer.lower() and longer != term:
                    rest = re.sub(re.escape(longer), " ", rest, flags=re.IGNORECASE)
            if "," in term or not _term_used(term, rest):
                continue
            titled = [shown for shown, title in marks if title == meaning]
            assert titled, f"{tab_id}: {term!r} is used in the intro but not marked with its definition"
            checked += 1
    assert checked >= 10, f"only {checked} terms found in the intros"
    page.close()


def test_a_tab_saves_its_figures_as_png_and_svg_at_slide_size(app_url, browser):
    import struct

    page, panel = _open(browser, f"{app_url}?tab=attention", tab="attention")
    figures = panel.locator(".js-plotly-plot").count()
    assert figures >= 2
    downloads = []
    page.on("download", lambda d: downloads.append(d))
    page.locator("#save-attention-png").click()
    for _ in range(60):
        if len(downloads) == figures:
            break
        page.wait_for_timeout(500)
    assert len(downloads) == figures, f"{len(downloads)} files for {figures} figures"
    names = [d.suggested_filename for d in downloads]
    assert all(n.endswith(".png") for n in names) and len(set(names)) == figures, names
    assert names[0].startswith("Layer_0_head_0"), names[0]  # named after the figure's title
    for d in downloads:
        png = Path(d.path()).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        w, h = struct.unpack(">II", png[16:24])
        assert w <= 1921 and h <= 1081 and (w >= 1900 or h >= 1070), (d.suggested_filename, w, h)
    # one figure, from its hover bar: SVG
    plot = panel.locator(".js-plotly-plot").first
    plot.hover()
    icons = [plot.locator(f'.modebar-btn[data-title^="Download as {f}"] path').first.get_attribute("d")
             for f in ("PNG", "SVG")]
    assert icons[0] and icons[1] and icons[0] != icons[1], "PNG and SVG buttons with the same icon"
    with page.expect_download() as info:
        plot.locator('.modebar-btn[data-title^="Download as SVG"]').click()
    svg = Path(info.value.path()).read_text()
    assert info.value.suggested_filename.endswith(".svg") and svg.startswith("<svg") and "Layer 0" in svg
    page.close()


def test_python_app_py_serves_a_page_at_once_that_fills_in_by_itself(browser, served_model_dir, model_root):
    """``python app.py`` answers before its opening examples are computed: a page opened as soon as the server
    answers says so (when it is quick enough to see it), then reloads itself and shows the first tab's computed
    figure, with no error toast and no page error."""
    from explorer.bench.server import served_app

    env = {"EXPLORER_DEFAULT_MODEL": str(served_model_dir), "EXPLORER_MODEL_ROOT": str(model_root)}
    with served_app(env, until="answered") as server:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
        page.goto(server.url, wait_until="domcontentloaded")
        page.get_by_role("tab", name="Attention").wait_for(timeout=60_000)
        status = page.locator("#opening-status")
        pending = status.is_visible() and status.inner_text()
        if pending:  # the page came before the first tab's example: it says so and has no figure yet
            assert "being computed" in pending, pending
        figure = page.locator("#tab-walkthrough .js-plotly-plot").first
        deadline = time.monotonic() + 300
        while True:  # the page reloads itself (once or twice) as the examples come in: look again after each
            try:
                figure.wait_for(state="visible", timeout=5_000)
                break
            except Exception:  # noqa: BLE001 - not there yet, or the page was reloading under the look
                if time.monotonic() > deadline:
                    raise AssertionError(f"no computed figure after 300 s; server log:\n{server.log_tail()}")
        page.wait_for_load_state("domcontentloaded")
        for _ in range(3):
            page.wait_for_timeout(700)
            _wait_idle(page)
        assert page.locator("#tab-walkthrough .js-plotly-plot").first.is_visible()
        toasts = page.locator(".toast-body.error")
        assert toasts.count() == 0, f"error toast: {toasts.first.inner_text()}"
        assert not errors, "\n".join(errors)
        if not pending:
            print("the page came after the first tab's example: the waiting sentence was not seen")
        page.close()
