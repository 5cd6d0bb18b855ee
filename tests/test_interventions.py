"""Interventions (explorer.interventions) against direct computations on tiny random grouped-query models.

The references never use the edit machinery under test: a knock-out is checked by zeroing ``o_proj``'s input
columns in a copy of the model; patching by running the blocks by hand, or with PyTorch's own pre-hook on
``o_proj``; the loss by ``F.cross_entropy``.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from explorer import interventions as iv
from lens.hooks import run_with_hooks
from models import Decoder, ModelConfig
from models.hooks import has_hooks


def tiny(seed: int = 0, n_layers: int = 3, n_heads: int = 4, n_kv_heads: int = 2) -> Decoder:
    torch.manual_seed(seed)
    model = Decoder(ModelConfig(vocab_size=61, d_model=32, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                                d_ff=48, max_seq_len=64)).eval()
    with torch.no_grad():  # larger than the 0.02 init so heads matter and patterns are not uniform
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    return model


def tokens(seed: int, T: int = 12, V: int = 61) -> torch.Tensor:
    return torch.randint(0, V, (1, T), generator=torch.Generator().manual_seed(seed))


def without_head_columns(model: Decoder, heads, *, mean_z=None) -> Decoder:
    """A copy in which head h of layer l reaches o_proj as zeros (its D input columns zeroed), or, given mean_z
    {(l, h): (D,)}, as the constant mean_z (folded into a bias)."""
    out = copy.deepcopy(model)
    D = model.config.head_dim
    with torch.no_grad():
        for layer, h in heads:
            o = out.blocks[layer].attn.o_proj
            cols = slice(h * D, (h + 1) * D)
            if mean_z is not None:
                bias = o.weight[:, cols] @ mean_z[(layer, h)]
                new = nn.Linear(o.in_features, o.out_features, bias=True)
                new.weight.copy_(o.weight)
                new.bias.copy_(bias if o.bias is None else o.bias + bias)
                out.blocks[layer].attn.o_proj = o = new
            o.weight[:, cols] = 0.0
    return out


@pytest.mark.parametrize("heads", [[(0, 1)], [(1, 3), (2, 0)], [(0, 0), (0, 2)]])
def test_zero_ablation_equals_zeroed_o_proj_columns(heads):
    model, x = tiny(), tokens(1)
    got = iv.ablate_heads(model, x, heads, how="zero")
    with torch.no_grad():
        want = without_head_columns(model, heads)(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, model(x).detach(), atol=1e-3)  # the knock-out did change something


def test_mean_ablation_equals_a_constant_head_output():
    model, x = tiny(2), tokens(3)
    layer, h = 1, 2
    D = model.config.head_dim
    seen = {}
    handle = model.blocks[layer].attn.o_proj.register_forward_pre_hook(
        lambda m, args: seen.setdefault("z", args[0].detach().clone()))  # (1, T, H * D)
    with torch.no_grad():
        model(x)
    handle.remove()
    mean = seen["z"][0, :, h * D:(h + 1) * D].mean(0)  # (D,) the head's mean output over the prompt
    got = iv.ablate_heads(model, x, [(layer, h)], how="mean")
    with torch.no_grad():
        want = without_head_columns(model, [(layer, h)], mean_z={(layer, h): mean})(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_knockout_sweep_equals_one_ablation_at_a_time():
    model, x = tiny(4), tokens(5)
    sweep = iv.knockout_sweep(model, x)
    want_base = F.cross_entropy(model(x)[0, :-1].detach(), x[0, 1:], reduction="none")
    torch.testing.assert_close(sweep["base"], want_base, rtol=1e-5, atol=1e-5)
    for layer, h in [(0, 0), (1, 3), (2, 1)]:
        with torch.no_grad():
            logits = without_head_columns(model, [(layer, h)])(x)
        want = F.cross_entropy(logits[0, :-1], x[0, 1:], reduction="none")
        torch.testing.assert_close(sweep["knocked"][layer, h], want, rtol=1e-4, atol=1e-4)


def test_per_token_loss_is_cross_entropy():
    model, x = tiny(6), tokens(7)
    want = F.cross_entropy(model(x)[0, :-1].detach().double(), x[0, 1:], reduction="none").float()
    torch.testing.assert_close(iv.per_token_loss(model, x), want, rtol=1e-5, atol=1e-5)
    assert iv.per_token_loss(model, x[0].tolist()).shape == (x.shape[1] - 1,)


def blocks_by_hand(model: Decoder, x: torch.Tensor, layer: int, pos: int, replacement: torch.Tensor) -> torch.Tensor:
    """The decoder's forward written out, with the residual entering ``layer`` at ``pos`` replaced: logits (1, T, V)."""
    T = x.shape[1]
    rope = (model.rope_cos[:T], model.rope_sin[:T])
    h = model.embed_tokens(x)
    for i, block in enumerate(model.blocks):
        if i == layer:
            h = h.clone()
            h[:, pos] = replacement
        h = block(h, rope=rope, layer=i)
    return model.lm_head(model.norm(h))


