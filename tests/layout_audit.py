"""The layout audit (issue 37): every tab's opening figure, every lesson view of docs/lesson.md, the README's deck
step and a class room (live and revealed), opened in Chromium at three viewports, each figure in the window read from
its SVG as drawn (tests/layout_audit.js); a room on a phone is the phone's own page (its texts and width).

The rules, per viewport:

- projector mode (``present=1``) at 1280×720 and at 1920×1080: the main figure's plot area (the union of its
  subplots) at least 300 px tall and wide; a lesson view's figure (presented: it has the window) wholly inside the
  window; every figure text (ticks, legends, titles, subplot titles, annotations, colour bars, cell text) at least
  14 px;
- a 390×844 phone (no projector mode: a student's screen, held at reading distance): the main figure's plot area at
  least 200 px tall and wide, every figure text at least 11 px;
- everywhere: no two texts of a figure overlap (two slanted tick labels excepted: their boxes are loose), no text
  past its figure's edge, no figure past the window's right edge, the figure's block label on none of its texts.

A failure is named ``model viewport view figure check`` (``key``); tests/test_layout_audit.py compares the names
against tests/layout_known.txt, the list of views still failing, which can only shrink.

    python -m tests.layout_audit --serve shipped --out artifacts/layout     # starts python app.py itself
    python -m tests.layout_audit --serve smol --out artifacts/layout-smol   # links carrying a SmolLM2-135M shape
    python -m tests.layout_audit --url http://127.0.0.1:7860/ --out DIR     # a server already running

writes DIR/report.md, DIR/report.json and one screenshot per view and viewport (the README's screenshots can be
retaken from them).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.headless import ARGS, CHROMIUM, TABS, _wait_idle, ask_the_class  # noqa: E402

SCRIPT = (Path(__file__).parent / "layout_audit.js").read_text(encoding="utf-8")
KNOWN = Path(__file__).parent / "layout_known.txt"


@dataclass(frozen=True)
class Viewport:
    name: str
    width: int
    height: int
    projector: bool
    min_plot: int  # px: the main figure's plot area, each way
    min_font: float  # px: every figure text

    def rules(self, view: "View") -> dict:
        """The script's thresholds; a presented figure (a lesson view in projector mode) must be wholly in view. A
        room's tally (a few bars, each ~36 px thick) is held to the phone's 200 px plot: the room's question and
        count share the window with it and the QR code."""
        least = min(self.min_plot, 200) if view.room else self.min_plot
        return {"minPlot": least, "minFont": self.min_font, "inWindow": self.projector and view.query is not None}


VIEWPORTS = [Viewport("projector-1280x720", 1280, 720, True, 300, 14),
             Viewport("projector-1920x1080", 1920, 1080, True, 300, 14),
             Viewport("phone-390x844", 390, 844, False, 200, 11)]


@dataclass(frozen=True)
class View:
    name: str
    tab: str
    query: str | None  # a lesson link's query (opened as a link); None: the tab's opening (its tab clicked)
    room: str | None = None  # "live" / "reveal": a class room's tally after two phones voted (``room_view``)


def lesson_links() -> list[str]:
    """The links of docs/lesson.md's 50-minute lesson, in order (each ends in focus=<name>)."""
    text = (ROOT / "docs" / "lesson.md").read_text(encoding="utf-8")
    return re.findall(r"`\?([^`]+)`", text[text.index("## A 50-minute lesson"):])


#: The deck's step the README shows (assets/screenshots/deck.png): the intro deck's head scores, its bar beneath.
DECK_STEP = ("intro", 6, "attention", "scores")


def views() -> list[View]:
    """Every tab's opening, then every lesson view (``lesson-N-tab-focus``), then the README's deck step
    (``deck-intro-N-tab-focus``, opened as the deck opens it)."""
    out = [View(f"tab-{tab}", tab, None) for _, tab, _ in TABS]
    for i, query in enumerate(lesson_links()):
        tab = re.search(r"tab=(\w+)", query)[1]
        focus = re.search(r"focus=(\w+)", query)
        out.append(View(f"lesson-{i + 1}-{tab}" + (f"-{focus[1]}" if focus else ""), tab, query))
    deck, step, tab, focus = DECK_STEP
    out.append(View(f"deck-{deck}-{step}-{tab}-{focus}", tab, f"lesson={deck}&step={step}"))
    return out + [View("room-live", "walkthrough", None, "live"), View("room-reveal", "walkthrough", None, "reveal")]


