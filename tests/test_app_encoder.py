"""The Encoder vs decoder tab through gradio_client: fill in the blank is each model's own softmax,
the held-out accuracies are the ones measured on the shipped encoder, and a decoder with another
tokenizer is said so plainly."""
import numpy as np
import pytest
import torch
from gradio_client.exceptions import AppError

from explorer.probes import encoder_probe as ep
from explorer import probes
from explorer.state import session
from tests.plotly_payload import arr, fig

SENTENCE = "Tom gave the red ball to Anna."


@pytest.fixture(scope="module")
def served(client):
    return session.load_default()


@pytest.fixture(scope="module")
def encoder_and_tokenizer():
    # Loaded here again from the files, not the app's shared copy.
    return ep.load_encoder(ep.encoder_dir()), ep.load_encoder_tokenizer(ep.encoder_dir())


def _ids(tok, text):
    return list(tok(text)["input_ids"])


def test_fill_in_blank_is_the_encoders_own_softmax(client, served, encoder_and_tokenizer):
    encoder, tok = encoder_and_tokenizer
    decoder, dec_tok = served
    ids = _ids(tok, SENTENCE)
    position = ids.index(tok.convert_tokens_to_ids("▁red"))
    figure, table, md = client.predict(SENTENCE, position, api_name="/fill_in_blank")
    x = torch.tensor([ids])
    x[0, position] = tok.mask_token_id
    with torch.no_grad():
        probs = torch.softmax(encoder(x)[0, position].double(), -1)
    top = probs.topk(10)
    rows = table["data"]
    assert [r[0] for r in rows] == list(range(1, 11))
    assert [r[1] for r in rows] == [tok.decode([int(i)]) for i in top.indices]
    np.testing.assert_allclose([r[2] for r in rows], top.values.numpy(), atol=2e-6)
    f = fig(figure)
    np.testing.assert_allclose(arr(f["data"][0]["x"]), top.values.numpy(), atol=1e-5)
    assert "[MASK]" in md and "red" in md
    if ep.same_tokenizer(dec_tok, tok):
        # The decoder's column: its next-token softmax after the tokens before the blank.
        with torch.no_grad():
            dprobs = torch.softmax(decoder(torch.tensor([ids[:position]]))[0, -1].double(), -1)
        dtop = dprobs.topk(10)
        assert [r[3] for r in rows] == [tok.decode([int(i)]) for i in dtop.indices]
        np.testing.assert_allclose([r[4] for r in rows], dtop.values.numpy(), atol=2e-6)
        np.testing.assert_allclose(arr(f["data"][1]["x"]), dtop.values.numpy(), atol=1e-5)


@pytest.mark.slow
def test_held_out_accuracies_are_the_measured_ones(client, served, encoder_and_tokenizer):
    import json

    encoder, tok = encoder_and_tokenizer
    decoder, dec_tok = served
    *_, md = client.predict(SENTENCE, 1, api_name="/fill_in_blank")
    stories = ep.held_out_stories(ep.encoder_dir())
    seqs = ep.held_out_sequences(tok, stories, encoder.config.max_seq_len)
    chosen = ep.choose_positions(seqs, tok.all_special_ids)
    acc = ep.masked_accuracy(encoder, seqs, chosen, tok.mask_token_id)
    assert f"right **{acc:.1%}**" in md
    assert f"Measured on {len(stories)} held-out stories" in md
    with open(ep.encoder_dir() / "training_log.json") as fh:
        log = json.load(fh)
    assert acc == pytest.approx(log["held_out"]["encoder_accuracy"], abs=1e-9)
    if ep.same_tokenizer(dec_tok, tok):
        dec = ep.next_token_accuracy(decoder, seqs, chosen)
        assert f"right **{dec:.1%}**" in md and "only the words before" in md


def test_encoder_map_is_the_trained_encoders_pattern(client, encoder_and_tokenizer):
    encoder, tok = encoder_and_tokenizer
    out = client.predict(SENTENCE, 1, 2, -1, api_name="/encoder_decoder")
    ids = _ids(tok, SENTENCE)
    ref = probes.attention_pattern(encoder.encoder, ids, 1, 2)
    a = fig(out[1])
    np.testing.assert_allclose(arr(a["data"][1]["z"]).astype(float), ref, atol=1e-6)
    assert not np.allclose(ref, 1.0 / len(ids), atol=0.02)   # trained: not flat
    assert "masked-language modelling" in out[4]


def test_fill_in_blank_refuses_bad_positions(client):
    with pytest.raises(AppError, match="word to hide must be"):
        client.predict(SENTENCE, 0, api_name="/fill_in_blank")
    with pytest.raises(AppError, match="word to hide must be"):
        client.predict(SENTENCE, 99, api_name="/fill_in_blank")
    with pytest.raises(AppError, match="word to hide must be"):
        client.predict(SENTENCE, "red", api_name="/fill_in_blank")


@pytest.mark.slow
def test_another_tokenizer_is_said_plainly(app_url, model_root, encoder_and_tokenizer):
    from tests.loopback import loopback_client

    encoder, tok = encoder_and_tokenizer
    c = loopback_client(app_url)
    c.predict(str(model_root / "tiny-local"), api_name="/load_model")
    ids = _ids(tok, SENTENCE)
    position = ids.index(tok.convert_tokens_to_ids("▁red"))
    figure, table, md = c.predict(SENTENCE, position, api_name="/fill_in_blank")
    assert "another tokenizer" in md and "default model's tokenizer" in md
    assert all(r[3] in ("", None) for r in table["data"])
    x = torch.tensor([ids])
    x[0, position] = tok.mask_token_id
    with torch.no_grad():
        probs = torch.softmax(encoder(x)[0, position].double(), -1)
    np.testing.assert_allclose([r[2] for r in table["data"]], probs.topk(10).values.numpy(), atol=2e-6)
    out = c.predict(SENTENCE, 0, 0, -1, api_name="/encoder_decoder")
    assert "another tokenizer" in out[4]
    enc_map = arr(fig(out[1])["data"][1]["z"]).astype(float)
    np.testing.assert_allclose(enc_map, probes.attention_pattern(encoder.encoder, ids, 0, 0), atol=1e-6)
