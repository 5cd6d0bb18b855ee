"""Encoder vs decoder tab: one sentence through the trained decoder and the trained encoder; masks and
attention maps side by side; fill in the blank (the encoder reads both sides, the decoder only the left);
RMSNorm vs LayerNorm and SwiGLU vs GELU on the same vectors. The computing is in explorer.probes.encoder_probe."""
from __future__ import annotations

import gradio as gr

from explorer.web import links
from explorer.web.groups import VIEW, lane
from explorer.probes import encoder_probe as ep
from explorer.state import session
from lens.device import gpu
from explorer.figures import encoder_decoder as figs
from explorer.figures.common import head_label

from explorer.panels.controls import as_index, head_choices, layer_choices
from explorer.panels.errors import user_errors
from explorer.state.openings import cached_opening

MAX_TOKENS = 48
DEFAULT_PROMPT = "The little dog found a red ball in the garden."
DEFAULT_BLANK_WORD = "red"
TOP_K = 10
TABLE_HEADERS = ["rank", "encoder guess", "encoder probability", "decoder guess", "decoder probability"]

INTRO = """### Encoder vs decoder: the same sentence, two kinds of transformer
The **decoder** (left) is the default model: each token sees only the tokens before it (causal mask), positions
enter by rotating q and k (RoPE), it normalises with RMSNorm and its feed-forward is SwiGLU. The **encoder**
(right) lets every token see every other token, adds a sinusoidal position table, and uses LayerNorm and GELU.
Both were trained here on the same stories with the same tokenizer: the decoder to predict the next token, the
encoder to fill in hidden words (masked-language modelling, as BERT). **Fill in the blank** hides one word: the
encoder guesses it from both sides, the decoder from the words before it only."""


def _token_index(value, T: int) -> int:
    try:
        i = int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an infinite number
        raise ValueError(f"token position must be a whole number from -{T} to {T - 1}, got {value!r}.") from None
    if not -T <= i < T:
        raise ValueError(f"token position must be from -{T} to {T - 1} for this prompt ({T} tokens), got {i}.")
    return i % T


def blank_choices(labels: list[str]) -> list[tuple[str, int]]:
    """Every token but ``<s>`` (position 0), as (label, position)."""
    return [(label, i) for i, label in enumerate(labels) if i > 0]