#: What a phone page (no figure) must keep: every text at least the viewport's smallest size, no sideways scroll.
PAGE_TEXT = """(minFont) => {
  const small = [...document.querySelectorAll('body *')].filter(e => e.childElementCount === 0 &&
      e.textContent.trim() && e.getBoundingClientRect().width > 0 && parseFloat(getComputedStyle(e).fontSize) < minFont);
  const failures = small.slice(0, 3).map(e => ({figure: 'page', check: 'font',
      detail: `${e.textContent.trim().slice(0, 40)} ${getComputedStyle(e).fontSize}`}));
  if (document.documentElement.scrollWidth > window.innerWidth)
    failures.push({figure: 'page', check: 'past-edge', detail: `page ${document.documentElement.scrollWidth} px wide`});
  return {figures: [], failures};
}"""


def room_view(page, url: str, view: View, viewport: Viewport, link_model: str | None = None) -> dict:
    """A class room as a lecture runs it: the projector page asks the walkthrough's question and two phones vote;
    "live" is the tally then, "reveal" after the model's answer is shown beside it. On a projector viewport the
    tally figure is audited on ``page``; on a phone viewport ``page`` is a phone's own page (no figure: its texts
    and width are), and the projector is a page of its own at 1280x720. ``link_model``: the model the page loads."""
    phone_vp = not viewport.projector
    teacher = page.context.browser.new_page(viewport={"width": 1280, "height": 720}) if phone_vp else page
    phones = [page] if phone_vp else []
    try:
        open_room = teacher.evaluate("() => { const e = document.querySelector('#ask-walkthrough-link textarea, "
                                     "#ask-walkthrough-link input'); return !!(e && e.value.includes('vote?code=')); }")
        if view.room == "live" or not open_room:
            teacher.goto(url + "?present=1" + (f"&model={link_model}" if link_model else ""),
                         wait_until="domcontentloaded")
            link = ask_the_class(teacher, "walkthrough", "Ask the class: which token comes next?", timeout=300_000)
            browser = page.context.browser
            phones += [browser.new_page(viewport={"width": 390, "height": 844}) for _ in range(2 - len(phones))]
            for i, phone in enumerate(phones):
                phone.goto(link, wait_until="domcontentloaded")
                phone.locator(f"#choice-{i}").click(timeout=60_000)
                phone.wait_for_function("() => document.querySelector('#status').textContent.startsWith('Your vote')",
                                        timeout=30_000)
            teacher.wait_for_function("() => (document.querySelector('#ask-walkthrough-counts') || {}).innerText"
                                      "?.includes('2 votes')", timeout=30_000)
        if view.room == "reveal":
            teacher.locator("#ask-walkthrough-reveal").click()
            teacher.wait_for_function("() => (document.querySelector('#ask-walkthrough-counts') || {}).innerText"
                                      "?.includes('the model gave it')", timeout=30_000)
            if phone_vp:
                page.wait_for_function("() => document.querySelector('#status').textContent.startsWith('Look at')",
                                       timeout=30_000)
        teacher.evaluate("() => document.querySelector('#ask-walkthrough').scrollIntoView({block: 'start'})")
        teacher.wait_for_timeout(1500)  # the projector's timer redraws every second; the page's fit after the scroll
        if phone_vp:
            return page.evaluate(PAGE_TEXT, viewport.min_font)
        return page.evaluate(SCRIPT, {"main": "#ask-walkthrough-tally", **viewport.rules(view)})
    finally:
        for other in ([teacher] if phone_vp else []) + [p for p in phones if p is not page]:
            other.close()


def _settle(page, rounds=3):
    for _ in range(rounds):
        page.wait_for_timeout(700)
        _wait_idle(page, timeout_ms=300_000)


def _open_base(page, url: str, viewport: Viewport) -> None:
    page.goto(url + ("?present=1" if viewport.projector else ""), wait_until="domcontentloaded")
    page.locator(".js-plotly-plot").first.wait_for(state="visible", timeout=300_000)
    _settle(page)


