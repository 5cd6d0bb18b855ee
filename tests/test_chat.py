"""Chat templates, stop tokens and special tokens marked on screen, on a tokenizer built here (no download)."""
from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from explorer.state import text

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def chat_tokenizer(template: str | None = CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    words = ["<unk>", "<|im_start|>", "<|im_end|>", "user", "assistant", "hello", "there", "\n"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(r"\s+|\n", behavior="isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<|im_end|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = template
    return fast


def test_chat_prompt_matches_the_template_written_out():
    tok = chat_tokenizer()
    assert text.has_chat_template(tok) and not text.has_chat_template(chat_tokenizer(None))
    wrapped = text.chat_prompt(tok, "hello there")
    assert wrapped == "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(ValueError, match="no chat template"):
        text.chat_prompt(chat_tokenizer(None), "hello")


def test_special_tokens_are_marked_in_token_strings_and_decoded_text():
    tok = chat_tokenizer()
    start, end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    hello = tok.convert_tokens_to_ids("hello")
    assert {start, end} <= text.special_ids(tok) and hello not in text.special_ids(tok)
    assert text.token_strings(tok, [start, hello, end]) == ["⟨<|im_start|>⟩", "hello", "⟨<|im_end|>⟩"]
    segs = text.decoded_segments(tok, [start, hello, hello, end])
    assert segs[0] == ("⟨<|im_start|>⟩", True) and segs[-1] == ("⟨<|im_end|>⟩", True)
    assert [s for s, special in segs if not special] == [tok.decode([hello, hello])]
    assert text.decode_marked(tok, [hello, end]) == tok.decode([hello]) + "⟨<|im_end|>⟩"


def test_stop_tokens_come_from_config_generation_config_and_end_of_turn():
    tok = chat_tokenizer()
    end = tok.convert_tokens_to_ids("<|im_end|>")

    class Config:
        eos_token_id = 5

    assert text.stop_token_ids(tok) == [end]
    assert text.stop_token_ids(tok, Config(), {"eos_token_id": [6, 7]}) == sorted({end, 5, 6, 7})
