"""Positions tab: RoPE as turning 2-D pairs, the angle table, score against relative distance, another
rope_theta applied to the same weights, and the encoder's sinusoidal table beside it."""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import gradio as gr

from explorer.web import links
from explorer.web.groups import VIEW, lane
from explorer.state.cache import results, weights_key
from lens.device import gpu
from explorer import probes
from explorer.state import session
from explorer.figures import positions as figs
from explorer.figures.common import head_label

from explorer.panels.controls import as_index, head_choices, layer_choices, outputs_of
from explorer.panels.errors import user_errors

POSITIONS = 64
MAX_TOKENS = 48
MAX_THETA = 1e9
DEFAULT_PROMPT = "Tom gave the red ball to Anna. Anna gave the red ball to Tom."

INTRO = """### Positions: how the decoder knows where a token is
RoPE splits each query and key head into 2-D pairs and turns pair *i* by *position × θ^(−2i/D)*: the first
pairs spin fast, the last ones barely move. Because both q and k are turned, their dot product depends only on
how far apart they are. Change **rope_theta** to see how the attention of the same trained weights changes;
the encoder instead *adds* a fixed sinusoidal table to its embeddings (right)."""


def _pairs(value, half: int) -> list[int]:
    if value is None or value == [] or value == "":
        raise ValueError(f"Choose at least one pair (0 to {half - 1}).")
    items = value if isinstance(value, (list, tuple)) else str(value).replace(";", ",").split(",")
    out = []
    for item in items:
        out.append(as_index(item if not isinstance(item, str) else item.strip(), half, "pair"))
    if len(out) > 8:
        raise ValueError("Choose at most 8 pairs to follow.")
    return sorted(set(out))


def _theta(value) -> float:
    try:
        theta = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"rope_theta must be a number greater than 1, got {value!r}.") from None
    if not 1.0 < theta <= MAX_THETA:
        raise ValueError(f"rope_theta must lie between 1 (exclusive) and {MAX_THETA:.0e}, got {value!r}.")
    return theta


class RopeView(NamedTuple):
    """What the Positions tab shows (the event's outputs, in order)."""
    circle: Any  # plotly Figures from here to sinusoidal
    angles: Any
    distance: Any
    compare: Any
    sinusoidal: Any
    md: str
    layer: Any  # gr.Dropdown updates
    head: Any
    pairs: Any
    wavelengths: Any  # plotly Figure: plain and (when the model has RoPE scaling) scaled wavelengths
    theta: Any  # gr.Number update: the hint names the loaded model's trained θ


def scaling_text(scaling: dict | None) -> str:
    """``ModelConfig.rope_scaling`` in words ("" for plain RoPE)."""
    if not scaling:
        return ""
    if scaling["rope_type"] == "linear":
        return f"linear, factor {scaling['factor']:g}"
    return (f"llama3, factor {scaling['factor']:g}, low/high freq factor {scaling['low_freq_factor']:g}/"
            f"{scaling['high_freq_factor']:g}, original context {scaling['original_max_position_embeddings']:,}")


def theta_hint(config) -> str:
    return f"trained with {config.rope_theta:,.0f}; try 100 or 1,000,000"


def pairs_label(config) -> str:
    return f"Pairs to follow (0 = fastest, {config.head_dim // 2 - 1} = slowest)"


