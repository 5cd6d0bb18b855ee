"""explorer.probes' hooks: every documented hook name captured with its shape, hooks that only observe, and
run_with_cache removing its hooks and releasing the model's lock whatever happens, on one thread or several.
The attention weights, head scores, generation trace and positions: tests/test_probes_patterns.py."""
import threading

import pytest
import torch

from explorer import probes

from explorer.state import locks
from models.hooks import HookPoint, module_hooked
from tests.probe_models import IMPLS, _small_decoder, _tokens


def _no_hooks(model):
    return not any(module_hooked(m) for m in model.modules())


def _acquire_and_release_elsewhere(model):
    """True when another thread can take and give back the model's lock."""
    ok = []

    def worker():
        lock = locks.model_lock(model)
        if lock.acquire(timeout=2):
            lock.release()
            ok.append(True)
        else:
            ok.append(False)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    return ok[0]


# --------------------------------------------------------------------------------------------------
# hook names and run_with_cache
# --------------------------------------------------------------------------------------------------

def test_every_documented_hook_name_is_captured_with_its_shape():
    model = _small_decoder()
    B, T = 2, 9
    cfg = model.config
    H, Hkv, D, C = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_model
    logits, cache = probes.run_with_cache(model, _tokens(T, n=B))
    names = probes.hook_names(model)
    assert set(cache) == set(names) and len(names) == len(set(names))
    assert names[0] == "hook_embed" and names[-1] == "hook_logits"
    expected = {"hook_embed": (B, T, C), "hook_logits": (B, T, cfg.vocab_size),
                "norm.hook_normalized": (B, T, C), "norm.hook_scale": (B, T, 1)}
    for i in range(cfg.n_layers):
        p = f"blocks.{i}."
        for hook in ("hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post"):
            expected[p + hook] = (B, T, C)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            expected[f"{p}{norm}.hook_scale"] = (B, T, 1)
            expected[f"{p}{norm}.hook_normalized"] = (B, T, C)
        expected.update({
            p + "attn.hook_q": (B, H, T, D), p + "attn.hook_rot_q": (B, H, T, D), p + "attn.hook_z": (B, H, T, D),
            p + "attn.hook_k": (B, Hkv, T, D), p + "attn.hook_rot_k": (B, Hkv, T, D),
            p + "attn.hook_v": (B, Hkv, T, D),
            p + "attn.hook_attn_scores": (B, H, T, T), p + "attn.hook_pattern": (B, H, T, T),
            p + "mlp.hook_gate": (B, T, cfg.d_ff), p + "mlp.hook_up": (B, T, cfg.d_ff),
            p + "mlp.hook_post": (B, T, cfg.d_ff),
        })
    assert set(expected) == set(names)
    for name, shape in expected.items():
        assert tuple(cache[name].shape) == shape, name
        assert not cache[name].requires_grad
    # the captures are the model's own tensors: the residual stream adds up, the logits are the output
    torch.testing.assert_close(cache["hook_logits"], logits)
    torch.testing.assert_close(cache["hook_embed"], model.embed_tokens.weight[_tokens(T, n=B)])
    for i in range(cfg.n_layers):
        p = f"blocks.{i}."
        torch.testing.assert_close(cache[p + "hook_resid_mid"], cache[p + "hook_resid_pre"] + cache[p + "hook_attn_out"])
        torch.testing.assert_close(cache[p + "hook_resid_post"], cache[p + "hook_resid_mid"] + cache[p + "hook_mlp_out"])
        rms = cache[p + "hook_resid_pre"].pow(2).mean(-1, keepdim=True).add(cfg.norm_eps).sqrt()
        torch.testing.assert_close(cache[p + "input_layernorm.hook_scale"], rms)
    assert _no_hooks(model)


def test_names_list_predicate_and_single_name_select_what_is_asked():
    model = _small_decoder()
    tok = _tokens(5)
    _, c1 = probes.run_with_cache(model, tok, ["blocks.1.attn.hook_pattern", "hook_logits"])
    assert set(c1) == {"blocks.1.attn.hook_pattern", "hook_logits"}
    _, c2 = probes.run_with_cache(model, tok, lambda n: n.endswith("hook_resid_post"))
    assert set(c2) == {"blocks.0.hook_resid_post", "blocks.1.hook_resid_post"}
    _, c3 = probes.run_with_cache(model, tok[0].tolist(), "hook_embed")
    assert set(c3) == {"hook_embed"}
    with pytest.raises(ValueError, match="not a hook point"):
        probes.run_with_cache(model, tok, ["blocks.9.attn.hook_pattern"])
    assert _no_hooks(model)


