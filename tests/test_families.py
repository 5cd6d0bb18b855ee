"""The families that change Llama in a few named ways (Qwen2, Qwen3, Gemma 3 text, Mistral), each against its
transformers class on the same random weights (no network): logits, attention weights, greedy tokens with and
without the KV cache (sliding-window rings included), and checkpoints written by us that transformers loads."""
from __future__ import annotations

import math

import numpy as np

import pytest
import torch
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, MistralConfig, MistralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

from models import Decoder, ModelConfig, generate, load_pretrained
from models.families import FAMILIES
from models.loading import save_pretrained

WINDOW = 5  # shorter than every prompt below, so the local layers' band and ring both matter
LOCAL = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
CASES = {
    # Qwen2: q/k/v biases, theta 1e6, tied; sliding window on the layers from max_window_layers on (2 and 3)
    "qwen2-gqa-tied": (Qwen2Config, Qwen2ForCausalLM, dict(
        num_key_value_heads=2, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2)),
    "qwen2-mqa-untied": (Qwen2Config, Qwen2ForCausalLM, dict(
        num_key_value_heads=1, tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    # Qwen3: QK-norm, head_dim 24 where hidden / heads is 16
    "qwen3-gqa-untied": (Qwen3Config, Qwen3ForCausalLM, dict(
        num_key_value_heads=2, head_dim=24, tie_word_embeddings=False)),
    "qwen3-mha-tied-window": (Qwen3Config, Qwen3ForCausalLM, dict(
        num_key_value_heads=4, head_dim=24, tie_word_embeddings=True, use_sliding_window=True, sliding_window=WINDOW,
        layer_types=LOCAL)),
    # Gemma 3: everything at once; one case with attention biases on all four projections
    "gemma3-gqa-tied": (Gemma3TextConfig, Gemma3ForCausalLM, dict(
        num_key_value_heads=2, head_dim=24, tie_word_embeddings=True, query_pre_attn_scalar=20,
        sliding_window=WINDOW, layer_types=LOCAL,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})),
    "gemma3-mqa-untied-bias": (Gemma3TextConfig, Gemma3ForCausalLM, dict(
        num_key_value_heads=1, head_dim=16, tie_word_embeddings=False, query_pre_attn_scalar=32, attention_bias=True,
        sliding_window=WINDOW, layer_types=LOCAL,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 5e5},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 500.0}})),
    "mistral-gqa-untied": (MistralConfig, MistralForCausalLM, dict(
        num_key_value_heads=2, tie_word_embeddings=False, sliding_window=WINDOW)),
}


def _pair(case: str, folder, seed: int = 0):
    """(transformers model with eager attention, our Decoder) on the same random weights, saved to ``folder``.

    Weights N(0, 0.08); biases N(0, 0.2); norm weights N(1, 0.2), or N(0, 0.2) for Gemma's (1 + w) norms: all far
    enough from their defaults that a missing bias, norm or offset shows in the logits."""
    config_class, model_class, extra = CASES[case]
    config = config_class(vocab_size=97, hidden_size=64, intermediate_size=112, num_hidden_layers=4,
                          num_attention_heads=4, max_position_embeddings=96, rms_norm_eps=1e-6,
                          bos_token_id=None, eos_token_id=None, pad_token_id=None, **extra)
    torch.manual_seed(seed)
    ref = model_class(config)
    gemma = case.startswith("gemma3")
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "norm" in name:
                p.normal_(0.0 if gemma else 1.0, 0.2)
            else:
                p.normal_(0.0, 0.2 if name.endswith(".bias") else 0.08)
    ref.save_pretrained(folder)
    ref = model_class.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    return ref, load_pretrained(folder)


def _tokens(n=2, T=20, seed=1):
    return torch.randint(0, 97, (n, T), generator=torch.Generator().manual_seed(seed))


