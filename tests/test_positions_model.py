"""The Positions tab follows the loaded model: its hints, ranges and the scaled wavelengths come from that model's
config (a llama3-scaled random model here), and its views are computed once per model and inputs."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from explorer import probes

from explorer.state import session
from explorer.state.cache import results
from explorer.panels import positions
from models.config import ModelConfig
from models.decoder import Decoder

PROMPT = "Tom gave the red ball to Anna."
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 256}
THETA = 500000.0


def _llama3_wavelengths(D: int) -> tuple[np.ndarray, np.ndarray]:
    """(plain, scaled) positions per turn, float64, from Meta's Llama 3.1 definition with explicit bands."""
    plain = 2 * math.pi * THETA ** (np.arange(0, D, 2) / D)
    context, factor = LLAMA3["original_max_position_embeddings"], LLAMA3["factor"]
    lo, hi = context / LLAMA3["low_freq_factor"], context / LLAMA3["high_freq_factor"]
    scaled = []
    for w in plain:
        if w < hi:
            scaled.append(w)
        elif w > lo:
            scaled.append(w * factor)
        else:
            s = (context / w - LLAMA3["low_freq_factor"]) / (LLAMA3["high_freq_factor"] - LLAMA3["low_freq_factor"])
            scaled.append(2 * math.pi / ((1 - s) * (2 * math.pi / w) / factor + s * (2 * math.pi / w)))
    return plain, np.array(scaled)


@pytest.fixture()
def scaled_state():
    _, tokenizer = session.load_default()
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=len(tokenizer), d_model=128, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=256,
                         max_seq_len=1024, rope_theta=THETA, rope_scaling=LLAMA3)
    return session.set_model(session.new_state(), Decoder(config).eval(), tokenizer, "llama3-test", "test")


def test_labels_ranges_and_scaled_wavelengths_come_from_the_loaded_model(scaled_state):
    view = positions.rope_view(PROMPT, THETA, 5, [0, 31], 1, 1, scaled_state)
    assert view.theta.info == "trained with 500,000; try 100 or 1,000,000"
    assert view.pairs.label == "Pairs to follow (0 = fastest, 31 = slowest)"  # head_dim 64: 32 pairs
    assert view.pairs.choices[-1][1] == 31
    assert [v for _, v in view.layer.choices] == [0, 1]
    assert "context 1,024 positions" in view.md and "RoPE scaling (llama3, factor 8" in view.md
    w = view.wavelengths
    assert len(w.data) == 3 and "plain and scaled (llama3" in w.layout.title.text
    assert w.data[2].name == "context: 1,024 positions"  # a dashed line, drawn as a trace (see the test below)
    plain, scaled = _llama3_wavelengths(64)
    np.testing.assert_allclose(np.asarray(w.data[0].y, float), plain, rtol=1e-9)
    np.testing.assert_allclose(np.asarray(w.data[1].y, float), scaled, rtol=1e-9)
    bands = (scaled == plain).sum(), (scaled == plain * 8).sum()
    assert 0 < bands[0] and 0 < bands[1] and bands[0] + bands[1] < 32  # all three bands show
    angles = np.asarray(view.angles.data[0].z, float)  # the angle table turns at the scaled speeds
    np.testing.assert_allclose(angles, np.mod(np.outer(np.arange(64), 2 * math.pi / scaled), 2 * math.pi), atol=1e-8)


def test_the_default_model_says_it_has_no_scaling():
    view = positions.rope_view(PROMPT, 10000.0, 5, [0, 15], 0, 0, session.new_state())
    w = view.wavelengths
    assert len(w.data) == 2 and "no RoPE scaling" in w.layout.title.text  # the wavelengths and the context line
    assert view.pairs.label == "Pairs to follow (0 = fastest, 15 = slowest)"
    assert "RoPE scaling" not in view.md


def test_a_view_is_computed_once_per_model_and_inputs(scaled_state, monkeypatch):
    calls = []
    real = probes.rope_probe
    monkeypatch.setattr(probes, "rope_probe", lambda *a, **k: calls.append(1) or real(*a, **k))
    results.clear()
    first = positions.rope_view(PROMPT, THETA, 5, [0, 1], 0, 0, scaled_state)
    again = positions.rope_view(PROMPT, THETA, 5, [0, 1], 0, 0, scaled_state)
    assert len(calls) == 1 and again.md == first.md
    positions.rope_view(PROMPT, THETA, 5, [0, 1], 0, 0, session.new_state())  # another model: its own entry
    assert len(calls) == 2


def test_the_wavelength_chart_keeps_its_log_axis_on_the_data():
    """Plotly reads a data-anchored annotation's y on a log axis as log10(y): a "context" label at y=256 once
    stretched the axis to 10^277 and flattened every point. Nothing may sit on the log axis but the traces."""
    from explorer.figures import positions as figs

    plain = 2 * math.pi * 10000.0 ** (np.arange(32) / 32)
    fig = figs.rope_wavelength_figure(plain, None, theta=10000.0, context=256)
    assert fig.layout.yaxis.type == "log" and fig.layout.yaxis.dtick == 1
    assert not [a for a in fig.layout.annotations if a.yref in (None, "y")]
    assert not [s for s in fig.layout.shapes if s.yref in (None, "y")]
    context = [t for t in fig.data if t.name.startswith("context")]
    assert len(context) == 1 and list(context[0].y) == [256, 256]
