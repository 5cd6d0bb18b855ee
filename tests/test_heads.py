"""Head scores on hand-built attention patterns, where the right answer is known by construction."""
import numpy as np
import pytest
import torch

from lens.heads import (
    duplicate_token_score,
    first_token_score,
    induction_score,
    previous_token_score,
    head_scores,
    induction_scores,
    repeated_random_tokens,
)
from models import Decoder, ModelConfig


def _uniform_causal(B, H, T):
    m = np.tril(np.ones((T, T)))
    m /= m.sum(-1, keepdims=True)
    return torch.tensor(np.broadcast_to(m, (B, H, T, T)).copy())


def _previous_token(T):
    m = np.zeros((T, T))
    m[0, 0] = 1.0
    for t in range(1, T):
        m[t, t - 1] = 1.0
    return m


def _first_token(T):
    m = np.zeros((T, T))
    m[:, 0] = 1.0
    return m


def _induction(T, span_len):
    # Second copy occupies the last span_len rows; elsewhere attend to self.
    m = np.eye(T)
    for j in range(T - span_len, T):
        m[j] = 0.0
        m[j, j - span_len + 1] = 1.0
    return m


def test_pure_previous_token_pattern_scores_one():
    T = 9
    pat = torch.tensor(_previous_token(T))[None, None]          # (1, 1, T, T)
    assert previous_token_score(pat).tolist() == pytest.approx([1.0])
    assert first_token_score(pat).tolist() == pytest.approx([1 / (T - 1)])  # only t=1 hits key 0


def test_uniform_pattern_matches_numpy_average():
    B, H, T = 2, 3, 7
    pat = _uniform_causal(B, H, T)
    expected = np.mean([1.0 / (t + 1) for t in range(1, T)])
    assert previous_token_score(pat).numpy() == pytest.approx(np.full(H, expected))
    assert first_token_score(pat).numpy() == pytest.approx(np.full(H, expected))


def test_heads_are_scored_separately_and_layers_axis_kept():
    T = 8
    heads = np.stack([_previous_token(T), _first_token(T), _induction(T, 3), np.eye(T)])
    pat = torch.tensor(heads)[None]                             # (1, 4, T, T)
    prev = previous_token_score(pat)
    first = first_token_score(pat)
    assert prev.shape == (4,)
    assert int(prev.argmax()) == 0 and prev[0] == pytest.approx(1.0)
    assert int(first.argmax()) == 1 and first[1] == pytest.approx(1.0)
    stacked = torch.stack([pat] * 3)                            # (L=3, B=1, H=4, T, T)
    assert previous_token_score(stacked).shape == (3, 4)
    assert torch.allclose(previous_token_score(stacked)[2], prev)


@pytest.mark.parametrize("bos", [True, False])
def test_planted_induction_head_scores_one_and_ranks_first(bos):
    span = 6
    T = 2 * span + (1 if bos else 0)
    rng = np.random.default_rng(0)
    others = []
    for _ in range(3):                                          # random causal heads
        m = np.tril(rng.random((T, T)))
        others.append(m / m.sum(-1, keepdims=True))
    heads = np.stack([others[0], _induction(T, span), others[1], _previous_token(T), others[2]])
    pat = torch.tensor(np.stack([heads, heads]))                # (B=2, H=5, T, T)
    score = induction_score(pat, span)
    assert score[1] == pytest.approx(1.0)
    assert int(score.argmax()) == 1
    assert score.max() - torch.cat([score[:1], score[2:]]).max() > 0.5


def test_induction_score_bos_offset_counts_from_the_end():
    # [BOS] a b c a b c: query 4 (second 'a') should attend to key 2 ('b' after the first 'a').
    span = 3
    T = 1 + 2 * span
    m = np.zeros((T, T))
    m[:, 0] = 1.0
    for j, k in [(4, 2), (5, 3), (6, 4)]:
        m[j] = 0.0
        m[j, k] = 1.0
    assert induction_score(torch.tensor(m)[None, None], span).tolist() == pytest.approx([1.0])


def test_duplicate_token_score():
    tokens = torch.tensor([[5, 7, 5, 9, 7]])
    T = 5
    m = np.zeros((T, T))
    for t in range(T):
        m[t, t] = 1.0
    m[2] = 0.0
    m[2, 0] = 1.0          # second 5 looks at the first 5
    m[4] = 0.0
    m[4, 1] = 0.25         # second 7 puts a quarter on the first 7
    m[4, 4] = 0.75
    score = duplicate_token_score(torch.tensor(m)[None, None], tokens)
    assert score.tolist() == pytest.approx([(1.0 + 0.25) / 2])
    no_repeat = duplicate_token_score(torch.tensor(np.eye(3))[None, None], torch.tensor([1, 2, 3]))
    assert torch.isnan(no_repeat).all()


def test_repeated_random_tokens_probe():
    x = repeated_random_tokens(vocab_size=50, span_len=10, batch=4, seed=3, bos_id=1)
    assert x.shape == (4, 21) and x.dtype == torch.long
    assert (x[:, 0] == 1).all()
    assert torch.equal(x[:, 1:11], x[:, 11:])
    assert not (x[:, 1:] == 1).any()
    for row in x[:, 1:11]:
        assert len(set(row.tolist())) == 10                     # distinct within a span
    assert torch.equal(x, repeated_random_tokens(50, 10, 4, seed=3, bos_id=1))
    assert not torch.equal(x, repeated_random_tokens(50, 10, 4, seed=4, bos_id=1))
    y = repeated_random_tokens(50, 5, 2, seed=0, candidates=[10, 11, 12, 13, 14, 15])
    assert y.shape == (2, 10) and ((y >= 10) & (y <= 15)).all()
    with pytest.raises(ValueError):
        repeated_random_tokens(5, 10, 1, seed=0)


def test_bad_shapes_raise_value_error():
    with pytest.raises(ValueError):
        previous_token_score(torch.zeros(3, 3))
    with pytest.raises(ValueError):
        induction_score(torch.zeros(1, 1, 5, 5), span_len=3)


@pytest.mark.parametrize("bos", [None, 0])
def test_induction_scores_equal_head_scores_without_the_stack(bos):
    # The one-forward reduction against the full path: every layer's (B, H, T, T) weights stacked, then scored.
    torch.manual_seed(0)
    model = Decoder(ModelConfig(vocab_size=97, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=48,
                                max_seq_len=64, bos_token_id=bos)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)  # patterns far from uniform, so a wrong entry would show
    for span, batch, seed in ((5, 4, 0), (20, 3, 7)):
        got = induction_scores(model, span, batch=batch, seed=seed)
        want = head_scores(model, span_len=span, batch=batch, seed=seed)["induction"]
        assert got.shape == (3, 4) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
        assert float(np.ptp(got)) > 0.01
    with pytest.raises(ValueError, match="use span_len <= 3[12]"):
        induction_scores(model, 40)