def default_pairs(half: int) -> list[int]:
    """The fastest, two middle and the slowest pair of a head with ``half`` pairs."""
    return sorted({0, half // 4, half // 2, half - 1})


def model_defaults(state) -> dict:
    """The settings whose default depends on the model (after a model load): its own θ, pairs it has."""
    c = session.get_model(state)[0].config
    half = c.head_dim // 2
    return {"theta": gr.Number(value=float(c.rope_theta), info=theta_hint(c)),
            "pairs": gr.Dropdown(choices=list(range(half)), value=default_pairs(half), label=pairs_label(c))}


def _rope_view(prompt, theta, position, pairs, layer, head, state):
    model, tokenizer, name = session.get_model(state)
    c = model.config
    half = c.head_dim // 2
    theta = _theta(theta)
    pairs = _pairs(pairs, half)
    position = as_index(position, POSITIONS, "position")
    layer = as_index(layer, c.n_layers, "layer")
    head = as_index(head, c.n_heads, "head")
    # every visitor's opening example (and any view asked twice) of the same weights is computed once
    key = ("positions", weights_key(model), name, str(prompt), theta, position, tuple(pairs), layer, head)
    figures = results.get_or_compute(key, lambda: _rope_figures(model, tokenizer, name, prompt, theta, position,
                                                                pairs, layer, head))
    return RopeView(*figures[:6], layer=gr.Dropdown(choices=layer_choices(c.n_layers), value=layer),
                    head=gr.Dropdown(choices=head_choices(c.n_heads, c.n_kv_heads), value=head),
                    pairs=gr.Dropdown(choices=list(range(half)), value=pairs, multiselect=True, label=pairs_label(c)),
                    wavelengths=figures[-1], theta=gr.Number(info=theta_hint(c)))


def _rope_figures(model, tokenizer, name, prompt, theta, position, pairs, layer, head) -> tuple:
    """(circle, angles, distance, compare, sinusoidal, md, wavelengths) for checked inputs."""
    c = model.config
    half = c.head_dim // 2
    ids, labels, notice = session.encode_with_notice(tokenizer, prompt, min(MAX_TOKENS, c.max_seq_len))

    trained = float(c.rope_theta)
    thetas = sorted({trained, theta, 100.0, 1e6})
    probe = probes.rope_probe(model, theta=theta, thetas=thetas, positions=POSITIONS, pairs=pairs, tokens=ids,
                              layer=layer, head=head)
    circle = figs.rope_circle_figure(probe["angles"], pairs, position, head_dim=c.head_dim, theta=theta,
                                     wavelengths=probe["wavelengths"])
    angles = figs.rope_angle_heatmap(probe["angles"], theta=theta, wavelengths=probe["wavelengths"])

    def curve_name(t: float) -> str:
        tags = [x for x, ok in (("trained", t == trained), ("chosen", t == theta)) if ok]
        return f"θ = {t:,.0f}" + (f" ({', '.join(tags)})" if tags else "")

    curves = {curve_name(t): v["by_distance"] for t, v in probe["theta_sweep"].items()}
    rel = probe["relative"]
    distance = figs.rope_distance_figure(
        curves, highlight=curve_name(theta),
        subtitle=f"{rel['vectors']}<br>at θ = {theta:,.0f} the score depends only on m − n "
                 f"(largest gap between scores at the same distance: {rel['max_deviation']:.1e})")

    before = probes.attention_pattern(model, ids, layer, head)
    after = probes.attention_pattern(model, ids, layer, head, rope_theta=theta)
    hl = head_label(head, c.n_heads, c.n_kv_heads)
    compare = figs.theta_attention_figure(before, after, labels, theta_before=trained, theta_after=theta,
                                          layer=layer, head_text=hl)
    sin = probes.sinusoidal_probe(POSITIONS, c.d_model)
    sinus = figs.sinusoidal_heatmap(sin["table"])

    changed = abs(after - before).max()
    md = [f"**What changed:** the same weights of {name} ran with rotary tables rebuilt for θ = {theta:,.0f} "
          f"(trained with θ = {trained:,.0f}); every layer saw the new rotations. The shared model was not "
          f"modified. Largest change of an attention weight in layer {layer} · {hl}: **{changed:.3f}**.",
          f"head_dim {c.head_dim} → {half} pairs; context {c.max_seq_len:,} positions; the slowest pair turns once every "
          f"{probe['wavelengths'][-1]:,.0f} positions, the fastest every {probe['wavelengths'][0]:.1f}."]
    scaled = None
    if c.rope_scaling:
        scaled = probe["wavelengths"]
        plain = 2 * math.pi / probe["plain_frequencies"]
        changed_pairs = int((abs(scaled - plain) > 1e-9 * plain).sum())
        md.append(f"RoPE scaling ({scaling_text(c.rope_scaling)}): {changed_pairs} of {half} pairs turn slower than "
                  f"θ alone says; every figure here uses the scaled speeds the model rotates by.")
    wavelengths = figs.rope_wavelength_figure(2 * math.pi / probe["plain_frequencies"], scaled, theta=theta,
                                              scaling_text=scaling_text(c.rope_scaling), context=c.max_seq_len)
    if notice:
        md.append(f"⚠️ {notice}")
    return circle, angles, distance, compare, sinus, "\n\n".join(md), wavelengths


@user_errors
@gpu(30)
def rope_view(prompt, theta, position, pairs, layer, head, state) -> RopeView:
    model, _, _ = session.get_model(state)
    with session.threads_for(model):
        return _rope_view(prompt, theta, position, pairs, layer, head, state)


@user_errors
def circle_only(theta, position, pairs, state):
    """The unit-circle plot alone (cheap: moves with the position slider)."""
    model, _, _ = session.get_model(state)
    c = model.config
    theta = _theta(theta)
    pairs = _pairs(pairs, c.head_dim // 2)
    position = as_index(position, POSITIONS, "position")
    probe = probes.rope_probe(c, theta=theta, positions=POSITIONS, pairs=pairs)
    return figs.rope_circle_figure(probe["angles"], pairs, position, head_dim=c.head_dim, theta=theta,
                                   wavelengths=probe["wavelengths"])


def build_positions(demo: gr.Blocks, state: gr.State) -> None:
    model, _, _ = session.get_model(None)
    c = model.config
    half = c.head_dim // 2
    gr.Markdown(INTRO)
    with gr.Row():
        with gr.Column(scale=2):
            theta = gr.Number(value=float(c.rope_theta), label="rope_theta (θ)", info=theta_hint(c))
            prompt = gr.Textbox(label="Prompt for the attention map", value=DEFAULT_PROMPT, lines=2)
            with gr.Row():
                layer = gr.Dropdown(label="Layer", choices=layer_choices(c.n_layers), value=0,
                                    allow_custom_value=True)
                head = gr.Dropdown(label="Head", choices=head_choices(c.n_heads, c.n_kv_heads), value=0,
                                   allow_custom_value=True)
            run = gr.Button("Apply θ", variant="primary")
            position = gr.Slider(0, POSITIONS - 1, value=5, step=1, label="Position (moves the circle)")
            pairs = gr.Dropdown(choices=list(range(half)), value=default_pairs(half),
                                multiselect=True, label=pairs_label(c))
        with gr.Column(scale=3):
            circle = gr.Plot(label="RoPE pairs on the unit circle", elem_id="positions-circle")
    md = gr.Markdown(elem_id="positions-theta-text")
    compare = gr.Plot(label="The same head with the trained θ and the chosen θ", elem_id="positions-theta")
    with gr.Row():
        angles = gr.Plot(label="Decoder: RoPE angle of every pair at every position", elem_id="positions-angles")
        sinus = gr.Plot(label="Encoder: sinusoidal position table")
    with gr.Row():
        distance = gr.Plot(label="Score against relative distance")
        wavelengths = gr.Plot(label="Wavelength of each pair (plain, and scaled when the model has RoPE scaling)")

    inputs = [prompt, theta, position, pairs, layer, head, state]
    outputs = outputs_of(RopeView, circle=circle, angles=angles, distance=distance, compare=compare, sinusoidal=sinus,
                         md=md, layer=layer, head=head, pairs=pairs, wavelengths=wavelengths, theta=theta)
    run.click(rope_view, inputs, outputs, api_name="rope", **lane(VIEW))
    for control in (theta, prompt):
        control.submit(rope_view, inputs, outputs, api_name=f"rope_{control.label.split()[0].lower()}",
                       api_visibility="private", **lane(VIEW))
    for control in (layer, head):
        control.input(rope_view, inputs, outputs, api_name=f"rope_{control.label.lower()}", api_visibility="private", **lane(VIEW))
    position.change(circle_only, [theta, position, pairs, state], [circle], api_name="rope_circle",
                    api_visibility="undocumented", show_progress="hidden", **lane(VIEW))
    pairs.input(circle_only, [theta, position, pairs, state], [circle], api_name="rope_pairs",
                api_visibility="private", show_progress="hidden", **lane(VIEW))
    links.register(demo, "positions", rope_view, inputs, outputs, api_name="rope_example",
                   params=dict(prompt=prompt, theta=theta, position=position, pairs=pairs, layer=layer, head=head),
                   model_defaults=model_defaults, focus=dict(theta=[md, compare], circle=circle))