def resid_pre_by_hand(model: Decoder, x: torch.Tensor) -> list[torch.Tensor]:
    """The residual stream entering each block, (T, C) each, from the forward written out."""
    T = x.shape[1]
    rope = (model.rope_cos[:T], model.rope_sin[:T])
    h, out = model.embed_tokens(x), []
    for i, block in enumerate(model.blocks):
        out.append(h[0].detach().clone())
        h = block(h, rope=rope, layer=i)
    return out


def test_resid_pre_patching_equals_blocks_run_by_hand():
    model = tiny(8)
    clean, corrupt = tokens(9), tokens(9)
    corrupt[0, 4] = (clean[0, 4] + 1) % 61
    corrupt[0, 7] = (clean[0, 7] + 5) % 61
    answer = (3, 11)
    got = iv.patched_metrics(model, corrupt, clean, "resid_pre", answer)
    assert got.shape == (3, 12)
    src = resid_pre_by_hand(model, clean)
    with torch.no_grad():
        for layer, pos in [(0, 4), (1, 7), (2, 11), (1, 2), (0, 0)]:
            logits = blocks_by_hand(model, corrupt, layer, pos, src[layer][pos])
            want = logits[0, -1, 3] - logits[0, -1, 11]
            torch.testing.assert_close(got[layer, pos], want, rtol=1e-4, atol=1e-4)


