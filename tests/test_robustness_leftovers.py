"""What a stranger's requests leave behind once they have gone idle: a link's answers go like any other result; only
the opening examples computed at start-up stay."""
from __future__ import annotations

import time

import pytest

from explorer.state.cache import results
from explorer.state.openings import is_pinned, pinned
from explorer.web.sweeper import drop_unused_results

N = 20  # distinct prompts per road: the 500 in miniature, on loopback
CAUSAL = "causal (as trained)"


def _opening_keys(name: str) -> list:
    found = []
    results.count_where(lambda k: found.append(k) or False)
    return [k for k in found if isinstance(k, tuple) and k[:2] == ("opening", name)]


def _unpinned() -> int:
    return results.count_where(lambda k: not is_pinned(k))


@pytest.mark.slow
def test_link_views_leave_no_more_results_than_plain_views_once_idle(client):
    """Before: 500 link views left +276 MiB after the idle sweep, each cached as an "opening" the sweeper kept."""
    pinned_at_start = [k for k in pinned() if k[:2] == ("opening", "attention_example")]
    assert len(pinned_at_start) >= 1  # the page's own example, computed at start-up through Gradio's processing
    kept = [k for k in pinned() if results.contains(k)]  # (other tests may have cleared the cache meanwhile)

    def idle_sweep() -> int:
        time.sleep(0.3)
        drop_unused_results(0.2)
        return _unpinned()

    idle_sweep()
    for i in range(N):
        client.predict(f"The cat number {i} sat on the mat.", 0, 0, CAUSAL, "32", False, api_name="/attention_example")
    links = [k for k in _opening_keys("attention_example") if not is_pinned(k)]
    assert len(links) == N  # each link's answer is shared while it is asked for
    left_by_links = idle_sweep()
    for i in range(N):
        client.predict(f"The cat number {i} sat on the mat.", 0, 0, CAUSAL, "32", False, api_name="/attention")
    assert _unpinned() >= N
    left_by_views = idle_sweep()
    assert left_by_links == left_by_views == 0
    assert all(results.contains(k) for k in kept)


@pytest.mark.slow
def test_one_address_within_its_share_never_frees_another_addresss_model(monkeypatch):
    """Before: an address loading within its share of the private-model budget freed another visitor's model."""
    import gc

    import pytest

    from explorer.state import clients, private_models, session

    gc.collect()
    monkeypatch.setattr(private_models, "_owners", {})  # other tests' sessions are not candidates here
    first, second, third, again = [session.new_state() for _ in range(4)]
    one = private_models.model_bytes(session.get_model(first)[0])
    budget = private_models.private_models_bytes() + 2 * one + one // 2  # room for two
    monkeypatch.setattr(private_models, "PRIVATE_MODELS_BUDGET_BYTES", budget)
    monkeypatch.setattr(private_models, "CLIENT_SHARE", (one + one // 2) / budget)  # one each

    def as_client(address, state):
        token = clients.CURRENT.set(address)
        try:
            session.private_model(state)
        finally:
            clients.CURRENT.reset(token)

    as_client("10.0.0.1", first)
    as_client("10.0.0.2", second)
    with pytest.raises(ValueError, match=r"other visitors' own models already hold .* is freed in \d+ min"):
        as_client("10.0.0.3", third)  # within its share, but the budget is full of other addresses' models
    assert first["model"] is not None and second["model"] is not None and third["model"] is None
    as_client("10.0.0.2", again)  # an address makes room from its own model
    assert first["model"] is not None and second["model"] is None and again["model"] is not None