def test_hooks_only_observe_output_is_bit_identical():
    model = _small_decoder()
    tok = _tokens(12, n=2)
    for impl in IMPLS:
        with torch.no_grad():
            plain = model(tok, attn_impl=impl)
        out, _ = probes.run_with_cache(model, tok, attn_impl=impl)
        assert torch.equal(out, plain), impl


def test_hooks_are_removed_and_lock_released_when_the_predicate_raises():
    model = _small_decoder()
    seen = []

    def bad(name):
        seen.append(name)
        if len(seen) > 5:  # some hooks are already registered by now
            raise RuntimeError("boom")
        return True

    with pytest.raises(RuntimeError, match="boom"):
        probes.run_with_cache(model, _tokens(4), bad)
    assert _no_hooks(model)
    assert _acquire_and_release_elsewhere(model)


def test_hooks_are_removed_and_lock_released_when_the_forward_raises():
    model = _small_decoder()
    registered = []
    orig = HookPoint.register_forward_hook

    def spy(self, *a, **k):
        registered.append(self)
        return orig(self, *a, **k)

    def broken(*args, **kwargs):
        raise ValueError("raised inside the forward")

    HookPoint.register_forward_hook = spy
    try:
        with pytest.raises(ValueError, match="token ids must lie"):  # refused where the ids come in
            probes.run_with_cache(model, torch.tensor([[1, 2, 999]]))
        assert registered == []  # refused at the probes' edge, before any hook or forward
        model.blocks[1].mlp.forward = broken  # an instance attribute: only this model's block breaks
        try:
            with pytest.raises(ValueError, match="raised inside the forward"):
                probes.run_with_cache(model, torch.tensor([[1, 2, 3]]))
        finally:
            del model.blocks[1].mlp.forward
        with pytest.raises(ValueError, match="context"):  # positions past the context are refused as well
            probes.run_with_cache(model, torch.tensor([[1, 2, 3]]), start_pos=model.config.max_seq_len - 1)
    finally:
        HookPoint.register_forward_hook = orig
    assert len(registered) == len(probes.hook_names(model))  # the hooks were in place when it raised
    assert _no_hooks(model)
    assert _acquire_and_release_elsewhere(model)
    _, cache = probes.run_with_cache(model, torch.tensor([[1, 2, 3]]))  # and the model still works
    assert cache["hook_logits"].shape == (1, 3, 50)


def test_a_plain_forward_on_another_thread_is_never_captured_and_a_second_capture_waits():
    model = _small_decoder()
    mine, theirs = _tokens(10, seed=1), _tokens(4, seed=2)
    _, reference = probes.run_with_cache(model, mine)
    _, their_reference = probes.run_with_cache(model, theirs)
    other_capture, states = {}, {}

    def in_the_middle(module, inputs, output):
        if states:  # only on our own call, not on the forwards it starts
            return
        states["started"] = True
        # another user's plain forward on the shared model, while our hooks are registered
        plain = threading.Thread(target=lambda: model(theirs))
        plain.start()
        plain.join()
        # another user's capture must wait for ours
        waiting = threading.Thread(target=lambda: other_capture.update(probes.run_with_cache(model, theirs)[1]))
        waiting.start()
        waiting.join(timeout=0.5)
        states["blocked"] = waiting.is_alive()
        states["thread"] = waiting

    handle = model.lm_head.register_forward_hook(in_the_middle)  # runs after every block's hook points
    try:
        _, cache = probes.run_with_cache(model, mine)
    finally:
        handle.remove()
    states["thread"].join(timeout=10)
    assert states["blocked"]
    assert set(cache) == set(reference)
    for name in reference:
        assert torch.equal(cache[name], reference[name]), name
    assert set(other_capture) == set(their_reference)
    for name in their_reference:
        assert torch.equal(other_capture[name], their_reference[name]), name
    assert _no_hooks(model)


def test_concurrent_captures_on_one_model_do_not_mix():
    model = _small_decoder()
    inputs = {n: _tokens(T, seed=n) for n, T in enumerate((11, 6, 8))}
    refs = {n: probes.run_with_cache(model, t, lambda s: "pattern" in s or "resid" in s)[1] for n, t in inputs.items()}
    errors = []
    barrier = threading.Barrier(len(inputs) + 1)

    def capture(n):
        barrier.wait()
        for _ in range(8):
            _, c = probes.run_with_cache(model, inputs[n], lambda s: "pattern" in s or "resid" in s)
            if set(c) != set(refs[n]) or any(not torch.equal(c[k], refs[n][k]) for k in c):
                errors.append(n)

    def plain():
        barrier.wait()
        for _ in range(20):
            model(_tokens(3, seed=9))

    threads = [threading.Thread(target=capture, args=(n,)) for n in inputs] + [threading.Thread(target=plain)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _no_hooks(model)
