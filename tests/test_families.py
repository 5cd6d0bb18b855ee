"""The families that change Llama in a few named ways (Qwen2, Qwen3, Gemma 3 text, Mistral), each against its
transformers class on the same random weights (no network): logits, attention weights, greedy tokens with and
without the KV cache (sliding-window rings included), and checkpoints written by us that transformers loads."""
from __future__ import annotations

import math

import pytest
import torch
from transformers import Qwen2Config

from models import Decoder, ModelConfig, generate, load_pretrained
from models.families import FAMILIES
from models.loading import save_pretrained
from tests.family_pairs import CASES, LOCAL, WINDOW, _pair, _tokens
from tests.tiers import fast_first


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


@pytest.mark.parametrize("case", fast_first(CASES))  # qwen2-gqa-tied: full and sliding layers in one model
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


@pytest.mark.parametrize("case", fast_first(["mistral-gqa-untied", "qwen2-gqa-tied", "qwen3-gqa-untied",
                                              "gemma3-gqa-tied", "gemma3-mqa-untied-bias"]))
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
