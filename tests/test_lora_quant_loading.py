"""LoRA, weight-only int8 and checkpoint loading."""
import json

import pytest
import torch
from torch import nn

from models import Decoder, ModelConfig, load_pretrained, save_pretrained
from models.speed import optimize_for_decode
from models.lora import (LoRALinear, adapter_mode, attach_lora, check_lora, count_parameters, detach_lora, merge_lora,
                         set_adapter_mode, set_lora_enabled, unmerge_lora)
from models.quant import Int8Linear, quantize_int8


def model_and_tokens(seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=53, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32, d_ff=64)
    model = Decoder(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" not in n:
                p.normal_(0, 0.1)
    return model, torch.randint(0, 53, (2, 12))


def _randomise_b(model):
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.normal_(0, 0.1)


# --- LoRA -------------------------------------------------------------------------------------------
def test_fresh_adapter_leaves_logits_unchanged_to_the_bit():
    model, tokens = model_and_tokens()
    before = model(tokens)
    names = attach_lora(model, ("q_proj", "v_proj", "down_proj"), rank=4, alpha=8)
    assert names == [f"blocks.{i}.{p}" for i in range(2) for p in ("attn.q_proj", "attn.v_proj", "mlp.down_proj")]
    assert torch.equal(model(tokens), before)


def test_lora_is_w0_plus_scaled_ba_and_merges_disables_unmerges_detaches():
    model, tokens = model_and_tokens()
    before = model(tokens).detach()
    w0 = model.blocks[0].attn.q_proj.weight.detach().clone()
    attach_lora(model, ("q_proj", "o_proj"), rank=2, alpha=6)
    _randomise_b(model)
    layer = model.blocks[0].attn.q_proj
    x = torch.randn(3, 32)
    expected = x @ w0.T + (6 / 2) * (x @ layer.lora_A.T @ layer.lora_B.T)
    torch.testing.assert_close(layer(x), expected, atol=1e-6, rtol=1e-6)
    adapted = model(tokens).detach()
    assert (adapted - before).abs().max() > 1e-3
    merge_lora(model)
    torch.testing.assert_close(model(tokens), adapted, atol=1e-5, rtol=1e-5)
    assert not torch.equal(layer.base.weight, w0)
    set_lora_enabled(model, False)  # unmerges, then switches off: the base model exactly up to rounding
    torch.testing.assert_close(model(tokens), before, atol=1e-5, rtol=1e-5)
    set_lora_enabled(model, True)
    torch.testing.assert_close(model(tokens), adapted, atol=1e-5, rtol=1e-5)
    merge_lora(model)
    unmerge_lora(model)
    torch.testing.assert_close(layer.base.weight, w0, atol=1e-6, rtol=0)
    assert detach_lora(model) == 4
    assert type(model.blocks[0].attn.q_proj) is nn.Linear
    torch.testing.assert_close(model(tokens), before, atol=1e-5, rtol=1e-5)


def test_disabled_adapter_gives_the_base_model_to_the_bit():
    model, tokens = model_and_tokens()
    before = model(tokens)
    attach_lora(model, ("q_proj", "k_proj", "gate_proj"), rank=3, alpha=3)
    _randomise_b(model)
    set_lora_enabled(model, False)
    assert torch.equal(model(tokens), before)


def test_only_adapters_train_and_counts_add_up():
    model, _ = model_and_tokens()
    total = count_parameters(model)["total"]
    attach_lora(model, ("q_proj", "v_proj"), rank=4, alpha=8)
    counts = count_parameters(model)
    # per layer: q (32 -> 32) and v (32 -> 16): A (r, in) + B (out, r)
    expected = 2 * (4 * 32 + 32 * 4 + 4 * 32 + 16 * 4)
    assert counts == {"trainable": expected, "frozen": total, "total": total + expected}
    assert all(("lora_" in n) == p.requires_grad for n, p in model.named_parameters())


@pytest.mark.parametrize("kwargs,message", [
    (dict(targets=("q_proj",), rank=0), "rank must be a positive integer"),
    (dict(targets=("v_proj",), rank=17), "exceeds"),
    (dict(targets=("q_proj",), rank=2, alpha=0), "alpha"),
    (dict(targets=("qkv",), rank=2), "subset"),
    (dict(targets=(), rank=2), "subset"),
])
def test_lora_errors(kwargs, message):
    model, _ = model_and_tokens()
    targets = kwargs.pop("targets")
    with pytest.raises(ValueError, match=message):
        attach_lora(model, targets, **kwargs)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    assert all(p.requires_grad for p in model.parameters())  # nothing was frozen either


@pytest.mark.parametrize("decode_layout", [False, True])
def test_adapter_modes_switch_what_the_model_computes(decode_layout):
    model, tokens = model_and_tokens()
    if decode_layout:  # the app fine-tunes and merges into the (in, out)-ordered weights
        optimize_for_decode(model)
    base = model(tokens).detach()
    assert adapter_mode(model) is None
    attach_lora(model, ("q_proj", "v_proj", "up_proj"), rank=3, alpha=6)
    _randomise_b(model)
    assert adapter_mode(model) == "on"
    on = model(tokens).detach()
    assert (on - base).abs().max() > 1e-3
    set_adapter_mode(model, "off")  # never merged: W0 x exactly
    assert adapter_mode(model) == "off" and torch.equal(model(tokens), base)
    set_adapter_mode(model, "on")
    assert adapter_mode(model) == "on" and torch.equal(model(tokens), on)
    set_adapter_mode(model, "merged")
    assert adapter_mode(model) == "merged" and all(layer.merged for layer in model.modules()
                                                   if isinstance(layer, LoRALinear))
    merged = model(tokens).detach()
    torch.testing.assert_close(merged, on, atol=1e-5, rtol=1e-5)
    set_adapter_mode(model, "merged")  # choosing it again leaves the merged weights alone
    assert torch.equal(model(tokens), merged)
    set_adapter_mode(model, "on")
    assert adapter_mode(model) == "on"
    torch.testing.assert_close(model(tokens), on, atol=1e-5, rtol=1e-5)
    set_adapter_mode(model, "merged")
    set_adapter_mode(model, "off")  # from merged: W0 is back up to float rounding
    assert adapter_mode(model) == "off"
    torch.testing.assert_close(model(tokens), base, atol=1e-5, rtol=1e-5)
    set_adapter_mode(model, "merged")  # straight from off
    assert adapter_mode(model) == "merged"
    torch.testing.assert_close(model(tokens), on, atol=1e-5, rtol=1e-5)


def test_adapter_mode_errors_say_what_to_do():
    model, _ = model_and_tokens()
    with pytest.raises(ValueError, match="no LoRA adapters"):
        set_adapter_mode(model, "on")
    attach_lora(model, ("q_proj",), rank=2, alpha=2)
    with pytest.raises(ValueError, match="must be one of"):
        set_adapter_mode(model, "enabled")
    model.blocks[0].attn.q_proj.disabled = True  # one layer off, the other on: no single mode
    with pytest.raises(ValueError, match="set_adapter_mode"):
        adapter_mode(model)
    set_adapter_mode(model, "off")
    assert adapter_mode(model) == "off"


def test_check_lora_takes_projection_shapes_before_any_model_exists():
    check_lora(16, 32.0, shapes=[(576, 576), (192, 576)])
    check_lora(192, 1.0, shapes=[(192, 576)])  # at most the smaller side: equal is allowed
    with pytest.raises(ValueError, match=r"rank 193 exceeds the smaller side \(192\) of a chosen projection: "
                                         r"choose a rank of at most 192"):
        check_lora(193, 1.0, shapes=[(576, 576), (192, 576)])
    with pytest.raises(ValueError, match=r"smaller side \(8\)"):  # (out, in) and linears together
        check_lora(9, 1.0, [nn.Linear(32, 16)], shapes=[(64, 8)])
    with pytest.raises(ValueError, match=r"smaller side \(16\)"):
        check_lora(17, 1.0, [nn.Linear(32, 16)], shapes=[(64, 64)])
    check_lora(10_000, 1.0)  # nothing to fit: only rank and alpha themselves are checked
    with pytest.raises(ValueError, match="alpha"):
        check_lora(2, float("inf"), shapes=[(8, 8)])


def test_attaching_twice_is_refused():
    model, _ = model_and_tokens()
    attach_lora(model)
    with pytest.raises(ValueError, match="already has LoRA"):
        attach_lora(model)


# --- int8 -------------------------------------------------------------------------------------------
def test_int8_quantization_reports_bytes_and_a_small_logit_error():
    model, tokens = model_and_tokens()
    before = model(tokens).detach()
    qmodel, report = quantize_int8(model, tokens=tokens)
    assert torch.equal(model(tokens), before)  # the original is untouched
    n_linear = 2 * 7 + 1  # every block's seven projections and the LM head
    assert report["layers"] == n_linear and isinstance(qmodel.lm_head, Int8Linear)
    fp_bytes = sum(m.weight.numel() * 4 for m in model.modules() if type(m) is nn.Linear)
    assert report["bytes_before"] == fp_bytes
    assert report["bytes_after"] == fp_bytes // 4 + sum(m.out_features * 4 for m in qmodel.modules()
                                                          if isinstance(m, Int8Linear))
    assert 0 < report["relative_logit_error"] < 0.05
    assert report["max_abs_logit_error"] == pytest.approx((qmodel(tokens) - before).abs().max().item())