def audit_view(page, url: str, view: View, viewport: Viewport, *, fresh: bool, link_model: str | None = None) -> dict:
    """One view at one viewport on ``page`` (a tab's opening: its tab clicked on the page as it is, after the page
    was opened when ``fresh``; a lesson link: the link opened). With ``link_model`` every view is a link carrying
    ``model=`` (a tab's opening: ``?tab=<tab>&model=...``), as a lecturer on a larger model opens them. Returns the
    script's answer."""
    present = "&present=1" if viewport.projector else ""
    if view.room is not None:
        return room_view(page, url, view, viewport, link_model)
    if view.query is None:
        main = f"#tab-{view.tab} .js-plotly-plot"
        if link_model is not None:
            page.goto(f"{url}?tab={view.tab}&model={link_model}{present}", wait_until="domcontentloaded")
        else:
            if fresh:
                _open_base(page, url, viewport)
            label = next(label for label, tab, _ in TABS if tab == view.tab)
            page.get_by_role("tab", name=label, exact=True).click()
        page.locator(main).first.wait_for(state="visible", timeout=300_000)
        _settle(page, 3 if link_model is not None else 2)
        page.evaluate("(sel) => { const el = document.querySelector(sel); if (el) el.scrollIntoView({block: 'nearest'}); }",
                      main)
        page.wait_for_timeout(900)  # the page's debounced fit and thinning after the scroll
    else:
        query = view.query + (f"&model={link_model}" if link_model else "")
        page.goto(f"{url}?{query}{present}", wait_until="domcontentloaded")
        page.wait_for_function("() => document.body.dataset.focused", timeout=300_000)
        _settle(page)
        page.wait_for_timeout(1000)
        focused = page.evaluate("() => document.body.dataset.focused").split()
        main = ", ".join(f"#{element_id}" for element_id in focused)
    return page.evaluate(SCRIPT, {"main": main, **viewport.rules(view)})


def key(model: str, viewport: str, view: str, figure: str, check: str) -> str:
    return " ".join([model, viewport, view, figure.replace(" ", "_"), check])


def run_audit(url: str, *, model: str, views_: list[View] | None = None, viewports: list[Viewport] | None = None,
              out: Path | None = None, log=print, browser=None, link_model: str | None = None) -> dict:
    """The audit of ``views_`` (default: all) at ``viewports`` (default: all) on the app at ``url``: one browser, one
    page per viewport. Returns {"model", "results": [{view, viewport, figures, failures}], "keys": [...]}; with
    ``out``, a screenshot of each view there. ``browser``: a Playwright browser already running (the test suite's:
    a second sync Playwright cannot start beside it), else one is launched for the audit."""
    if browser is not None:
        return _audit(browser, url, model, views_, viewports, out, log, link_model)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        own = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            return _audit(own, url, model, views_, viewports, out, log, link_model)
        finally:
            own.close()


def _audit(browser, url: str, model: str, views_, viewports, out, log, link_model=None) -> dict:
    views_ = views() if views_ is None else views_
    viewports = VIEWPORTS if viewports is None else viewports
    results, keys = [], []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    for vp in viewports:
        page = browser.new_page(viewport={"width": vp.width, "height": vp.height})
        fresh = True
        for view in views_:
            t0 = time.monotonic()
            try:
                answer = audit_view(page, url, view, vp, fresh=fresh, link_model=link_model)
                failed = False
            except Exception as e:  # a view that never settled is a failure of its own, not the end
                answer = {"figures": [], "failures": [{"figure": "page", "check": "not-drawn",
                                                       "detail": str(e).splitlines()[0][:200]}]}
                failed = True
                page.close()
                page = browser.new_page(viewport={"width": vp.width, "height": vp.height})
            # after a link, a room or a new page, the next opening opens the page
            fresh = view.query is not None or view.room is not None or failed
            if out is not None:
                page.screenshot(path=str(out / f"{model}-{vp.name}-{view.name}.png"))
            results.append({"view": view.name, "viewport": vp.name, **answer})
            keys += [key(model, vp.name, view.name, f["figure"], f["check"]) for f in answer["failures"]]
            log(f"{model} {vp.name} {view.name}: {len(answer['failures'])} failures "
                f"({time.monotonic() - t0:.0f} s)")
        page.close()
    return {"model": model, "url": url, "results": results, "keys": sorted(set(keys))}


def report_markdown(report: dict) -> str:
    """A table of failures per view and viewport, then each failure with its detail."""
    vps = [vp.name for vp in VIEWPORTS if any(r["viewport"] == vp.name for r in report["results"])]
    names = list(dict.fromkeys(r["view"] for r in report["results"]))
    cell = {(r["view"], r["viewport"]): r for r in report["results"]}
    lines = [f"# Layout audit: {report['model']}", "", "| view | " + " | ".join(vps) + " |",
             "|---|" + "---|" * len(vps)]
    for name in names:
        row = []
        for vp in vps:
            r = cell.get((name, vp))
            row.append("" if r is None else str(len(r["failures"])) + (
                " (" + ", ".join(sorted({f["check"] for f in r["failures"]})) + ")" if r["failures"] else ""))
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    total = sum(len(r["failures"]) for r in report["results"])
    lines += ["", f"{total} failures in {len(report['results'])} views.", ""]
    for r in report["results"]:
        for f in r["failures"]:
            lines.append(f"- {r['viewport']} {r['view']} · {f['figure']} · {f['check']}: {f['detail']}")
    return "\n".join(lines) + "\n"


