"""The trained encoder beside the decoder: what the Encoder vs decoder tab computes.

The encoder (``assets/encoder-model``, or the folder named by ``EXPLORER_ENCODER_MODEL``) is a
``models.encoder.EncoderForMaskedLM`` trained with masked-language modelling on the default
decoder's stories and tokenizer (``python -m training --encoder``). It is loaded once per process
and never changed. Everything here is torch in, NumPy / plain numbers out; the panel lays out.

Notation: ``T`` tokens, ``C`` model dim, ``F`` feed-forward dim, ``V`` vocabulary, ``k`` guesses.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from models.layers import LayerNorm, RMSNorm

from explorer import probes
from explorer.state.cache import results, weights_key
from lens.device import device_of, place, to_host
from lens.heldout import (choose_positions, held_out_sequences, held_out_stories, load_encoder_tokenizer,  # noqa: F401
                         masked_accuracy, next_token_accuracy)

REPO_ROOT = Path(__file__).resolve().parents[2]

_lock = threading.Lock()
_shared: tuple | None = None


def encoder_dir() -> Path:
    return Path(os.environ.get("EXPLORER_ENCODER_MODEL", REPO_ROOT / "assets" / "encoder-model"))


def load_encoder(folder: str | os.PathLike):
    """The encoder in ``folder`` (config.json + model.safetensors), in eval mode, frozen."""
    from safetensors.torch import load_file

    from models import ModelConfig
    from models.encoder import EncoderForMaskedLM

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder} has no config.json: train the encoder with "
                         "`python -m training --encoder` first.")
    config = ModelConfig.from_dict(json.loads((folder / "config.json").read_text()))
    model = EncoderForMaskedLM(config)
    model.load_state_dict(load_file(str(folder / "model.safetensors")))
    for p in model.parameters():
        p.requires_grad_(False)
    return place(model.eval())  # the app's device and dtype, like the decoder


def shared_encoder():
    """(encoder, tokenizer), loaded once per process from :func:`encoder_dir`."""
    global _shared
    with _lock:
        if _shared is None:
            folder = encoder_dir()
            _shared = (load_encoder(folder), load_encoder_tokenizer(folder))
        return _shared


def same_tokenizer(a, b) -> bool:
    """True when two tokenizers map every token string to the same id (and add the same BOS)."""
    if a is b:
        return True
    return a.get_vocab() == b.get_vocab() and a.bos_token_id == b.bos_token_id


# --------------------------------------------------------------------------------------------------
# Fill in the blank
# --------------------------------------------------------------------------------------------------

@dataclass
class Guesses:
    """Top-k guesses of one model for one position: ids (k,), probabilities (k,) summing to <= 1."""
    ids: list[int]
    probs: list[float]


@dataclass
class Blank:
    position: int            # which token of the sentence was hidden (0 is <s>)
    target: int              # the hidden token's id
    masked_ids: list[int]    # what the encoder read: the sentence with <mask> at ``position``
    encoder: Guesses         # reads both sides
    decoder: Guesses | None  # reads only ids[:position]; None when it uses another tokenizer


def _top(probs: torch.Tensor, k: int) -> Guesses:
    top = probs.topk(min(k, probs.shape[-1]))
    return Guesses([int(i) for i in top.indices], [float(p) for p in top.values])


def check_position(position, n_tokens: int) -> int:
    """The token to hide: a whole number from 1 (0 is ``<s>``) to ``n_tokens - 1``."""
    try:
        i = int(position)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an infinite number
        raise ValueError(f"the word to hide must be a token position from 1 to {n_tokens - 1}, "
                         f"got {position!r}.") from None
    if n_tokens < 2:
        raise ValueError("the sentence has no word to hide: type a sentence.")
    if not 1 <= i < n_tokens:
        raise ValueError(f"the word to hide must be a token position from 1 to {n_tokens - 1} "
                         f"(position 0 is <s>), got {i}.")
    return i


@torch.no_grad()
def encoder_probs(encoder, ids: list[int], position: int, mask_id: int) -> torch.Tensor:
    """Softmax over the vocabulary (V,) at ``position`` with that token replaced by ``mask_id``."""
    x = torch.tensor([ids], device=device_of(encoder))
    x[0, position] = mask_id
    return encoder(x)[0, position].float().softmax(-1)


@torch.no_grad()
def decoder_probs(decoder, ids: list[int], position: int) -> torch.Tensor:
    """The decoder's next-token softmax (V,) after ``ids[:position]``: its guess for ``position``."""
    x = torch.tensor([ids[:position]], device=decoder.embed_tokens.weight.device)
    return decoder(x)[0, -1].float().softmax(-1)


def fill_in_blank(encoder, mask_id: int, ids: list[int], position: int, decoder=None,
                  k: int = 10) -> Blank:
    """Hide ``ids[position]``: the encoder's top-``k`` (reading both sides) and, when ``decoder``
    is given (it must share the encoder's tokenizer), its top-``k`` next-token guesses there."""
    position = check_position(position, len(ids))
    masked = list(ids)
    masked[position] = mask_id
    enc = _top(encoder_probs(encoder, ids, position, mask_id), k)
    dec = None if decoder is None else _top(decoder_probs(decoder, ids, position), k)
    return Blank(position, ids[position], masked, enc, dec)


