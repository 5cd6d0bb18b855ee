"""explorer.measure: measured vs predicted attention memory, the budget guard, the tiled trace, calculators.

No timing assertions: speed targets are the benchmark's business. References are independent: NumPy float64
for the tiled trace, the model code itself (Decoder, KVCache, attach_lora) for the calculators' counts, and
published parameter counts for the real configurations.
"""
import math

import numpy as np
import pytest
import torch

from explorer import measure
from models.config import ModelConfig
from models.decoder import Decoder
from models.kv_cache import KVCache
from models.lora import attach_lora, count_parameters

KEYS = {"peak_bytes", "predicted_bytes", "seconds", "max_abs_diff"}


@pytest.fixture(scope="module")
def at_1024():
    return measure.attention_memory(1024, 8, 64, repeats=1)


def test_attention_memory_small_returns_everything_and_agrees():
    res = measure.attention_memory(128, 4, 32, repeats=2)
    assert set(res) == {"naive", "sdpa", "tiled"}
    for impl, r in res.items():
        assert KEYS <= set(r), impl
        assert r["peak_bytes"] > 0 and r["predicted_bytes"] > 0 and r["seconds"] > 0
        assert r["max_abs_diff"] < 1e-4
    assert res["naive"]["max_abs_diff"] == 0.0


def test_naive_needs_more_memory_than_sdpa(at_1024):
    assert at_1024["naive"]["peak_bytes"] > 10 * at_1024["sdpa"]["peak_bytes"]
    assert at_1024["naive"]["peak_bytes"] > at_1024["tiled"]["peak_bytes"]


def test_naive_peak_within_25_percent_of_prediction(at_1024):
    r = at_1024["naive"]
    assert abs(r["peak_bytes"] / r["predicted_bytes"] - 1) <= 0.25
    # the prediction is at least the two (B, H, T, S) fp32 tensors the textbook formula holds at once
    assert r["predicted_bytes"] >= 2 * 8 * 1024 * 1024 * 4


@pytest.mark.parametrize("kw", [dict(n_kv_heads=2), dict(dtype="bfloat16"), dict(causal=False, batch=2)])
def test_predictions_follow_measurements_in_other_settings(kw):
    res = measure.attention_memory(256, 8, 32, repeats=1, **kw)
    for impl, r in res.items():
        assert abs(r["peak_bytes"] / r["predicted_bytes"] - 1) <= 0.25, (impl, r)
        tol = 6e-2 if kw.get("dtype") == "bfloat16" else 1e-4  # bf16: naive rounds its weights to 8 bits
        assert r["max_abs_diff"] < tol


def test_prediction_grows_quadratically_for_naive_only():
    n1, n2 = (measure.predict_naive_bytes(T, 8, 64) for T in (2048, 4096))
    s1, s2 = (measure.predict_sdpa_bytes(T, 8, 64, threads=2) for T in (2048, 4096))
    assert 3.9 < n2 / n1 < 4.1
    assert s2 / s1 < 2.5


