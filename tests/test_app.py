"""The app launched in-process and called through gradio_client, endpoint by endpoint.

Figure data is checked against what the served model computes for the same tokens (probes on the very
model object the app serves); bad input must come back as a gradio error carrying the sentence to fix it.
"""
import json

import numpy as np
import pytest
from gradio_client.exceptions import AppError

from explorer import probes

from explorer.state import session

from explorer.probes import encoder_probe
from explorer.panels.attention import AttentionView
from explorer.panels.positions import RopeView
from tests.api_answer import named
from tests.plotly_payload import arr, fig

CAUSAL, BIDIR = "causal (as trained)", "bidirectional (mask removed)"
PROMPT = "The cat sat on the mat. The cat sat on the mat."


def heat(figure: dict, i: int = 0) -> np.ndarray:
    return arr(figure["data"][i]["z"]).astype(float)


@pytest.fixture(scope="module")
def served(client):
    model, tokenizer = session.load_default()
    return model, tokenizer


def pattern(model, ids, layer, head, causal=True):
    _, cache = probes.run_with_cache(model, ids, [f"blocks.{layer}.attn.hook_pattern"], causal=causal)
    return cache[f"blocks.{layer}.attn.hook_pattern"][0, head].float().numpy()


# --- Attention --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("view", [CAUSAL, BIDIR])
def test_attention_heatmap_is_the_models_pattern(client, served, view):
    model, tokenizer = served
    layer, head = model.config.n_layers - 1, model.config.n_heads - 1
    out = named(AttentionView, client.predict(PROMPT, layer, head, view, api_name="/attention"))
    heatmap, table, info, grid, gqa_md = out.heatmap, out.tokens, out.info, out.grid, out.gqa_md
    impl_md = client.predict(PROMPT, view, api_name="/attention_impls")  # the answer's follow-up
    ids, labels = session.encode(tokenizer, PROMPT, 64)
    f = fig(heatmap)
    np.testing.assert_allclose(heat(f), pattern(model, ids, layer, head, causal=view == CAUSAL), atol=1e-6)
    assert f["data"][0]["y"] == labels and len(labels) == len(ids)  # repeated tokens keep their rows
    assert f["layout"]["yaxis"]["autorange"] == "reversed"
    assert f["layout"]["title"]["text"].startswith(f"Layer {layer} · head {head}")
    assert [row[2] for row in table["data"]] == ids
    # the grid holds every layer and head
    g = heat(fig(grid))
    T = len(ids)
    np.testing.assert_allclose(g[:T, :T], pattern(model, ids, 0, 0, causal=view == CAUSAL), atol=1e-6)
    assert len(fig(grid)["layout"]["xaxis"]["ticktext"]) == model.config.n_heads
    assert "max |Δlogit| SDPA − naive" in impl_md
    assert f"{model.config.n_kv_heads} key/value heads" in gqa_md
    assert "ms" in info


def test_attention_head_scores_match_probes(client, served):
    model, tokenizer = served
    out = named(AttentionView, client.predict(PROMPT, 0, 0, CAUSAL, api_name="/attention"))
    ids, _ = session.encode(tokenizer, PROMPT, 64)
    expected = probes.head_scores(model, tokens=ids)
    s = fig(out.scores)
    np.testing.assert_allclose(heat(s, 0), expected["previous_token"], atol=1e-5)
    np.testing.assert_allclose(heat(s, 2), expected["induction"], atol=1e-5)
    picks = out.pick["choices"]
    assert picks and any("induction" in str(c[0]) for c in picks)


@pytest.mark.parametrize("prompt, message", [
    ("", "empty"),
    ("   \n\t ", "empty"),
    ("\x00\x01\x02", "empty"),
])
def test_attention_refuses_empty_prompts(client, prompt, message):
    with pytest.raises(AppError, match=message):
        client.predict(prompt, 0, 0, CAUSAL, api_name="/attention")


def test_attention_refuses_out_of_range_layer_and_head(client, served):
    model, _ = served
    with pytest.raises(AppError, match="layer must be between 0 and"):
        client.predict(PROMPT, model.config.n_layers, 0, CAUSAL, api_name="/attention")
    with pytest.raises(AppError, match="head must be between 0 and"):
        client.predict(PROMPT, 0, -1, CAUSAL, api_name="/attention")


def test_attention_handles_odd_text(client, served):
    _, tokenizer = served
    def view(prompt):
        return named(AttentionView, client.predict(prompt, 0, 0, CAUSAL, api_name="/attention"))

    clean, dirty = view("The cat"), view("The\x00 cat\x07")
    assert fig(clean.heatmap)["data"][0]["z"] == fig(dirty.heatmap)["data"][0]["z"]  # control characters stripped
    ys = fig(view("Ça va? 🙂 日本語 <b>bold</b>").heatmap)["data"][0]["y"]
    assert all("<b>" not in y for y in ys)  # HTML shown as text, not markup
    long = view("the cat " * 80)
    assert len(fig(long.heatmap)["data"][0]["y"]) == 64
    assert "only the first 64" in long.info


