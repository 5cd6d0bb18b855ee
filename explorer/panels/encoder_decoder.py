"""Encoder vs decoder tab: one sentence through the trained decoder and an untrained encoder of the same
width and vocabulary; masks and attention maps side by side; RMSNorm vs LayerNorm and SwiGLU vs GELU on
the same vectors."""
from __future__ import annotations

import gradio as gr
import numpy as np
import torch
import torch.nn.functional as F

from explorer.device import gpu
from explorer import probes, session
from explorer.figures import encoder_decoder as figs
from explorer.figures.common import head_label
from models.attention import build_mask
from models.layers import LayerNorm, RMSNorm

from . import as_index, head_choices, layer_choices, user_errors

MAX_TOKENS = 48
DEFAULT_PROMPT = "The little dog found a red ball in the garden."

INTRO = """### Encoder vs decoder: the same sentence, two kinds of transformer
The **decoder** (left) is the trained model: each token sees only the tokens before it (causal mask), positions
enter by rotating q and k (RoPE), it normalises with RMSNorm and its feed-forward is SwiGLU. The **encoder**
(right) lets every token see every other token, adds a sinusoidal position table, and uses LayerNorm and GELU.

⚠️ **The encoder's weights are random (seed 0) and untrained.** It shares the decoder's tokenizer and width, so
its masks, shapes and position code are real, but its attention patterns carry no learned meaning."""


def _token_index(value, T: int) -> int:
    try:
        i = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"token position must be a whole number from -{T} to {T - 1}, got {value!r}.") from None
    if not -T <= i < T:
        raise ValueError(f"token position must be from -{T} to {T - 1} for this prompt ({T} tokens), got {i}.")
    return i % T


def _encoder_decoder_view(prompt, layer, head, token_pos, state):
    decoder, tokenizer, name = session.get_model(state)
    encoder = session.encoder_for(decoder)
    c, ec = decoder.config, encoder.config
    layer = as_index(layer, c.n_layers, "layer")
    head = as_index(head, c.n_heads, "head")
    enc_layer = min(layer, ec.n_layers - 1)
    ids, labels, notice = session.encode_with_notice(tokenizer, prompt, min(MAX_TOKENS, c.max_seq_len,
                                                                           ec.max_seq_len))
    T = len(ids)
    t = _token_index(token_pos, T)

    dec_mask = build_mask(T, T, causal=True)[0, 0].float().numpy()
    enc_mask = np.ones((T, T))  # build_mask(..., causal=False) is None: every key visible
    masks = figs.side_by_side_maps(
        dec_mask, enc_mask, labels, left_title="decoder · causal mask", right_title="encoder · no mask",
        title="Which keys each query may see (1 = visible, 0 = hidden)",
        colorbar_title="visible (1) / hidden (0)", value_name="visible")

    hooks = [f"blocks.{layer}.attn.hook_pattern", f"blocks.{layer}.hook_resid_mid",
             f"blocks.{layer}.mlp.hook_gate", f"blocks.{layer}.mlp.hook_up", f"blocks.{layer}.mlp.hook_post"]
    _, dcache = probes.run_with_cache(decoder, ids, hooks)
    dec_att = dcache[hooks[0]][0, head].float().numpy()
    enc_att = probes.attention_pattern(encoder, ids, enc_layer, head)
    hl = head_label(head, c.n_heads, c.n_kv_heads)
    attn = figs.side_by_side_maps(
        dec_att, enc_att, labels,
        left_title=f"decoder (trained) · layer {layer} · {hl}",
        right_title=f"encoder (random weights) · layer {enc_layer} · head {head}",
        title="Attention weights, same sentence, same colour range (0–1)")

    # The same vector into both norms: the decoder's residual stream entering layer `layer`'s MLP norm,
    # at token t. Both norms with gain 1 and bias 0, so only the normalisation itself differs.
    x = dcache[hooks[1]][0, t].float()  # (C,)
    with torch.inference_mode():
        rms = RMSNorm(c.d_model, c.norm_eps)(x[None])[0]
        ln = LayerNorm(c.d_model, c.norm_eps)(x[None])[0]
        u = dcache[hooks[2]][0, t].float()  # (F,) SwiGLU's gate pre-activation
        grid = torch.linspace(-6, 6, 241)
        silu_grid, gelu_grid = F.silu(grid), F.gelu(grid)
        silu_u, gelu_u = F.silu(u), F.gelu(u)
    swiglu = dcache[hooks[4]][0, t].float()  # SiLU(gate) * up, as the model computed it
    norms = figs.norm_figure(x.numpy(), rms.numpy(), ln.numpy(), token=labels[t], eps=c.norm_eps)
    acts = figs.activation_figure(grid.numpy(), silu_grid.numpy(), gelu_grid.numpy(), u.numpy(), silu_u.numpy(),
                                  gelu_u.numpy(), swiglu.numpy(), token=labels[t])
    rows = [
        ("attention", "causal (sees earlier tokens)", "bidirectional (sees all tokens)"),
        ("positions", f"RoPE, θ = {c.rope_theta:,.0f}, rotates q and k", "sinusoidal table added to embeddings"),
        ("norm", "RMSNorm: x / rms(x) · g", "LayerNorm: (x − mean) / std · g + b"),
        ("feed-forward", f"SwiGLU {c.d_model} → {c.d_ff} → {c.d_model}",
         f"GELU MLP {ec.d_model} → {ec.d_ff} → {ec.d_model}"),
        ("heads", f"{c.n_heads} query / {c.n_kv_heads} key-value", f"{ec.n_heads} / {ec.n_kv_heads}"),
        ("layers", str(c.n_layers), str(ec.n_layers)),
        ("weights", f"trained ({name})", f"random, seed {session.ENCODER_SEED}, untrained"),
    ]
    md = "| | decoder | encoder |\n|---|---|---|\n" + "\n".join(f"| {a} | {b} | {e} |" for a, b, e in rows)
    md += (f"\n\nNorm and activation plots use token **{labels[t]}**: its residual stream before layer {layer}'s "
           f"feed-forward norm (RMSNorm and LayerNorm with gain 1, bias 0), and the gate pre-activations of that "
           f"feed-forward.")
    if enc_layer != layer:
        md += f" The encoder has {ec.n_layers} layers, so its map shows layer {enc_layer}."
    if notice:
        md += f"\n\n⚠️ {notice}"
    return (masks, attn, norms, acts, md, gr.Dropdown(choices=layer_choices(c.n_layers), value=layer),
            gr.Dropdown(choices=head_choices(c.n_heads, c.n_kv_heads), value=head))

