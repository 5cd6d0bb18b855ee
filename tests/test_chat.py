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


def test_an_id_past_the_tokenizers_vocabulary_reads_as_its_id_not_none():
    """A model's embedding may have more rows than its tokenizer has tokens (padded vocabularies; a random model at
    SmolLM2's 49,152 rows with a smaller tokenizer): such an id is named, not shown as "None" or dropped."""
    tok = chat_tokenizer()
    hello, past = tok.convert_tokens_to_ids("hello"), len(tok) + 40
    assert text.token_strings(tok, [hello, past]) == ["hello", f"⟨id {past}⟩"]
    assert text.decode_marked(tok, [hello, past, hello]) == "hello" + f"⟨id {past}⟩" + "hello"


def test_stop_tokens_come_from_config_generation_config_and_end_of_turn():
    tok = chat_tokenizer()
    end = tok.convert_tokens_to_ids("<|im_end|>")

    class Config:
        eos_token_id = 5

    assert text.stop_token_ids(tok) == [end]
    assert text.stop_token_ids(tok, Config(), {"eos_token_id": [6, 7]}) == sorted({end, 5, 6, 7})


def test_a_chat_templates_system_prompt_is_folded_so_the_answer_stays_in_sight():
    """Issue 28: SmolLM2's template puts a system prompt before the user's turn; shown whole it filled a 1280×720
    screen and the answer was below it."""
    from explorer.panels.generation import _highlighted

    from tokenizers import Regex, decoders

    words = ["<unk>", "<|im_start|>", "<|im_end|>", "user", "assistant", "hello", "there", "\n", "system", " "]
    word_level = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s"), behavior="isolated")
    word_level.decoder = decoders.Fuse()  # spaces are tokens of their own: decoded back as they were
    tok = PreTrainedTokenizerFast(tokenizer_object=word_level, unk_token="<unk>", eos_token="<|im_end|>",
                                  additional_special_tokens=["<|im_start|>"])
    tok.chat_template = "<|im_start|>system\nhello there hello there<|im_end|>\n" + CHAT_TEMPLATE
    ids = tok(text.chat_prompt(tok, "there hello"), add_special_tokens=False)["input_ids"]
    end = tok.convert_tokens_to_ids("<|im_end|>")
    new = tok.convert_tokens_to_ids(["hello", "<|im_end|>"])
    shown = _highlighted(tok, ids, new, user_text="there hello")
    first_turn = ids.index(end) + 2  # <|im_start|> system ... <|im_end|> \n, then the user's <|im_start|>
    assert shown[0] == (f"⟨chat template and system prompt: {first_turn} tokens, not shown⟩", "special")
    assert shown[1] == ("⟨<|im_start|>⟩", "special") and "there hello" in shown[2][0]
    assert shown[-2:] == [("hello", "generated"), ("⟨<|im_end|>⟩", "special")]
    assert "hello there hello there" not in "".join(t for t, _ in shown)
    # without a system prompt nothing is folded, and without chat the prompt is shown whole
    plain = PreTrainedTokenizerFast(tokenizer_object=word_level, unk_token="<unk>", eos_token="<|im_end|>",
                                    additional_special_tokens=["<|im_start|>"])
    plain.chat_template = CHAT_TEMPLATE
    wrapped = plain(text.chat_prompt(plain, "there hello"), add_special_tokens=False)["input_ids"]
    assert _highlighted(plain, wrapped, [], user_text="there hello")[0] == ("⟨<|im_start|>⟩", "special")
    assert "hello there hello there" in "".join(t for t, _ in _highlighted(tok, ids, new))
