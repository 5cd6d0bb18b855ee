"""The app in a real browser: Debian's Chromium driven by Playwright, headless, offline.

Opens the page, visits every tab, waits for a rendered Plotly chart in each, runs each tab's main action,
and fails on any console error or error toast. Screenshots go to artifacts/screenshots/ (git-ignored); with
``EXPLORER_SCREENSHOTS_TO_ASSETS=1`` they are also written to assets/screenshots/ for the README.
"""
import os
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts" / "screenshots"
ASSETS = ROOT / "assets" / "screenshots"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
# (tab label, tab id, label of the button that runs the tab's main action)
TABS = [
    ("Inside the model", "walkthrough", "Walk through"),
    ("Attention", "attention", "Show attention"),
    ("Positions", "positions", "Apply θ"),
    ("Memory lab", "memory", None),
    ("KV cache & generation", "generation", None),
    ("LoRA", "lora", None),
    ("Encoder vs decoder", "encoder_decoder", "Compare"),
    ("Model", "model", "Load"),
]

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason=f"{CHROMIUM} is absent (install Debian's chromium: apt-get install chromium)")


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


def _save_small_png(png: bytes, path: Path) -> None:
    """A 256-colour PNG for the README (a third of the size of the 24-bit screenshot, same look)."""
    import io

    from PIL import Image

    Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(
        path, optimize=True)


def _wait_idle(page, timeout_ms=120_000):
    """Until no Gradio progress indicator is showing (the tab's events have finished)."""
    page.wait_for_function(
        "() => !document.querySelector('.progress-text, .progress-level, .eta-bar, .meta-text, .meta-text-center')",
        timeout=timeout_ms)


def test_every_tab_renders_runs_and_logs_no_errors(app_url, browser):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    to_assets = os.environ.get("EXPLORER_SCREENSHOTS_TO_ASSETS") == "1"
    if to_assets:
        ASSETS.mkdir(parents=True, exist_ok=True)
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
        if to_assets:
            _save_small_png(shot, ASSETS / f"{tab_id}.png")
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
