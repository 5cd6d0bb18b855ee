"""The family test cases (Qwen2, Qwen3, Gemma 3 text, Mistral at small shapes) and the (transformers, ours) model
pairs on the same random weights that the family tests share (tests/test_families*.py)."""
import torch
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, MistralConfig, MistralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

from models import load_pretrained

WINDOW = 5  # shorter than every prompt below, so the local layers' band and ring both matter
LOCAL = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
CASES = {
    # Qwen2: q/k/v biases, theta 1e6, tied; sliding window on the layers from max_window_layers on (2 and 3)
    "qwen2-gqa-tied": (Qwen2Config, Qwen2ForCausalLM, dict(
        num_key_value_heads=2, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2)),
    "qwen2-mqa-untied": (Qwen2Config, Qwen2ForCausalLM, dict(
        num_key_value_heads=1, tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    # Qwen3: QK-norm, head_dim 24 where hidden / heads is 16
    "qwen3-gqa-untied": (Qwen3Config, Qwen3ForCausalLM, dict(
        num_key_value_heads=2, head_dim=24, tie_word_embeddings=False)),
    "qwen3-mha-tied-window": (Qwen3Config, Qwen3ForCausalLM, dict(
        num_key_value_heads=4, head_dim=24, tie_word_embeddings=True, use_sliding_window=True, sliding_window=WINDOW,
        layer_types=LOCAL)),
    # Gemma 3: everything at once; one case with attention biases on all four projections
    "gemma3-gqa-tied": (Gemma3TextConfig, Gemma3ForCausalLM, dict(
        num_key_value_heads=2, head_dim=24, tie_word_embeddings=True, query_pre_attn_scalar=20,
        sliding_window=WINDOW, layer_types=LOCAL,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})),
    "gemma3-mqa-untied-bias": (Gemma3TextConfig, Gemma3ForCausalLM, dict(
        num_key_value_heads=1, head_dim=16, tie_word_embeddings=False, query_pre_attn_scalar=32, attention_bias=True,
        sliding_window=WINDOW, layer_types=LOCAL,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 5e5},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 500.0}})),
    "mistral-gqa-untied": (MistralConfig, MistralForCausalLM, dict(
        num_key_value_heads=2, tie_word_embeddings=False, sliding_window=WINDOW)),
}


def _pair(case: str, folder, seed: int = 0):
    """(transformers model with eager attention, our Decoder) on the same random weights, saved to ``folder``.

    Weights N(0, 0.08); biases N(0, 0.2); norm weights N(1, 0.2), or N(0, 0.2) for Gemma's (1 + w) norms: all far
    enough from their defaults that a missing bias, norm or offset shows in the logits."""
    config_class, model_class, extra = CASES[case]
    config = config_class(vocab_size=97, hidden_size=64, intermediate_size=112, num_hidden_layers=4,
                          num_attention_heads=4, max_position_embeddings=96, rms_norm_eps=1e-6,
                          bos_token_id=None, eos_token_id=None, pad_token_id=None, **extra)
    torch.manual_seed(seed)
    ref = model_class(config)
    gemma = case.startswith("gemma3")
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "norm" in name:
                p.normal_(0.0 if gemma else 1.0, 0.2)
            else:
                p.normal_(0.0, 0.2 if name.endswith(".bias") else 0.08)
    ref.save_pretrained(folder)
    ref = model_class.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    return ref, load_pretrained(folder)


def _tokens(n=2, T=20, seed=1):
    return torch.randint(0, 97, (n, T), generator=torch.Generator().manual_seed(seed))