def test_int8_of_a_tied_model_gives_the_head_its_own_int8_rows():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=53, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32, d_ff=64,
                      tie_embeddings=True)
    model = Decoder(cfg).eval()
    table = model.embed_tokens.weight.detach().clone()
    qmodel, report = quantize_int8(model)
    assert model.lm_head.weight is model.embed_tokens.weight  # the original is still tied
    # the copy's lookups read the fp32 table unchanged; its head is the table's rows in int8, each row within half a
    # step of its scale
    assert qmodel.embed_tokens.weight.dtype == torch.float32 and torch.equal(qmodel.embed_tokens.weight, table)
    head = qmodel.lm_head
    assert isinstance(head, Int8Linear) and head.qweight.shape == table.shape
    assert torch.all((head.qweight.float() * head.scale[:, None] - table).abs() <= head.scale[:, None] / 2 + 1e-7)
    assert report["bytes_before"] == sum(m.weight.numel() * 4 for m in model.modules() if type(m) is nn.Linear)
    tokens = torch.randint(0, 53, (1, 8))
    ref = model(tokens)
    assert 0 < (qmodel(tokens) - ref).abs().max() < 0.05 * ref.abs().max()


def test_int8_linear_round_trip_error_is_bounded_by_half_a_step():
    torch.manual_seed(0)
    lin = nn.Linear(16, 8, bias=True)
    q = Int8Linear.from_linear(lin)
    w = q.qweight.float() * q.scale[:, None]
    assert torch.all((w - lin.weight).abs() <= q.scale[:, None] / 2 + 1e-7)
    x = torch.randn(4, 16)
    torch.testing.assert_close(q(x), x @ w.T + lin.bias, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="no linear layer"):
        quantize_int8(nn.Sequential(nn.ReLU()))