def test_sweep_refuses_over_budget_before_allocating(monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("something was allocated or measured before the budget check")

    monkeypatch.setattr(measure.run, "attention_memory", must_not_run)
    monkeypatch.setattr(measure.run, "random_qkv", must_not_run)
    with pytest.raises(ValueError) as info:
        measure.attention_sweep([64, 4096], 8, 64, budget_bytes=4_000_000)  # 64 fits, 4096 does not
    msg = str(info.value)
    assert "budget" in msg and "4000000" in msg and "seq_len 4096" in msg
    assert "seq_len" in msg and "at most" in msg  # says what to change


def test_attention_memory_refuses_over_budget():
    with pytest.raises(ValueError, match="budget"):
        measure.attention_memory(4096, 8, 64, budget_bytes=10 * measure.MIB)


def test_sweep_skip_mode_runs_what_fits():
    need_naive = measure.request_bytes(512, 4, 32, impls=("naive",))
    need_tiled = measure.request_bytes(512, 4, 32, impls=("sdpa", "tiled"))
    assert need_tiled < need_naive
    rows = measure.attention_sweep([128, 512], 4, 32, repeats=1, budget_bytes=(need_naive + need_tiled) // 2,
                                   over_budget="skip")
    by = {(r["seq_len"], r["impl"]): r for r in rows}
    assert len(rows) == 6
    assert by[(512, "naive")]["refused"] and by[(512, "naive")]["peak_bytes"] is None
    assert by[(512, "sdpa")]["refused"] is None and by[(512, "sdpa")]["peak_bytes"] > 0
    assert by[(128, "naive")]["refused"] is None and by[(128, "tiled")]["max_abs_diff"] < 1e-4


def test_largest_fitting_seq_len_is_tight():
    budget = 64 * measure.MIB
    T = measure.largest_fitting_seq_len(budget, 8, 64)
    assert measure.request_bytes(T, 8, 64) <= budget < measure.request_bytes(T + 1, 8, 64)


def test_budget_from_environment(monkeypatch):
    monkeypatch.setenv("EXPLORER_MEMORY_BUDGET", "1GiB")
    assert measure.budget_from_env() == 2**30
    monkeypatch.setenv("EXPLORER_MEMORY_BUDGET", "123456789")
    assert measure.budget_from_env() == 123456789
    monkeypatch.setenv("EXPLORER_MEMORY_BUDGET", "lots")
    with pytest.warns(UserWarning):
        assert measure.budget_from_env() == measure.DEFAULT_MEMORY_BUDGET_BYTES
    monkeypatch.delenv("EXPLORER_MEMORY_BUDGET")
    assert measure.budget_from_env() == 4 * 2**30
    assert isinstance(measure.MEMORY_BUDGET_BYTES, int)


def test_the_budget_is_read_where_it_lives(monkeypatch):
    """``measure.MEMORY_BUDGET_BYTES`` is the value in ``measure.units``, and every check uses it."""
    assert measure.MEMORY_BUDGET_BYTES == measure.units.MEMORY_BUDGET_BYTES > 0
    monkeypatch.setattr(measure.units, "MEMORY_BUDGET_BYTES", 123_456)
    assert measure.MEMORY_BUDGET_BYTES == 123_456
    with pytest.raises(ValueError, match="over the memory budget of .* \\(123456 bytes\\)"):
        measure.check_budget(512, 8, 64)
    with pytest.raises(ValueError, match="over the budget"):
        measure.tiled_trace(64, 2, 16, 8)


def test_parse_and_format_bytes():
    assert measure.parse_bytes("512MB") == 512 * 10**6
    assert measure.parse_bytes("8 GiB") == 8 * 2**30
    for bad in ("", "-1", "1 parsec", "0"):
        with pytest.raises(ValueError):
            measure.parse_bytes(bad)
    assert measure.format_bytes(1536) == "1.5 KiB"
    assert measure.format_bytes(3 * 2**30) == "3 GiB"


def test_peak_tracker_sees_a_known_allocation():
    def make():
        a = torch.empty(1_000_000, dtype=torch.float32)  # 4 MB, alive at the same time as b
        b = torch.empty(500_000, dtype=torch.float64)  # 4 MB
        return a.numel() + b.numel()

    _, peak = measure.peak_bytes_cpu(make)
    assert peak == 8_000_000


# --- tiled trace ------------------------------------------------------------------------------------
def test_tiled_trace_matches_a_float64_online_softmax():
    T, H, D, bs = 40, 2, 8, 16
    tr = measure.tiled_trace(T, H, D, bs, seed=3)
    assert [b["block"] for b in tr["blocks"]] == [0, 1, 2]
    assert [(b["start"], b["stop"]) for b in tr["blocks"]] == [(0, 16), (16, 32), (32, 40)]
    assert tr["max_abs_diff"] < 1e-5
    np.testing.assert_allclose(tr["blocks"][-1]["out"], tr["out"], atol=1e-6)
    q, k, v = (t[0].double().numpy() for t in measure.random_qkv(T, H, D, seed=3))
    s = q @ k.transpose(0, 2, 1) / math.sqrt(D)  # (H, T, S)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    for b in tr["blocks"]:
        seen = s[:, :, : b["stop"]]
        m = seen.max(-1)  # (H, T); rows with no key seen yet keep the fill value
        has = np.isfinite(m)
        np.testing.assert_allclose(b["m"][has], m[has], rtol=1e-5, atol=1e-5)
        l = np.exp(seen - m[..., None]).sum(-1)
        np.testing.assert_allclose(b["l"][has], l[has], rtol=1e-5)
        out = np.einsum("hts,hsd->htd", np.exp(seen - m[..., None]), v[:, : b["stop"]]) / l[..., None]
        np.testing.assert_allclose(b["out"][has], out[has], atol=1e-5)
    w = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(tr["weights"], w / w.sum(-1, keepdims=True), atol=1e-6)


def test_tiled_trace_refuses_huge_requests():
    with pytest.raises(ValueError, match="budget"):
        measure.tiled_trace(8192, 8, 64, 8, budget_bytes=measure.GIB)
    with pytest.raises(ValueError):
        measure.tiled_trace(64, 4, 16, 0)


# --- calculators ------------------------------------------------------------------------------------
SMALL = [ModelConfig(vocab_size=300, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=96),
         ModelConfig(vocab_size=128, d_model=48, n_layers=2, n_heads=6, tie_embeddings=True),
         ModelConfig(vocab_size=50, d_model=32, n_layers=1, n_heads=4, n_kv_heads=1, d_ff=40)]


@pytest.mark.parametrize("cfg", SMALL)
def test_parameter_count_matches_the_model(cfg):
    assert measure.parameter_count(cfg)["total"] == Decoder(cfg).num_parameters()
    mem = measure.parameter_memory(cfg)
    assert mem["fp32"] == 4 * mem["parameters"] and mem["bf16"] == 2 * mem["parameters"]
    assert mem["int8"] == mem["parameters"]
    # against the bytes a built model holds, counted tensor by tensor (a tied head is one tensor)
    model = Decoder(cfg)
    held = {dtype: sum(p.numel() * p.element_size() for p in model.to(dtype).parameters())
            for dtype in (torch.float32, torch.bfloat16)}
    assert (mem["fp32"], mem["bf16"]) == (held[torch.float32], held[torch.bfloat16])
    n = measure.parameter_count(cfg)
    assert n["embedding"] == model.embed_tokens.weight.numel()
    assert n["per_layer"] == sum(p.numel() for p in model.blocks[0].parameters())
    assert n["final_norm"] == model.norm.weight.numel()
    assert n["lm_head"] == (0 if cfg.tie_embeddings else model.lm_head.weight.numel())


@pytest.mark.parametrize("cfg", SMALL)
def test_parameters_by_component_add_up_to_the_model(cfg):
    from models.lora import attach_lora

    model = Decoder(cfg)
    parts = measure.parameters_by_component(model)
    n = measure.parameter_count(cfg)
    assert sum(parts.values()) == model.num_parameters() and "other" not in parts
    assert parts["embedding"] == n["embedding"] and parts["LM head"] == n["lm_head"]
    assert parts["norms"] == 2 * cfg.d_model * cfg.n_layers + cfg.d_model
    attach_lora(model, ("q_proj",), rank=2, alpha=4)  # an adapter counts under its projection's component
    grown = measure.parameters_by_component(model)
    assert grown["attention"] - parts["attention"] == cfg.n_layers * 2 * (cfg.d_model + cfg.n_heads * cfg.head_dim)
    held = measure.module_bytes(model)
    assert held["parameters"] == 4 * model.num_parameters()
    assert held["buffers"] == sum(b.numel() * b.element_size() for b in model.buffers()) > 0  # the rotary tables


@pytest.mark.parametrize("cfg", SMALL[:2])  # an LM head of its own, and one tied to the embedding
def test_int8_memory_matches_models_quant(cfg):
    from models.quant import quantize_int8

    qmodel, _ = quantize_int8(Decoder(cfg))
    held = sum(t.numel() * t.element_size() for t in list(qmodel.parameters()) + list(qmodel.buffers(recurse=True)))
    held -= sum(b.numel() * b.element_size() for n, b in qmodel.named_buffers() if n.startswith("rope_"))
    assert measure.parameter_memory(cfg)["int8_models_quant"] == held


@pytest.mark.parametrize("cfg", SMALL)
def test_kv_cache_bytes_match_the_cache_object(cfg):
    cache = KVCache.for_model(cfg, batch=3, max_len=100, dtype=torch.float32)
    kv = measure.kv_cache_bytes(cfg, seq_len=100, batch=3, dtype=torch.float32)
    assert kv["batch"] == cache.nbytes
    assert kv["per_token"] == cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * 4


def test_llama2_70b_gqa_cache_is_8x_smaller_than_mha():
    cfg = measure.real_config("Llama-2-70B")
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.n_layers, cfg.head_dim) == (64, 8, 80, 128)
    v = measure.attention_variants(cfg, seq_len=4096)
    assert v["MHA"]["per_token"] == 8 * v["GQA"]["per_token"]
    assert v["GQA"]["per_token"] == 80 * 2 * 8 * 128 * 2  # fp16: 320 KiB per token
    assert v["MQA"]["per_token"] * 8 == v["GQA"]["per_token"]
    mha = ModelConfig.from_dict({**cfg.to_dict(), "n_kv_heads": 64})
    assert measure.kv_cache_bytes(mha, seq_len=4096)["per_sequence"] == 8 * measure.kv_cache_bytes(cfg, seq_len=4096)[
        "per_sequence"]