def test_head_patching_equals_an_o_proj_pre_hook():
    model = tiny(10)
    clean, corrupt = tokens(11), tokens(12)
    answer = (5, 8)
    D = model.config.head_dim
    got = iv.patched_metrics(model, corrupt, clean, "head", answer)
    assert got.shape == (3, 4)
    for layer, h in [(0, 1), (2, 3), (1, 0)]:
        seen = {}
        o = model.blocks[layer].attn.o_proj
        handle = o.register_forward_pre_hook(lambda m, args: seen.setdefault("z", args[0].detach().clone()))
        with torch.no_grad():
            model(clean)
        handle.remove()
        cols = slice(h * D, (h + 1) * D)

        def put_clean(m, args):
            z = args[0].clone()
            z[:, :, cols] = seen["z"][:, :, cols]
            return (z,)
        handle = o.register_forward_pre_hook(put_clean)
        with torch.no_grad():
            logits = model(corrupt)
        handle.remove()
        torch.testing.assert_close(got[layer, h], logits[0, -1, 5] - logits[0, -1, 8], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("site", ["resid_pre", "head"])
def test_patching_with_a_runs_own_activations_recovers_exactly_it(site):
    model = tiny(13)
    clean, corrupt = tokens(14), tokens(15)
    answer = (1, 2)
    with torch.no_grad():
        m_clean = float(iv.logit_diff(model(clean), answer)[0])
        m_corrupt = float(iv.logit_diff(model(corrupt), answer)[0])
    own_clean = iv.patched_metrics(model, clean, clean, site, answer)
    own_corrupt = iv.patched_metrics(model, corrupt, corrupt, site, answer)
    frac_clean = (own_clean - m_corrupt) / (m_clean - m_corrupt)
    frac_corrupt = (own_corrupt - m_corrupt) / (m_clean - m_corrupt)
    torch.testing.assert_close(frac_clean, torch.ones_like(frac_clean), rtol=0, atol=1e-4)
    torch.testing.assert_close(frac_corrupt, torch.zeros_like(frac_corrupt), rtol=0, atol=1e-4)


def test_prompts_that_differ_in_the_last_token_are_recovered_there_alone():
    model = tiny(13)
    clean = tokens(14)
    corrupt = clean.clone()
    corrupt[0, -1] = (clean[0, -1] + 7) % 61
    fracs = iv.patch(model, clean, corrupt, "resid_pre", (1, 2))
    torch.testing.assert_close(fracs[:, -1], torch.ones(3), rtol=0, atol=1e-4)  # the one position that differs
    assert torch.equal(fracs[:, :-1], torch.zeros(3, 11))  # a shared prefix: swapping it changes nothing


def test_the_tabs_patching_experiment_is_patch_at_both_sites_and_the_two_ends():
    model, clean, corrupt, answer = tiny(13), tokens(14), tokens(15), (1, 2)
    r = iv.patching_experiment(model, clean, corrupt, answer)
    for site in ("resid_pre", "head"):
        assert torch.equal(r[site], iv.patch(model, clean, corrupt, site, answer))
    with torch.no_grad():
        ends = iv.logit_diff(torch.cat([model(clean), model(corrupt)]), answer)
    assert (r["clean"], r["corrupt"]) == pytest.approx((float(ends[0]), float(ends[1])), rel=1e-5, abs=1e-5)


def test_no_hook_means_the_same_tensor_and_edits_leave_nothing_behind():
    model, x = tiny(16), tokens(17)
    point = model.blocks[0].attn.hook_z
    t = torch.randn(2, 3)
    assert point(t) is t
    with torch.no_grad():
        before = model(x)
    iv.ablate_heads(model, x, [(1, 1)])
    assert not has_hooks(model)
    with torch.no_grad():
        after = model(x)
    assert torch.equal(before, after)


def test_an_edit_on_the_pattern_weighs_the_values():
    model, x = tiny(18), tokens(19)
    T = x.shape[1]
    uniform = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]  # each query averages what it sees

    def flat(p, point):
        return uniform.expand_as(p).clone()
    got = run_with_hooks(model, x, [("blocks.0.attn.hook_pattern", flat)])
    attn = model.blocks[0].attn
    # reference: replace layer 0's attention by the uniform causal average of its values, by hand
    H, Hkv, D = attn.n_heads, attn.n_kv_heads, attn.head_dim

    def averaged(module, args, output):
        (h,) = args
        v = module.v_proj(h).view(1, T, Hkv, D).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)  # (1, H, T, D)
        z = (uniform @ v).transpose(1, 2).reshape(1, T, H * D)
        return module.o_proj(z)
    handle = attn.register_forward_hook(averaged)
    with torch.no_grad():
        want = model(x)
    handle.remove()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_edits_apply_only_on_the_thread_that_made_them():
    import threading

    model, x = tiny(20), tokens(21)
    with torch.no_grad():
        plain = model(x)
    results = {}
    started, release = threading.Event(), threading.Event()

    def slow_zero(z, point):
        started.set()
        release.wait(5)
        return torch.zeros_like(z)

    def ablate():
        results["edited"] = run_with_hooks(model, x, [("blocks.0.attn.hook_z", slow_zero)])
    t = threading.Thread(target=ablate)
    t.start()
    assert started.wait(5)
    with torch.no_grad():
        results["other"] = model(x)  # another user's forward while the edit is registered
    release.set()
    t.join(5)
    assert torch.equal(results["other"], plain)
    assert not torch.allclose(results["edited"], plain)