def known() -> set[str]:
    """tests/layout_known.txt: the failures still expected (one key a line, # comments)."""
    if not KNOWN.is_file():
        return set()
    return {line.strip() for line in KNOWN.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.lstrip().startswith("#")}


@contextlib.contextmanager
def serve(model: str):
    """``python app.py`` on a loopback port serving the shipped model; with "smol" also a SmolLM2-135M-shape folder
    (random weights, the shipped tokenizer) in a temporary model root, which every view then loads through its
    link's ``model=`` as a lecturer's links do (the Training tab replays the shipped model's snapshots either way).
    Yields (url, the model id the views' links carry, or None)."""
    import tempfile

    from explorer.bench.flood import write_smol_shape_folder
    from explorer.bench.server import served_app

    if model not in ("shipped", "smol"):
        raise ValueError(f'model must be "shipped" or "smol", got {model!r}.')
    with tempfile.TemporaryDirectory() as root:
        env, link_model = {}, None
        if model == "smol":
            link_model = "smol-shape"
            write_smol_shape_folder(Path(root) / link_model)
            env = {"EXPLORER_MODEL_ROOT": root}
        with served_app(env, start_timeout=900, until="answered") as server:
            _until_openings_settle(server)
            yield server.url, link_model


def _until_openings_settle(server, timeout: float = 1200.0) -> None:
    """Until every opening example is computed or said to have failed (random weights at SmolLM2-135M's shape have
    no induction head for the circuit's opening: its figure stays empty, and the audit sees the rest)."""
    import httpx

    from explorer.bench.server import openings_pending

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"app.py exited with {server.process.returncode}:\n{server.log_tail()}")
        try:
            if not openings_pending(httpx.get(server.url + "config", timeout=10).json()):
                return
        except RuntimeError:  # an opening failed: said on the page, the others are in
            return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(1.0)
    raise RuntimeError(f"the opening examples were not computed within {timeout:.0f} s")


def to_assets(out: Path, model: str) -> list[str]:
    """The README's and docs' screenshots from an audit at 1280×720 in projector mode, as 256-colour PNGs: each tab's
    opening (assets/screenshots/<tab>.png) and the deck's step (deck.png); returns the names written."""
    from tests.headless import ASSETS, _save_small_png

    deck = next(v.name for v in views() if v.name.startswith("deck-"))
    shots = [("projector-1280x720", f"tab-{tab}", f"{tab}.png") for _, tab, _ in TABS] + [
        ("projector-1280x720", deck, "deck.png"), ("projector-1280x720", "room-live", "vote-projector-live.png"),
        ("projector-1280x720", "room-reveal", "vote-projector-reveal.png"),
        ("phone-390x844", "room-live", "vote-phone.png")]
    written = []
    for viewport, view, name in shots:
        shot = out / f"{model}-{viewport}-{view}.png"
        if shot.is_file():
            _save_small_png(shot.read_bytes(), ASSETS / name)
            written.append(name)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.layout_audit", description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="an app already running")
    where.add_argument("--serve", choices=["shipped", "smol"], help="start python app.py on this model shape")
    parser.add_argument("--model", default=None, help="the model's name in the report (default: --serve's)")
    parser.add_argument("--link-model", default=None, help="with --url: a model id every view's link carries")
    parser.add_argument("--to-assets", action="store_true",
                        help="write the tabs' openings and the deck's step at 1280x720 in projector mode to "
                             "assets/screenshots/")
    parser.add_argument("--out", type=Path, required=True, help="folder for report.md, report.json, screenshots")
    parser.add_argument("--views", nargs="*", help="view names (default: all); e.g. tab-attention lesson-3-attention-heatmap")
    parser.add_argument("--viewports", nargs="*", choices=[vp.name for vp in VIEWPORTS])
    args = parser.parse_args(argv)
    chosen = [v for v in views() if not args.views or v.name in args.views]
    vps = [vp for vp in VIEWPORTS if not args.viewports or vp.name in args.viewports]
    model = args.model or args.serve or "app"
    with (serve(args.serve) if args.serve else contextlib.nullcontext((args.url, args.link_model))) as (url, linked):
        report = run_audit(url, model=model, views_=chosen, viewports=vps, out=args.out, link_model=linked)
    (args.out / "report.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    (args.out / "report.md").write_text(report_markdown(report), encoding="utf-8")
    print(f"{len(report['keys'])} failing (view, figure, check) in {len(report['results'])} views: {args.out}/report.md")
    if args.to_assets:
        print("assets/screenshots/:", ", ".join(to_assets(args.out, model)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
