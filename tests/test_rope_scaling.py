"""RoPE scaling (``linear``, ``llama3``) against transformers' LlamaForCausalLM on random weights (no network)."""
import math

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.llama_pair import llama_pair
from models.config import ModelConfig
from models.loading import save_pretrained
from models.rope import rope_frequencies

HEAD_DIM = 32  # hidden 128 / 4 heads: 16 pairs, wavelengths from 2π to about 2π·θ^(30/32)
THETA = 10000.0

# factor, low, high, original context: with θ = 10,000 and D = 32 the wavelengths run 6.3 .. 36,600 positions, so
# an original context of 64 (bands at 64 / high and 64 / low positions) puts pairs in all three bands.
LLAMA3 = [
    dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64),
    dict(factor=4.0, low_freq_factor=2.0, high_freq_factor=8.0, original_max_position_embeddings=256),
    dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=128),
]
LINEAR = [dict(factor=f) for f in (1.0, 2.0, 4.0, 16.0)]
CASES = [("llama3", p) for p in LLAMA3] + [("linear", p) for p in LINEAR]


def _bands(params) -> tuple[int, int, int]:
    """How many pairs fall in each llama3 band (kept, blended, divided), counted in float64 from the definition."""
    wavelengths = 2 * math.pi * THETA ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    context = params["original_max_position_embeddings"]
    fast = wavelengths < context / params["high_freq_factor"]
    slow = wavelengths > context / params["low_freq_factor"]
    return int(fast.sum()), int((~fast & ~slow).sum()), int(slow.sum())


def _pair(folder, kind, params, seed=0, tied=False):
    """(transformers model, our Decoder) on the same random weights with this RoPE scaling."""
    return llama_pair(folder, hidden_size=128, intermediate_size=176, layers=2, tied=tied, max_positions=512,
                      seed=seed, rope_parameters={"rope_type": kind, "rope_theta": THETA, **params})


def test_the_llama3_cases_cover_all_three_bands():
    for params in LLAMA3:
        assert all(n > 0 for n in _bands(params)), _bands(params)


@pytest.mark.parametrize("kind, params", CASES, ids=[f"{k}-{p['factor']:g}" for k, p in CASES])
def test_inverse_frequencies_equal_transformers(kind, params):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(hidden_size=128, num_attention_heads=4, max_position_embeddings=512,
                         rope_parameters={"rope_type": kind, "rope_theta": THETA, **params})
    expected, attention_factor = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
    assert attention_factor == 1.0  # neither scaling rescales cos/sin, so the frequencies are the whole story
    got = rope_frequencies(HEAD_DIM, THETA, {"rope_type": kind, **params})
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=0)
    assert not torch.equal(got, rope_frequencies(HEAD_DIM, THETA)) or params["factor"] == 1.0


@pytest.mark.parametrize("kind, params", CASES, ids=[f"{k}-{p['factor']:g}" for k, p in CASES])
def test_logits_match_transformers(kind, params, tmp_path):
    ref, ours = _pair(tmp_path, kind, params)
    assert ours.config.rope_scaling == {"rope_type": kind, **params}
    tokens = torch.randint(0, 97, (2, 300), generator=torch.Generator().manual_seed(1))  # past the original context
    with torch.no_grad():
        expected = ref(tokens).logits
        got = ours(tokens)
        rebuilt = ours(tokens, rope_theta=THETA)  # tables rebuilt for a θ override keep the model's scaling
    assert expected.abs().max() > 1.0
    tol = dict(rtol=1e-4, atol=1e-4 * expected.abs().max().item())
    torch.testing.assert_close(got, expected, **tol)
    torch.testing.assert_close(rebuilt, expected, **tol)


@pytest.mark.parametrize("kind, params", [CASES[0], CASES[4]], ids=["llama3", "linear"])
def test_saved_checkpoint_loads_in_transformers_unchanged(kind, params, tmp_path):
    ref, ours = _pair(tmp_path / "a", kind, params, tied=True)
    save_pretrained(ours, tmp_path / "b")
    again = LlamaForCausalLM.from_pretrained(tmp_path / "b", dtype=torch.float32).eval()
    assert again.config.rope_parameters["rope_type"] == kind
    tokens = torch.randint(0, 97, (2, 200), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(again(tokens).logits, ref(tokens).logits, rtol=1e-5, atol=1e-5)


def test_older_config_files_with_rope_scaling_and_a_top_level_theta_load():
    hf = {**ModelConfig(d_model=64, n_heads=4).to_hf(), "rope_theta": 5e5}
    del hf["rope_parameters"]
    hf["rope_scaling"] = {"type": "linear", "factor": 2}
    c = ModelConfig.from_hf(hf)
    assert c.rope_theta == 5e5 and c.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    hf["rope_scaling"] = {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4}
    assert ModelConfig.from_hf(hf).rope_scaling["original_max_position_embeddings"] == hf["max_position_embeddings"]


@pytest.mark.parametrize("scaling, message", [
    ({"rope_type": "yarn", "factor": 4.0}, r"'yarn' is not supported: only plain RoPE and the scalings \['linear', 'llama3'\]"),
    ({"rope_type": "dynamic", "factor": 2.0}, "'dynamic' is not supported"),
    ({"rope_type": "longrope", "factor": 2.0}, "'longrope' is not supported"),
    ({"rope_type": "linear"}, "needs a number for 'factor'"),
    ({"rope_type": "linear", "factor": 0.5}, "at least 1"),
    ({"rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 1,
      "original_max_position_embeddings": 8192}, "low_freq_factor < high_freq_factor"),
])
def test_unsupported_or_broken_scalings_are_refused_by_name(scaling, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(d_model=64, n_heads=4, rope_scaling=scaling)
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf({**ModelConfig(d_model=64, n_heads=4).to_hf(),
                             "rope_parameters": {**scaling, "rope_theta": 5e5}})
