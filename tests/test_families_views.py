"""What the app makes of each family: sizes against the published ones, the memory cap on loading, the Llama-only
speed path left out, the walkthrough's steps against transformers' values, the switches and differences shown, and
a Gemma checkpoint loaded through the app."""
from __future__ import annotations

import math

import numpy as np

import pytest
import torch

from explorer.figures.common import unwrapped
from models import Decoder, ModelConfig, generate, load_pretrained
from models.loading import save_pretrained
from tests.family_pairs import _pair, _tokens


# --- the app's side: sizes, the load cap, the speed path -------------------------------------------------------
# The fields sizes depend on, as the checkpoints' config.json give them, with the totals their model cards publish
# (parameters, and parameters outside the embedding where the card gives them).
REAL = {
    "Qwen/Qwen2.5-0.5B-Instruct": ({"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
                                    "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                                    "vocab_size": 151936, "max_position_embeddings": 32768, "rope_theta": 1e6,
                                    "tie_word_embeddings": True, "use_sliding_window": False,
                                    "sliding_window": 32768, "max_window_layers": 21}, 0.49e9, 0.36e9),
    "Qwen/Qwen3-0.6B": ({"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
                         "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                         "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1e6,
                         "tie_word_embeddings": True, "use_sliding_window": False}, 0.6e9, 0.44e9),
    "google/gemma-3-270m": ({"model_type": "gemma3_text", "hidden_size": 640, "intermediate_size": 2048,
                             "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1,
                             "head_dim": 256, "vocab_size": 262144, "max_position_embeddings": 32768,
                             "sliding_window": 512, "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3,
                             "rope_theta": 1e6, "rope_local_base_freq": 1e4, "query_pre_attn_scalar": 256},
                            0.27e9, 0.10e9),
    "meta-llama/Llama-3.2-1B": ({"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
                                 "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                                 "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 131072,
                                 "tie_word_embeddings": True, "rope_scaling": {
                                     "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                                 "rope_theta": 5e5}, 1.23e9, None),
}


@pytest.mark.parametrize("name", list(REAL))
def test_real_configs_read_to_their_published_sizes(name):
    from explorer import measure

    hf, total, beyond_embedding = REAL[name]
    n = measure.parameter_count(ModelConfig.from_hf(hf))
    assert n["total"] == pytest.approx(total, rel=0.02)
    if beyond_embedding is not None:
        assert n["total"] - n["embedding"] - n["lm_head"] == pytest.approx(beyond_embedding, rel=0.02)


def test_parameter_count_counts_every_parameter_of_each_family(tmp_path):
    from explorer import measure

    for case in ("qwen2-gqa-tied", "qwen3-gqa-untied", "gemma3-mqa-untied-bias"):
        _, ours = _pair(case, tmp_path / case)
        assert measure.parameter_count(ours.config)["total"] == ours.num_parameters(), case


def test_the_load_cap_is_the_memory_allowed_for_visitors_models(tmp_path, monkeypatch):
    """Llama 3.2 1B (1.24 B parameters, 4.6 GiB in float32) is refused under the default 4 GiB with a sentence
    naming the memory and its setting, and passes the size checks under 6 GiB (refused no earlier than reading
    its weights, which this test never has)."""
    import json

    from explorer.state import checkpoints, private_models

    folder = tmp_path / "llama-3.2-1b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(REAL["meta-llama/Llama-3.2-1B"][0]))
    monkeypatch.setenv("EXPLORER_MODEL_ROOT", str(tmp_path))
    monkeypatch.setattr(private_models, "_owners", {})

    def reached(*args, **kwargs):
        raise RuntimeError("the weights would be read now")

    monkeypatch.setattr(checkpoints, "load_pretrained", reached)
    monkeypatch.setattr(private_models, "PRIVATE_MODELS_BUDGET_BYTES", 4 * 2**30)
    assert checkpoints.max_load_parameters() == 2**30
    with pytest.raises(ValueError, match=r"about 1236 M parameters \(4.6 GiB in float32\).*4 GiB "
                                         r"\(EXPLORER_PRIVATE_MODELS_BUDGET\), room for 1074 M"):
        checkpoints.load_checkpoint("llama-3.2-1b")
    monkeypatch.setattr(private_models, "PRIVATE_MODELS_BUDGET_BYTES", 6 * 2**30)
    with pytest.raises(RuntimeError, match="the weights would be read now"):
        checkpoints.load_checkpoint("llama-3.2-1b")


@pytest.mark.parametrize("name", ["Qwen3-0.6B", "Llama-3.2-1B"])
def test_the_budget_a_model_needs_lets_one_visitor_load_it_and_a_byte_less_does_not(name, tmp_path, monkeypatch):
    """``checkpoints.budget_needed`` (the README's table of models to try) is exact for a visitor on the network:
    the load reserves its float32 weights and rotary tables within that visitor's share of the budget (one half
    by default), so Qwen3-0.6B (2.26 GiB) is refused under the default 4 GiB though it is smaller."""
    import json

    from explorer import measure
    from explorer.state import checkpoints, clients, private_models

    fields = measure.load_real_configs()[name]["config"]
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text(json.dumps(fields))
    monkeypatch.setenv("EXPLORER_MODEL_ROOT", str(tmp_path))
    monkeypatch.setattr(private_models, "_owners", {})
    token = clients.CURRENT.set("203.0.113.7")  # a visitor's address, as a request sets it
    try:
        def reached(*args, **kwargs):
            raise RuntimeError("the weights would be read now")

        monkeypatch.setattr(checkpoints, "load_pretrained", reached)
        need = checkpoints.budget_needed(measure.real_config(name))
        assert need == math.ceil(checkpoints.load_bytes(measure.real_config(name)) / private_models.CLIENT_SHARE)
        if name == "Qwen3-0.6B":
            monkeypatch.setattr(private_models, "PRIVATE_MODELS_BUDGET_BYTES", private_models.DEFAULT_BUDGET_BYTES)
            with pytest.raises(ValueError, match="more than the 2 GiB one network address may hold"):
                checkpoints.load_checkpoint(name)
        monkeypatch.setattr(private_models, "PRIVATE_MODELS_BUDGET_BYTES", need - 2)
        with pytest.raises(ValueError, match="one network address may hold"):
            checkpoints.load_checkpoint(name)
        monkeypatch.setattr(private_models, "PRIVATE_MODELS_BUDGET_BYTES", need)
        with pytest.raises(RuntimeError, match="the weights would be read now"):
            checkpoints.load_checkpoint(name)
    finally:
        clients.CURRENT.reset(token)


@pytest.mark.parametrize("case", ["qwen3-gqa-untied", "gemma3-gqa-tied"])
def test_the_app_never_prepares_the_llama_only_speed_path_for_another_family(case, tmp_path):
    """models.speed's one-token step computes Llama's block only: it stands aside for another family even when
    passed, which decodes through its modules, token for token as transformers."""
    from explorer.state.checkpoints import prepare
    from models.speed import fast_step, why_not

    ref, ours = _pair(case, tmp_path)
    ours = prepare(ours)
    assert why_not(ours) is not None
    prompt = _tokens(n=1, T=8, seed=3)
    with torch.no_grad():
        expected = ref.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16,
                                min_new_tokens=16, do_sample=False)
    assert torch.equal(generate(ours, prompt, 16, step=fast_step), expected)
    llama = prepare(Decoder(ModelConfig(n_layers=1, d_model=32, n_heads=4, vocab_size=50)))
    assert why_not(llama) is None  # plain Llama keeps its speed path


@pytest.mark.parametrize("case", ["qwen2-gqa-tied", "qwen3-gqa-untied", "gemma3-gqa-tied", "mistral-gqa-untied"])
def test_the_walkthrough_shows_each_familys_steps_with_transformers_values(case, tmp_path):
    """The same 18 steps on every family, each switch where it acts, its values equal to transformers' own
    modules' outputs (captured by forward hooks on the reference model)."""
    from explorer.probes.walkthrough import STEP_KEYS, walk

    ref, ours = _pair(case, tmp_path)
    c = ours.config
    ids = _tokens(1, T=20)[0].tolist()
    p = 17
    caught = {}

    def keep(name):
        def hook(module, args, out):
            caught[name] = (out[0] if isinstance(out, tuple) else out).detach()
        return hook

    layer = 1
    hf_layer = ref.model.layers[layer]
    handles = [ref.model.embed_tokens.register_forward_hook(keep("embed")),
               hf_layer.self_attn.o_proj.register_forward_hook(keep("o_proj"))]
    if c.qk_norm:
        handles += [hf_layer.self_attn.q_norm.register_forward_hook(keep("q_norm")),
                    hf_layer.self_attn.k_norm.register_forward_hook(keep("k_norm"))]
    if c.sandwich_norm:
        handles += [hf_layer.post_attention_layernorm.register_forward_hook(keep("norm_o")),
                    hf_layer.mlp.down_proj.register_forward_hook(keep("down")),
                    hf_layer.post_feedforward_layernorm.register_forward_hook(keep("norm_m"))]
    with torch.no_grad():
        logits = ref(torch.tensor([ids])).logits[0, p]
    for h in handles:
        h.remove()
    w = walk(ours, ids, p)
    steps = {s.key: s for s in w.steps(layer, "x")}
    assert tuple(steps) == STEP_KEYS  # the same steps (and numbers, and link names) for every family
    close = dict(rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(steps["embed"].arrays["x0"], caught["embed"][0, p].numpy(), **close)
    np.testing.assert_allclose(steps["top"].arrays["probs"], torch.softmax(logits, -1)[steps["top"].arrays["ids"]],
                               **close)
    if c.qk_norm:  # transformers' q_norm output: (B, T, H, D) in Qwen3, (B, H, T, D) in Gemma 3
        for name in ("q", "k"):
            got = caught[f"{name}_norm"]
            got = got if got.shape[1] == len(ids) else got.transpose(1, 2)
            np.testing.assert_allclose(steps["qkv"].arrays[f"{name} normed"], got[0, p].numpy(), **close)
        assert "QK-norm" in steps["qkv"].sentence and "q ← RMSNorm(q)" in steps["qkv"].formula
    if c.sandwich_norm:
        o = steps["o_proj"].arrays
        np.testing.assert_allclose(o["o_proj(z)"], caught["o_proj"][0, p].numpy(), **close)
        np.testing.assert_allclose(o["norm(o)"], caught["norm_o"][0, p].numpy(), **close)
        m = steps["down"].arrays
        np.testing.assert_allclose(m["down_proj(h)"], caught["down"][0, p].numpy(), **close)
        np.testing.assert_allclose(m["norm(m)"], caught["norm_m"][0, p].numpy(), **close)
        assert "GeGLU" in steps["swiglu"].title and "(1 + g)" in steps["norm1"].formula
        assert f"· {c.attn_scale:.4g}" in steps["scores"].formula and "√" in steps["embed"].sentence
    else:
        np.testing.assert_allclose(steps["o_proj"].arrays["o"], caught["o_proj"][0, p].numpy(), **close)
    if c.qkv_bias:
        assert "+ b_q" in steps["qkv"].formula
    for L in range(c.n_layers):  # a local layer masks the keys behind its window too, and says so
        window = c.layer_window(L)
        mask = w.step(STEP_KEYS.index("mask"), L, "x")
        n_inf = int(np.isinf(mask.arrays["scores"][0]).sum())
        far = max(0, p + 1 - window) if window else 0
        assert n_inf == len(ids) - p - 1 + far and f"{n_inf} masked" in mask.title
        assert ("sliding-window" in mask.title) == bool(window)


# --- what the app shows ---------------------------------------------------------------------------------------
def test_every_switch_points_at_the_line_of_models_that_applies_it():
    from explorer.probes.families import MODELS_ROOT, SITES, where_applied

    assert set(SITES) == set(__import__("models.config", fromlist=["x"]).FAMILY_SWITCHES)
    for switch, sites in SITES.items():
        for place, (_, marker) in zip(where_applied(switch), sites):
            path, line = place.rsplit(":", 1)
            assert path.startswith("models/"), place
            assert marker in (MODELS_ROOT / path).read_text().splitlines()[int(line) - 1], (switch, place)


def test_the_differences_table_marks_what_a_family_changes(tmp_path):
    from explorer.probes.families import differences_sentence, differences_table, local_layers_sentence

    _, ours = _pair("gemma3-gqa-tied", tmp_path)
    rows = differences_table(ours.config)
    changed = [row[0][2:] for row in rows if row[0].startswith("● ")]
    assert changed == list(ours.config.differences_from_llama())  # first, in FAMILY_SWITCHES order
    by_name = {row[0].lstrip("● "): row for row in rows}
    assert by_name["layer_types"][1] == "3 local, 1 global (global: 2)"
    assert by_name["attn_scale"][1].startswith("0.2236 (1/√20")
    assert by_name["qkv_bias"][1] == by_name["qkv_bias"][2] == "False"  # unchanged: Llama's value both sides
    assert by_name["sliding_window"][4].count("models/") == 2  # the mask and the ring cache
    assert "gemma3_text** differs from Llama by 10 switches" in differences_sentence(ours.config)
    llama = ModelConfig()
    assert not any(row[0].startswith("●") for row in differences_table(llama))
    assert "Llama's block exactly" in differences_sentence(llama) and local_layers_sentence(llama, 0) == ""
    said = local_layers_sentence(ours.config, 1)
    assert "Layer 1 is **local**" in said and "itself and the 4 tokens before it" in said
    assert "local layers (sliding window 5): 0–1, 3; global: 2." in said
    assert "Layer 2 is **global**" in local_layers_sentence(ours.config, 2)


def test_the_window_edge_runs_between_the_last_unseen_and_the_first_seen_key():
    from explorer.figures.attention import attention_heatmap, window_edge_path

    assert window_edge_path(4, 2) == "M 0.5,1.5 L 0.5,2.5 L 1.5,2.5 L 1.5,3.5"  # row 2 sees keys 1-2, row 3 keys 2-3
    assert window_edge_path(4, 2, key_offset=1).startswith("M -0.5,1.5")
    labels = [f"{i}·t" for i in range(6)]
    fig = attention_heatmap(np.tril(np.ones((6, 6))) / np.arange(1, 7)[:, None], labels, layer=1, head=0,
                            n_heads=4, n_kv_heads=2, window=3)
    assert "sliding window 3" in unwrapped(fig.layout.title.text)
    assert fig.layout.shapes[0].path == window_edge_path(6, 3)
    plain = attention_heatmap(np.eye(6), labels, layer=1, head=0, n_heads=4, n_kv_heads=2)
    assert not plain.layout.shapes


def test_the_app_loads_a_gemma_checkpoint_and_shows_its_switches_and_bands(app_url, model_root):
    """End to end through the served app: a tiny Gemma 3 checkpoint (the fixture tokenizer) under the allowed
    root loads; the Model tab lists its switches with the lines that apply them; the Attention tab says which
    layers are local and marks the window on a local layer's map."""
    import shutil

    from tests.loopback import loopback_client

    from explorer.figures.attention import window_edge_path
    from explorer.panels.attention import AttentionView
    from tests.api_answer import named
    from tests.plotly_payload import arr, fig

    folder = model_root / "tiny-gemma"
    if not folder.exists():
        local = load_pretrained(model_root / "tiny-local").config
        config = ModelConfig(family="gemma3_text", vocab_size=local.vocab_size, d_model=32, n_layers=3, n_heads=4,
                             n_kv_heads=2, head_dim=16, d_ff=64, max_seq_len=128, norm_eps=1e-6, tie_embeddings=True,
                             qk_norm=True, norm_offset=1.0, embed_scale=math.sqrt(32), hidden_act="gelu_pytorch_tanh",
                             sandwich_norm=True, attn_scale=16 ** -0.5, sliding_window=4,
                             layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                             local_rope_theta=1e4, rope_theta=1e6, bos_token_id=local.bos_token_id,
                             eos_token_id=local.eos_token_id, pad_token_id=local.pad_token_id)
        torch.manual_seed(0)
        save_pretrained(Decoder(config), folder)
        for f in (model_root / "tiny-local").iterdir():
            if f.name not in ("config.json", "model.safetensors"):
                shutil.copy(f, folder / f.name)
    c = loopback_client(app_url)
    status, bars, config, card, differs = c.predict("tiny-gemma", api_name="/load_model")
    assert "Loaded" in status and "gemma3_text** differs from Llama by 10 switches" in status
    rows = {row[0]: row for row in differs["data"]}
    assert rows["● sandwich_norm"][1] == "True" and rows["● sandwich_norm"][4].startswith("models/block.py:")
    prompt = "The cat sat on the mat. The dog sat on the log."
    out = named(AttentionView, c.predict(prompt, 1, 0, "causal (as trained)", api_name="/attention"))
    assert "Layer 1 is **local**" in out.info and "global: 2" in out.info
    heat = fig(out.heatmap)
    assert "sliding window 4" in unwrapped(heat["layout"]["title"]["text"])
    tokens = len(out.tokens["data"])
    assert heat["layout"]["shapes"][0]["path"] == window_edge_path(tokens, 4)
    weights = arr(heat["data"][0]["z"])  # the band: nothing seen 4 or more tokens back
    assert np.nanmax(np.abs(np.tril(weights, -4))) == 0 and np.nanmin(np.diag(weights)) > 0
    out = named(AttentionView, c.predict(prompt, 2, 0, "causal (as trained)", api_name="/attention"))
    assert "Layer 2 is **global**" in out.info
    c.predict("default", api_name="/load_model")
