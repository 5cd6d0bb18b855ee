"""The word-level tokenizer shared by the default decoder and the encoder."""
from __future__ import annotations

import json
import os
import string

from . import corpus

# What transformers' AutoTokenizer reads from special_tokens_map.json / tokenizer_config.json.
SPECIAL_MAP = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
               "mask_token": "<mask>"}


def train_tokenizer(texts, vocab_size: int):
    """A BPE tokenizer whose tokens are (nearly always) whole words.

    Metaspace turns spaces into "▁" and splits on them, Punctuation splits ".", "," and ":" off
    words, so BPE merges never cross a word boundary; once every corpus word is a single token no
    pair is left to merge and training stops below ``vocab_size``. The initial alphabet holds every
    printable ASCII character, so any English text the user types still tokenizes (into pieces).
    ``<s>`` is added in front of every encoded text, as Llama does. The special tokens are
    ``corpus.SPECIAL_TOKENS`` with ids 0, 1, 2, ... in that order.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True),
        pre_tokenizers.Punctuation(behavior="isolated"),
    ])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    alphabet = [c for c in string.printable if not c.isspace()] + ["▁"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                  special_tokens=list(corpus.SPECIAL_TOKENS),
                                  initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    return tok


def save_tokenizer(tok, folder: str, model_max_length: int) -> None:
    """tokenizer.json plus the two small files AutoTokenizer reads (offline)."""
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **SPECIAL_MAP,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
    }
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as fh:
        json.dump(config, fh, indent=2)
    with open(os.path.join(folder, "special_tokens_map.json"), "w") as fh:
        json.dump(SPECIAL_MAP, fh, indent=2)


def load_tokenizer(folder: str):
    """The ``tokenizers`` object saved by :func:`save_tokenizer`."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
