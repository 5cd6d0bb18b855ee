"""The batched paths of explorer.interventions (rows joining one batch block by block, started mid-prompt from the
unchanged run's KV cache) against one intervention at a time over the whole forward, every entry compared.

The references run ``run_with_hooks`` on the full prompt from the embedding, one edit per forward: no
``start_at_layer``, no cache, no batch.
"""
from __future__ import annotations

import functools

import pytest
import torch

from explorer import interventions as iv
from lens.hooks import run_with_hooks
from lens.loss import token_losses
from models import Decoder, ModelConfig

L, H, V = 5, 4, 61


def tiny(seed: int = 0, **switches) -> Decoder:
    torch.manual_seed(seed)
    model = Decoder(ModelConfig(vocab_size=V, d_model=32, n_layers=L, n_heads=H, n_kv_heads=2, d_ff=48,
                                max_seq_len=64, **switches)).eval()
    with torch.no_grad():  # larger than the 0.02 init so every head and position matters
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    return model


def pair(T: int = 12, changed=(5, 8)) -> tuple[torch.Tensor, torch.Tensor]:
    clean = torch.randint(0, V, (1, T), generator=torch.Generator().manual_seed(3))
    corrupt = clean.clone()
    for p in changed:
        corrupt[0, p] = (clean[0, p] + 7) % V
    return clean, corrupt


# One layer per group (the staircase never grows), groups of two layers or fewer rows, every layer in one staircase.
GROUPINGS = [dict(PROGRESS_STEPS=L), dict(PROGRESS_STEPS=2, STAIR_TOKENS=60), dict(PROGRESS_STEPS=1)]


@pytest.fixture(params=GROUPINGS, ids=lambda g: ",".join(f"{k}={v}" for k, v in g.items()))
def grouping(request, monkeypatch):
    for name, value in request.param.items():
        monkeypatch.setattr(iv, name, value)
    return request.param


# The references (one edit per forward) do not depend on the grouping: each is computed once and compared with the
# batched result of every grouping.
@functools.cache
def _knocked_one_at_a_time(how: str) -> torch.Tensor:
    model, (x, _) = tiny(1), pair()
    return torch.stack([torch.stack([token_losses(iv.ablate_heads(model, x, [(layer, h)], how), x)[0]
                                     for h in range(H)]) for layer in range(L)])


@pytest.mark.parametrize("how", ["zero", "mean"])
def test_the_sweep_equals_one_knock_out_at_a_time(grouping, how):
    model, (x, _) = tiny(1), pair()
    got = iv.knockout_sweep(model, x, how)["knocked"]
    torch.testing.assert_close(got, _knocked_one_at_a_time(how), rtol=1e-4, atol=1e-4)
    assert (got.std(dim=(0, 1)) > 1e-3).all()  # the heads matter: a wrong row would show


def _by_one_edit(model, corrupt, name, put, answer):
    return iv.logit_diff(run_with_hooks(model, corrupt, [(name, put)]), answer)[0]


@pytest.mark.parametrize("changed", [(5, 8), (0,), (11,)])  # the first changed token mid-prompt, first, last
def test_resid_patching_equals_one_patch_at_a_time(grouping, changed):
    model, (clean, corrupt), answer = tiny(2), pair(changed=changed), (4, 9)
    got = iv.patched_metrics(model, corrupt, clean, "resid_pre", answer)
    torch.testing.assert_close(got, _resid_patched_one_at_a_time(changed), rtol=1e-4, atol=1e-4)


@functools.cache
def _resid_patched_one_at_a_time(changed: tuple) -> torch.Tensor:
    model, (clean, corrupt), answer = tiny(2), pair(changed=changed), (4, 9)
    want = torch.zeros(L, clean.shape[1])
    src = {}
    with torch.no_grad():
        handles = [model.blocks[i].hook_resid_pre.register_forward_hook(
            lambda m, a, o, i=i: src.setdefault(i, o.detach().clone())) for i in range(L)]
        model(clean)
        for h in handles:
            h.remove()
    for layer in range(L):
        for pos in range(clean.shape[1]):
            def put(x, point, pos=pos, layer=layer):
                x = x.clone()
                x[:, pos] = src[layer][:, pos]
                return x
            want[layer, pos] = _by_one_edit(model, corrupt, f"blocks.{layer}.hook_resid_pre", put, answer)
    return want


@pytest.mark.parametrize("changed", [(5, 8), (0,)])
def test_head_patching_from_the_first_changed_token_equals_one_patch_at_a_time(grouping, changed):
    model, (clean, corrupt), answer = tiny(3), pair(changed=changed), (4, 9)
    got = iv.patched_metrics(model, corrupt, clean, "head", answer)
    torch.testing.assert_close(got, _heads_patched_one_at_a_time(changed), rtol=1e-4, atol=1e-4)
    assert got.std() > 1e-3


@functools.cache
def _heads_patched_one_at_a_time(changed: tuple) -> torch.Tensor:
    model, (clean, corrupt), answer = tiny(3), pair(changed=changed), (4, 9)
    want = torch.zeros(L, H)
    z = {}
    with torch.no_grad():
        handles = [model.blocks[i].attn.hook_z.register_forward_hook(
            lambda m, a, o, i=i: z.setdefault(i, o.detach().clone())) for i in range(L)]
        model(clean)
        for h in handles:
            h.remove()
    for layer in range(L):
        for h in range(H):
            def put(x, point, h=h, layer=layer):
                x = x.clone()
                x[:, h] = z[layer][:, h]
                return x
            want[layer, h] = _by_one_edit(model, corrupt, f"blocks.{layer}.attn.hook_z", put, answer)
    return want


def test_a_sliding_window_model_patched_mid_prompt_equals_one_patch_at_a_time(monkeypatch):
    """Local layers whose window is shorter than the prompt read the kept cache's prefix through their mask."""
    monkeypatch.setattr(iv, "PROGRESS_STEPS", 1)
    model = tiny(4, sliding_window=3, layer_types=("sliding_attention", "full_attention") * 2 + ("sliding_attention",))
    (clean, corrupt), answer = pair(changed=(6,)), (4, 9)
    got = iv.patched_metrics(model, corrupt, clean, "head", answer)
    _, cache = iv.run_with_cache(model, clean, lambda n: n.endswith("hook_z"))
    for layer in range(L):
        for h in range(H):
            def put(x, point, h=h, layer=layer):
                x = x.clone()
                x[:, h] = cache[f"blocks.{layer}.attn.hook_z"][:, h]
                return x
            want = _by_one_edit(model, corrupt, f"blocks.{layer}.attn.hook_z", put, answer)
            torch.testing.assert_close(got[layer, h], want, rtol=1e-4, atol=1e-4)


def test_stop_at_layer_returns_the_residual_entering_that_block():
    model, (x, _) = tiny(5), pair()
    _, cache = iv.run_with_cache(model, x, lambda n: n.endswith("hook_resid_pre"))
    mid = model(x, stop_at_layer=3)
    torch.testing.assert_close(mid, cache["blocks.3.hook_resid_pre"])
    on = model(x, start_at_layer=1, resid=cache["blocks.1.hook_resid_pre"], stop_at_layer=4)
    torch.testing.assert_close(model(x, start_at_layer=4, resid=on), model(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="stop_at_layer must be between start_at_layer"):
        model(x, start_at_layer=2, resid=cache["blocks.2.hook_resid_pre"], stop_at_layer=1)
