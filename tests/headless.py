"""Debian's Chromium driven by Playwright, headless and offline: the marks, the browser fixture and the page
helpers that the browser test modules share (tests/test_browser*.py)."""
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
    ("Experiments", "experiments", "Knock out"),
    ("Training", "training", "▶ Play"),
    ("Positions", "positions", "Apply θ"),
    ("KV cache & generation", "generation", None),
    ("Memory lab", "memory", None),
    ("LoRA & int8", "lora", None),
    ("Encoder vs decoder", "encoder_decoder", "Compare"),
    ("Model", "model", "Load"),
]

#: Every browser test module's marks: slow, and skipped with the install to run where Chromium is absent.
BROWSER_MARKS = [pytest.mark.browser, pytest.mark.slow,
                 pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                    reason=f"{CHROMIUM} is absent (install Debian's chromium: apt-get install chromium)")]


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


def _open(browser, url, *, tab, width=1280, height=720, scale=1):
    page = browser.new_page(viewport={"width": width, "height": height}, device_scale_factor=scale)
    page.goto(url, wait_until="domcontentloaded")
    panel = page.locator(f"#tab-{tab}")
    panel.locator(".js-plotly-plot").first.wait_for(state="visible", timeout=120_000)
    for _ in range(3):
        page.wait_for_timeout(700)
        _wait_idle(page)
    return page, panel


def ask_the_class(page, tab: str, accordion: str, *, timeout: int = 60_000) -> str:
    """On a teacher's page: open ``tab``'s "Ask the class" accordion (its header text ``accordion``), press Ask, and
    return the room's join link once the page shows it."""
    page.get_by_text(accordion).click(timeout=timeout)
    page.locator(f"#ask-{tab}-go").click()
    field = f"#ask-{tab}-link textarea, #ask-{tab}-link input"
    page.wait_for_function(f"() => {{ const e = document.querySelector('{field}'); "
                           "return e && e.value.includes('vote?code='); }", timeout=120_000)
    return page.locator(field).first.input_value()