# --------------------------------------------------------------------------------------------------
# Accuracy on held-out stories
# --------------------------------------------------------------------------------------------------

def held_out_accuracy(decoder=None, decoder_tokenizer=None) -> dict:
    """Masked-token top-1 of the shared encoder and next-token top-1 of ``decoder`` (when it shares
    the encoder's tokenizer) at the same held-out positions. Computed once per encoder and decoder weights, kept in
    the result cache (``explorer.state.cache.results``).

    Returns {"encoder": float, "decoder": float | None, "positions": int, "stories": int}.
    """
    encoder, tok = shared_encoder()
    use_decoder = decoder is not None and decoder_tokenizer is not None and same_tokenizer(
        decoder_tokenizer, tok)
    key = ("held_out_accuracy", weights_key(encoder), weights_key(decoder) if use_decoder else None)
    return results.get_or_compute(key, lambda: _held_out_accuracy(encoder, tok, decoder if use_decoder else None))


def _held_out_accuracy(encoder, tok, decoder) -> dict:
    stories = held_out_stories(encoder_dir())
    max_len = encoder.config.max_seq_len
    if decoder is not None:
        max_len = min(max_len, decoder.config.max_seq_len + 1)
    seqs = held_out_sequences(tok, stories, max_len)
    chosen = choose_positions(seqs, tok.all_special_ids)
    return {"encoder": masked_accuracy(encoder, seqs, chosen, tok.mask_token_id),
            "decoder": next_token_accuracy(decoder, seqs, chosen) if decoder is not None else None,
            "positions": int(sum(int(c.sum()) for c in chosen)), "stories": len(stories)}


# --------------------------------------------------------------------------------------------------
# Masks, attention maps, norms and activations on the same sentence
# --------------------------------------------------------------------------------------------------

def masks(T: int) -> tuple[np.ndarray, np.ndarray]:
    """(decoder causal mask, encoder mask), each (T, T), 1 = the key is visible to the query."""
    from models.attention import build_mask

    causal = build_mask(T, T, causal=True)[0, 0].float().numpy()
    return causal, np.ones((T, T))   # build_mask(..., causal=False) is None: every key visible


def attention_maps(decoder, dec_ids: list[int], encoder, enc_ids: list[int], layer: int,
                   head: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(decoder map (T, T), encoder map (T', T'), encoder layer, encoder head): the encoder's
    layer and head are the decoder's, clipped to what the encoder has."""
    enc_layer = min(layer, encoder.config.n_layers - 1)
    enc_head = min(head, encoder.config.n_heads - 1)
    dec = probes.attention_pattern(decoder, dec_ids, layer, head)
    enc = probes.attention_pattern(encoder.encoder, enc_ids, enc_layer, enc_head)
    return dec, enc, enc_layer, enc_head


@dataclass
class NormsAndActivations:
    x: np.ndarray          # (C,) residual stream before the feed-forward norm, at the chosen token
    rms: np.ndarray        # (C,) RMSNorm(x), gain 1
    ln: np.ndarray         # (C,) LayerNorm(x), gain 1, bias 0
    grid: np.ndarray       # (G,) pre-activation values for the function curves
    silu_grid: np.ndarray
    gelu_grid: np.ndarray
    u: np.ndarray          # (F,) the feed-forward's real gate pre-activations at that token
    silu_u: np.ndarray
    gelu_u: np.ndarray
    swiglu: np.ndarray     # (F,) SiLU(gate) * up, as the model computed it
    eps: float


def norms_and_activations(decoder, ids: list[int], layer: int, t: int) -> NormsAndActivations:
    """The same vector through RMSNorm and LayerNorm, and the same pre-activations through SiLU and
    GELU: the decoder's residual stream entering layer ``layer``'s feed-forward norm at token ``t``
    (both norms with gain 1 and bias 0, so only the normalisation itself differs)."""
    c = decoder.config
    hooks = [f"blocks.{layer}.hook_resid_mid", f"blocks.{layer}.mlp.hook_gate",
             f"blocks.{layer}.mlp.hook_post"]
    _, cache = probes.run_with_cache(decoder, ids, hooks)
    # the figure boundary: one token's vectors go to the host, where the comparison norms are built
    x = torch.from_numpy(to_host(cache[hooks[0]][0, t].float()))  # (C,)
    u = torch.from_numpy(to_host(cache[hooks[1]][0, t].float()))  # (F,)
    with torch.inference_mode():
        rms = RMSNorm(c.d_model, c.norm_eps)(x[None])[0]
        ln = LayerNorm(c.d_model, c.norm_eps)(x[None])[0]
        grid = torch.linspace(-6, 6, 241)
        return NormsAndActivations(
            x=x.numpy(), rms=rms.numpy(), ln=ln.numpy(), grid=grid.numpy(),
            silu_grid=F.silu(grid).numpy(), gelu_grid=F.gelu(grid).numpy(), u=u.numpy(),
            silu_u=F.silu(u).numpy(), gelu_u=F.gelu(u).numpy(),
            swiglu=to_host(cache[hooks[2]][0, t].float()), eps=c.norm_eps)