def test_lora_example_rank_16_on_4096_square():
    r = measure.lora_linear_parameters(4096, 4096, 16)
    assert r["full"] == 16_777_216 and r["lora"] == 131_072 and r["ratio"] == 128


def test_lora_parameters_match_attach_lora():
    cfg = SMALL[0]
    for targets in (("q_proj", "v_proj"), ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                           "down_proj")):
        model = Decoder(cfg)
        attach_lora(model, targets, rank=4)
        counts = count_parameters(model)
        calc = measure.lora_parameters(cfg, 4, targets)
        assert calc["trainable"] == counts["trainable"]
        assert calc["frozen"] == counts["frozen"]
    with pytest.raises(ValueError):
        measure.lora_parameters(cfg, 4, ("w_proj",))


PUBLISHED = {"SmolLM2-135M": 134.5e6, "TinyLlama-1.1B": 1.10e9, "Llama-2-7B": 6.74e9, "Llama-2-70B": 68.98e9,
             "Mistral-7B-v0.1": 7.24e9,
             # the model cards' rounded figures: 0.49B, 0.6B, 270M (the name), 1.23B
             "Qwen2.5-0.5B-Instruct": 0.49e9, "Qwen3-0.6B": 0.6e9, "Gemma-3-270m": 0.27e9, "Llama-3.2-1B": 1.23e9}


