"""Weight formats (fp32 / bf16 / int8), the decoding roofline and the measured summary table.

Every figure here is checked against a direct computation made in the test (NumPy, float64, the calculators in
explorer.measure.calculators), never against the function under test; the app's section is called through
gradio_client on the app launched in-process (tests/conftest.py).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from explorer import measure

from explorer.state import session
from explorer.figures.formats import roofline_figure
from explorer.measure import formats as fm
from lens.hooks import run_with_cache
from explorer.probes.patterns import attention_pattern
from models import Decoder, ModelConfig, generate
from models.quant import Int8Linear


def tiny(tie: bool = True, seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=96,
                      tie_embeddings=tie)
    model = Decoder(cfg).eval()
    with torch.no_grad():  # larger than the 0.02 init, so formats disagree measurably
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    return model


@pytest.fixture(scope="module")
def model():
    return tiny()


@pytest.fixture(scope="module")
def prompt():
    return torch.randint(0, 97, (1, 8), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("fmt", fm.FORMATS)
def test_every_format_answers_with_the_same_api(model, prompt, fmt):
    m = fm.convert(model, fmt)
    out = generate(m, prompt, 6)
    assert out.shape == (1, 14) and torch.equal(out[:, :8], prompt)
    logits, cache = run_with_cache(m, prompt)
    assert logits.shape == (1, 8, 97)
    assert "blocks.1.attn.hook_pattern" in cache
    pat = attention_pattern(m, prompt, 1, 2)
    pat = torch.as_tensor(np.asarray(pat)).double()
    assert pat.shape[-2:] == (8, 8)
    assert torch.allclose(pat.sum(-1), torch.ones_like(pat.sum(-1)), atol=1e-2)  # rows of a softmax
    assert torch.all(pat.triu(1) == 0)  # causal
    ref_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.float32}[fmt]
    assert m.embed_tokens.weight.dtype == ref_dtype
    assert model.embed_tokens.weight.dtype == torch.float32  # the original is untouched
    assert not any(isinstance(x, Int8Linear) for x in model.modules())


def test_int8_matmul_equals_the_dequantised_weight_in_float64(model):
    q = fm.convert(model, "int8")
    layer = q.blocks[0].mlp.down_proj
    assert isinstance(layer, Int8Linear)
    x = torch.randn(3, layer.in_features, generator=torch.Generator().manual_seed(2))
    w = layer.qweight.double() * layer.scale.double()[:, None]  # (out, in)
    ref = x.double() @ w.T
    assert torch.allclose(layer(x).double(), ref, atol=1e-4, rtol=1e-4)
    # and the int8 weight is within half a step of the fp32 one, row by row
    w0 = model.blocks[0].mlp.down_proj.weight.double()
    assert torch.all((w - w0).abs() <= layer.scale.double()[:, None] / 2 + 1e-7)
    expected = "int8pack_mm" if hasattr(torch.ops.aten, "_weight_int8pack_mm") else "dequantize"
    assert fm.int8_kernel(q) == expected and fm.int8_kernel(model) is None  # a decode step's one row
    # one row (torch's int8 kernel where it has one) and several rows (dequantised) agree with float64
    assert layer.kernel_for(x) == "dequantize" and layer.kernel_for(x[:1]) == expected
    assert torch.allclose(layer(x[:1]).double(), ref[:1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("tie", [True, False])
def test_weight_bytes_and_bytes_per_token_against_the_calculators(tie):
    model = tiny(tie)
    c = model.config
    mem = measure.parameter_memory(c)
    assert fm.weight_bytes(fm.convert(model, "fp32")) == mem["fp32"]
    assert fm.weight_bytes(fm.convert(model, "bf16")) == mem["bf16"]
    assert fm.weight_bytes(fm.convert(model, "int8")) == mem["int8_models_quant"]
    n = measure.parameter_count(c)
    kv_per_token = c.n_layers * 2 * c.n_kv_heads * c.head_dim * 4
    # by hand: every matrix and norm once; the embedding table is read in full only as the tied LM head
    weights = 4 * (n["total"] - (0 if tie else n["embedding"] - c.d_model))
    got = fm.bytes_per_token(model, 10)
    assert got == {"weights": weights, "kv_cache": 10 * kv_per_token, "total": weights + 10 * kv_per_token}
    assert kv_per_token == measure.kv_cache_bytes(c, dtype=torch.float32)["per_token"]
    with pytest.raises(ValueError):
        fm.bytes_per_token(model, -1)


def test_roofline_arithmetic_on_a_hand_example():
    # 50 GB/s reading 250 MB per token: at most 200 tokens per second
    assert fm.roofline_tokens_per_s(250e6, 50e9) == pytest.approx(200.0)
    with pytest.raises(ValueError):
        fm.roofline_tokens_per_s(0, 50e9)
    fig = roofline_figure([{"name": "a", "bytes_per_token": 250e6, "tokens_per_s": 100.0}], 50e9)
    line = fig.data[0]
    xs, ys = np.asarray(line.x) * 1e6, np.asarray(line.y)
    assert np.allclose(xs * ys, 50e9)  # the line is bandwidth / bytes everywhere
    assert fig.data[1].x[0] == pytest.approx(250.0) and fig.data[1].y[0] == 100.0


def test_read_bandwidth_is_a_positive_figure():
    bw = fm.read_bandwidth(8 * measure.MIB, repeats=3)
    assert bw["bytes_per_s"] > 0 and bw["nbytes"] == 8 * measure.MIB
    assert bw["bytes_per_s"] == pytest.approx(bw["nbytes"] / bw["seconds"])


def test_agreement_logit_error_and_loss_against_direct_computation(model, prompt):
    bf = fm.convert(model, "bf16")
    a = generate(model, prompt, 12)
    b = generate(bf, prompt, 12)
    got = fm.greedy_agreement(a, b, 8)
    same = [int(x == y) for x, y in zip(a[0, 8:].tolist(), b[0, 8:].tolist())]
    assert got["matching"] == sum(same) and got["new_tokens"] == 12
    assert got["first_divergence"] == (same.index(0) if 0 in same else None)
    hand = torch.tensor([[5, 1, 2, 3, 4]]), torch.tensor([[5, 1, 9, 3, 9]])
    assert fm.greedy_agreement(*hand, 1) == {"matching": 2, "new_tokens": 4, "fraction": 0.5, "first_divergence": 1}

    with torch.no_grad():
        la, lb = model(prompt).double().numpy(), bf(prompt).double().numpy()
    assert fm.max_abs_logit_diff(model, bf, prompt) == pytest.approx(np.abs(la - lb).max(), rel=1e-5)
    x = la[0, :-1]
    logp = x - x.max(-1, keepdims=True) - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
    nll = -logp[np.arange(7), prompt[0, 1:].numpy()].mean()
    assert fm.held_out_loss(model, prompt) == pytest.approx(nll, rel=1e-5)
    probs = np.exp(la[0, -1] - la[0, -1].max())
    probs /= probs.sum()
    top = fm.next_token_top(model, prompt, 3)
    assert [i for i, _ in top] == list(np.argsort(-probs)[:3])
    assert [p for _, p in top] == pytest.approx(list(np.sort(probs)[::-1][:3]), rel=1e-5)


def test_transformers_decodes_through_the_end_token_as_ours_does(prompt, tmp_path):
    """The transformers row once read "greedy agreement 0 / 64" whenever the model's first greedy token was its
    end-of-text token: min_new_tokens forbade it there while ours decodes through it."""
    import dataclasses

    m = tiny()
    ours = generate(m, prompt, 12)
    m.config = dataclasses.replace(m.config, eos_token_id=int(ours[0, prompt.shape[1]]))  # its first answer
    hf = fm.transformers_copy(m, tmp_path)
    theirs = fm.transformers_generate_fn(hf, prompt)(12)
    assert torch.equal(theirs, ours)
    against = fm.transformers_against(m, hf, ours)  # the row's logit and loss columns, no longer "—"
    assert against["max_abs_logit_diff"] < 1e-4
    assert abs(against["held_out_loss"] - fm.held_out_loss(m, ours)) < 1e-5


def test_transformers_stepped_speed_times_what_generate_decodes_and_its_budget_cuts_runs(prompt, tmp_path):
    """transformers timed as ours is (``stepped_speed``): the tokens its generate decodes; a spent budget ends the
    one run at ``min_tokens``."""
    m = tiny()
    hf = fm.transformers_copy(m, tmp_path)
    r = fm.transformers_stepped_speed(hf, prompt, 10, repeats=2)
    assert torch.equal(r["tokens"], generate(m, prompt, 10))
    assert r["new_tokens"] == 10 and r["repeats"] == 2 and r["tokens_per_s"] == 1.0 / r["step_seconds"] > 0
    r = fm.transformers_stepped_speed(hf, prompt, 10, repeats=3, budget_s=0.0, min_tokens=4)
    assert r["new_tokens"] == 4 and r["repeats"] == 1
    assert torch.equal(r["tokens"], generate(m, prompt, 4))


@pytest.mark.slow
def test_compare_formats_reports_each_format(model, prompt):
    models = {f: fm.convert(model, f) for f in fm.FORMATS}
    out = fm.compare_formats(models, prompt, prompt, new_tokens=6, repeats=1, top_k=3)
    assert list(out) == list(fm.FORMATS)
    assert out["fp32"]["agreement"]["matching"] == 6 and out["fp32"]["max_abs_logit_diff"] == 0.0
    for f, r in out.items():
        assert r["tokens_per_s"] > 0
        assert r["tokens"] == generate(models[f], prompt, 6)[0].tolist()
        assert r["bytes_per_token"] == fm.bytes_per_token(models[f], 8 + 3)


def test_stepped_speed_decodes_what_generate_decodes_and_its_budget_cuts_runs(model, prompt):
    """``stepped_speed`` times the loop ``generate`` runs: the same tokens; without a budget every run and token;
    with a spent budget one run of ``min_tokens``."""
    from models.speed import fast_step

    r = fm.stepped_speed(model, prompt, 12, step=fast_step, repeats=3)
    assert torch.equal(r["tokens"], generate(model, prompt, 12, step=fast_step))
    assert r["new_tokens"] == 12 and r["repeats"] == 3 and r["tokens_per_s"] == 1.0 / r["step_seconds"] > 0
    r = fm.stepped_speed(model, prompt, 12, repeats=3, budget_s=0.0, min_tokens=4)
    assert r["new_tokens"] == 4 and r["repeats"] == 1
    assert torch.equal(r["tokens"], generate(model, prompt, 4))
    with pytest.raises(ValueError, match="at least 2"):
        fm.stepped_speed(model, prompt, 1)


@pytest.mark.slow  # sleeps through its time budgets
def test_a_decode_speed_within_a_budget_takes_fewer_tokens_and_runs_for_a_slow_decoder():
    """``decode_speed(..., budget_s=)``: a decoder whose step takes 50 ms, given 1 s for 3 runs of up to 64 tokens,
    is timed over fewer tokens (at least 8), ends near its budget, and still measures its step time; a fast one
    keeps all 64 tokens and 3 runs."""
    import time as clock

    def fake(step_s, prefill_s=0.01):
        calls = []

        def fn(n):
            calls.append(n)
            clock.sleep(prefill_s + step_s * (n - 1))
            return torch.arange(n)[None]
        return fn, calls

    slow, calls = fake(0.05)
    t0 = clock.perf_counter()
    r = fm.decode_speed(slow, 64, repeats=3, budget_s=1.0)
    took = clock.perf_counter() - t0
    assert 8 <= r["new_tokens"] < 64 and 1 <= r["repeats"] <= 3
    assert r["tokens"].shape[1] == r["new_tokens"] and max(calls) == r["new_tokens"]
    assert took < 1.0 + 0.05 * 2 + 0.5  # the warm-up's 2 tokens, then about the budget
    assert 0.04 < r["step_seconds"] < 0.08
    fast, _ = fake(0.0005, 0.001)
    r = fm.decode_speed(fast, 64, repeats=3, budget_s=1.0)
    assert r["new_tokens"] == 64 and r["repeats"] == 3
    slowest, _ = fake(0.3)
    r = fm.decode_speed(slowest, 64, repeats=3, budget_s=1.0)
    assert r["new_tokens"] == 8 and r["repeats"] == 1  # the floor: 8 tokens, one run, past the budget


# --- the app, through gradio_client -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def formats_answer(client):
    table, top, roofline, notes, summary, numbers = client.predict(
        "Once upon a time there was a little girl", api_name="/formats")
    return {"table": table, "top": top, "notes": notes, "summary": summary, "numbers": numbers}


def _rows(df):
    return df["data"] if isinstance(df, dict) else df


@pytest.mark.slow
def test_formats_table_equals_its_measurements(formats_answer):
    model, _ = session.load_default()
    n = formats_answer["numbers"]
    rows = {r[0]: r for r in _rows(formats_answer["table"])}
    mem = measure.parameter_memory(model.config)
    for fmt, key in (("fp32", "fp32"), ("bf16", "bf16"), ("int8", "int8_models_quant")):
        r = n["formats"][fmt]
        assert r["weight_bytes"] == mem[key]
        assert rows[fmt][1] == measure.format_bytes(mem[key])
        assert rows[fmt][2] == round(r["tokens_per_s"], 1)
        limit = n["bandwidth"]["bytes_per_s"] / r["bytes_per_token"]["total"]
        assert rows[fmt][4] == round(limit, 1)
        both = min(r["new_tokens"], n["formats"]["fp32"]["new_tokens"])  # timed within a budget: <= 64 tokens
        assert r["agreement"]["new_tokens"] == both and 8 <= both <= 64
        assert rows[fmt][6] == f"{r['agreement']['matching']} / {both}"
        assert rows[fmt][10] == f"{r['new_tokens']} tokens × {r['repeats']} run{'s' if r['repeats'] != 1 else ''}"
    assert n["bandwidth"]["bytes_per_s"] > 0
    assert n["formats"]["fp32"]["bytes_per_token"] == fm.bytes_per_token(model, n["prompt_tokens"] + 32)
    assert len(_rows(formats_answer["top"])) == 10


@pytest.mark.slow
def test_summary_table_cells_equal_the_calculators_and_measurements(formats_answer):
    model, _ = session.load_default()
    c = model.config
    n = formats_answer["numbers"]
    rows = {r[0]: r for r in _rows(formats_answer["summary"])}
    assert list(rows) == ["KV caching", "GQA", "FlashAttention", "LoRA", "INT8"]
    kv = measure.kv_cache_bytes(c, seq_len=c.max_seq_len, dtype=torch.float32)
    assert rows["KV caching"][2].startswith(f"{kv['per_token']:,} bytes per cached position")
    assert f"{n['kv']['cached_ms']:.1f} ms per token with the cache" in rows["KV caching"][2]
    v = measure.attention_variants(c, seq_len=c.max_seq_len, dtype=torch.float32)
    assert (f"cache {measure.format_bytes(v['GQA']['per_sequence'])} against "
            f"{measure.format_bytes(v['MHA']['per_sequence'])} as MHA") in rows["GQA"][2]
    assert rows["GQA"][3] == ("yes" if v["MHA"]["per_sequence"] * c.n_kv_heads == v["GQA"]["per_sequence"] * c.n_heads
                              else "no")
    f = n["flash"]
    assert f"naive {measure.format_bytes(f['naive'][0])} → {measure.format_bytes(f['naive'][1])}" in rows[
        "FlashAttention"][2]
    lo = measure.lora_parameters(c, 8, ("q_proj", "v_proj"))
    assert f"{lo['trainable']:,} of {lo['frozen']:,} parameters trained ({lo['trainable_fraction']:.2%})" in rows[
        "LoRA"][2]
    f32, i8 = n["formats"]["fp32"], n["formats"]["int8"]
    saved = 1 - i8["weight_bytes"] / f32["weight_bytes"]
    assert f"weights {saved:.0%} smaller than fp32" in rows["INT8"][2]
    assert f"x{i8['tokens_per_s'] / f32['tokens_per_s']:.2f} the fp32" in rows["INT8"][2]
    assert all(r[4] for r in rows.values())  # every row names where it is measured live


@pytest.mark.slow
def test_the_measurement_tells_the_progress_bar_each_stage_in_order():
    """Issue 28: the measurement ran for minutes on a real model with nothing on screen saying it was running."""
    from explorer.panels import formats as panel

    said = []
    panel.formats_view("Tom saw a progress bar at the park", None,
                       progress=lambda value, desc=None, unit=None: said.append((value, desc)))
    assert said == [((i, len(panel.STAGES)), stage) for i, stage in enumerate(panel.STAGES)]