def test_each_family_is_llama_with_its_own_switches(tmp_path):
    expected = {
        "qwen2-gqa-tied": {"qkv_bias": True, "sliding_window": WINDOW,
                           "layer_types": ("full_attention",) * 2 + ("sliding_attention",) * 2},
        "qwen2-mqa-untied": {"qkv_bias": True},
        "qwen3-gqa-untied": {"qk_norm": True, "head_dim": 24},
        "gemma3-gqa-tied": {"qk_norm": True, "head_dim": 24, "norm_offset": 1.0, "embed_scale": 8.0,
                            "hidden_act": "gelu_pytorch_tanh", "sandwich_norm": True, "attn_scale": 20 ** -0.5,
                            "sliding_window": WINDOW, "layer_types": tuple(LOCAL), "local_rope_theta": 1e4},
        "mistral-gqa-untied": {"sliding_window": WINDOW, "layer_types": ("sliding_attention",) * 4},
    }
    for case, switches in expected.items():
        _, ours = _pair(case, tmp_path / case)
        c = ours.config
        assert c.differences_from_llama() == pytest.approx(switches), case
        assert c.family == CASES[case][0].model_type
    qwen2 = load_pretrained(tmp_path / "qwen2-gqa-tied").config
    assert qwen2.rope_theta == 1e6 and qwen2.tie_embeddings and qwen2.local_rope_theta is None
    assert [qwen2.layer_window(i) for i in range(4)] == [None, None, WINDOW, WINDOW]
    gemma = load_pretrained(tmp_path / "gemma3-gqa-tied").config
    assert [gemma.layer_rope(i)[0] for i in range(4)] == [1e4, 1e4, 1e6, 1e4]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("impl", ["naive", "sdpa", "tiled"])
def test_logits_match_transformers(case, impl, tmp_path):
    ref, ours = _pair(case, tmp_path)
    ours.set_attn_impl(impl)
    for block in ours.blocks:
        block.attn.tile_size = 4  # several key blocks per row, some wholly outside a local layer's window
    tokens = _tokens()
    with torch.no_grad():
        expected = ref(tokens).logits
        got = ours(tokens)
    assert expected.abs().max() > 1.0  # large enough for a missing switch to show
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())


@pytest.mark.parametrize("case", ["qwen2-gqa-tied", "gemma3-gqa-tied", "mistral-gqa-untied"])
def test_attention_weights_equal_transformers_and_local_layers_are_bands(case, tmp_path):
    ref, ours = _pair(case, tmp_path)
    tokens = _tokens(T=17)
    captured = {}
    handles = [b.attn.hook_pattern.register_forward_hook(
        lambda mod, inp, out, i=i: captured.__setitem__(i, inp[0].clone())) for i, b in enumerate(ours.blocks)]
    try:
        with torch.no_grad():
            ours(tokens, attn_impl="naive")
            attns = ref(tokens, output_attentions=True).attentions
    finally:
        for h in handles:
            h.remove()
    q, k = torch.arange(17)[:, None], torch.arange(17)[None, :]
    for i, a in enumerate(attns):
        torch.testing.assert_close(captured[i], a, rtol=1e-5, atol=1e-6)
        window = ours.config.layer_window(i)
        outside = (k > q) if window is None else (k > q) | (q - k >= window)
        assert captured[i][..., outside].abs().max() == 0  # nothing seen outside the causal band
        assert captured[i][..., ~outside].min() > 0  # and everything inside it


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_tokens_equal_transformers_generate_past_the_window(case, tmp_path):
    ref, ours = _pair(case, tmp_path)
    prompt = _tokens(n=1, T=8, seed=3)
    new = 24  # 32 positions: local layers wrap their ring of WINDOW slots several times
    with torch.no_grad():
        expected = ref.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                                min_new_tokens=new, do_sample=False)
    assert torch.equal(generate(ours, prompt, new), expected)
    assert torch.equal(generate(ours, prompt, new, use_cache=False), expected)


