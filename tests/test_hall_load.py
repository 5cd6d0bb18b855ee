"""A lecture hall against the app as served, through the benchmark's own clients (explorer/bench/vote.py): 200
phones on the phone page's requests, 120 of them behind one campus address named in X-Forwarded-For (one trusted
proxy hop), a tenth reloading and voting again, three questions in one room, the third while 40 other sessions
ask the Attention tab (as the benchmark's row does). Every phone joins and every count is exact; the timings are
the benchmark's to judge."""
from __future__ import annotations

import pytest


@pytest.mark.slow
def test_two_hundred_phones_join_vote_and_see_each_question_with_exact_counts(app_url, monkeypatch):
    from explorer.bench.vote import lecture_hall

    monkeypatch.setattr("explorer.web.clients.PROXY_HOPS", 1)
    r = lecture_hall(app_url, 200, 120, visitors=40, timeout=900, round_seconds=240)
    assert r["joined"] == 200 and r["failures"] == 0 and r["refused_429"] == 0, r["failed"]
    assert set(r["rounds"]) == {"join", "idle", "busy"}
    for name, q in r["rounds"].items():
        assert "failed" not in q, (name, q)
        assert q["voters"] == 200 and q["votes"] >= 200, (name, q)  # a reload's second vote changes, never adds
        assert q["exact"] and sum(q["tally_counts"]) == 200, (name, q["tally_counts"], q["expected_counts"])
    assert r["rounds"]["busy"]["attention_answered"] >= 1
