"""One bounded result cache: the walkthrough's forwards are kept in explorer.state.cache.results with every other
computed view, so its bounds (bytes and entries, least recently used out first) hold for them too."""
from __future__ import annotations

import numpy as np
import torch

from explorer.panels import walkthrough as pw
from explorer.probes import walkthrough as wt
from explorer.state.cache import ResultCache, approx_bytes
from models import Decoder, ModelConfig


def _model():
    torch.manual_seed(0)
    return Decoder(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                               max_seq_len=32))


def test_the_walkthrough_keeps_its_forwards_in_the_bounded_shared_cache(monkeypatch):
    small = ResultCache(max_bytes=2**30, max_entries=2)
    monkeypatch.setattr(pw, "results", small)
    m, ids = _model(), [1, 5, 9, 5]
    first, cached = pw.walk_cached(m, ids, 0)
    assert not cached and small.stats()["entries"] == 1
    for pos in (1, 2):  # two more: the first walk, least recently used, goes
        pw.walk_cached(m, ids, pos)
    assert small.stats()["entries"] == 2
    again, cached = pw.walk_cached(m, ids, 0)
    assert not cached and again is not first  # computed anew, and equal to an independent walk
    np.testing.assert_array_equal(again.layers[1].mlp_out, wt.walk(m, ids, 0).layers[1].mlp_out)
    _, cached = pw.walk_cached(m, ids, 0)
    assert cached


def test_a_walkthrough_counts_against_the_byte_bound_by_its_arrays():
    m, ids = _model(), [1, 5, 9, 5, 7, 2]
    w = wt.walk(m, ids, 3)
    arrays = sum(layer_bytes for layer_bytes in (_array_bytes(vars(layer)) for layer in w.layers))
    assert approx_bytes(w) >= arrays > 0
    tiny = ResultCache(max_bytes=arrays // 2, max_entries=10)  # a walkthrough larger than the whole cache
    tiny.put("w", w)
    assert tiny.stats()["entries"] == 0


def _array_bytes(fields: dict) -> int:
    return sum(v.nbytes for v in fields.values() if isinstance(v, np.ndarray))


def test_the_panels_package_still_offers_what_generation_and_the_tests_import_from_it():
    import explorer.panels as panels
    from explorer.panels import controls, errors

    for name in ("as_index", "as_number", "as_whole", "head_choices", "layer_choices", "outputs_of"):
        assert getattr(panels, name) is getattr(controls, name)
    for name in ("no_paths", "plain", "short", "shown", "user_errors"):
        assert getattr(panels, name) is getattr(errors, name)