def test_a_local_layers_cache_holds_only_its_window(tmp_path):
    _, ours = _pair("gemma3-gqa-tied", tmp_path)
    cache = ours.new_cache(2, 40)
    c = ours.config
    assert [k.shape[2] for k in cache.k] == [WINDOW, WINDOW, 40, WINDOW]
    per_position = 2 * 2 * c.n_kv_heads * c.head_dim * 4  # K and V, batch 2, fp32
    assert cache.nbytes == per_position * (3 * WINDOW + 40)
    tokens = _tokens(T=30, seed=5)
    with torch.no_grad():
        full = ours(tokens)
        # the prompt in uneven pieces, then one token at a time, through the rings
        pieces = [ours(tokens[:, :3], cache=cache, start_pos=0), ours(tokens[:, 3:11], cache=cache, start_pos=3)]
        assert cache.bytes_used == per_position * (3 * WINDOW + 11)
        pieces += [ours(tokens[:, p:p + 1], cache=cache, start_pos=p) for p in range(11, 30)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-5, atol=1e-5)
    assert cache.length == 30 and cache.bytes_used == per_position * (3 * WINDOW + 30)
    with torch.no_grad():
        ours(tokens[:, 29:30], cache=cache, start_pos=29)  # the last position again: still inside every ring
        with pytest.raises(ValueError, match="keeps only its last 5 positions.*Start a new cache"):
            ours(tokens[:, 20:21], cache=cache, start_pos=20)  # its window's keys were written over


@pytest.mark.parametrize("case", ["qwen2-gqa-tied", "qwen3-gqa-untied", "gemma3-gqa-tied",
                                  "gemma3-mqa-untied-bias", "mistral-gqa-untied"])