def test_real_configs_are_data_with_sources_and_published_sizes():
    configs = measure.load_real_configs()
    assert set(configs) == set(PUBLISHED)
    for name, entry in configs.items():
        assert entry["source"].startswith("https://huggingface.co/") and entry["source"].endswith("config.json")
        n = measure.parameter_count(measure.real_config(name))["total"]
        assert abs(n / PUBLISHED[name] - 1) < 0.01, (name, n)
    rows = measure.real_config_table(seq_len=1024)
    assert {r["name"] for r in rows} == set(PUBLISHED)
    with pytest.raises(ValueError, match="choose one of"):
        measure.real_config("GPT-5")


def test_machine_info_has_provenance():
    info = measure.machine_info("cpu", "float32")
    for key in ("cpu", "cores", "torch", "device", "dtype", "date"):
        assert info[key]
    assert info["dtype"] == "float32"


def test_timed_sweep_stops_before_a_length_predicted_to_pass_the_time_limit(monkeypatch):
    import threading
    import time

    ran, me, real = [], threading.get_ident(), measure.run.attention_sweep

    def fake_sweep(seq_lens, n_heads, head_dim, **kw):
        if threading.get_ident() != me:  # an app another test started may measure meanwhile: not this sweep
            return real(seq_lens, n_heads, head_dim, **kw)
        ran.append(seq_lens[0])
        time.sleep(0.05 * (seq_lens[0] / 64) ** 2)  # a length costs as T² would
        return [{"seq_len": seq_lens[0], "impl": "sdpa"}]

    monkeypatch.setattr(measure.run, "attention_sweep", fake_sweep)
    steps = list(measure.timed_sweep([64, 128, 256], 2, 16, impls=("sdpa",), time_limit=0.2))
    # 64 took at least 0.05 s, so 128 is predicted at 0.2 s or more: past the limit, it never starts
    assert ran == [64]
    T, expect = steps[-1].stopped_before
    assert T == 128 and expect >= 0.2  # four times the 0.05 s (at least) that 64 took
    assert [r["seq_len"] for r in steps[-1].rows] == [64] and steps[0].stopped_before is None
    ran.clear()
    steps = list(measure.timed_sweep([64, 128], 2, 16, impls=("sdpa",), time_limit=60))
    assert ran == [64, 128] and all(s.stopped_before is None for s in steps)
    assert [len(s.rows) for s in steps] == [1, 2]
    ran.clear()
    with pytest.raises(ValueError, match="over the memory budget"):  # every size is checked before any runs
        list(measure.timed_sweep([64, 8192], 8, 64, time_limit=60, budget_bytes=4_000_000))
    assert ran == []


def test_a_stop_ends_a_naive_measurement_between_two_operations(monkeypatch):
    """Stop pressed inside one naive call (here: as its mask is built, after the QKᵀ product) ends the call
    before its softmax: the visitor waits for one operation, not one whole T = 4,096 call (1-2 s)."""
    import threading

    import models.attention as attention_module
    from explorer.measure.run import attention_memory
    from explorer.state.threads import Stopped, stoppable

    event, softmaxes = threading.Event(), []
    build_mask, softmax = attention_module.build_mask, torch.softmax

    def mask_then_stop(*args, **kwargs):
        event.set()
        return build_mask(*args, **kwargs)

    monkeypatch.setattr(attention_module, "build_mask", mask_then_stop)
    me = threading.get_ident()  # only this thread's: an app another test started may run softmax meanwhile

    def counted(*args, **kwargs):
        if threading.get_ident() == me:
            softmaxes.append(1)
        return softmax(*args, **kwargs)
    monkeypatch.setattr(torch, "softmax", counted)
    with stoppable(event), pytest.raises(Stopped):
        attention_memory(64, 2, 16, impls=["naive"], repeats=1)
    assert not softmaxes
    event.clear()  # without a Stop, the same call runs whole
    monkeypatch.setattr(attention_module, "build_mask", build_mask)
    assert attention_memory(64, 2, 16, impls=["naive"], repeats=1)["naive"]["seconds"] > 0 and softmaxes
