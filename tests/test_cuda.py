"""CUDA checks: run where torch sees a GPU, reported as skipped elsewhere.

Parity of the three attention implementations in float32 and bfloat16 against a float64 NumPy oracle,
cached decoding equal to the full forward, the allocator's peaks beside the predictions, and the app's
endpoints answering with models on the GPU (the app picks CUDA by itself: EXPLORER_DEVICE=auto).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.reference import numpy_attention

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")]

IMPLS = ("naive", "sdpa", "tiled")
# bf16 keeps 8 bits of mantissa: outputs of unit-variance attention agree to about 2^-8 relative.
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 3e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [True, False])
def test_attention_parity_on_cuda(impl, dtype, causal):
    from models.attention import attention

    g = torch.Generator().manual_seed(0)
    B, H, Hkv, T, S, D = 2, 8, 2, 37, 37, 64
    q, k, v = (torch.randn(B, h, n, D, generator=g) for h, n in ((H, T), (Hkv, S), (Hkv, S)))
    out, _ = attention(*(t.to("cuda", dtype) for t in (q, k, v)), impl=impl, causal=causal, tile_size=16)
    assert out.device.type == "cuda" and out.dtype == dtype
    out = out.float().cpu().numpy()
    for b in range(B):
        for h in range(H):
            ref, _ = numpy_attention(q[b, h], k[b, h // (H // Hkv)], v[b, h // (H // Hkv)], causal=causal)
            np.testing.assert_allclose(out[b, h], ref, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cached_decoding_equals_full_forward_on_cuda(dtype):
    from models import Decoder, ModelConfig
    from models.generate import generate

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=256, d_model=128, n_layers=3, n_heads=4, n_kv_heads=2, max_seq_len=96)
    model = Decoder(cfg).to("cuda", dtype).eval()
    prompt = torch.randint(0, 256, (1, 9), device="cuda")
    with torch.inference_mode():
        cached = generate(model, prompt, 24, use_cache=True)
        uncached = generate(model, prompt, 24, use_cache=False)
        assert torch.equal(cached, uncached)
        full = model(cached).float()
        cache = model.new_cache(1, cached.shape[1])
        steps = [model(cached[:, :9], cache=cache).float()]
        for pos in range(9, cached.shape[1]):
            steps.append(model(cached[:, pos:pos + 1], start_pos=pos, cache=cache).float())
    stepped = torch.cat(steps, dim=1)
    tol = TOLERANCE[dtype] * 4
    torch.testing.assert_close(stepped, full, atol=tol, rtol=tol)


def test_allocator_peaks_beside_predictions_on_cuda():
    from explorer.measure import attention_memory

    res = attention_memory(2048, 8, 64, device="cuda", dtype=torch.float16, repeats=2)
    assert {r["memory_source"] for r in res.values()} == {"torch.cuda.max_memory_allocated"}
    naive = res["naive"]
    assert abs(naive["peak_bytes"] - naive["predicted_bytes"]) <= 0.25 * naive["predicted_bytes"]
    assert res["sdpa"]["peak_bytes"] * 10 < naive["peak_bytes"]
    assert max(r["max_abs_diff"] for r in res.values()) < 1e-2


def test_app_endpoints_answer_on_cuda(client):
    from lens import device
    from explorer.state import session
    from explorer.panels.attention import AttentionView
    from tests.api_answer import named
    from tests.test_app import CAUSAL

    assert device.device().type == "cuda"
    assert next(session.load_default()[0].parameters()).is_cuda
    out = named(AttentionView, client.predict("The cat sat on the mat. The cat sat on the", 0, 0, CAUSAL,
                                              api_name="/attention"))
    assert out.tokens and "cuda" in out.info
    answer = client.predict("Once upon a time", 8, 0.0, 0, 1.0, 0, api_name="/generate")
    assert answer
