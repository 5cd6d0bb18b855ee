"""Ask the class in a real browser (Debian's Chromium, headless): the projector page at 1280x720 asks, phones at
390x844 open the phone page (its own few KB, no Gradio) by link, by typed code and by the old ?join= address; a
reload votes again and the tally moves by one; Reveal shows the model beside the class and the phone says "look at
the screen"; a question from another tab reuses the room and reaches the joined phone by itself; the CSV holds the
counts; Close ends the room on the phone. Screenshots go to artifacts/screenshots/ (the README's come from the layout
audit's room views)."""
from __future__ import annotations

from tests.headless import ask_the_class
from tests.test_browser import ARTIFACTS, BROWSER_MARKS, browser  # noqa: F401 (fixture)

pytestmark = BROWSER_MARKS


def _shot(page, name: str, *, full: bool = False) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / name).write_bytes(page.screenshot(full_page=full))


def _status(page) -> str:
    return page.locator("#status").inner_text()


def test_projector_asks_phones_vote_reload_and_get_the_next_question(app_url, browser):  # noqa: F811
    errors: list[str] = []
    teacher = browser.new_page(viewport={"width": 1280, "height": 720})
    teacher.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    teacher.goto(app_url + "?present=1", wait_until="domcontentloaded")
    url = ask_the_class(teacher, "walkthrough", "Ask the class: which token comes next?")
    code = url.rsplit("=", 1)[1]
    assert url == f"{app_url}vote?code={code}"
    assert teacher.locator("#ask-walkthrough-qr img").count() == 1
    assert teacher.evaluate("() => document.querySelector('#ask-walkthrough-qr img').naturalWidth") > 200

    # a phone opens the link: its own small page, the question and its choices, no sideways scrolling
    phone = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True,
                             has_touch=True)
    phone.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    sizes: list[int] = []
    phone.on("response", lambda r: sizes.append(len(r.body())) if r.request.method == "GET" and "/api/" not in r.url
             else None)
    phone.goto(url, wait_until="domcontentloaded")
    phone.locator("#choice-0").wait_for(state="visible", timeout=60_000)
    assert sum(sizes) < 20_000 and not phone.evaluate("() => !!window.gradio_config")  # no Gradio bundle
    assert phone.locator("#question").inner_text().startswith("Which token")
    assert phone.evaluate("() => document.documentElement.scrollWidth") <= 390
    choices = phone.locator(".choice")
    n = choices.count()
    assert 2 <= n <= 6 and all(choices.nth(i).bounding_box()["height"] >= 56 for i in range(n))
    choices.nth(1).click()
    phone.wait_for_function("() => document.querySelector('#status').textContent.startsWith('Your vote: B')",
                            timeout=30_000)
    _shot(phone, "vote-phone.png")

    def total() -> str:
        teacher.wait_for_timeout(1500)  # the projector's timer redraws every second
        return teacher.locator("#ask-walkthrough-counts").inner_text()

    teacher.wait_for_function("() => (document.querySelector('#ask-walkthrough-counts') || {}).innerText"
                              "?.includes('1 vote ')", timeout=30_000)
    # a reload votes again: the vote changes, the tally does not grow
    phone.reload(wait_until="domcontentloaded")
    phone.locator("#choice-0").wait_for(state="visible", timeout=60_000)
    assert "mine" in phone.locator("#choice-1").get_attribute("class")  # the page remembers this phone's vote
    phone.locator("#choice-0").click()
    phone.wait_for_function("() => document.querySelector('#status').textContent.startsWith('Your vote: A')",
                            timeout=30_000)
    assert "1 vote " in total()

    # a second phone types the code on the bare page; the old ?join= address lands on the phone page
    typed = browser.new_page(viewport={"width": 390, "height": 844})
    typed.goto(app_url + "vote", wait_until="domcontentloaded")
    typed.locator("#code").fill(code.lower(), timeout=60_000)
    typed.locator("#join button").click()
    typed.locator("#choice-0").wait_for(state="visible", timeout=30_000)
    typed.locator("#choice-0").click()
    typed.wait_for_function("() => document.querySelector('#status').textContent.startsWith('Your vote: A')",
                            timeout=30_000)
    old = browser.new_page(viewport={"width": 390, "height": 844})
    old.goto(app_url + "?join=" + code, wait_until="domcontentloaded")
    old.locator("#choice-0").wait_for(state="visible", timeout=30_000)
    assert old.url == f"{app_url}vote?code={code}"
    old.close()
    teacher.wait_for_function("() => (document.querySelector('#ask-walkthrough-counts') || {}).innerText"
                              "?.includes('2 votes')", timeout=30_000)
    teacher.evaluate("() => document.querySelector('#ask-walkthrough').scrollIntoView({block: 'start'})")
    teacher.wait_for_timeout(500)
    _shot(teacher, "vote-projector-live.png")

    teacher.locator("#ask-walkthrough-reveal").click()
    teacher.wait_for_function("() => (document.querySelector('#ask-walkthrough-counts') || {}).innerText"
                              "?.includes('the model gave it')", timeout=30_000)
    teacher.wait_for_timeout(500)
    _shot(teacher, "vote-projector-reveal.png")
    phone.wait_for_function("() => document.querySelector('#status').textContent.startsWith('Look at the screen')",
                            timeout=30_000)
    assert phone.locator("#choice-0").is_disabled()

    # the next question, from another tab of the same page: the same room, and the joined phone shows it by itself
    teacher.get_by_role("tab", name="Attention", exact=True).click()
    again = ask_the_class(teacher, "attention", "Ask the class: which token does this head look at?", timeout=30_000)
    assert again == url  # one room for the lecture: the same code and join link
    phone.wait_for_function("() => document.querySelector('#question').textContent.startsWith('Layer')",
                            timeout=30_000)
    assert not phone.locator("#choice-0").is_disabled() and "mine" not in phone.locator("#choice-0").get_attribute("class")
    phone.locator("#choice-0").click()
    teacher.wait_for_function("() => (document.querySelector('#ask-attention-counts') || {}).innerText"
                              "?.includes('1 vote ')", timeout=30_000)

    # the tallies as CSV, then the lecturer ends the room: the phone says so
    teacher.locator("#ask-attention-csv").click()
    teacher.locator("#ask-attention-download").wait_for(state="visible", timeout=30_000)
    with teacher.expect_download(timeout=30_000) as got:
        teacher.locator("#ask-attention-download").click()
    rows = got.value.path().read_text(encoding="utf-8").splitlines()
    assert rows[0].startswith("question,") and any(r.startswith("2,") for r in rows)
    teacher.locator("#ask-attention-close").click()
    phone.wait_for_function("() => document.querySelector('#status').textContent.includes('room has ended')",
                            timeout=40_000)
    assert not [e for e in errors if "favicon" not in e], errors


