"""The app's layout in a real browser (Debian's Chromium, headless): deep links, projector mode, dark mode,
phone widths, the header's model picker, and figures readable from the back of a room and on a phone."""
import pytest

from tests.headless import BROWSER_MARKS, TABS, _open, _wait_idle, browser  # noqa: F401 (fixture)

pytestmark = BROWSER_MARKS


# --- links, projector mode, dark mode, narrow screens, the header's model picker (explorer/links.py, app.py) ---

def _text_value(panel, label):
    return panel.get_by_label(label).first.input_value()


# (tab, link query, {textbox label: value it must show}, text the tab's first figure title must contain)
LINKS = [
    ("attention", "prompt=Tom%20ran.%20Tom%20ran.&layer=1&head=1", {"Prompt": "Tom ran. Tom ran."}, "Layer 1 · head 1"),
    ("positions", "prompt=The%20cat%20sat.&theta=100&layer=1&head=1", {"rope_theta (θ)": "100",
                                                                       "Prompt for the attention map": "The cat sat."},
     None),
    ("walkthrough", "prompt=The%20dog%20sat.&step=rope", {"Prompt": "The dog sat."}, None),
    ("generation", "prompt=Anna%20saw&tokens=5&seed=3", {"Prompt": "Anna saw", "seed": "3"}, None),
    ("lora", "prompt=The%20sun%20was&tokens=4", {"Prompt to continue": "The sun was"}, None),
    ("encoder_decoder", "sentence=The%20bird%20sang.&layer=1", {"Sentence": "The bird sang."}, None),
]


@pytest.mark.parametrize("tab,query,values,title", LINKS, ids=[row[0] for row in LINKS])
def test_a_deep_link_opens_its_tab_with_its_settings(app_url, browser, tab, query, values, title):
    page, panel = _open(browser, f"{app_url}?tab={tab}&{query}", tab=tab)
    assert panel.is_visible()
    for label, value in values.items():
        assert _text_value(panel, label) == value, label
    if title is not None:
        assert title in panel.locator(".js-plotly-plot .gtitle").first.text_content()
    assert not page.locator("#link-notice").is_visible(), "a good link gave a notice"
    assert page.locator(".toast-body.error").count() == 0, "a good link gave an error"
    page.locator("#copy-link").click()  # the tab's link, rebuilt from the widgets, carries the same settings
    page.wait_for_function("() => document.querySelector('#view-link textarea, #view-link input').value !== ''")
    link = page.locator("#view-link textarea, #view-link input").first.input_value()
    from urllib.parse import parse_qs, urlsplit
    sent, rebuilt = parse_qs(query), parse_qs(urlsplit(link).query)
    assert rebuilt["tab"] == [tab]
    for key, value in sent.items():
        assert rebuilt[key] == value, (key, link)
    page.close()


def test_a_bad_link_value_is_ignored_with_a_sentence_and_never_rendered_as_html(app_url, browser):
    page, panel = _open(browser, f"{app_url}?tab=attention&prompt=%3Cb%3Ebold%3C/b%3E&layer=99&mask=%3Ci%3Ex%3C/i%3E",
                        tab="attention")
    notice = page.locator("#link-notice textarea, #link-notice input").first.input_value()
    assert "Ignored layer='99'" in notice and "Ignored mask='<i>x</i>'" in notice
    assert page.locator("#link-notice b, #link-notice i, #tab-attention b").count() == 0
    assert _text_value(panel, "Prompt") == "<b>bold</b>"  # a prompt is text: the literal tags, as typed
    assert "Layer 0 · head 0" in panel.locator(".js-plotly-plot .gtitle").first.text_content()  # the defaults
    page.close()


# Tabs whose main figure still starts below a 1280×720 window in projector mode (their layouts put text and
# controls above it): listed so that the test checks every other tab and fails when one of these starts to fit.
BELOW_THE_FOLD: dict[str, str] = {}


