"""From-scratch transformer models: a Llama-style decoder and a classic encoder.

The decoder also runs the families that change Llama in a few named ways (Mistral, Qwen2, Qwen3, Gemma 3 text):
each change is one switch of ModelConfig, applied where it acts; families.py says which family sets which.

Reading order (each file uses only the ones above it, except that attention takes a KV cache and that
ModelConfig.from_hf / to_hf hand over to families.py):
    config.py      ModelConfig: every size in one validated dataclass, and the switches other families set
    families.py    each family's config.json read into those switches and written back
    rope.py        rotary tables (decoder) and the sinusoidal table (encoder)
    hooks.py       HookPoint: named places where probes observe activations
    layers.py      RMSNorm, LayerNorm, SwiGLU (GeGLU) and GELU feed-forwards
    attention.py   naive, SDPA and tiled ("flash") attention; the grouped-query Attention module
    block.py       the pre-norm residual block both models share (Gemma's sandwich norms too)
    decoder.py     Decoder (Llama and the families above) and check_tokens
    encoder.py     Encoder (classic, bidirectional)
    kv_cache.py    the preallocated cache written at explicit positions (a ring per sliding-window layer)
    generate.py    prefill, decode_one, sampling, the loop (generate_steps) and generate
    lora.py        low-rank adapters and their off / on / merged modes
    quant.py       weight-only int8
    loading.py     transformers checkpoints (safetensors) in and out

Optional, and imported only by callers that ask for speed (never by the files above):
    speed/         the fast step, a second implementation of one decode step that
                   ``generate(..., step=fast_step)`` takes when passed, with its own copy of the weights' layout

Notation in every shape comment: B batch, T positions (queries), S keys, H query heads, Hkv key/value
heads, D head dim, C model dim, V vocabulary.
"""
from .config import ModelConfig
from .decoder import Decoder, check_tokens
from .encoder import Encoder
from .generate import generate
from .kv_cache import KVCache
from .loading import load_pretrained, save_pretrained

__all__ = ["ModelConfig", "Decoder", "Encoder", "KVCache", "check_tokens", "generate", "load_pretrained",
           "save_pretrained"]
