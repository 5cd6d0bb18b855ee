"""New voters per network address (explorer.state.rooms): a class behind one NAT votes, a script rotating session
ids from one address cannot fill the room, and the teacher's page says so; visitor text on that page is text."""
from __future__ import annotations

import markdown_it
import pytest

from explorer.probes.questions import Question
from explorer.state import rooms as R

CHOICES = ("“ball”", "“kite”", "“cat”", "“to”")
NAT, OTHER = "203.0.113.7", "198.51.100.20"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_sixty_phones_behind_one_address_all_vote_at_once():
    store = R.Rooms(max_votes=200, clock=Clock())
    code, secret, qid = store.open("Which token?", CHOICES)
    for i in range(60):
        store.vote(code, f"phone{i}", qid, i % 4, address=NAT)
    t = store.tally(code, secret)
    assert t.total == 60 and t.refused == 0


def test_a_script_rotating_sessions_from_one_address_cannot_fill_the_room():
    clock = Clock()
    store = R.Rooms(max_votes=200, clock=clock)
    code, secret, qid = store.open("Which token?", CHOICES)
    counted = refused = 0
    for i in range(600):  # the script, longer: 600 fresh session ids, as fast as the rate lets them in
        try:
            store.vote(code, f"fake{i}", qid, 0, address=NAT)
            counted += 1
        except ValueError as exc:
            refused += 1
            assert "not counted" in str(exc) or "wait a few seconds" in str(exc)
        clock.t += 0.05
    assert counted == 150 and refused == 450  # three quarters of the room, at most 60 each 10 s
    for i in range(50):  # a class on another network still fits
        store.vote(code, f"student{i}", qid, 1, address=OTHER)
    t = store.tally(code, secret)
    assert t.counts[:2] == (150, 50) and t.refused == 450


def test_the_rate_refuses_a_burst_and_lets_the_next_window_in():
    clock = Clock()
    store = R.Rooms(max_votes=200, clock=clock, new_voters_per_window=5)
    code, _, qid = store.open("Which token?", CHOICES)
    for i in range(5):
        store.vote(code, f"s{i}", qid, 0, address=NAT)
    with pytest.raises(ValueError, match="5 new voters from your network joined this room in the last 10 seconds"):
        store.vote(code, "s5", qid, 0, address=NAT)
    store.vote(code, "s0", qid, 1, address=NAT)  # a counted voter changes their vote freely
    store.vote(code, "x0", qid, 1, address=OTHER)  # another address is not slowed
    clock.t += R.NEW_VOTER_WINDOW + 0.01
    store.vote(code, "s5", qid, 0, address=NAT)


def test_admitted_voters_vote_again_on_the_next_question_and_ipv6_counts_by_its_64():
    store = R.Rooms(max_votes=4, clock=Clock(), address_share=0.5)
    code, secret, qid = store.open("Which token?", CHOICES)
    store.vote(code, "a", qid, 0, address="2001:db8:1:2::1")
    store.vote(code, "b", qid, 0, address="2001:db8:1:2::ffff")  # the same /64: its share (2 of 4) is full now
    with pytest.raises(ValueError, match="already counts 2 voters from your network"):
        store.vote(code, "c", qid, 0, address="2001:db8:1:2:abcd::9")
    store.vote(code, "d", qid, 0, address="2001:db8:1:3::1")  # the next /64 is another network
    qid2 = store.ask(code, secret, "Next?", CHOICES)
    for voter in ("a", "b"):
        store.vote(code, voter, qid2, 1, address="2001:db8:1:2::1")
    assert store.tally(code, secret).counts == (0, 2, 0, 0)
    assert R.network("10.0.0.1") == "10.0.0.1" and R.network("unknown") == "unknown"


def _rendered(markdown: str) -> str:
    return markdown_it.MarkdownIt("commonmark").render(markdown)


def test_the_teachers_page_shows_prompt_markup_as_text_and_names_a_burst(monkeypatch):
    from explorer.panels import vote

    store = R.Rooms(max_votes=4, clock=Clock(), address_share=0.5)
    monkeypatch.setattr(R, "rooms", store)
    question = Question("next_token", "Which token does the model predict next after “…<i>I</i> *am*”?", CHOICES,
                        (0.4, 0.3, 0.2, 0.1), "probability", "The model's most likely is “<b>x</b>”.")
    qr, link, code_md, fig, counts, timer, owner, _ = vote.ask_handler(lambda: question)(None, "",
                                                                                        "http://127.0.0.1:7860/")
    html = _rendered(counts)
    assert "&lt;i&gt;I&lt;/i&gt; *am*" in html and "<i>" not in html and "<em>" not in html
    qid = store.tally(owner["code"], owner["secret"]).qid
    for i in range(2):  # the address's share of a 4-voter room
        store.vote(owner["code"], f"s{i}", qid, 0, address=NAT)
    with pytest.raises(ValueError, match="not counted"):
        store.vote(owner["code"], "s2", qid, 0, address=NAT)
    _, counts, _ = vote.tally(owner)
    assert "⚠️ 1 new voter(s) were turned away" in counts
    _, counts, _ = vote.reveal(owner)
    html = _rendered(counts)
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<b>" not in html
