"""From-scratch transformer models: a Llama-style decoder and a classic encoder."""
from .config import ModelConfig
from .decoder import Decoder, check_tokens
from .encoder import Encoder
from .fast import optimize_for_decode
from .generate import generate
from .kv_cache import KVCache
from .loading import load_pretrained, save_pretrained

__all__ = ["ModelConfig", "Decoder", "Encoder", "KVCache", "check_tokens", "generate", "load_pretrained", "optimize_for_decode",
           "save_pretrained"]
