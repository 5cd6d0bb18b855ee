"""Rooms a stranger cannot take (explorer.state.rooms): wrong codes from many addresses never keep a right code out,
one address cannot open every room, and a room whose lecturer's page has gone ends after the grace time while a
reload of the same browser keeps it; one room per lecture, kept alive by the section that asked last."""
from __future__ import annotations

import pytest

from explorer.state import rooms as R

CHOICES = ("“ball”", "“kite”", "“cat”", "“to”")
TEACHER, STRANGER = "198.51.100.20", "203.0.113.7"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _wrong(code: str) -> str:
    return next(c for c in ("AAAAAA", "BBBBBB") if c != code)


def test_four_hundred_wrong_codes_from_four_hundred_addresses_then_a_right_code_joins():
    store = R.Rooms(clock=Clock())
    code, _, qid = store.open("Which token?", CHOICES, address=TEACHER)
    for i in range(400):
        with pytest.raises(ValueError, match="No open room has the code"):
            store.join(_wrong(code), f"bot-{i}", address=f"10.0.{i // 256}.{i % 256}")
    assert store.join(code, "phone", address="192.0.2.55").qid == qid
    assert store.join(code, "bot-7", address="10.0.0.7").qid == qid  # a guesser's own right code joins too
    store.vote(code, "phone", qid, 1, address="192.0.2.55")


def test_one_address_past_its_wrong_codes_is_told_so_and_its_right_code_still_joins():
    clock = Clock()
    store = R.Rooms(clock=clock, wrong_per_address=30)
    code, _, qid = store.open("Which token?", CHOICES, address=TEACHER)
    for i in range(30):  # fresh sessions: the address is what is counted
        with pytest.raises(ValueError, match="No open room has the code"):
            store.join(_wrong(code), f"fresh-{i}", address=STRANGER)
    for i in range(370):
        with pytest.raises(ValueError, match="30 wrong room codes from your network in 10 minutes"):
            store.join(_wrong(code), f"more-{i}", address=STRANGER)
    assert store.join(code, "student-behind-the-same-nat", address=STRANGER).qid == qid
    with pytest.raises(ValueError, match="No open room has the code"):  # another network is not held to it
        store.join(_wrong(code), "typo", address=TEACHER)
    assert max(len(t) for t in store._wrong_net.values()) == 30  # refused codes are not even written down
    clock.t += R.WRONG_SESSION_WINDOW + 1
    with pytest.raises(ValueError, match="No open room has the code"):
        store.join(_wrong(code), "later", address=STRANGER)


def test_sixty_rooms_asked_from_one_address_leave_rooms_for_another_teacher():
    store = R.Rooms(clock=Clock(), rooms_per_address=5, max_rooms=50)
    opened, refused = 0, []
    for i in range(60):
        try:
            store.open("Q?", CHOICES, owner=f"throwaway-page-{i}", address=STRANGER)
            opened += 1
        except ValueError as exc:
            refused.append(str(exc))
    assert opened == 5 and len(refused) == 55
    assert refused[0].startswith("Your network address already holds 5 open class rooms, its limit: close one")
    code, secret, _ = store.open("Which token?", CHOICES, owner="teacher-browser", address=TEACHER)
    assert store.tally(code, secret).total == 0 and len(store) == 6
    # an IPv6 address counts by its /64, as for voters
    store6 = R.Rooms(clock=Clock(), rooms_per_address=2)
    store6.open("Q?", CHOICES, address="2001:db8:1:2::1")
    store6.open("Q?", CHOICES, address="2001:db8:1:2::2")
    with pytest.raises(ValueError, match="already holds 2 open class rooms"):
        store6.open("Q?", CHOICES, address="2001:db8:1:2:ffff::3")


def test_a_room_whose_page_stopped_asking_ends_after_the_grace_time():
    clock = Clock()
    store = R.Rooms(clock=clock, grace_minutes=0.05)  # 3 s
    code, secret, qid = store.open("Which token?", CHOICES, owner="lecturer-1", address=TEACHER)
    store.join(code, "phone", address="192.0.2.55")
    for _ in range(20):  # the page's tally poll keeps it alive well past the grace time
        clock.t += 2.0
        assert store.tally(code, secret).qid == qid
    for _ in range(5):  # phones asking for the question do not keep it alive
        clock.t += 0.5
        assert store.current(code) is not None
    clock.t += 0.6
    assert store.current(code) is None and len(store) == 0 and not store._rooms
    with pytest.raises(ValueError, match="has ended .* 0.05 minutes after its page is closed"):
        store.tally(code, secret)
    with pytest.raises(ValueError, match="No open room has the code"):
        store.join(code, "phone")