def test_save_pretrained_folders_load_in_transformers_and_back(case, tmp_path):
    ref, ours = _pair(case, tmp_path / "a")
    save_pretrained(ours, tmp_path / "b")
    model_class = CASES[case][1]
    again = model_class.from_pretrained(tmp_path / "b", dtype=torch.float32, attn_implementation="eager").eval()
    back = load_pretrained(tmp_path / "b")
    assert back.config == ours.config
    tokens = _tokens()
    with torch.no_grad():
        expected = ref(tokens).logits
        torch.testing.assert_close(again(tokens).logits, expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(back(tokens), expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())


def test_new_hook_points_name_the_new_steps_and_edits_reach_the_output(tmp_path):
    from lens.hooks import hook_names, run_with_cache

    _, ours = _pair("gemma3-gqa-tied", tmp_path)
    names = hook_names(ours)
    b = "blocks.0."
    for name in ("attn.hook_q_normed", "attn.hook_k_normed", "pre_feedforward_layernorm.hook_normalized",
                 "post_feedforward_layernorm.hook_normalized", "attn.q_norm.hook_scale"):
        assert b + name in names, name
    forward = ("hook_resid_pre", "input_layernorm.hook_normalized", "attn.hook_q", "attn.q_norm.hook_normalized",
               "attn.hook_q_normed", "attn.hook_rot_q", "attn.hook_z", "post_attention_layernorm.hook_normalized",
               "hook_attn_out", "hook_resid_mid", "pre_feedforward_layernorm.hook_normalized", "mlp.hook_gate",
               "post_feedforward_layernorm.hook_normalized", "hook_mlp_out", "hook_resid_post")
    order = [names.index(b + n) for n in forward]
    assert order == sorted(order)  # listed in the order the forward reaches them
    tokens = _tokens(n=1, T=9)
    with torch.no_grad():
        logits, cache = run_with_cache(ours, tokens, names=[b + "attn.hook_q_normed", b + "attn.hook_q"])
        normed, raw = cache[b + "attn.hook_q_normed"], cache[b + "attn.hook_q"]
        rms = raw.pow(2).mean(-1, keepdim=True).add(1e-6).rsqrt()
        torch.testing.assert_close(normed, raw * rms * (1 + ours.blocks[0].attn.q_norm.weight), rtol=1e-5, atol=1e-5)
        handle = ours.blocks[0].attn.hook_q_normed.add_edit(lambda x, point: torch.zeros_like(x))
        try:
            edited = ours(tokens)
        finally:
            handle.remove()
    assert not torch.allclose(edited, logits)


def test_qwen2_style_config_matches_a_hand_written_transformers_config():
    """The switches alone (no checkpoint): a ModelConfig written for Qwen2 saves a config Qwen2Config accepts."""
    config = ModelConfig(family="qwen2", vocab_size=97, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=112,
                         rope_theta=1e6, qkv_bias=True, tie_embeddings=True, norm_eps=1e-6)
    model = Decoder(config)
    assert model.blocks[0].attn.q_proj.bias is not None and model.blocks[0].attn.o_proj.bias is None
    hf = Qwen2Config(**{k: v for k, v in config.to_hf().items() if k not in ("architectures", "model_type", "dtype")})
    assert hf.rope_parameters["rope_theta"] == 1e6 and hf.layer_types == ["full_attention"] * 2


@pytest.mark.parametrize("hf, message", [
    ({"model_type": "olmo2"}, "Only Llama-family checkpoints load .*'qwen2', 'qwen3' or 'gemma3_text'.*'olmo2'"),
    ({"model_type": "phi"}, "'llama', 'mistral', 'qwen2'"),
    ({"model_type": "gemma3"}, "image-and-text.*gemma3_text"),
])
def test_other_model_types_are_refused_naming_the_families_that_load(hf, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf(hf)


GEMMA = dict(model_type="gemma3_text", vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=112, head_dim=16)


@pytest.mark.parametrize("hf, message", [
    ({**GEMMA, "final_logit_softcapping": 30.0}, "soft-capping"),
    ({**GEMMA, "use_bidirectional_attention": True}, "bidirectional"),
    ({**GEMMA, "rope_parameters": {"full_attention": {"rope_theta": 1e6},
                                   "sliding_attention": {"rope_type": "linear", "factor": 8.0}}}, "local"),
    ({**GEMMA, "model_type": "qwen3", "hidden_act": "relu"}, "hidden_act must be one of"),
    ({**GEMMA, "model_type": "llama", "mlp_bias": True}, "MLP biases"),
])
def test_family_settings_the_code_does_not_implement_are_refused(hf, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf(hf)


def test_old_gemma3_config_spelling_reads_the_same():
    old = {**GEMMA, "rope_theta": 1e6, "rope_local_base_freq": 1e4, "sliding_window": 7, "sliding_window_pattern": 2,
           "query_pre_attn_scalar": 16}
    c = ModelConfig.from_hf(old)
    assert c.layer_types == ("sliding_attention", "full_attention") and c.sliding_window == 7
    assert (c.rope_theta, c.local_rope_theta, c.attn_scale) == (1e6, 1e4, 0.25)
    assert c.tie_embeddings and c.embed_scale == 8.0 and c.hidden_act == "gelu_pytorch_tanh"


@pytest.mark.parametrize("kwargs, message", [
    (dict(hidden_act="relu"), "hidden_act must be one of"),
    (dict(sliding_window=4), "no layer is local: mark the local layers"),
    (dict(n_layers=2, layer_types=["sliding_attention", "full_attention"]), "sliding_window is None: set the window"),
    (dict(n_layers=2, layer_types=["full_attention"], sliding_window=4), "each of the 2 layers"),
    (dict(family="gpt2"), "family must be one of"),
    (dict(head_dim=7), "head_dim = 7 must be even"),
    (dict(d_model=60, n_heads=8), "or set head_dim"),
    (dict(embed_scale=0), "embed_scale must be a positive number"),
    (dict(attn_scale=float("nan")), "attn_scale"),
    (dict(qk_norm=1), "qk_norm must be True or False"),
])
def test_switch_errors_say_what_to_change(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**kwargs)
    assert ModelConfig(d_model=60, n_heads=8, head_dim=8).head_dim == 8  # any head_dim, once it is given


def test_saving_a_config_its_family_cannot_hold_names_the_families_that_can(tmp_path):
    with pytest.raises(ValueError, match="LlamaForCausalLM cannot hold.*qk_norm must be False.*'qwen3'"):
        save_pretrained(Decoder(ModelConfig(n_layers=1, qk_norm=True)), tmp_path / "x")
    assert not (tmp_path / "x").exists()  # refused before anything was written
    with pytest.raises(ValueError, match="Qwen2 always has q, k and v biases"):
        ModelConfig(family="qwen2").to_hf()
    assert set(FAMILIES) == {"llama", "mistral", "qwen2", "qwen3", "gemma3_text"}


def test_gemma_norms_start_as_identity_and_the_embedding_scale_is_rounded_like_gemma():
    config = ModelConfig(family="gemma3_text", vocab_size=50, d_model=640, n_layers=1, n_heads=4, head_dim=16,
                         norm_offset=1.0, embed_scale=math.sqrt(640), sandwich_norm=True, qk_norm=True,
                         hidden_act="gelu_pytorch_tanh", tie_embeddings=True)
    model = Decoder(config).to(torch.bfloat16)
    assert torch.equal(model.norm.weight, torch.zeros(640, dtype=torch.bfloat16))  # (1 + 0): a scale of one
    seen = {}
    model.hook_embed.register_forward_hook(lambda m, i, o: seen.setdefault("x", o))
    with torch.no_grad():
        model(torch.tensor([[3]]))
    # sqrt(640) = 25.30 is 25.25 in bf16, the factor transformers' Gemma multiplies by in bf16
    torch.testing.assert_close(seen["x"][0, 0], model.embed_tokens.weight[3] * torch.tensor(25.25, dtype=torch.bfloat16),
                               rtol=0, atol=0)


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
    assert "sliding window 3" in fig.layout.title.text
    assert fig.layout.shapes[0].path == window_edge_path(6, 3)
    plain = attention_heatmap(np.eye(6), labels, layer=1, head=0, n_heads=4, n_kv_heads=2)
    assert not plain.layout.shapes


def test_the_app_loads_a_gemma_checkpoint_and_shows_its_switches_and_bands(app_url, model_root):
    """End to end through the served app: a tiny Gemma 3 checkpoint (the fixture tokenizer) under the allowed
    root loads; the Model tab lists its switches with the lines that apply them; the Attention tab says which
    layers are local and marks the window on a local layer's map."""
    import shutil

    from gradio_client import Client

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
    c = Client(app_url, verbose=False)
    status, bars, config, card, differs = c.predict("tiny-gemma", api_name="/load_model")
    assert "Loaded" in status and "gemma3_text** differs from Llama by 10 switches" in status
    rows = {row[0]: row for row in differs["data"]}
    assert rows["● sandwich_norm"][1] == "True" and rows["● sandwich_norm"][4].startswith("models/block.py:")
    prompt = "The cat sat on the mat. The dog sat on the log."
    out = named(AttentionView, c.predict(prompt, 1, 0, "causal (as trained)", api_name="/attention"))
    assert "Layer 1 is **local**" in out.info and "global: 2" in out.info
    heat = fig(out.heatmap)
    assert "sliding window 4" in heat["layout"]["title"]["text"]
    tokens = len(out.tokens["data"])
    assert heat["layout"]["shapes"][0]["path"] == window_edge_path(tokens, 4)
    weights = arr(heat["data"][0]["z"])  # the band: nothing seen 4 or more tokens back
    assert np.nanmax(np.abs(np.tril(weights, -4))) == 0 and np.nanmin(np.diag(weights)) > 0
    out = named(AttentionView, c.predict(prompt, 2, 0, "causal (as trained)", api_name="/attention"))
    assert "Layer 2 is **global**" in out.info
    c.predict("default", api_name="/load_model")


# --- the KV cache of local layers ---------------------------------------------------------------------------
def test_the_kv_cache_of_a_local_layer_is_sized_by_its_window():
    """Counted by hand: Gemma-3-270m (1 KV head of 256 dims; layers 5, 11, 17 global, the 15 others local with a
    window of 512) and Mistral-7B (every layer local, window 4096) at 32,768 float16 tokens; below the window
    nothing is saved; and the count equals the bytes ``KVCache`` allocates for Qwen2's top layers' windows."""
    from explorer import measure
    from models.kv_cache import KVCache

    gemma = measure.real_config("Gemma-3-270m")
    kv = measure.kv_cache_bytes(gemma, seq_len=32768, batch=2, dtype="float16")
    per_position = 2 * 1 * 256 * 2  # K and V, one KV head, head_dim 256, 2 bytes
    assert kv["per_sequence"] == (3 * 32768 + 15 * 512) * per_position == 108_527_616
    assert kv["batch"] == 2 * kv["per_sequence"] and kv["all_global"] == 2 * 18 * 32768 * per_position
    assert kv["saved"] == kv["all_global"] - kv["batch"] and kv["per_token"] == 18 * per_position
    assert kv["window"] == 512 and kv["local_layers"] == [i for i in range(18) if i % 6 != 5]
    short = measure.kv_cache_bytes(gemma, seq_len=300, dtype="float16")
    assert short["saved"] == 0 and short["per_sequence"] == 18 * 300 * per_position
    mistral = measure.kv_cache_bytes(measure.real_config("Mistral-7B-v0.1"), seq_len=32768, dtype="float16")
    assert mistral["per_sequence"] == 32 * 4096 * (2 * 8 * 128 * 2) and len(mistral["local_layers"]) == 32
    assert measure.kv_cache_bytes(measure.real_config("Qwen3-0.6B"), seq_len=4096)["window"] is None
    qwen2 = ModelConfig.from_hf({"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 4,
                                 "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
                                 "vocab_size": 50, "max_position_embeddings": 64, "use_sliding_window": True,
                                 "sliding_window": WINDOW, "max_window_layers": 2})
    counted = measure.kv_cache_bytes(qwen2, seq_len=64, batch=3, dtype=torch.float32)
    assert counted["local_layers"] == [2, 3]
    assert counted["batch"] == KVCache.for_model(qwen2, 3, dtype=torch.float32).nbytes == 3 * (2 * 64 + 2 * WINDOW) * (
        2 * 2 * 16 * 4)


def test_the_kv_calculator_says_which_layers_are_local_and_what_their_windows_save():
    from explorer.panels.generation import kv_calculator
    from explorer.state import session

    fig, rows, md = kv_calculator("Gemma-3-270m", 32768, 1, "float16", session.new_state())
    assert "15 of 18 layers are local (sliding window 512: layers 0–4, 6–10, 12–16; global: 5, 11, 17)" in md
    assert "saves **472 MiB** (82%) against 576 MiB with every layer global" in md  # 495,452,160 bytes saved
    assert "= **104 MiB**" in md  # 108,527,616 bytes
    own = next(t for t in fig.data if "(its own)" in t.name)
    assert own.x[-1] == 32768 and own.y[-1] == pytest.approx(108_527_616 / 2**20)
    assert fig.layout.shapes[0].x0 == 512 and "15 of 18 layers are local" in fig.layout.title.text
    row = {r[0]: r for r in rows}
    assert row["Gemma-3-270m"][8] == 108_527_616 and row["Gemma-3-270m"][10] == "15 of 18 (window 512)"
    assert row["Mistral-7B-v0.1"][10] == "32 of 32 (window 4,096)" and row["Llama-2-7B"][10] == "none"
    _, _, short = kv_calculator("Gemma-3-270m", 256, 1, "float16", session.new_state())
    assert "no window is full yet" in short
    fig, _, plain = kv_calculator("Llama-2-7B", 32768, 1, "float16", session.new_state())
    assert "local" not in plain and not fig.layout.shapes