# --- Positions ---------------------------------------------------------------------------------------------

def test_rope_theta_changes_the_map_without_touching_the_shared_model(client, served):
    model, tokenizer = served
    cos_before = model.rope_cos.clone()
    theta = 100.0
    out = named(RopeView, client.predict(PROMPT, theta, 5, [0, 1], 0, 1, api_name="/rope"))
    angles, compare, sinus, md = out.angles, out.compare, out.sinusoidal, out.md
    ids, _ = session.encode(tokenizer, PROMPT, 48)
    c = fig(compare)
    np.testing.assert_allclose(heat(c, 0), probes.attention_pattern(model, ids, 0, 1), atol=1e-6)
    np.testing.assert_allclose(heat(c, 1), probes.attention_pattern(model, ids, 0, 1, rope_theta=theta), atol=1e-6)
    assert not np.allclose(heat(c, 0), heat(c, 1))
    assert (model.rope_cos == cos_before).all() and model.config.rope_theta != theta
    a = heat(fig(angles))
    probe = probes.rope_probe(model.config, theta=theta, positions=64)
    np.testing.assert_allclose(a, np.mod(probe["angles"], 2 * np.pi), atol=1e-9)
    assert "θ = 100" in md and "not modified" in md
    s = heat(fig(sinus))
    np.testing.assert_allclose(s, probes.sinusoidal_probe(64, s.shape[1])["table"], atol=1e-6)


@pytest.mark.parametrize("theta, message", [(0.5, "rope_theta must lie between"), (1.0, "rope_theta")])
def test_rope_refuses_bad_theta(client, theta, message):
    with pytest.raises(AppError, match=message):
        client.predict(PROMPT, theta, 5, [0], 0, 0, api_name="/rope")


def test_rope_refuses_bad_pairs(client, served):
    model, _ = served
    with pytest.raises(AppError):
        client.predict(PROMPT, 10000.0, 5, [model.config.head_dim], 0, 0, api_name="/rope")


# --- Encoder vs decoder ------------------------------------------------------------------------------------

def test_encoder_decoder_maps_are_each_models_pattern(client, served):
    model, tokenizer = served
    out = client.predict(PROMPT, 0, 1, -1, api_name="/encoder_decoder")
    masks, attn, norms, acts, md = out[:5]
    ids, labels = session.encode(tokenizer, PROMPT, 48)
    m = fig(masks)
    np.testing.assert_array_equal(heat(m, 0), np.tril(np.ones((len(ids), len(ids)))))
    np.testing.assert_array_equal(heat(m, 1), np.ones((len(ids), len(ids))))
    a = fig(attn)
    np.testing.assert_allclose(heat(a, 0), pattern(model, ids, 0, 1), atol=1e-6)
    encoder, enc_tok = encoder_probe.shared_encoder()
    enc_ids, _ = session.encode(enc_tok, PROMPT, 48)
    np.testing.assert_allclose(heat(a, 1), probes.attention_pattern(encoder.encoder, enc_ids, 0, 1), atol=1e-6)
    assert a["data"][0]["coloraxis"] == a["data"][1]["coloraxis"]
    assert (a["layout"]["coloraxis"]["cmin"], a["layout"]["coloraxis"]["cmax"]) == (0, 1)
    assert "trained encoder" in md and "masked-language modelling" in md
    n = fig(norms)
    rms = arr(n["data"][2]["y"])
    assert abs(np.sqrt((rms ** 2).mean()) - 1) < 1e-3  # RMSNorm output has unit RMS
    ln = arr(n["data"][4]["y"])
    assert abs(ln.mean()) < 1e-4 and abs(ln.std() - 1) < 1e-3


def test_encoder_decoder_refuses_bad_token_position(client):
    with pytest.raises(AppError, match="token position must be"):
        client.predict("a b", 0, 0, 99, api_name="/encoder_decoder")


# --- Model: loading, validation, per-user state -------------------------------------------------------------

@pytest.mark.parametrize("source, message", [
    ("/etc", "must be inside"),
    ("../../etc", "must be inside"),
    ("HuggingFaceTB/SmolLM2-135M", "offline"),
    ("not a repo id!!", "not a folder"),
])
def test_load_model_refuses(fresh_client, source, message):
    with pytest.raises(AppError, match=message):
        fresh_client.predict(source, api_name="/load_model")
    status = fresh_client.predict("default", api_name="/load_model")[0]
    assert "default" in status