def _run_action(page, panel, tab_id, button):
    """A tab's main action (as the every-tab test runs it), waited for."""
    if tab_id == "positions":
        panel.get_by_label("rope_theta (θ)").fill("100")
    action = (panel.get_by_role("button", name=button, exact=True) if button is not None
              else panel.locator("button.primary").first)
    action.click()
    for _ in range(3):
        page.wait_for_timeout(700)
        _wait_idle(page)


def _each_tab(page):
    """Open each tab in turn (its first figure drawn, the page idle); yields (tab id, its button, its panel)."""
    for label, tab_id, button in TABS:
        page.get_by_role("tab", name=label, exact=True).click()
        panel = page.locator(f"#tab-{tab_id}")
        panel.locator(".js-plotly-plot").first.wait_for(state="visible", timeout=120_000)
        _wait_idle(page)
        yield tab_id, button, panel


def _main_figure_box(page, panel):
    page.evaluate("window.scrollTo(0, 0)")
    page.wait_for_timeout(800)  # the debounced fit
    # the first figure shown: in projector mode an action's own figure is presented and the others fold away
    figure = panel.locator(".js-plotly-plot >> visible=true").first
    # Gradio swaps a Plot's element when a new figure arrives: the box is read once the new one is laid out
    for _ in range(30):
        figure.wait_for(state="visible", timeout=15_000)
        box = figure.bounding_box()  # None when the element was swapped out between the wait and the read
        if box is not None:
            return box
        page.wait_for_timeout(200)
    raise AssertionError("the figure's element kept being replaced for 6 s")


def test_projector_mode_fits_each_main_figure_at_1280x720(app_url, browser):
    page, _ = _open(browser, f"{app_url}?present=1", tab="walkthrough")
    assert page.evaluate("getComputedStyle(document.querySelector('#tab-walkthrough .prose')).fontSize") == "18px"
    misfits = []
    for tab_id, button, panel in _each_tab(page):
        _run_action(page, panel, tab_id, button)  # fits after the tab's action, not only on its opening
        box = _main_figure_box(page, panel)
        fits = (box["y"] >= 0 and box["y"] + box["height"] <= 720 and box["x"] + box["width"] <= 1280
                and box["height"] >= 240)  # a collapsed figure fits nothing
        if fits == (tab_id in BELOW_THE_FOLD):
            misfits.append(f"{tab_id}: {box} ({'now fits: remove it from BELOW_THE_FOLD' if fits else 'does not fit'})")
        tick = page.evaluate("(id) => { const t = document.querySelector('#tab-' + id + ' .js-plotly-plot .xtick text');"
                             " return t ? parseFloat(getComputedStyle(t).fontSize) : 16; }", tab_id)
        assert tick >= 16, f"{tab_id}: ticks {tick}px"
    assert not misfits, "main figure outside the 1280×720 window:\n" + "\n".join(misfits)
    page.close()


def test_without_projector_mode_each_main_figure_starts_in_the_first_720px(app_url, browser):
    page, _ = _open(browser, app_url, tab="walkthrough")
    late = []
    for tab_id, _, panel in _each_tab(page):
        box = _main_figure_box(page, panel)
        if not 0 <= box["y"] < 720 or box["x"] + box["width"] > 1280 or box["height"] < 240:
            late.append(f"{tab_id}: {box}")
    assert not late, "main figure starting below the first 720 px (or wider than 1280, or collapsed):\n" + "\n".join(late)
    page.close()


def test_dark_mode_draws_plots_on_a_dark_background(app_url, browser):
    page, panel = _open(browser, f"{app_url}?__theme=dark&tab=attention", tab="attention")
    fill = page.evaluate("getComputedStyle(document.querySelector('#tab-attention .js-plotly-plot rect.bg')).fill")
    r, g, b = (int(x) for x in fill[fill.index("(") + 1:fill.index(")")].split(",")[:3])
    assert max(r, g, b) < 80, fill
    page.close()


