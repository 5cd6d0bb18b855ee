"""Our decoder against transformers' LlamaForCausalLM on the same random weights (no network)."""
import pytest
import torch
from transformers import LlamaForCausalLM

from models import generate
from models.speed import fast_step, optimize_for_decode
from models.loading import save_pretrained
from tests.llama_pair import llama_pair

CASES = {
    "mha-untied": dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False, theta=10000.0, eps=1e-5),
    "gqa-tied": dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, theta=500.0, eps=1e-6),
    "mqa-untied": dict(num_attention_heads=8, num_key_value_heads=1, tie_word_embeddings=False, theta=1e6, eps=1e-5),
}


def _build(case, tmp_path, seed=0):
    c = CASES[case]
    return llama_pair(tmp_path, n_heads=c["num_attention_heads"], n_kv_heads=c["num_key_value_heads"],
                      tied=c["tie_word_embeddings"], theta=c["theta"], eps=c["eps"], seed=seed)


def _tokens(n=2, T=24, seed=1):
    return torch.randint(0, 97, (n, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("impl", ["naive", "sdpa", "tiled"])
def test_logits_match_transformers(case, impl, tmp_path):
    ref, ours = _build(case, tmp_path)
    tokens = _tokens()
    with torch.no_grad():
        expected = ref(tokens).logits
        got = ours(tokens, attn_impl=impl)
    assert expected.abs().max() > 1.0  # the logits are large enough for a wrong rotation to show
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())


@pytest.mark.parametrize("case", list(CASES))
def test_attention_weights_equal_transformers_output_attentions(case, tmp_path):
    ref, ours = _build(case, tmp_path)
    tokens = _tokens(T=17)
    captured = {}
    handles = [b.attn.hook_pattern.register_forward_hook(
        lambda mod, inp, out, i=i: captured.__setitem__(i, inp[0].clone())) for i, b in enumerate(ours.blocks)]
    try:
        with torch.no_grad():
            ours(tokens, attn_impl="naive")
            attns = ref(tokens, output_attentions=True).attentions
    finally:
        for h in handles:
            h.remove()
    assert len(attns) == len(captured) == 3
    for i, a in enumerate(attns):
        torch.testing.assert_close(captured[i], a, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["gqa-tied", "mqa-untied"])
def test_greedy_tokens_equal_transformers_generate(case, tmp_path):
    ref, ours = _build(case, tmp_path)
    prompt = _tokens(n=1, T=8, seed=3)
    with torch.no_grad():
        expected = ref.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=32,
                                min_new_tokens=32, do_sample=False)
    assert torch.equal(generate(ours, prompt, 32), expected)
    assert torch.equal(generate(ours, prompt, 32, use_cache=False), expected)
    served = optimize_for_decode(ours)  # the layout the app serves, decoded by the modules and by the fast step
    assert torch.equal(generate(served, prompt, 32), expected)
    assert torch.equal(generate(served, prompt, 32, step=fast_step), expected)


def test_save_pretrained_round_trips_into_transformers(tmp_path):
    ref, ours = _build("gqa-tied", tmp_path / "a")
    save_pretrained(ours, tmp_path / "b")
    again = LlamaForCausalLM.from_pretrained(tmp_path / "b", dtype=torch.float32).eval()
    tokens = _tokens()
    with torch.no_grad():
        torch.testing.assert_close(again(tokens).logits, ref(tokens).logits, rtol=1e-5, atol=1e-5)