@pytest.mark.parametrize("heads, message", [
    ([(3, 0)], "layer must be between 0 and 2"),
    ([(0, 4)], "head must be between 0 and 3"),
    ([], "at least one head"),
    ([(0,)], "(layer, head) pair"),
])
def test_bad_heads_say_what_to_change(heads, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        iv.ablate_heads(tiny(), tokens(0), heads)


def test_bad_patching_input_says_what_to_change():
    model = tiny()
    with pytest.raises(ValueError, match="12 tokens and the corrupted one 10"):
        iv.patch(model, tokens(0), tokens(1, T=10), "head", (1, 2))
    with pytest.raises(ValueError, match="site must be one of"):
        iv.patch(model, tokens(0), tokens(1), "mlp", (1, 2))
    with pytest.raises(ValueError, match="token id between 0 and 60"):
        iv.patch(model, tokens(0), tokens(1), "head", (1, 99))
    with pytest.raises(ValueError, match="same logit difference"):
        iv.patch(model, tokens(0), tokens(0), "head", (1, 2))
    with pytest.raises(ValueError, match="how must be one of"):
        iv.ablate_heads(model, tokens(0), [(0, 0)], how="noise")


def test_induction_circuit_reports_four_losses_and_checks_the_order():
    model = tiny(22)
    span = 6
    r = torch.randint(1, 61, (2, span), generator=torch.Generator().manual_seed(3))
    x = torch.cat([torch.zeros(2, 1, dtype=torch.long), r, r], dim=1)
    out = iv.induction_circuit(model, x, (0, 1), (1, 2), span)
    assert set(out) == {"neither", "previous", "induction", "both"}
    T = x.shape[1]
    with torch.no_grad():
        want = F.cross_entropy(model(x)[:, :-1].transpose(1, 2), x[:, 1:], reduction="none")[:, T - span - 1:]
    torch.testing.assert_close(out["neither"], want.mean(-1), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="earlier layer"):
        iv.induction_circuit(model, x, (1, 0), (1, 2), span)


def test_patching_a_sliding_window_sandwich_model_equals_a_plain_edit():
    """Gemma 3's switches (QK-norm, (1 + w) norms, sandwich norms, GELU gate, local layers with a window shorter
    than the prompt): the trimmed resid_pre patching equals an edit at hook_resid_pre over the whole forward."""
    torch.manual_seed(30)
    cfg = ModelConfig(vocab_size=61, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=48, max_seq_len=64,
                      qk_norm=True, norm_offset=1.0, embed_scale=32 ** 0.5, hidden_act="gelu_pytorch_tanh",
                      sandwich_norm=True, sliding_window=4, layer_types=("sliding_attention", "full_attention",
                                                                         "sliding_attention"),
                      local_rope_theta=10000.0, rope_theta=1e6, family="gemma3_text")
    model = Decoder(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    clean, corrupt = tokens(31), tokens(32)
    answer = (4, 9)
    got = iv.patched_metrics(model, corrupt, clean, "resid_pre", answer)
    with torch.no_grad():
        src = {}
        handles = [model.blocks[i].hook_resid_pre.register_forward_hook(
            lambda m, a, o, i=i: src.setdefault(i, o.detach().clone())) for i in range(3)]
        model(clean)
        for h in handles:
            h.remove()
    for layer, pos in [(0, 1), (1, 5), (2, 9), (0, 11)]:
        def put(x, point, pos=pos, layer=layer):
            x = x.clone()
            x[:, pos] = src[layer][:, pos]
            return x
        logits = run_with_hooks(model, corrupt, [(f"blocks.{layer}.hook_resid_pre", put)])
        torch.testing.assert_close(got[layer, pos], iv.logit_diff(logits, answer)[0], rtol=1e-4, atol=1e-4)
    heads = iv.patched_metrics(model, corrupt, clean, "head", answer)
    assert heads.shape == (3, 4) and torch.isfinite(heads).all()