def test_a_reload_of_the_lecturers_browser_keeps_its_room_another_browser_gets_its_own():
    clock = Clock()
    store = R.Rooms(clock=clock, grace_minutes=0.05)
    code, secret, qid = store.open("Which token?", CHOICES, owner="lecturer-1", address=TEACHER)
    store.vote(code, "phone", qid, 2)
    clock.t += 2.5  # the page reloaded: its state (the secret) is gone, its browser id is not
    again, secret2, qid2 = store.open("Next?", ("yes", "no"), owner="lecturer-1", address=TEACHER)
    assert (again, secret2) == (code, secret) and qid2 != qid
    t = store.tally(code, secret)
    assert t.text == "Next?" and t.counts == (0, 0)  # the next question, its votes from none
    other, _, _ = store.open("Q?", CHOICES, owner="lecturer-2", address=TEACHER)
    assert other != code and len(store) == 2
    anonymous = {store.open("Q?", CHOICES, address=TEACHER)[0] for _ in range(2)}
    assert len(anonymous) == 2 and code not in anonymous  # no browser id: a room each time
    clock.t += 3.1
    fresh, _, _ = store.open("Q?", CHOICES, owner="lecturer-1", address=TEACHER)
    assert fresh != code  # its room ended with the grace time: a new one


def test_the_room_limit_counts_only_live_lectures():
    clock = Clock()
    store = R.Rooms(clock=clock, max_rooms=50, grace_minutes=5)
    for i in range(50):
        store.open("Q?", CHOICES, owner=f"page-{i}", address=f"10.1.0.{i}")
    with pytest.raises(ValueError, match="50 class rooms, its limit: a room ends 5 min after its page is closed"):
        store.open("Q?", CHOICES, owner="teacher", address=TEACHER)
    clock.t += 5 * 60 + 1  # those fifty pages were closed
    code, secret, _ = store.open("Q?", CHOICES, owner="teacher", address=TEACHER)
    assert len(store) == 1 and store.tally(code, secret).total == 0


def test_the_phone_page_counts_wrong_codes_by_the_forwarded_address(monkeypatch):
    """The phone page's join reads the client address as the operator's proxy hops say (X-Forwarded-For)."""
    from starlette.testclient import TestClient

    from explorer.web import clients, hall

    async def gradio(scope, receive, send):  # what Gradio would answer: the phone routes never pass these on
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    store = R.Rooms(clock=Clock(), wrong_per_address=3)
    monkeypatch.setattr(clients, "PROXY_HOPS", 1)
    code, _, _ = store.open("Which token?", CHOICES, address=TEACHER)
    client = TestClient(hall.PhoneRoutes(gradio, store=store), client=("10.9.9.9", 50000))  # the proxy itself

    def state(code: str, voter: str, forwarded: str) -> dict:
        return client.get("/vote/api/state", params={"code": code, "voter": voter},
                          headers={"x-forwarded-for": forwarded}).json()

    for i in range(400):
        answer = state(_wrong(code), f"phone-{i:04d}-0123456789", f"6.6.6.6, 172.16.{i // 256}.{i % 256}")
        assert "No open room has the code" in answer["message"]
    assert len(store._wrong_net) == 400  # one each: the made-up first entry was not the address
    assert state(code, "honest-0123456789abcdef", "192.0.2.9")["text"] == "Which token?"


def test_one_room_per_lecture_lives_while_the_section_that_asked_last_polls(monkeypatch):
    """Ask in one tab, then another, then after a reload: one room; the first section's tally steps aside, the
    last one's poll keeps the room alive past the grace time, and once nothing polls, the room ends."""
    from types import SimpleNamespace

    from explorer.panels import vote
    from explorer.probes.questions import Question

    clock = Clock()
    store = R.Rooms(clock=clock, grace_minutes=0.05)  # 3 s
    monkeypatch.setattr(R, "rooms", store)
    demo = SimpleNamespace(server_name="127.0.0.1", share_url=None)
    lecturer, url = "ab" * 24, "http://127.0.0.1:7860/"
    first = Question("next_token", "Which token comes next?", CHOICES, (0.4, 0.3, 0.2, 0.1), "probability", "x")
    second = Question("attention", "Layer 1, head 0 looks at?", ("0·a", "1·b"), (0.7, 0.3), "weight", "y")
    owner = vote.ask_handler(lambda: first, "walkthrough", demo)(None, lecturer, url)[6]
    store.vote(owner["code"], "phone", store.tally(owner["code"], owner["secret"]).qid, 2)
    owner = vote.ask_handler(lambda: second, "attention", demo)(owner, lecturer, url)[6]
    _, text, timer = vote.tally_handler("walkthrough")(owner)
    assert "asked in another section" in text and timer.active is False
    for _ in range(10):  # the attention section's timer, well past the grace time
        clock.t += 2.0
        vote.tally_handler("attention")(owner)
    assert len(store) == 1
    _, _, timer = vote.reveal(owner)
    assert timer.active is True and timer.value == vote.HEARTBEAT_SECONDS < R.GRACE_MINUTES * 60
    # a reload (the page's state gone) asking from a third tab: the same room, its history kept for the CSV
    again = vote.ask_handler(lambda: first, "experiments", demo)(None, lecturer, url)[6]
    assert again["code"] == owner["code"] and len(store) == 1
    assert [t.counts for t in store.tallies(again["code"], again["secret"])] == [(0, 0, 1, 0), (0, 0), (0, 0, 0, 0)]
    clock.t += 3.1  # no section polls any more: the lecturer's page has gone
    assert len(store) == 0
