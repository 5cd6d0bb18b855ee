"""The join link phones can open (explorer.web.join_link, through Ask's handler): a loopback server says so in the
Ask box, a server on the network puts this machine's network address in the link and QR code (the interface list
faked here), a public page (a Space) keeps its own address."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from explorer.probes.questions import Question
from explorer.state import rooms as R
from explorer.web import join_link as J

CHOICES = ("“ball”", "“kite”", "“cat”", "“to”")
QUESTION = Question("next_token", "Which token comes next?", CHOICES, (0.4, 0.3, 0.2, 0.1), "probability", "x")
LECTURER = "ab" * 24


@pytest.mark.parametrize("host, loop", [("127.0.0.1", True), ("127.1.2.3", True), ("localhost", True),
                                        ("[::1]", True), ("::1", True), ("app.localhost", True),
                                        ("192.168.1.20", False), ("0.0.0.0", False), ("someone-app.hf.space", False),
                                        ("", False), (None, False)])
def test_loopback_hosts(host, loop):
    assert J.is_loopback(host) is loop


def test_the_link_for_each_way_of_serving():
    fake = lambda: ["10.20.30.40", "192.168.1.5"]  # noqa: E731
    page = "http://127.0.0.1:7860/"
    assert J.join_base(page, "0.0.0.0", addresses=fake) == ("http://10.20.30.40:7860/", None)
    assert J.join_base("http://localhost:7860/app/", "::", addresses=fake) == ("http://10.20.30.40:7860/app/", None)
    assert J.join_base(page, "192.168.1.5", addresses=fake) == ("http://192.168.1.5:7860/", None)
    assert J.join_base(page, "fd00::5", addresses=fake) == ("http://[fd00::5]:7860/", None)
    assert J.join_base(page, "127.0.0.1", share_url="https://abc.gradio.live") == ("https://abc.gradio.live/", None)
    space = "https://someone-explorer.hf.space/"
    assert J.join_base(space, "0.0.0.0", addresses=fake) == (space, None)  # a Space keeps the page's address
    lan = "http://192.168.1.5:7860/"
    assert J.join_base(lan, "0.0.0.0", addresses=fake) == (lan, None)
    base, warning = J.join_base(page, "127.0.0.1", addresses=fake)
    assert base == page and "Phones cannot open this link" in warning and "GRADIO_SERVER_NAME=0.0.0.0" in warning
    base, warning = J.join_base(page, "0.0.0.0", addresses=lambda: [])
    assert base == page and "no network address right now" in warning


def test_network_addresses_are_never_loopback_or_link_local():
    found = J.network_ipv4()  # this machine's, whatever it has: the filter is what is checked
    assert all(not J.is_loopback(a) and not a.startswith("169.254.") and a.count(".") == 3 for a in found)
    assert len(found) == len(set(found))


def _ask(monkeypatch, server_name, page, *, browser=LECTURER, share_url=None):
    from explorer.panels import vote

    monkeypatch.setattr(R, "rooms", R.Rooms())
    monkeypatch.setattr(J, "network_ipv4", lambda: ["10.20.30.40"])  # this machine's interfaces, faked
    demo = SimpleNamespace(server_name=server_name, share_url=share_url)
    return vote.ask_handler(lambda: QUESTION, "walkthrough", demo)(None, browser, page)


def test_a_loopback_server_says_so_in_the_ask_box(monkeypatch):
    qr, link, code_md, fig, counts, timer, owner, reach = _ask(monkeypatch, "127.0.0.1", "http://127.0.0.1:7860/")
    assert link == f"http://127.0.0.1:7860/vote?code={owner['code']}"
    assert reach.visible is True and "Phones cannot open this link" in reach.value
    assert "`GRADIO_SERVER_NAME=0.0.0.0 python app.py`" in reach.value


def test_a_network_server_puts_its_network_address_in_the_link_and_the_qr_code(monkeypatch):
    from explorer.panels import vote

    qr, link, code_md, fig, counts, timer, owner, reach = _ask(monkeypatch, "0.0.0.0", "http://127.0.0.1:7860/")
    code = owner["code"]
    assert link == f"http://10.20.30.40:7860/vote?code={code}" and reach.visible is False
    assert qr == vote.qr_image(link) != vote.qr_image(f"http://127.0.0.1:7860/vote?code={code}")
    # a Space: the page's own public address, loopback nowhere
    _, link, _, _, _, _, owner, reach = _ask(monkeypatch, "0.0.0.0", "https://someone-explorer.hf.space/")
    assert link == f"https://someone-explorer.hf.space/vote?code={owner['code']}" and reach.visible is False


def test_the_same_browser_asks_in_the_same_room_after_a_reload_from_any_tab(monkeypatch):
    from explorer.panels import vote

    store = R.Rooms()
    monkeypatch.setattr(R, "rooms", store)
    demo = SimpleNamespace(server_name="127.0.0.1", share_url=None)
    ask = vote.ask_handler(lambda: QUESTION, "walkthrough", demo)
    first = ask(None, LECTURER, "http://127.0.0.1:7860/")[6]
    reloaded = ask(None, LECTURER, "http://127.0.0.1:7860/")[6]  # a new page: no room in its state
    assert reloaded["code"] == first["code"] and len(store) == 1
    elsewhere = vote.ask_handler(lambda: QUESTION, "attention", demo)(None, LECTURER, "http://127.0.0.1:7860/")[6]
    assert elsewhere["code"] == first["code"] and len(store) == 1  # one room per lecture, whatever the tab
    other = ask(None, "cd" * 24, "http://127.0.0.1:7860/")[6]
    made_up = ask(None, "<b>not-an-id</b>", "http://127.0.0.1:7860/")[6]  # no usable id: a room of its own
    assert len({first["code"], other["code"], made_up["code"]}) == 3
