"""A stranger's small inputs (issue 31): a folder name, a model card, a loop of links, a hard link, an infinite
number, a number or dict where text belongs. Each is shown as text or answered with a sentence.

Shared helpers and fixtures: tests/hostile.py.
"""
from __future__ import annotations

import asyncio
import os

import gradio as gr
import pytest

from tests.hostile import (  # noqa: F401 - fixtures are found by their names here
    fresh, hub_local_only, load, root, served,
)

pytestmark = pytest.mark.usefixtures("served")

MARKUP = ["<img src=x onerror=alert(1)>", "**bold**", "`tick`", "[x](javascript:alert(1))", "_i_", "a&lt;b"]


@pytest.mark.parametrize("folder", MARKUP)
def test_a_folder_name_is_shown_as_text_never_as_markup(root, folder):
    import shutil

    from explorer.panels.model import local_checkpoints
    from explorer.state.checkpoints import shown_name

    shutil.copytree(root / "good", root / folder)
    status, fig, *_, state = load(folder)
    assert "Loaded" in status and state["model"] is not None
    name = state["name"]
    assert not set("<>&*`[]") & set(name) and name.endswith(" (local)"), name
    for shown in (status, fig.layout.title.text):  # the app's own Markdown and chart title show the cleaned name
        assert name in shown and folder not in shown, shown
    assert "_i_" not in state["name"]
    assert folder in local_checkpoints()  # the list holds the real name; the page shows it through shown_name
    assert not set("<>&*`[]") & set(shown_name(folder))


def test_plain_folder_names_are_shown_unchanged():
    from explorer.state.checkpoints import shown_name

    for name in ("tiny-local", "my_model", "ckpt/v1.2-final", "Ünïcode_名前", "owner/Name.v2"):
        assert shown_name(name) == name


def test_a_visitors_model_card_shows_its_html_as_text(root):
    from explorer.panels.model import _card_text

    (root / "good" / "README.md").write_text("# Card\n\n<img src=x onerror=alert(1)> **bold** kept\n")
    card = _card_text(root / "good")
    assert "<img" not in card and "&lt;img" in card and "**bold**" in card


def test_a_hard_linked_model_card_is_not_shown(root, tmp_path):
    from explorer.panels.model import _card_text

    secret = tmp_path / "outside.txt"
    secret.write_text("a file outside the model folder")
    (root / "good" / "README.md").unlink(missing_ok=True)
    os.link(secret, root / "good" / "README.md")
    card = _card_text(root / "good")
    assert "outside the model folder" not in card and "hard link" in card


def test_a_loop_of_links_gets_a_sentence(root):
    (root / "a").symlink_to(root / "b")
    (root / "b").symlink_to(root / "a")
    for source in ("a", "good/../a"):
        with pytest.raises(gr.Error, match="loop of links"):
            load(source)


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), 10**400])
def test_infinite_numbers_to_fill_in_the_blank_get_a_sentence(value):
    from explorer.panels.encoder_decoder import encoder_decoder_view, fill_in_blank_view

    with pytest.raises(gr.Error, match="the word to hide must be a token position"):
        fill_in_blank_view("The cat sat on the mat.", value, fresh())
    with pytest.raises(gr.Error, match="token position must be"):
        encoder_decoder_view("The cat sat on the mat.", 0, 0, value, fresh())


def test_an_overflow_anywhere_in_a_handler_is_a_sentence():
    from explorer.panels.errors import user_errors

    with pytest.raises(gr.Error, match="infinite or too large"):
        user_errors(lambda: int(float("inf")))()


@pytest.mark.parametrize("value", [float("inf"), {"a": 1}, [1, 2], 3])
def test_a_text_box_takes_only_text(value):
    """Gradio's Textbox would pass ``str(value)`` on: ``formats`` measured the prompt "inf" for 11 s."""
    from explorer.web import gradio_adapter as adapter
    from explorer.web.serving import bad_value_sentence

    seen = []
    with gr.Blocks() as demo:
        box = gr.Textbox(label="Prompt")
        out = gr.Textbox()
        box.submit(seen.append, box, out, api_name="formats")
    adapter.sentence_for_bad_values(demo, bad_value_sentence)
    block_fn = demo.fns[0]
    with pytest.raises(gr.Error, match="Prompt must be text") as caught:
        asyncio.run(demo.preprocess_data(block_fn, [value], None))
    assert "formats" in caught.value.message and not seen
    assert asyncio.run(demo.preprocess_data(block_fn, ["a sentence"], None)) == ["a sentence"]


def test_sessions_loading_the_same_folder_share_one_copy_until_one_fine_tunes(root):
    """Two sessions load the same local folder: one model object, counted once against the cap, shown as
    shared; the first change (a private copy, as a fine-tune or LoRA makes) gives that session its own, and the
    other keeps the shared one untouched. Changed files on disk make a new load."""
    import torch

    from explorer.state import session
    from explorer.state.private_models import model_bytes, private_models_bytes

    before = private_models_bytes()
    status_a, *_, a = load("good")
    status_b, *_, b = load("good")
    assert a["model"] is b["model"] and a["tokenizer"] is b["tokenizer"]
    assert private_models_bytes() - before == model_bytes(a["model"])  # one copy held, one counted
    assert session.is_shared(a["model"]) and "shared by every session" in status_b
    shared = a["model"]
    weights = {k: v.clone() for k, v in shared.state_dict().items()}
    own, _, _ = session.private_model(a)
    assert own is not shared and a["model"] is own and b["model"] is shared and not session.is_shared(own)
    with torch.no_grad():
        next(own.parameters()).add_(1.0)  # what a fine-tune would do to its own copy
    assert all(torch.equal(weights[k], v) for k, v in shared.state_dict().items())
    (root / "good" / "config.json").touch()
    os.utime(root / "good" / "config.json", ns=(1, 1))
    *_, c = load("good")
    assert c["model"] is not shared  # the files changed: not the copy made from the old ones
