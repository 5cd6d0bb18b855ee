"""A random transformers Llama and the same weights loaded into our Decoder (no network)."""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from models import load_pretrained


def llama_pair(folder, *, vocab_size=97, hidden_size=64, intermediate_size=112, layers=3, n_heads=4,
               n_kv_heads=2, tied=False, theta=10000.0, eps=1e-5, max_positions=96, seed=0, rope_parameters=None):
    """(transformers model with eager attention, our Decoder) on the same weights, saved to ``folder``.

    Weights are spread wide (N(0, 0.08), norms N(1, 0.1)) so a wrong rotation or pairing cannot hide in
    tiny logits.
    """
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=layers, num_attention_heads=n_heads, num_key_value_heads=n_kv_heads,
        rope_parameters=rope_parameters or {"rope_type": "default", "rope_theta": theta}, rms_norm_eps=eps,
        tie_word_embeddings=tied, max_position_embeddings=max_positions,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(seed)
    ref = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p.normal_(1.0, 0.1) if "norm" in name else p.normal_(0.0, 0.08)
    ref.save_pretrained(folder)
    ref = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    return ref, load_pretrained(folder)