def test_dark_mode_draws_the_softmax_ticks_light(app_url, browser):
    page, panel = _open(browser, f"{app_url}?__theme=dark&tab=generation", tab="generation")
    panel.locator(".js-plotly-plot .scatterlayer path.point").first.wait_for(state="attached", timeout=120_000)
    strokes = page.evaluate("""() => [...document.querySelectorAll('#tab-generation .js-plotly-plot .scatterlayer path.point')]
        .map(p => getComputedStyle(p).stroke)""")
    rgb = [s for s in strokes if s.startswith("rgb")]
    dark = [s for s in rgb if max(int(x) for x in s[s.index("(") + 1:s.index(")")].split(",")[:3]) < 120]
    assert rgb and not dark, strokes
    page.close()


def test_nothing_is_wider_than_a_390px_phone(app_url, browser):
    page, _ = _open(browser, f"{app_url}?tab=attention", tab="attention", width=390, height=844)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.close()


def test_at_phone_width_each_tabs_main_figure_is_at_least_300px_wide(app_url, browser):
    """A 390×844 phone: each tab's main (first) figure is drawn at least 300 px wide and inside the screen."""
    page, _ = _open(browser, app_url, tab="walkthrough", width=390, height=844)
    narrow = []
    for tab_id, _, panel in _each_tab(page):
        page.wait_for_timeout(500)  # Plotly's autosize after the tab is shown
        box = panel.locator(".js-plotly-plot").first.bounding_box()
        drawn = page.evaluate("(id) => { const el = document.querySelector('#tab-' + id + ' .js-plotly-plot');"
                              " return el && el._fullLayout ? el._fullLayout.width : 0; }", tab_id)
        if box["width"] < 300 or drawn < 300 or box["x"] < 0 or box["x"] + box["width"] > 390:
            narrow.append(f"{tab_id}: box {box}, drawn {drawn} px wide")
    assert not narrow, "main figure narrower than 300 px (or off the screen) at 390 px:\n" + "\n".join(narrow)
    page.close()


# What each tab shows of the model it runs, after the header picker loaded tiny-local (3 layers, head_dim 8)
PICKED = {"walkthrough": "tiny-local", "attention": "tiny-local", "positions": "0 = fastest, 3 = slowest",
          "generation": "tiny-local", "lora": "tiny-local", "encoder_decoder": "tiny-local", "model": "tiny-local"}
# the Memory lab measures attention alone, at the sizes its sliders give: no model runs there


def test_the_header_picker_loads_a_model_for_every_tab(app_url, browser):
    page, panel = _open(browser, app_url, tab="walkthrough")
    page.get_by_role("tab", name="Attention", exact=True).click()
    picker = page.locator("#header-model input")
    picker.fill("tiny-local")
    picker.press("Enter")
    page.locator("#header-load").click()
    info = page.locator("#tab-attention").get_by_text("tiny-local")
    info.first.wait_for(timeout=120_000)  # the Attention tab re-ran for the new model without its button
    for _ in range(3):
        page.wait_for_timeout(700)
        _wait_idle(page)
    for label, tab_id, _ in TABS:
        if tab_id not in PICKED:
            continue
        page.get_by_role("tab", name=label, exact=True).click()
        panel = page.locator(f"#tab-{tab_id}")
        panel.get_by_text(PICKED[tab_id]).first.wait_for(timeout=60_000)  # each tab's view re-ran on it
        assert panel.get_by_text("default model (assets/default-model)").count() == 0, tab_id
    assert "1930 × 128" not in page.locator("#tab-walkthrough .js-plotly-plot .gtitle").first.text_content()
    toasts = page.locator(".toast-body.error")
    assert toasts.count() == 0, f"error toast after the model load: {toasts.first.inner_text()}"
    page.close()


def test_at_150_percent_zoom_no_two_subplot_titles_overlap(app_url, browser):
    # a 1920×1080 laptop at 150 % zoom lays pages out in a 1280×720 CSS window, drawn at 1.5 device pixels per pixel
    page, panel = _open(browser, f"{app_url}?tab=attention", tab="attention", scale=1.5)
    boxes = page.evaluate("""() => [...document.querySelectorAll('#tab-attention .js-plotly-plot')].map(plot =>
        [...plot.querySelectorAll('.annotation')].map(a => { const r = a.getBoundingClientRect();
            return [r.left, r.top, r.right, r.bottom, a.textContent]; }).filter(r => r[2] > r[0]))""")
    assert any(len(b) >= 2 for b in boxes), "no figure with subplot titles on the Attention tab"
    for plot in boxes:
        for i, a in enumerate(plot):
            for b in plot[i + 1:]:
                apart = a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1]
                assert apart, f"subplot titles overlap: {a[4]!r} and {b[4]!r}"
    page.close()


