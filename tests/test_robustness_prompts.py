"""A visitor's text: empty, huge, emoji, markup, control characters, lone surrogates, server paths in messages.

Shared helpers and fixtures: tests/hostile.py.
"""
from __future__ import annotations

import json

import gradio as gr
import plotly.graph_objects as go
import pytest

from explorer.state import session

from tests.tiers import fast_first
from tests.hostile import (  # noqa: F401 - fixtures are found by their names here
    VIEWS, _prompt_endpoints, forbid, forbid_model_runs, fresh, hub_local_only, prompt_handlers, served,
)

pytestmark = pytest.mark.usefixtures("served")  # not an argument: hypothesis would print the model


@pytest.mark.parametrize("handler", ["attention", "rope", "encoder_decoder", "generate", "lora_compare",
                                     "lora_finetune"])
@pytest.mark.parametrize("prompt", ["", "   \n\t  ", "\x00\x01\x7f\x1b", "\u200b\u202e\u2066", None])
def test_empty_prompts_are_refused_before_the_model_runs(monkeypatch, handler, prompt):
    call = prompt_handlers()[handler]
    forbid_model_runs(monkeypatch)
    with pytest.raises(gr.Error, match="empty"):
        call(prompt)


@pytest.mark.parametrize("handler", ["attention", "generate", "lora_finetune"])
def test_huge_texts_are_refused_before_tokenizing(monkeypatch, handler):
    call = prompt_handlers()[handler]
    forbid_model_runs(monkeypatch)
    with pytest.raises(gr.Error, match="characters long; paste at most"):
        call("The cat sat. " * 20_000)


@pytest.mark.parametrize("handler", ["attention", "rope", "encoder_decoder", "generate", "lora_compare"])
@pytest.mark.parametrize("prompt", fast_first(["🦄🐳 the purple whale 🐋", "Tom\x00 gave\x07 the\x1b ball\u200b.",
                                               "中文 日本語 한국어", "العربية עברית"], 2))
def test_emoji_non_latin_and_control_characters_work(handler, prompt):
    out = prompt_handlers()[handler](prompt)
    text = json.dumps([o.to_plotly_json() if isinstance(o, go.Figure) else o for o in out], default=str)
    for c in "\x00\x07\x1b\u200b":  # control characters were stripped, not shown
        assert c not in text


def test_html_in_a_prompt_is_shown_as_text():
    from explorer.panels.attention import attention_view
    from explorer.panels.generation import generate

    prompt = "<script>alert(1)</script> <img src=x onerror=alert(2)> <b>bold</b>"
    heat, table, info, *rest = attention_view(prompt, 0, 0, VIEWS[0], fresh())
    labels = list(heat.data[0].y)
    assert any("&lt;" in label for label in labels)  # plotly would render tags in labels: they are escaped
    for item in [heat, info, *rest]:
        text = item.to_json() if isinstance(item, go.Figure) else json.dumps(item, default=str)
        assert "<script" not in text and "<img" not in text and "<b>bold" not in text
    shown = "".join(str(row[1]) for row in table)  # the token table (plain text cells) keeps the characters
    assert "script" in shown
    out = generate(prompt, 3, 0.0, None, None, 0, fresh())
    assert "<script>" in next(t for t, kind in out.text if kind is None)  # HighlightedText shows the prompt as text


def test_a_prompt_longer_than_the_view_is_cut_with_a_notice():
    from explorer.panels.attention import MAX_TOKENS, attention_view

    heat, table, info, *_ = attention_view("the cat sat. " * 400, 0, 0, VIEWS[0], fresh())
    assert len(heat.data[0].y) == len(table) == MAX_TOKENS
    assert "only the first" in info


def test_a_prompt_longer_than_the_context_is_refused_by_generate(monkeypatch):
    from explorer import probes
    from explorer.panels.generation import generate

    forbid(monkeypatch, probes, "compare_cache", "generation_trace", "stream_generation")
    with pytest.raises(gr.Error, match="shorten it.*context"):
        generate("the cat sat. " * 2000, 8, 0.8, 50, 0.95, 0, fresh())
    with pytest.raises(gr.Error) as info:  # another refusal of the prompt keeps its own sentence, nothing added
        generate(" \n ", 8, 0.8, 50, 0.95, 0, fresh())
    assert "The prompt is empty" in info.value.message and "must fit" not in info.value.message


def test_a_prompt_too_long_is_its_own_error_type():
    from explorer.state.text import PromptTooLong, encode

    _, tokenizer = session.load_default()
    with pytest.raises(PromptTooLong) as info:
        encode(tokenizer, "the cat sat. " * 50, 10)
    assert isinstance(info.value, ValueError) and info.value.max_len == 10 and info.value.n_tokens > 10
    assert "shorten it" in str(info.value)
    ids, labels = encode(tokenizer, "the cat sat. " * 50, 10, truncate=True)
    assert len(ids) == len(labels) == 10


@pytest.mark.parametrize("handler", ["attention", "rope", "encoder_decoder", "generate", "lora_compare",
                                     "lora_finetune", "walkthrough", "fill_in_blank", "formats"])
@pytest.mark.parametrize("prompt", ["Tom \ud800 has a ball", "\ud800", "a \udfff\ud83d b"])
def test_a_lone_surrogate_in_a_prompt_gets_a_sentence_on_every_endpoint(monkeypatch, handler, prompt):
    """Half of a UTF-16 pair (what JSON's "\\ud800" decodes to) is no character: the tokenizer raised a bare
    TypeError on it; now each endpoint refuses it with a sentence before the model runs."""
    forbid_model_runs(monkeypatch)
    with pytest.raises(gr.Error, match="broken character") as caught:
        _prompt_endpoints()[handler](prompt)
    assert "\ud800" not in caught.value.message and "\udfff" not in caught.value.message
def test_error_popups_show_markup_as_text_and_cut_long_echoes():
    from explorer.panels import as_index, user_errors

    @user_errors
    def handler(text):
        raise ValueError(f"cannot read {text!r}")

    with pytest.raises(gr.Error) as caught:
        handler("<b>bold</b> \ud800")
    assert "<b>" not in caught.value.message and "&lt;b&gt;bold&lt;/b&gt;" in caught.value.message
    for value in (float("inf"), 1e308, "9" * 100_000):
        with pytest.raises(ValueError, match="layer must be") as caught:
            as_index(value, 4, "layer")
        assert len(str(caught.value)) < 120


def test_messages_never_show_absolute_server_paths(tmp_path):
    """A ValueError that names a file by its server path (from a library, say) reaches the visitor with the
    path cut to its last part."""
    from explorer.panels import user_errors

    secret = tmp_path / "srv" / "models" / "config.json"

    @user_errors
    def handler():
        raise ValueError(f"cannot parse {secret}: expected a number at line 3")

    with pytest.raises(gr.Error) as caught:
        handler()
    assert str(tmp_path) not in caught.value.message and "/srv/" not in caught.value.message
    assert "config.json: expected a number" in caught.value.message