@pytest.mark.slow
def test_loaded_model_is_per_user(app_url, served, model_root):
    from tests.loopback import loopback_client

    from models import load_pretrained
    from models.loading import load_tokenizer

    default, _ = served
    alice, bob = loopback_client(app_url), loopback_client(app_url)
    status, bars, config, card, differs = alice.predict("tiny-local", api_name="/load_model")
    assert "Loaded" in status and "tiny-local" in status
    rows = dict(map(tuple, config["data"]))
    assert rows["n_layers"] == "3"
    parts = fig(bars)["data"][0]
    local = load_pretrained(model_root / "tiny-local")
    assert arr(parts["x"]).sum() == local.num_parameters()
    # alice's attention tab now runs her model, bob's still runs the default
    ids, _ = session.encode(load_tokenizer(model_root / "tiny-local"), PROMPT, 64)
    out = named(AttentionView, alice.predict(PROMPT, 2, 1, CAUSAL, api_name="/attention"))
    np.testing.assert_allclose(heat(fig(out.heatmap)), pattern(local, ids, 2, 1), atol=1e-6)
    out = named(AttentionView, bob.predict(PROMPT, 0, 0, CAUSAL, api_name="/attention"))
    assert len(fig(out.grid)["layout"]["yaxis"]["ticktext"]) == default.config.n_layers
    assert alice.predict("default", api_name="/load_model")[0].startswith("✅ Back to the shipped default")


def test_model_card_counts_parameters(client, served):
    model, _ = served
    status, bars, config, card, differs = client.predict("default", api_name="/load_model")
    parts = fig(bars)["data"][0]
    assert arr(parts["x"]).sum() == model.num_parameters()
    assert list(parts["y"]) == ["embedding", "attention", "MLP", "norms", "LM head"]
    assert "float32" in status and "iB**" in status


# --- the other tabs' endpoints --------------------------------------------------------------------------------

OTHER_ENDPOINTS = ["/memory_compare", "/generate", "/lora"]


@pytest.mark.parametrize("api", OTHER_ENDPOINTS)
def test_other_tabs_answer_with_their_defaults(client, api):
    """Called with each input's default value, every other tab's main endpoint returns a figure."""
    endpoints = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert api in endpoints, f"{api} is not an endpoint of the app"
    out = client.predict(api_name=api)
    out = out if isinstance(out, tuple) else (out,)
    plots = [o for o in out if isinstance(o, dict) and o.get("type") == "plotly"]
    assert plots, f"{api} returned no figure"
    for p in plots:
        assert fig(p)["data"]


def test_rope_circle_follows_the_position_slider(client, served):
    model, _ = served
    theta = 500.0
    f = fig(client.predict(theta, 9, [0, 1], api_name="/rope_circle"))
    arrows = [t for t in f["data"] if t.get("mode") == "lines+markers" and len(arr(t["x"])) == 2]
    freqs = probes.rope_probe(model.config, theta=theta, positions=64)["frequencies"]
    for arrow, i in zip(arrows, [0, 1]):
        np.testing.assert_allclose(arr(arrow["x"])[1], np.cos(9 * freqs[i]), atol=1e-9)
        np.testing.assert_allclose(arr(arrow["y"])[1], np.sin(9 * freqs[i]), atol=1e-9)


def test_jump_to_head_reads_the_score_menu():
    from explorer.panels.attention import jump_to_head

    assert jump_to_head("1,2") == (1, 2)
    with pytest.raises(Exception, match="Choose a head"):
        jump_to_head(None)


def test_load_model_refuses_a_checkpoint_too_big_before_reading_weights(fresh_client, model_root):
    huge = model_root / "huge"
    huge.mkdir(exist_ok=True)
    (huge / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "vocab_size": 32000,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336}))
    (huge / "model.safetensors").write_bytes(b"not read")  # never opened: the size check comes first
    with pytest.raises(AppError, match="parameters"):
        fresh_client.predict("huge", api_name="/load_model")


@pytest.mark.slow
def test_every_tab_answers_for_the_model_this_session_loaded(app_url, served, model_root):
    """After a load, each tab's endpoint answers on the loaded model (3 layers, head_dim 8) with its labels,
    ranges and hints, not the default model's; back to the default, they follow it again."""
    from tests.loopback import loopback_client

    default, _ = served
    c = loopback_client(app_url)
    c.predict("tiny-local", api_name="/load_model")
    att = named(AttentionView, c.predict(PROMPT, 2, 1, CAUSAL, api_name="/attention"))
    assert "tiny-local" in att.info
    with pytest.raises(AppError, match="layer must be between 0 and 2 for this model"):
        c.predict(PROMPT, 3, 0, CAUSAL, api_name="/attention")
    rope = named(RopeView, c.predict(PROMPT, 500.0, 3, [0, 1, 3], 2, 1, api_name="/rope"))
    assert "head_dim 8 → 4 pairs" in rope.md
    with pytest.raises(AppError):
        c.predict(PROMPT, 500.0, 3, [0, 5], 2, 1, api_name="/rope")  # pair 5 does not exist with 4 pairs
    c.predict("default", api_name="/load_model")
    rope = named(RopeView, c.predict(PROMPT, 500.0, 3, [0, 1, 3], 2, 1, api_name="/rope"))
    half = default.config.head_dim // 2
    assert f"head_dim {default.config.head_dim} → {half} pairs" in rope.md