# --- readable from the back of a room and on a phone (the lecturer's issue): titles, ticks, colour bars, order ---

def _boxes(page, root, selector):
    """[left, top, right, bottom, text] of each drawn element matching ``selector`` in the first match of ``root``."""
    return page.evaluate("""([root, sel]) => [...document.querySelector(root).querySelectorAll(sel)].map(e => {
        const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom, e.textContent]; })
        .filter(r => r[2] > r[0] && r[3] > r[1])""", [root, selector])


def _font_px(page, root, selector):
    """The smallest computed font size (px) of the elements matching ``selector`` in the first match of ``root``."""
    return page.evaluate("""([root, sel]) => Math.min(...[...document.querySelector(root).querySelectorAll(sel)]
        .map(t => parseFloat(getComputedStyle(t).fontSize)))""", [root, selector])


def _overlaps(boxes, slack=1.0):
    """Pairs of boxes that overlap by more than ``slack`` px both ways."""
    return [(a[4], b[4]) for i, a in enumerate(boxes) for b in boxes[i + 1:]
            if min(a[2], b[2]) - max(a[0], b[0]) > slack and min(a[3], b[3]) - max(a[1], b[1]) > slack]


@pytest.mark.parametrize("query,width,height", [("?present=1", 1280, 720), ("", 390, 844)],
                         ids=["projector-1280x720", "phone-390x844"])
def test_the_header_title_is_whole(app_url, browser, query, width, height):
    page, _ = _open(browser, f"{app_url}{query}", tab="walkthrough", width=width, height=height)
    title = page.evaluate("""() => { const h = document.querySelector('#header-row h2'); const r = h.getBoundingClientRect();
        return {scroll: h.scrollWidth, client: h.clientWidth, left: r.left, right: r.right, text: h.textContent}; }""")
    assert title["text"].strip() == "Transformer Explorer"
    assert title["scroll"] <= title["client"] and title["client"] > 100, title  # nothing clipped
    assert 0 <= title["left"] and title["right"] <= width, title
    page.close()


def test_at_phone_width_each_tabs_main_figure_comes_before_its_controls(app_url, browser):
    """A 390×844 phone: each tab's main figure starts within 900 px of the tab's top (its intro, then the figure,
    then the controls); the desktop order is checked by the 1280×720 tests above."""
    page, _ = _open(browser, app_url, tab="walkthrough", width=390, height=844)
    late = []
    for tab_id, _, panel in _each_tab(page):
        page.wait_for_timeout(500)  # the debounced marking of the main figure's branch
        offset = page.evaluate("""(id) => { const panel = document.querySelector('#tab-' + id);
            return panel.querySelector('.js-plotly-plot').getBoundingClientRect().top - panel.getBoundingClientRect().top; }""",
                               tab_id)
        if offset > 900:
            late.append(f"{tab_id}: {offset:.0f} px below the tab's top")
    assert not late, "main figure more than 900 px down a phone's tab:\n" + "\n".join(late)
    page.close()


def test_memory_lab_log_axes_name_each_tick_with_its_unit(app_url, browser):
    page, panel = _open(browser, f"{app_url}?tab=memory", tab="memory")
    ticks = page.evaluate("() => [...document.querySelectorAll('#tab-memory .js-plotly-plot')[0]"
                          ".querySelectorAll('.ytick text')].map(t => t.textContent)")
    assert ticks and all(t.endswith((" MiB", " ms")) for t in ticks), ticks  # never a bare "5" or "2"
    page.close()