@user_errors
@gpu(30)
def encoder_decoder_view(prompt, layer, head, token_pos, state):
    model, _, _ = session.get_model(state)
    with session.threads_for(model):
        return _encoder_decoder_view(prompt, layer, head, token_pos, state)


def build_encoder_decoder(demo: gr.Blocks, state: gr.State) -> None:
    model, _, _ = session.get_model(None)
    c = model.config
    gr.Markdown(INTRO)
    with gr.Row():
        prompt = gr.Textbox(label="Sentence", value=DEFAULT_PROMPT, lines=1, scale=3)
        layer = gr.Dropdown(label="Layer", choices=layer_choices(c.n_layers), value=0, allow_custom_value=True,
                            scale=1)
        head = gr.Dropdown(label="Head", choices=head_choices(c.n_heads, c.n_kv_heads), value=0,
                           allow_custom_value=True, scale=1)
        token = gr.Number(value=-1, precision=0, label="Token for norms (−1 = last)", scale=1)
        run = gr.Button("Compare", variant="primary", scale=1)
    masks = gr.Plot(label="Masks")
    attn = gr.Plot(label="Attention maps")
    md = gr.Markdown()
    norms = gr.Plot(label="RMSNorm vs LayerNorm")
    acts = gr.Plot(label="SwiGLU vs GELU")
    inputs = [prompt, layer, head, token, state]
    outputs = [masks, attn, norms, acts, md, layer, head]
    run.click(encoder_decoder_view, inputs, outputs, api_name="encoder_decoder")
    prompt.submit(encoder_decoder_view, inputs, outputs, api_name="encoder_decoder_submit", api_visibility="private")
    for control in (layer, head, token):
        control.input(encoder_decoder_view, inputs, outputs, api_name=f"encoder_decoder_{control.label.split()[0].lower()}",
                      api_visibility="private")
    demo.load(encoder_decoder_view, inputs, outputs, api_name="encoder_decoder_example", api_visibility="undocumented")
