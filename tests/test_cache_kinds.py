"""One cache API: results the app keeps for later (snapshots, curves, accuracies, the memory lab's opening sweep)
live in ``explorer.state.cache.results``, bounded and evicting; a kind of result may be bounded on its own."""
import pytest

from explorer.state.cache import ResultCache


def test_a_kind_of_result_is_counted_found_and_trimmed_without_touching_the_others():
    cache = ResultCache(max_bytes=10_000, max_entries=100)
    for step in range(5):
        cache.put(("snapshot", "m", step), f"model {step}", nbytes=lambda v: 10 * len(v))  # a size from the value
    cache.put(("opening", "x"), "kept", nbytes=7)
    assert cache.stats()["bytes"] == 5 * 70 + 7
    assert cache.get(("snapshot", "m", 0)) == "model 0"  # read: now the most recently used snapshot
    hits = cache.hits
    assert cache.contains(("snapshot", "m", 1)) and not cache.contains(("snapshot", "m", 9))
    assert cache.hits == hits  # looking is not reading

    def snapshot(key):
        return key[0] == "snapshot"

    assert cache.count_where(snapshot) == 5
    assert cache.drop_where(snapshot, keep=2) == 3
    assert [k for k in (("snapshot", "m", s) for s in range(5)) if cache.contains(k)] == [
        ("snapshot", "m", 0), ("snapshot", "m", 4)]  # the two most recently used
    assert cache.stats()["bytes"] == 2 * 70 + 7 and cache.contains(("opening", "x"))
    assert cache.drop_where(snapshot) == 2 and cache.count_where(snapshot) == 0


def test_the_training_tabs_snapshots_are_shared_from_the_result_cache_and_bounded(monkeypatch):
    from explorer.state import cache, snapshots

    steps = snapshots.available_steps()
    if len(steps) < 3:
        pytest.skip("the shipped model folder has fewer than 3 snapshots")
    monkeypatch.setattr(cache, "results", ResultCache())
    monkeypatch.setattr(snapshots, "results", cache.results)
    monkeypatch.setattr(snapshots, "MAX_SHARED", 2)
    first = snapshots.shared_snapshot(steps[0])
    assert snapshots.shared_snapshot(steps[0]) is first and snapshots.is_loaded(steps[0])
    snapshots.shared_snapshot(steps[1])
    snapshots.shared_snapshot(steps[2])
    assert snapshots.cached_count() == 2 and not snapshots.is_loaded(steps[0])
    assert cache.results.stats()["bytes"] >= 2 * 4 * first.num_parameters()  # counted at their float32 size
    snapshots.forget_shared()
    assert snapshots.cached_count() == 0