# --- loading ----------------------------------------------------------------------------------------
def test_save_and_load_round_trip(tmp_path):
    model, tokens = model_and_tokens()
    save_pretrained(model, tmp_path)
    again = load_pretrained(tmp_path)
    assert torch.equal(again(tokens), model(tokens))
    assert load_pretrained(tmp_path, dtype=torch.bfloat16).embed_tokens.weight.dtype == torch.bfloat16


def test_loading_errors_say_what_is_wrong(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="neither a folder nor a Hugging Face repo id"):
        load_pretrained("../../etc/passwd")
    with pytest.raises(ValueError, match="could not fetch"):
        load_pretrained("nobody-here/not-a-model-xyz")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        load_pretrained(tmp_path / "empty")
    model, _ = model_and_tokens()
    folder = save_pretrained(model, tmp_path / "ok")
    (folder / "pytorch_model.bin").write_bytes(b"not read")
    (folder / "model.safetensors").write_bytes(b"\x00" * 10)  # truncated
    with pytest.raises(ValueError, match="not a readable safetensors"):
        load_pretrained(folder)
    folder = save_pretrained(model, tmp_path / "nosafe")
    (folder / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="no .safetensors"):
        load_pretrained(folder)
    folder = save_pretrained(model, tmp_path / "wrong")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["num_hidden_layers"] = 3
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="missing"):
        load_pretrained(folder)
    cfg["num_hidden_layers"], cfg["hidden_size"], cfg["head_dim"] = 2, 64, 16
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="shape"):
        load_pretrained(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="lacks the field"):
        load_pretrained(folder)
