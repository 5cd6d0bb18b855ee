"""The model the tutorial shows is exactly ``load_pretrained``'s: the fast step keeps its own copy of the weights'
layout beside the model (``models.speed.decode_layout``) and never re-lays the model's own tensors.

The reference is ``load_pretrained`` itself and the modules' forward (the teaching path); the copy's size is
counted from the configuration by hand."""
import copy
import gc
import weakref

import pytest
import torch

from models import Decoder, generate, load_pretrained
from models.generate import prefill
from models.lora import attach_lora, detach_lora, lora_layers
from models.speed import decode_layout, decode_layout_bytes, fast_step, optimize_for_decode, torch_step
from models.speed import layout as layout_module
from tests.tiny_decoder import spread
from tests.tiny_decoder import tiny as tiny_config


def _plain(model):
    """Parameters that are not each a plain contiguous tensor owning exactly its own storage."""
    return [n for n, p in model.named_parameters()
            if not p.is_contiguous() or p.untyped_storage().nbytes() != p.numel() * p.element_size()]


class _Counted:
    def __init__(self, step):
        self.step, self.ran, self.aside = step, 0, 0

    def __call__(self, *args):
        logits = self.step(*args)
        self.ran += logits is not None
        self.aside += logits is None
        return logits


def _copy_bytes(c) -> int:
    """What the layout copies, from the configuration: q, k, v and o, gate and up side by side, and the LM head
    (every matrix with out >= in; SwiGLU's down projection narrows and is read in place), fp32."""
    H, Hkv, D, C, F, V = c.n_heads, c.n_kv_heads, c.head_dim, c.d_model, c.d_ff, c.vocab_size
    o = C * H * D if C >= H * D else 0
    return 4 * (c.n_layers * ((H + 2 * Hkv) * D * C + o + 2 * F * C) + V * C)


def test_the_app_serves_load_pretrained_weights_and_a_fast_decode_leaves_them_plain():
    from explorer.state import checkpoints, session

    model, tokenizer = session.load_default()
    reference = load_pretrained(checkpoints.default_model_dir())
    assert _plain(reference) == [] and _plain(model) == []
    for (name, p), (ref_name, ref) in zip(model.named_parameters(), reference.named_parameters()):
        assert name == ref_name and torch.equal(p, ref), name
    pointers = [p.data_ptr() for p in model.parameters()]
    prompt = torch.tensor([tokenizer("Once upon a time, there was a little girl named Lily.")["input_ids"]])
    counted = _Counted(fast_step)
    fast = generate(model, prompt, 24, step=counted)
    assert counted.ran == 23 and counted.aside == 0  # the fast step ran, every step
    assert torch.equal(fast, generate(model, prompt, 24))  # the modules agree
    assert _plain(model) == [] and [p.data_ptr() for p in model.parameters()] == pointers
    assert decode_layout_bytes(model) == _copy_bytes(model.config) > 0


def test_the_copy_is_remade_after_a_write_and_goes_with_its_model():
    torch.manual_seed(0)
    model = spread(Decoder(tiny_config(vocab_size=97, n_layers=2)), norms=True)
    assert decode_layout_bytes(model) == 0  # nothing before the first fast decode
    prompt = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(1))
    assert torch.equal(generate(model, prompt, 8, step=fast_step), generate(model, prompt, 8))
    first = decode_layout(model)
    assert decode_layout(model) is first  # kept: made once
    assert first.nbytes == decode_layout_bytes(model) == _copy_bytes(model.config)
    other = spread(Decoder(model.config), norms=True)
    model.load_state_dict(other.state_dict())  # in-place writes: the copy is stale
    assert torch.equal(generate(model, prompt, 8, step=fast_step), generate(model, prompt, 8))
    assert decode_layout(model) is not first
    # a write in the middle of a generation is seen at the next token, by either step
    for step in (fast_step, torch_step):
        cache, ref_cache = model.new_cache(1, 10), copy.deepcopy(model).new_cache(1, 10)
        with torch.inference_mode():
            prefill(model, prompt, cache), prefill(model, prompt, ref_cache)
            assert step(model, prompt[:, :1], cache, 5) is not None
            model(prompt[:, :1], start_pos=5, cache=ref_cache)
        with torch.no_grad():
            model.blocks[1].attn.k_proj.weight.mul_(-0.5)
        with torch.inference_mode():
            got = step(model, prompt[:, 1:2], cache, 6)
            want = model(prompt[:, 1:2], start_pos=6, cache=ref_cache, last_only=True)[:, -1]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert _plain(model) == []
    held = weakref.ref(decode_layout(model).lm_head)
    del model, cache, ref_cache
    gc.collect()
    assert held() is None  # the copy went with its model


def test_lora_makes_the_step_stand_aside_and_the_merged_weights_are_decoded_after_detaching():
    torch.manual_seed(2)
    model = spread(Decoder(tiny_config(vocab_size=97, n_layers=2)), norms=True)
    prompt = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(3))
    generate(model, prompt, 4, step=fast_step)
    attach_lora(model, rank=2)
    with torch.no_grad():
        for layer in lora_layers(model):
            layer.lora_B.normal_(std=0.5)
    counted = _Counted(fast_step)
    assert torch.equal(generate(model, prompt, 8, step=counted), generate(model, prompt, 8))
    assert counted.ran == 0
    for layer in lora_layers(model):
        layer.merge()
    merged = generate(model, prompt, 8)
    for layer in lora_layers(model):
        layer.merged = False  # keep the merged weights when the adapter goes
    detach_lora(model)
    counted = _Counted(fast_step)
    assert torch.equal(generate(model, prompt, 8, step=counted), merged)
    assert counted.ran == 7 and _plain(model) == []


def test_a_model_laid_out_in_place_costs_no_copy_and_the_number_of_copies_is_bounded(monkeypatch):
    torch.manual_seed(4)
    laid = optimize_for_decode(spread(Decoder(tiny_config(vocab_size=97, n_layers=2)), norms=True))
    prompt = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(5))
    assert torch.equal(generate(laid, prompt, 6, step=fast_step), generate(laid, prompt, 6))
    assert decode_layout_bytes(laid) == 0  # every matrix already lies as the step reads it: viewed, not copied
    monkeypatch.setattr(layout_module, "_layouts", layout_module._Layouts(max_models=2))
    models = [Decoder(tiny_config(vocab_size=97, n_layers=1)) for _ in range(4)]
    for m in models:
        decode_layout(m)
    assert [decode_layout_bytes(m) > 0 for m in models] == [False, False, True, True]  # the oldest forgotten
    one = decode_layout_bytes(models[3])
    monkeypatch.setattr(layout_module, "_layouts", layout_module._Layouts(max_models=4, max_bytes=int(2.5 * one)))
    for m in models:
        decode_layout(m)
    assert [decode_layout_bytes(m) > 0 for m in models] == [False, False, True, True]  # bounded in bytes too
    monkeypatch.setattr(layout_module, "_layouts", layout_module._Layouts(max_bytes=one // 2))
    decode_layout(models[0])
    assert decode_layout_bytes(models[0]) == one  # the copy in use is kept, even over the bound


@pytest.mark.parametrize("kw", [dict(n_kv_heads=6, tie_embeddings=False), dict(n_heads=8, n_kv_heads=2, head_dim=32)],
                         ids=["untied", "o-narrowing"])
def test_the_copy_counts_what_it_holds(kw):
    model = Decoder(tiny_config(**{"vocab_size": 97, "n_layers": 2, "n_heads": 6, **kw}))
    assert decode_layout(model).nbytes == _copy_bytes(model.config)
    assert _plain(model) == []