def default_blank(labels: list[str]) -> int:
    """The first ``red`` if the sentence has one (the tab's opening example), else the middle token."""
    for i, label in enumerate(labels):
        if i > 0 and label.split("·", 1)[-1].strip("▁ ") == DEFAULT_BLANK_WORD:
            return i
    return max(1, len(labels) // 2)


def _models(state):
    """(decoder, its tokenizer, its name, encoder, encoder tokenizer, whether they share the tokenizer)."""
    decoder, tokenizer, name = session.get_model(state)
    encoder, enc_tok = ep.shared_encoder()
    return decoder, tokenizer, name, encoder, enc_tok, ep.same_tokenizer(tokenizer, enc_tok)


def _tokenizer_note(name: str) -> str:
    return (f"⚠️ The model you loaded ({name}) uses another tokenizer than the trained encoder, which reads the "
            "default model's tokenizer. The two maps therefore show each model's own tokens, and fill in the blank "
            "shows the encoder only: its guesses cannot be lined up token by token with this decoder's. Load the "
            "default model to compare both.")


def _encoder_decoder_view(prompt, layer, head, token_pos, state):
    decoder, tokenizer, name, encoder, enc_tok, same = _models(state)
    c, ec = decoder.config, encoder.config
    layer = as_index(layer, c.n_layers, "layer")
    head = as_index(head, c.n_heads, "head")
    ids, labels, notice = session.encode_with_notice(tokenizer, prompt, min(MAX_TOKENS, c.max_seq_len))
    enc_ids, enc_labels = ids, labels
    if not same:
        enc_ids, enc_labels, _ = session.encode_with_notice(enc_tok, prompt, min(MAX_TOKENS, ec.max_seq_len))
    t = _token_index(token_pos, len(ids))

    dec_mask, enc_mask = ep.masks(len(ids))[0], ep.masks(len(enc_ids))[1]
    masks = figs.side_by_side_maps(
        dec_mask, enc_mask, labels, right_labels=enc_labels, left_title="decoder · causal mask",
        right_title="encoder · no mask", title="Which keys each query may see (1 = visible, 0 = hidden)",
        colorbar_title="visible (1) / hidden (0)", value_name="visible")
    dec_att, enc_att, enc_layer, enc_head = ep.attention_maps(decoder, ids, encoder, enc_ids, layer, head)
    attn = figs.side_by_side_maps(
        dec_att, enc_att, labels, right_labels=enc_labels,
        left_title=f"decoder · layer {layer} · {head_label(head, c.n_heads, c.n_kv_heads)}",
        right_title=f"encoder (trained, masked LM) · layer {enc_layer} · head {enc_head}",
        title="Attention weights, same sentence, same colour range (0–1)")

    v = ep.norms_and_activations(decoder, ids, layer, t)
    norms = figs.norm_figure(v.x, v.rms, v.ln, token=labels[t], eps=v.eps)
    acts = figs.activation_figure(v.grid, v.silu_grid, v.gelu_grid, v.u, v.silu_u, v.gelu_u, v.swiglu,
                                  token=labels[t])
    rows = [
        ("attention", "causal (sees earlier tokens)", "bidirectional (sees all tokens)"),
        ("positions", f"RoPE, θ = {c.rope_theta:,.0f}, rotates q and k", "sinusoidal table added to embeddings"),
        ("norm", "RMSNorm: x / rms(x) · g", "LayerNorm: (x − mean) / std · g + b"),
        ("feed-forward", f"SwiGLU {c.d_model} → {c.d_ff} → {c.d_model}",
         f"GELU MLP {ec.d_model} → {ec.d_ff} → {ec.d_model}"),
        ("heads", f"{c.n_heads} query / {c.n_kv_heads} key-value", f"{ec.n_heads} / {ec.n_kv_heads}"),
        ("layers", str(c.n_layers), str(ec.n_layers)),
        ("trained to", "predict the next token", "fill in hidden tokens (masked-language modelling)"),
        ("weights", name, f"trained encoder ({ep.encoder_dir().name})"),
    ]
    md = "| | decoder | encoder |\n|---|---|---|\n" + "\n".join(f"| {a} | {b} | {e} |" for a, b, e in rows)
    md += (f"\n\nNorm and activation plots use token **{labels[t]}**: its residual stream before layer {layer}'s "
           f"feed-forward norm (RMSNorm and LayerNorm with gain 1, bias 0), and the gate pre-activations of that "
           f"feed-forward.")
    if (enc_layer, enc_head) != (layer, head):
        md += (f" The encoder has {ec.n_layers} layers and {ec.n_heads} heads, so its map shows layer {enc_layer}, "
               f"head {enc_head}.")
    if not same:
        md += "\n\n" + _tokenizer_note(name)
    if notice:
        md += f"\n\n⚠️ {notice}"
    blank = gr.Dropdown(choices=blank_choices(enc_labels), value=default_blank(enc_labels))
    return (masks, attn, norms, acts, md, gr.Dropdown(choices=layer_choices(c.n_layers), value=layer),
            gr.Dropdown(choices=head_choices(c.n_heads, c.n_kv_heads), value=head), blank)


def _fill_in_blank_view(prompt, position, state):
    decoder, tokenizer, name, encoder, enc_tok, same = _models(state)
    ids, labels, notice = session.encode_with_notice(enc_tok, prompt, min(MAX_TOKENS, encoder.config.max_seq_len))
    if position is None:
        position = default_blank(labels)
    blank = ep.fill_in_blank(encoder, enc_tok.mask_token_id, ids, position, decoder if same else None, k=TOP_K)
    words = lambda g: session.token_strings(enc_tok, g.ids)  # noqa: E731
    hidden = session.token_strings(enc_tok, [blank.target])[0]
    enc_words = words(blank.encoder)
    dec_words = words(blank.decoder) if blank.decoder else None
    left = labels[blank.position - 1] if blank.position > 1 else "<s>"
    fig = figs.fill_in_blank_figure(
        enc_words, blank.encoder.probs, dec_words, blank.decoder.probs if blank.decoder else None, hidden=hidden,
        left_title="encoder: reads both sides of the blank",
        right_title=(f"decoder: reads only up to {left}" if blank.decoder else
                     "decoder: another tokenizer, not comparable"))
    table = [[i + 1, enc_words[i], round(blank.encoder.probs[i], 6),
              dec_words[i] if dec_words else "", round(blank.decoder.probs[i], 6) if blank.decoder else None]
             for i in range(len(enc_words))]
    acc = ep.held_out_accuracy(decoder if same else None, tokenizer)
    masked_text = " ".join("[MASK]" if i == blank.position else session.token_strings(enc_tok, [t])[0]
                           for i, t in enumerate(ids[1:], start=1))
    md = (f"Hidden: **{labels[blank.position]}**. The encoder read: `{masked_text}`. Its best guess is "
          f"**{enc_words[0]}** ({blank.encoder.probs[0]:.1%})")
    if blank.decoder:
        md += (f"; the decoder, reading only the {blank.position} tokens before the blank, guesses "
               f"**{dec_words[0]}** ({blank.decoder.probs[0]:.1%}).")
    else:
        md += ".\n\n" + _tokenizer_note(name)
    md += (f"\n\n**Measured on {acc['stories']} held-out stories** ({acc['positions']:,} hidden tokens, 15 % of "
           f"the words, chosen with a fixed seed): the encoder's top guess is right **{acc['encoder']:.1%}** of the "
           f"time, reading both sides of each blank.")
    if acc["decoder"] is not None:
        md += (f" The decoder's top next-token guess at the same positions is right **{acc['decoder']:.1%}** of the "
               f"time, reading only the words before each blank (and none of them hidden).")
    if notice:
        md += f"\n\n⚠️ {notice}"
    return fig, {"headers": TABLE_HEADERS, "data": table}, md


@user_errors
@gpu(30)
def encoder_decoder_view(prompt, layer, head, token_pos, state):
    model, _, _ = session.get_model(state)
    with session.threads_for(model):
        return _encoder_decoder_view(prompt, layer, head, token_pos, state)


@user_errors
@gpu(30)
def fill_in_blank_view(prompt, position, state):
    model, _, _ = session.get_model(state)
    with session.threads_for(model):
        return _fill_in_blank_view(prompt, position, state)


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
    masks = gr.Plot(label="Masks", elem_id="encoder-decoder-masks")
    attn = gr.Plot(label="Attention maps", elem_id="encoder-decoder-attention")
    gr.Markdown("#### Fill in the blank\nPick a word to hide. The encoder sees the sentence with that word replaced "
                "by `<mask>`; the decoder sees only the words before it.")
    with gr.Row():
        blank = gr.Dropdown(label="Word to hide", choices=[], value=None, allow_custom_value=True, scale=2)
        guess = gr.Button("Fill in the blank", scale=1)
    blank_fig = gr.Plot(label="Top-10 guesses", elem_id="encoder-decoder-blank")
    blank_md = gr.Markdown()
    blank_table = gr.Dataframe(label="Top-10 guesses (probabilities)", headers=TABLE_HEADERS, interactive=False)
    md = gr.Markdown()
    norms = gr.Plot(label="RMSNorm vs LayerNorm", elem_id="encoder-decoder-norms")
    acts = gr.Plot(label="SwiGLU vs GELU", elem_id="encoder-decoder-acts")
    inputs = [prompt, layer, head, token, state]
    outputs = [masks, attn, norms, acts, md, layer, head, blank]
    blank_io = ([prompt, blank, state], [blank_fig, blank_table, blank_md])
    run.click(encoder_decoder_view, inputs, outputs, api_name="encoder_decoder", **lane(VIEW)).then(
        fill_in_blank_view, *blank_io, api_name="encoder_decoder_then_blank", api_visibility="private", **lane(VIEW))
    prompt.submit(encoder_decoder_view, inputs, outputs, api_name="encoder_decoder_submit",
                  api_visibility="private", **lane(VIEW)).then(fill_in_blank_view, *blank_io,
                                                 api_name="encoder_decoder_submit_then_blank",
                                                 api_visibility="private", **lane(VIEW))
    for control in (layer, head, token):
        control.input(encoder_decoder_view, inputs, outputs,
                      api_name=f"encoder_decoder_{control.label.split()[0].lower()}", api_visibility="private", **lane(VIEW))
    guess.click(fill_in_blank_view, *blank_io, api_name="fill_in_blank", **lane(VIEW))
    blank.input(fill_in_blank_view, *blank_io, api_name="fill_in_blank_pick", api_visibility="private", **lane(VIEW))
    links.register(demo, "encoder_decoder", cached_opening("encoder_decoder", encoder_decoder_view), inputs, outputs, api_name="encoder_decoder_example",
                   params=dict(sentence=prompt, layer=layer, head=head, token=token),
                   then=[(fill_in_blank_view, *blank_io, "fill_in_blank_example")],
                   focus=dict(masks=masks, attention=attn, blank=blank_fig))
