"""The class rooms' store (explorer.state.rooms): secrets, one vote per session, caps, expiry, wrong-code limits,
and an exact tally under 40 threads voting at once."""
from __future__ import annotations

import threading

import pytest

from explorer.state import rooms as R

CHOICES = ("“ball”", "“kite”", "“cat”", "“to”")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_code_alphabet_and_space():
    assert len(R.ALPHABET) == len(set(R.ALPHABET)) == 31
    assert not set("0O1IL") & set(R.ALPHABET)
    assert R.CODE_SPACE == 31 ** 6 == 887_503_681
    store = R.Rooms()
    codes = {store.open("Q?", CHOICES)[0] for _ in range(40)}
    assert len(codes) == 40 and all(len(c) == 6 and set(c) <= set(R.ALPHABET) for c in codes)


def test_forty_threads_vote_at_once_some_change_the_tally_is_exact():
    store = R.Rooms()
    code, secret, qid = store.open("Which token?", CHOICES)
    start = threading.Barrier(40)
    errors = []

    def voter(i: int) -> None:
        try:
            q = store.join(code.lower(), f"s{i}")
            start.wait()
            store.vote(code, f"s{i}", q.qid, i % 4)
            if i % 5 == 0:  # every fifth voter changes their mind
                store.vote(code, f"s{i}", q.qid, (i + 1) % 4)
        except Exception as exc:  # noqa: BLE001 (collected, asserted below)
            errors.append(exc)

    threads = [threading.Thread(target=voter, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    expected = [0] * 4
    for i in range(40):
        expected[(i + 1) % 4 if i % 5 == 0 else i % 4] += 1
    t = store.tally(code, secret)
    assert list(t.counts) == expected and t.total == 40


def test_only_the_secret_reveals_closes_or_asks_again():
    store = R.Rooms()
    code, secret, qid = store.open("Q?", CHOICES)
    for wrong in (None, "", code, secret[:-1] + ("A" if secret[-1] != "A" else "B")):
        for action in (store.tally, store.reveal, store.close):
            with pytest.raises(ValueError, match="Only the page that asked"):
                action(code, wrong)
        with pytest.raises(ValueError, match="Only the page that asked"):
            store.ask(code, wrong, "Q2?", CHOICES)
    store.vote(code, "s1", qid, 1)
    t = store.reveal(code, secret)
    assert t.revealed and t.counts == (0, 1, 0, 0)
    with pytest.raises(ValueError, match="revealed"):
        store.vote(code, "s1", qid, 2)
    store.close(code, secret)
    with pytest.raises(ValueError, match="No open room"):
        store.join(code, "s2")


def test_next_question_clears_votes_and_old_votes_are_refused():
    store = R.Rooms()
    code, secret, qid = store.open("Q1?", CHOICES)
    store.vote(code, "s1", qid, 0)
    qid2 = store.ask(code, secret, "Q2?", ("yes", "no"))
    assert qid2 != qid and store.tally(code, secret).counts == (0, 0)
    with pytest.raises(ValueError, match="new question"):
        store.vote(code, "s1", qid, 0)
    with pytest.raises(ValueError, match="Choose one of the 2"):
        store.vote(code, "s1", qid2, 2)
    for bad in (-1, True, 1.0, "0", None):
        with pytest.raises(ValueError, match="Choose one of the 2"):
            store.vote(code, "s1", qid2, bad)


def test_caps_on_rooms_and_votes_hold():
    store = R.Rooms(max_rooms=3, max_votes=5)
    opened = [store.open("Q?", CHOICES) for _ in range(3)]
    with pytest.raises(ValueError, match="3 class rooms, its limit"):
        store.open("Q?", CHOICES)
    code, secret, qid = opened[0]
    for i in range(5):
        store.vote(code, f"s{i}", qid, 0)
    with pytest.raises(ValueError, match="5 votes, its limit"):
        store.vote(code, "s-new", qid, 0)
    store.vote(code, "s0", qid, 3)  # a counted voter may still change
    assert store.tally(code, secret).counts == (4, 0, 0, 1)
    store.close(code, secret)
    store.open("Q?", CHOICES)  # a closed room frees its place


def test_rooms_expire_and_nothing_is_kept():
    clock = Clock()
    store = R.Rooms(minutes=45, clock=clock)
    code, secret, qid = store.open("Q?", CHOICES)
    store.vote(code, "s1", qid, 0)
    for _ in range(14):  # the teacher's page asks for the tally all along: the room lives its 45 minutes
        clock.t += 3 * 60
        assert store.tally(code, secret).total == 1
    clock.t += 3 * 60 - 1
    assert store.tally(code, secret).total == 1
    clock.t += 2
    assert len(store) == 0 and not store._rooms
    with pytest.raises(ValueError, match="No open room has the code .* 45 minutes"):
        store.join(code, "s2")
    with pytest.raises(ValueError, match="has ended"):
        store.tally(code, secret)
    with pytest.raises(ValueError, match="ended"):
        store.vote(code, "s1", qid, 0)


def test_bad_codes_get_sentences_and_wrong_codes_are_limited_never_a_right_one():
    clock = Clock()
    store = R.Rooms(clock=clock)
    code, _, _ = store.open("Q?", CHOICES)
    for bad in ("", None, "ABC", "ABCDEFG", "OOOOOO", "<b>x</b>"):
        with pytest.raises(ValueError, match="room code"):
            store.join(bad, "guesser")
    other = next(c for c in ("AAAAAA", "BBBBBB") if c != code)
    for _ in range(R.WRONG_PER_SESSION):
        with pytest.raises(ValueError, match="No open room has the code"):
            store.join(other, "guesser")
    with pytest.raises(ValueError, match="wrong room codes from this page"):
        store.join(other, "guesser")
    assert store.join(code, "guesser").text == "Q?"  # the room is looked up first: a right code always joins
    assert store.join(code.lower(), "someone-else").text == "Q?"
    clock.t += R.WRONG_SESSION_WINDOW + 1
    with pytest.raises(ValueError, match="No open room has the code"):
        store.join(other, "guesser")


def test_questions_are_checked():
    store = R.Rooms()
    for text, choices in (("", CHOICES), ("Q?", ("one",)), ("Q?", tuple("abcdefg")), ("Q?", ("a", "a")),
                          ("Q?", ("a", "x" * 61)), ("x" * 301, CHOICES)):
        with pytest.raises(ValueError):
            store.open(text, choices)
    assert len(store) == 0