ASKS = {"walkthrough": ("Walkthrough", "Ask the class: which token comes next?"),
        "attention": ("Attention", "Ask the class: which token does this head look at?")}


def _ask_in_browser(page, app_url: str, tab: str = "walkthrough") -> str:
    """A fresh page (a reload) asks in ``tab``: the join link it shows."""
    label, accordion = ASKS[tab]
    page.goto(app_url, wait_until="domcontentloaded")
    if tab != "walkthrough":  # the walkthrough is the first tab
        page.get_by_role("tab", name=label, exact=True).click(timeout=60_000)
    return ask_the_class(page, tab, accordion)


def test_a_reload_asks_in_the_same_room_and_a_loopback_server_says_phones_cannot_reach_it(app_url, browser):  # noqa: F811
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    teacher = context.new_page()
    first = _ask_in_browser(teacher, app_url)
    assert len(teacher.evaluate("() => localStorage.getItem('explorer-lecturer')")) == 48
    reach = teacher.locator("#ask-walkthrough-reach")
    assert "Phones cannot open this link" in reach.inner_text() and "GRADIO_SERVER_NAME=0.0.0.0" in reach.inner_text()
    assert _ask_in_browser(teacher, app_url) == first  # reloaded: the page's state is gone, its browser id is not
    # reloaded again, asking from another tab: still the lecture's one room
    assert _ask_in_browser(teacher, app_url, "attention") == first
    other_context = browser.new_context()
    other = other_context.new_page()  # another browser: a room of its own
    assert _ask_in_browser(other, app_url) != first
    for page, tab in ((teacher, "attention"), (other, "walkthrough")):
        page.locator(f"#ask-{tab}-close").click()
        page.wait_for_function(f"() => (document.querySelector('#ask-{tab}-counts') || {{}}).innerText"
                               "?.includes('The room is closed')", timeout=30_000)
    context.close()
    other_context.close()
