import numpy as np
import pytest
import torch

from explorer.figures.common import unwrapped
from models.attention import Attention, attention, build_mask, tiled_attention
from tests.reference import numpy_attention

IMPLS = ("naive", "sdpa", "tiled")


def _qkv(B, H, Hkv, T, S, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, T, D, generator=g), torch.randn(B, Hkv, S, D, generator=g),
            torch.randn(B, Hkv, S, D, generator=g))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("H,Hkv", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("T,S", [(13, 13), (1, 9), (5, 19)])
def test_implementations_match_numpy(impl, causal, H, Hkv, T, S):
    q, k, v = _qkv(2, H, Hkv, T, S, 8)
    out, _ = attention(q, k, v, impl=impl, causal=causal, tile_size=4)
    for b in range(2):
        for h in range(H):
            ref, _ = numpy_attention(q[b, h], k[b, h // (H // Hkv)], v[b, h // (H // Hkv)], causal=causal)
            np.testing.assert_allclose(out[b, h].numpy(), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [True, False])
def test_padding_mask_matches_numpy(impl, causal):
    q, k, v = _qkv(2, 4, 2, 11, 11, 8, seed=1)
    pad = torch.ones(2, 11, dtype=torch.bool)
    pad[0, 7:] = False  # right padding on the first sequence
    pad[1, 3] = False  # a hole in the second
    out, _ = attention(q, k, v, impl=impl, causal=causal, key_padding=pad, tile_size=3)
    for b in range(2):
        for h in range(4):
            ref, w = numpy_attention(q[b, h], k[b, h // 2], v[b, h // 2], causal=causal, key_padding=pad[b].numpy())
            np.testing.assert_allclose(out[b, h].numpy(), ref, atol=1e-5, rtol=0)
            assert np.all(w[:, ~pad[b].numpy()] == 0)


def test_naive_weights_match_numpy_and_rows_sum_to_one():
    q, k, v = _qkv(1, 2, 1, 9, 9, 16, seed=2)
    _, weights = attention(q, k, v, impl="naive", causal=True)
    for h in range(2):
        _, ref = numpy_attention(q[0, h], k[0, 0], v[0, 0], causal=True)
        np.testing.assert_allclose(weights[0, h].numpy(), ref, atol=1e-6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 2, 9))
    assert torch.all(weights[0, :].triu(1) == 0)


def test_causal_and_bidirectional_masks_differ_exactly_above_the_diagonal():
    causal = build_mask(6, 6, causal=True)[0, 0]
    assert build_mask(6, 6, causal=False) is None  # bidirectional: every key visible
    diff = ~causal
    assert torch.equal(diff, torch.ones(6, 6, dtype=torch.bool).triu(1))


def test_tiled_tile_size_does_not_change_the_result_and_reports_state():
    q, k, v = _qkv(1, 2, 2, 17, 17, 8, seed=3)
    ref, _ = attention(q, k, v, impl="naive", causal=True)
    states = []
    for bs in (1, 5, 16, 64):
        out = tiled_attention(q, k, v, causal=True, tile_size=bs, on_block=states.append if bs == 5 else None)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    assert [s["block"] for s in states] == [0, 1, 2, 3]
    assert states[-1]["stop"] == 17
    torch.testing.assert_close(states[-1]["out"], ref, atol=1e-5, rtol=0)
    final_l = states[-1]["l"]
    assert torch.all(final_l >= 1.0 - 1e-6)  # the row max contributes exp(0) = 1
    # After each block, m is the row max of the scores seen so far and l the sum of exp(score - m) over them.
    # l can shrink from one block to the next: when a block raises the max, the old sum is rescaled by
    # exp(m - m') < 1 before the block's terms are added. Checked against float64 NumPy scores.
    qn, kn = q[0].double().numpy(), k[0].double().numpy()  # (H, T, D), (H, S, D)
    scores = qn @ kn.transpose(0, 2, 1) / np.sqrt(8)  # (H, T, S)
    visible = np.arange(17)[None, :] <= np.arange(17)[:, None]  # (T, S) causal
    for st in states:
        seen = np.where(visible[:, :st["stop"]], scores[:, :, :st["stop"]], -np.inf)  # (H, T, stop)
        m_ref = seen.max(-1)  # (H, T)
        np.testing.assert_allclose(st["m"][0].numpy(), m_ref, atol=1e-5)
        np.testing.assert_allclose(st["l"][0].numpy(), np.exp(seen - m_ref[..., None]).sum(-1), rtol=1e-5)


def test_attention_module_cross_attention_shapes_and_reference():
    torch.manual_seed(0)
    attn = Attention(32, 4, 2, causal=True, use_rope=True, impl="naive")
    x, ctx = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    out = attn(x, context=ctx)
    assert out.shape == (2, 5, 32)
    for impl in ("sdpa", "tiled"):
        torch.testing.assert_close(attn(x, context=ctx, impl=impl), out, atol=1e-5, rtol=0)
    # by hand: cross-attention is never causal and uses no positions
    q = attn.q_proj(x).view(2, 5, 4, 8).transpose(1, 2)
    k = attn.k_proj(ctx).view(2, 7, 2, 8).transpose(1, 2)
    v = attn.v_proj(ctx).view(2, 7, 2, 8).transpose(1, 2)
    z = np.stack([np.stack([numpy_attention(q[b, h].detach(), k[b, h // 2].detach(), v[b, h // 2].detach(),
                                            causal=False)[0] for h in range(4)]) for b in range(2)])
    ref = torch.from_numpy(z).float().transpose(1, 2).reshape(2, 5, 32) @ attn.o_proj.weight.T
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kwargs,message", [
    (dict(d_model=30, n_heads=4), "divisible by n_heads"),
    (dict(d_model=32, n_heads=4, n_kv_heads=3), "divisible by n_kv_heads"),
    (dict(d_model=32, n_heads=4, impl="fast"), "must be one of"),
])
def test_attention_module_rejects_bad_sizes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Attention(**kwargs)


def test_dispatcher_rejects_unknown_impl_and_bad_head_ratio():
    q, k, v = _qkv(1, 4, 3, 2, 2, 4)
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        attention(q, k, v, impl="naive")
    q, k, v = _qkv(1, 4, 2, 2, 2, 4)
    with pytest.raises(ValueError, match="must be one of"):
        attention(q, k, v, impl="flash3")
    with pytest.raises(ValueError, match="tile_size"):
        tiled_attention(q, k, v, causal=True, tile_size=0)


# --- The Attention tab: one forward reused, labels, the sink option, induction at a chosen span --------------

def _own_model_state():
    """A private copy of the shipped default model with its tokenizer, as a user's own model is held."""
    import copy

    from explorer.state import session

    model, tokenizer = session.load_default()
    own = copy.deepcopy(model)
    return own, {"source": "test", "name": "test copy", "model": own, "tokenizer": tokenizer}


def _count_forwards(model):
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    return calls


CAUSAL_VIEW = "causal (as trained)"
TAB_PROMPT = "Tom gave the red ball to Anna. Anna gave the red ball to Tom."


@pytest.mark.slow
def test_attention_tab_reuses_its_forward_for_layer_head_jump_and_display_switches():
    import torch

    from explorer.panels.attention import attention_view, jump_to_head

    model, state = _own_model_state()
    calls = _count_forwards(model)
    first = attention_view(TAB_PROMPT, 0, 0, CAUSAL_VIEW, state)
    assert len(calls) > 0
    n = len(calls)
    attention_view(TAB_PROMPT, 1, 1, CAUSAL_VIEW, state)  # layer and head switch
    layer, head = jump_to_head(first.pick.constructor_args["choices"][0][1])
    attention_view(TAB_PROMPT, layer, head, CAUSAL_VIEW, state)  # jump to a head
    attention_view(TAB_PROMPT, 2, 3, CAUSAL_VIEW, state, "32", True)  # sink hidden
    assert len(calls) == n, "a layer, head, jump or display switch ran the model again"
    with torch.no_grad():  # an in-place weight change (as LoRA training makes) must not meet a stale result
        model.blocks[0].attn.q_proj.weight.mul_(1.5)
    attention_view(TAB_PROMPT, 0, 0, CAUSAL_VIEW, state)
    assert len(calls) > n


def test_attention_tab_labels_every_token_of_a_64_token_prompt_uniquely():
    from explorer.panels.attention import attention_view

    _, state = _own_model_state()
    prompt = " ".join(["the red ball"] * 30)  # repeated words: equal labels would merge rows
    out = attention_view(prompt, 0, 0, CAUSAL_VIEW, state)
    assert len(out.tokens) == 64
    fig = out.heatmap
    y = list(fig.data[0].y)
    assert len(y) == 64 and len(set(y)) == 64
    assert list(fig.data[0].x) == y
    for axis in (fig.layout.xaxis, fig.layout.yaxis):  # every k-th token labelled (hover names each), as its own text
        ticks = list(axis.tickvals)
        assert ticks == list(axis.ticktext) and 1 < len(ticks) <= 64 and ticks == y[::y.index(ticks[1])]
    for (i, token, _), label in zip(out.tokens, y):
        assert label.startswith(f"{i}·")


def test_attention_tab_sink_option_equals_numpy_renormalisation():
    from explorer import probes
    from explorer.panels.attention import attention_view

    model, state = _own_model_state()
    out = attention_view(TAB_PROMPT, 1, 2, CAUSAL_VIEW, state, "32", True)
    ids = state["tokenizer"](TAB_PROMPT)["input_ids"]
    w = probes.attention_pattern(model, ids, 1, 2).astype(np.float64)  # (T, T)
    with np.errstate(invalid="ignore", divide="ignore"):
        expected = w[:, 1:] / w[:, 1:].sum(axis=1, keepdims=True)
    expected[0] = np.nan  # query 0 sees only key 0
    z = np.asarray(out.heatmap.data[0].z, dtype=float)
    np.testing.assert_allclose(z, expected, atol=1e-6)
    assert "sink hidden" in unwrapped(out.heatmap.layout.title.text)
    assert "not on key 0" in out.heatmap.data[0].colorbar.title.text


def _induction_trace(fig):
    heatmaps = [t for t in fig.data if t.type == "heatmap"]
    return np.asarray(heatmaps[1].z, dtype=float)  # SCORES_SHOWN order: previous-token, induction, sink


@pytest.mark.parametrize("span", ["8", "64"])
def test_attention_tab_induction_at_the_chosen_span_equals_numpy(span):
    from lens.heads import repeated_random_tokens
    from explorer.panels.attention import attention_view
    from explorer.probes import run_with_cache

    model, state = _own_model_state()
    out = attention_view(TAB_PROMPT, 0, 0, CAUSAL_VIEW, state, span, False)
    n = int(span)
    probe = repeated_random_tokens(model.config.vocab_size, n, 4, 0, bos_id=model.config.bos_token_id)
    _, cache = run_with_cache(model, probe, lambda name: name.endswith("attn.hook_pattern"))
    L, H = model.config.n_layers, model.config.n_heads
    expected = np.zeros((L, H))
    T = probe.shape[1]
    for layer in range(L):
        p = cache[f"blocks.{layer}.attn.hook_pattern"].double().numpy()  # (B, H, T, T)
        for j in range(T - n, T):
            expected[layer] += p[:, :, j, j - n + 1].mean(axis=0) / n
    np.testing.assert_allclose(_induction_trace(out.scores), expected, atol=1e-5)
    assert f"span {n}" in unwrapped(out.scores.layout.title.text)


def test_attention_tab_induction_on_the_prompts_own_repeat():
    from explorer.panels.attention import PROMPT_SPAN, attention_view
    from explorer.probes import run_with_cache

    model, state = _own_model_state()
    prompt = "the cat saw a big dog . the cat saw a big dog ."
    ids = state["tokenizer"](prompt)["input_ids"]
    n = next(k for k in range(len(ids) // 2, 0, -1) if ids[-2 * k:-k] == ids[-k:])  # the repeated stretch
    out = attention_view(prompt, 0, 0, CAUSAL_VIEW, state, PROMPT_SPAN, False)
    _, cache = run_with_cache(model, ids, lambda name: name.endswith("attn.hook_pattern"))
    T = len(ids)
    expected = np.stack([cache[f"blocks.{layer}.attn.hook_pattern"][0].double().numpy()[:, range(T - n, T),
                                                                                           [j - n + 1 for j in range(T - n, T)]]
                         .mean(axis=-1) for layer in range(model.config.n_layers)])
    np.testing.assert_allclose(_induction_trace(out.scores), expected, atol=1e-5)
    with pytest.raises(ValueError, match="does not end with a repeated"):
        attention_view("Tom gave the red ball.", 0, 0, CAUSAL_VIEW, state, PROMPT_SPAN, False)


def test_attention_tab_prediction_and_head_sentence_come_from_the_weights():
    import torch

    from explorer import probes
    from explorer.panels.attention import attention_view

    model, state = _own_model_state()
    out = attention_view(TAB_PROMPT, 0, 1, CAUSAL_VIEW, state)
    ids = state["tokenizer"](TAB_PROMPT)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0, -1].double()
    probs = np.exp(logits.numpy() - logits.numpy().max())
    probs /= probs.sum()
    top = np.argsort(probs)[::-1][:5]
    assert [row[2] for row in out.prediction] == [int(i) for i in top]
    np.testing.assert_allclose([row[3] for row in out.prediction], probs[top], atol=1e-4)
    w = probes.attention_pattern(model, ids, 0, 1).astype(np.float64)
    T = len(ids)
    share = [sum(w[t, t - d] for t in range(1, T) if t - d >= 1) / (T - 1) for d in range(T)]
    d = int(np.argmax(share[1:]) + 1)
    where = "the previous token" if d == 1 else f"the token {d} back"
    assert f"**{share[d]:.2f}** of its weight on {where}" in out.head_md


def test_attention_tab_first_answer_runs_no_comparison_and_the_follow_up_reuses_its_forward():
    import torch

    from explorer.state.cache import results
    from explorer.panels.attention import attention_impls, attention_view

    model, state = _own_model_state()
    results.clear()
    calls = _count_forwards(model)
    attention_view(TAB_PROMPT, 0, 0, CAUSAL_VIEW, state)
    assert len(calls) == 2, "the first answer runs the prompt's forward and the induction probe, nothing more"
    text = attention_impls(TAB_PROMPT, CAUSAL_VIEW, state)
    assert len(calls) == 4, "the comparison runs the two implementations the answer's forward did not"
    assert attention_impls(TAB_PROMPT, CAUSAL_VIEW, state) == text and len(calls) == 4  # then from the cache
    ids = state["tokenizer"](TAB_PROMPT)["input_ids"]
    with torch.no_grad():
        outs = {impl: model(torch.tensor([ids]), attn_impl=impl).double() for impl in ("naive", "sdpa", "tiled")}
    for impl, label in (("sdpa", "SDPA − naive"), ("tiled", "tiled (flash) − naive")):
        expected = float((outs[impl] - outs["naive"]).abs().max())
        shown = float(text.split(f"{label} = **")[1].split("**")[0])
        assert shown == pytest.approx(expected, rel=0.05, abs=2e-6)
    with pytest.raises(ValueError, match="view must be one of"):
        attention_impls(TAB_PROMPT, "sideways", state)


def test_attention_grid_page_of_a_smollm2_shaped_model_goes_out_at_one_byte_a_weight():
    import json

    from explorer.figures import attention as fa

    rng = np.random.default_rng(0)
    T = 64
    labels = [f"{i}·t" for i in range(T)]
    w = rng.random((6, 9, T, T)) * np.tril(np.ones((T, T)))
    w /= w.sum(-1, keepdims=True)  # the last page of a 30-layer, 9-head model: rows of weights summing to 1
    fig = fa.attention_grid(w, labels, n_kv_heads=3, layers=range(6), layer_names=range(24, 30), n_layers=30)
    z = np.asarray(fig.data[0].z)
    assert z.dtype == np.uint8
    np.testing.assert_allclose((z[:T, :T].astype(float) - 1) / 254, w[0, 0], atol=0.5 / 254 + 1e-12)
    assert z[T, 0] == 0  # the blank line between maps
    bar = fig.data[0].colorbar
    assert [float(t) for t in bar.ticktext] == [0, 0.25, 0.5, 0.75, 1.0]
    np.testing.assert_allclose((np.asarray(bar.tickvals) - 1) / 254, [0, 0.25, 0.5, 0.75, 1.0])
    assert len(fig.to_json()) < 600_000  # float32 weights with int8 indices were 2.4 MB
    json.loads(fig.to_json())
