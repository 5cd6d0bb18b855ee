"""Train one now, in a real browser: the button starts the server's live run, the status and the curves update each
second, Stop ends it, and live@final then loads from the header for the Attention tab."""
from tests.headless import BROWSER_MARKS, _open, _wait_idle, browser  # noqa: F401

pytestmark = BROWSER_MARKS


def test_train_one_now_streams_stops_and_loads_from_the_header(app_url, browser):
    page, panel = _open(browser, f"{app_url}?tab=training", tab="training")
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    status = page.locator("#live-status")
    assert "Nothing is training now" in status.inner_text() or "Ended" in status.inner_text()
    page.locator("#live-train").click()
    status.get_by_text("Training: step").wait_for(timeout=60_000)
    curves = page.locator("#live-curves .js-plotly-plot")
    curves.wait_for(state="visible", timeout=30_000)
    first = status.inner_text()
    page.wait_for_function("t => !document.querySelector('#live-status').innerText.includes(t)", arg=first,
                           timeout=30_000)  # a second update came: the step and the seconds moved on
    points = "() => document.querySelector('#live-curves .js-plotly-plot').data[0].x.length"
    before = page.evaluate(points)
    page.wait_for_function(f"n => ({points})() > n", arg=before, timeout=30_000)  # the figure itself redrew
    page.locator("#live-stop").click()
    status.get_by_text("Ended (stopped)").wait_for(timeout=30_000)
    assert "live@final" in status.inner_text()

    picker = page.locator("#header-model input")
    picker.fill("live@final")
    picker.press("Enter")
    page.locator("#header-load").click()
    page.get_by_role("tab", name="Attention", exact=True).click()
    page.locator("#tab-attention").get_by_text("live@final").first.wait_for(timeout=120_000)
    _wait_idle(page)
    toasts = page.locator(".toast-body.error")
    assert toasts.count() == 0, f"error toast: {toasts.first.inner_text()}"
    assert not errors, "\n".join(errors)
    page.close()
