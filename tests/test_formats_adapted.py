"""The Weight formats view after a fine-tune compares like with like, a speed above its roofline is flagged as a
measuring error, and the hardware sentences follow the CPU's flags."""
from __future__ import annotations

import pytest
import torch

from explorer.measure import formats as fm
from explorer.measure.weight_formats import format_copies
from explorer.panels import formats as panel
from models import Decoder, ModelConfig
from models.lora import LoRALinear, attach_lora, set_adapter_mode


def adapted_model() -> Decoder:
    torch.manual_seed(1)
    cfg = ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=64)
    model = Decoder(cfg).eval()
    attach_lora(model, ("q_proj", "v_proj", "down_proj"), rank=4)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.normal_(0, 0.5)  # a trained adapter: it moves the logits far
    return model


@pytest.mark.slow  # builds transformers' copy from safetensors
@torch.no_grad()
def test_every_format_and_transformers_hold_the_adapted_weights(tmp_path):
    model = adapted_model()
    ids = torch.randint(0, 97, (1, 20), generator=torch.Generator().manual_seed(2))
    adapted = model(ids)
    set_adapter_mode(model, "off")
    base = model(ids)
    set_adapter_mode(model, "on")
    assert (adapted - base).abs().max() > 0.5  # the adapter matters, so a copy of the base weights would show
    copies = format_copies(model)
    for fmt, copy in copies.items():
        assert not any(isinstance(m, LoRALinear) for m in copy.modules()), fmt
    torch.testing.assert_close(copies["fp32"](ids), adapted, atol=1e-5, rtol=1e-5)
    for fmt in ("bf16", "int8"):  # close to the adapted model, far from the base one
        err = (copies[fmt](ids).float() - adapted).abs().max()
        assert err < 0.2 * (base - adapted).abs().max(), fmt
    hf = fm.transformers_copy(copies["fp32"], tmp_path)
    torch.testing.assert_close(hf(ids).logits, adapted, atol=1e-4, rtol=1e-4)

    set_adapter_mode(model, "off")  # no weight written: the copies must still follow the switch
    torch.testing.assert_close(format_copies(model)["fp32"](ids), base, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model(ids), base)  # the loaded model itself untouched


def _numbers(fp32_speed: float, int8_speed: float, native) -> dict:
    def row(speed, nbytes):
        return {"tokens_per_s": speed, "bytes_per_token": {"total": nbytes}}
    return {"formats": {"fp32": row(fp32_speed, 4e8), "bf16": row(fp32_speed / 2, 2e8), "int8": row(int8_speed, 1.5e8)},
            "native_bf16": native, "int8_aside": None, "adapters": None}


def test_speeds_above_the_roofline_and_the_hardware_sentences():
    bw = 1e10  # 25 tokens/s for fp32's 4e8 bytes
    assert fm.above_limit(fm.roofline_tokens_per_s(4e8, bw) * 1.2, fm.roofline_tokens_per_s(4e8, bw))
    assert not fm.above_limit(20.0, fm.roofline_tokens_per_s(4e8, bw))
    text = panel._format_sentences(_numbers(20.0, 50.0, False), [], ["fp32"])
    assert "Measuring error:** fp32" in text and "no native bf16" in text and "2.50× as fast" in text
    text = panel._format_sentences(_numbers(20.0, 10.0, True), [], [])
    assert "only 0.50×" in text and "natively" in text and "Measuring error" not in text


def test_native_bf16_follows_the_cpu_flags():
    flags = set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    want = bool(flags & {"avx512_bf16", "amx_bf16"}) if flags else None
    assert fm.native_bf16(torch.device("cpu")) is want