def test_projector_mode_token_labels_colour_bar_titles_and_lens_cells_do_not_overlap(app_url, browser):
    prompt = "%20".join(["the red ball rolled"] * 5)  # more rows than 16 px labels fit in a 720 px window
    page, panel = _open(browser, f"{app_url}?tab=attention&present=1&prompt={prompt}", tab="attention")
    page.wait_for_timeout(1000)  # the fit and the thinning after it
    plot = "#tab-attention .js-plotly-plot"  # the first: the chosen head's map
    rows = page.evaluate("(sel) => document.querySelector(sel).data[0].y.length", plot)
    assert 3 <= len(_boxes(page, plot, ".ytick text")) < rows, "query labels: none, or every one at 16 px"
    assert _font_px(page, plot, ".ytick text") >= 16 and _font_px(page, plot, ".cbaxis text") >= 16
    for axis in ("ytick", "xtick"):
        clash = _overlaps(_boxes(page, plot, f".{axis} text"))
        assert not clash, f"{axis} labels overlap: {clash[:3]}"
    bar_title = _boxes(page, plot, ".cbtitle text")
    assert bar_title and not _overlaps(bar_title + _boxes(page, plot, ".cbaxis text")), "colour bar title on its ticks"
    # projector mode off again: the figure as sent (12 px or 9 px ticks), thinned for its own font
    page.locator("#projector input").uncheck()
    page.wait_for_timeout(1500)
    assert _font_px(page, plot, ".ytick text") < 16
    assert not _overlaps(_boxes(page, plot, ".ytick text"))
    page.close()

    page, panel = _open(browser, f"{app_url}?tab=walkthrough&present=1", tab="walkthrough")
    cells = _boxes(page, "#walkthrough-lens", ".heatmaplayer text")
    assert cells, "no text in the logit lens"
    assert _font_px(page, "#walkthrough-lens", ".heatmaplayer text") >= 16
    assert not _overlaps(cells), "lens cells' text overlaps"
    page.close()

    # a main figure first drawn while the header above it still wrapped is fitted again to the room it has:
    # the memory lab's plot (legend and margins below it) keeps an area to draw in
    page, panel = _open(browser, f"{app_url}?tab=memory&present=1", tab="memory")
    page.wait_for_timeout(1000)
    drawn = page.evaluate("() => document.querySelector('#tab-memory .js-plotly-plot')._fullLayout._size.h")
    assert drawn >= 120, f"the memory lab's plot area is {drawn} px tall in projector mode"
    page.close()


def test_on_a_phone_titles_legends_and_subplot_titles_stand_apart_and_inside_the_figure(app_url, browser):
    """390×844: the Memory lab's sweep is stacked (memory above time) and none of its titles, axis titles or legend
    entries overlap; the Attention heatmap's title is whole (broken onto lines) and below the figure's label."""
    page, panel = _open(browser, f"{app_url}?tab=memory", tab="memory", width=390, height=844)
    plot = "#tab-memory .js-plotly-plot"
    texts = (_boxes(page, plot, ".gtitle") + _boxes(page, plot, ".annotation") + _boxes(page, plot, ".g-xtitle")
             + _boxes(page, plot, ".g-x2title") + _boxes(page, plot, ".legendtext"))
    assert len(_boxes(page, plot, ".annotation")) == 2 and _boxes(page, plot, ".legendtext")
    clash = _overlaps(texts)
    assert not clash, f"overlapping text on a phone's memory sweep: {clash[:3]}"
    figure = page.locator(plot).first.bounding_box()
    assert all(figure["x"] - 1 <= b[0] and b[2] <= figure["x"] + figure["width"] + 1 for b in texts
               if not b[4].startswith(("naive", "SDPA", "tiled"))), "a title runs off the figure"
    page.close()
    page, panel = _open(browser, f"{app_url}?tab=attention", tab="attention", width=390, height=844)
    plot = "#tab-attention .js-plotly-plot"
    figure = page.locator(plot).first.bounding_box()
    title = _boxes(page, plot, ".gtitle")[0]
    label = page.locator("#tab-attention [data-testid='block-label']").first.bounding_box()
    assert title[2] <= figure["x"] + figure["width"] + 1, f"title runs off the figure: {title}"
    assert title[1] >= label["y"] + label["height"] - 1, "the figure's label covers its title"
    page.close()
