"""KV cache & generation tab: generate step by step (temperature, top-k, top-p, seed), the next-token
probabilities at each step, the cache filling up, time per token with and without the cache, and a KV-cache
calculator for real model configurations (MHA / GQA / MQA)."""
from __future__ import annotations

from typing import Any, NamedTuple

import gradio as gr

from explorer.web import links
from explorer.web.groups import GENERATION, VIEW, lane
from lens.device import gpu
from explorer import jobs, measure, probes
from explorer.probes import families
from explorer.state import session
from explorer.figures import generation as figs
from models.lora import adapter_mode
from explorer.state import text
from explorer.state.cache import results, weights_key
from explorer.state.text import PromptTooLong
from models.config import ModelConfig
from models.generate import check_sampling

from . import as_number, as_whole, outputs_of, short, user_errors
from . import generation_text as prose

MAX_NEW_TOKENS = 128
DEFAULT_NEW_TOKENS = 64  # long enough that recomputing the sequence costs clearly more than a cached step
MAX_CONTEXT = 1024  # prompt + new tokens: bounds the uncached run's time and its (T × vocab) logits on big models
TOP = 10  # candidates shown per step
DEFAULT_PROMPT = "Once upon a time, there was a little girl named Lily. She"  # greedy continues it readably
THIS_MODEL = "this app's model"
KV_DTYPES = ("float16", "bfloat16", "float32")
MAX_KV_SEQ = 1 << 20
# The modules by default: they are the code every other tab shows and the students edit, and they decode the shipped
# model (the one a class opens) as fast as a reader reads; the fast step is one click away for a 135M model, and the
# summary says which path made the tokens and whether the modules pick the same ones.
DECODE_CHOICES = (probes.generation.MODULES, probes.generation.FAST)
DEFAULT_DECODE = probes.generation.DEFAULT_DECODE

INTRO = """### KV cache and generation: one token at a time
The model reads the prompt once (prefill), then produces one token per step. At each step the bar chart
shows the candidates it weighed: black ticks mark the model's own softmax, bars the distribution actually
sampled from after temperature, top-k and top-p (red = the token chosen). For a model with a chat template,
"chat" wraps the prompt as a user turn; generation ends at the model's end tokens, shown as ⟨…⟩. The cache keeps every
layer's keys and values, so a step computes one new position instead of the whole sequence again. "Decode with"
chooses the code that computes the tokens after the prompt: the modules (the code the other tabs show) or the fast
step (the same math without module calls, faster on a 135M model); the summary says which ran and checks the fast
step's tokens against the modules."""

KV_INTRO = """#### How big is the KV cache of a real model?
Per token the cache holds 2 (keys and values) × layers × KV heads × head_dim numbers. Multi-head attention
(MHA) has one KV head per query head, grouped-query attention (GQA) shares each KV head among a group of
query heads, and multi-query attention (MQA) keeps a single one. A local (sliding-window) layer, as in Mistral
and five of every six layers of Gemma 3, keeps only its last W positions: its cache stops growing at the window.
Configurations come from each model's published config.json."""


def check_settings(max_new_tokens, temperature, top_k, top_p, seed, context: int, decode=DEFAULT_DECODE) -> dict:
    """The sampling settings as clean numbers and the decode path; ValueError with what to change otherwise (the
    sampling rules themselves are ``models.generate.check_sampling``'s)."""
    max_new = as_whole(max_new_tokens, "new tokens", 1, MAX_NEW_TOKENS)
    temperature = as_number(temperature, "temperature", finite=False)
    top_k = None if top_k in (None, "") else as_number(top_k, "top-k", finite=False)
    if top_k is not None and top_k.is_integer():
        top_k = int(top_k)  # a box sends 50.0; the sampler takes whole numbers
    top_p = None if top_p in (None, "") else as_number(top_p, "top-p", finite=False)
    check_sampling(temperature, top_k, top_p)
    top_p = None if top_p == 1 else top_p
    seed = 0 if seed in (None, "") else as_whole(seed, "seed", 0, 2**31 - 1)
    decode = DEFAULT_DECODE if decode in (None, "") else decode
    if decode not in DECODE_CHOICES:
        raise ValueError(f"decode with must be one of {', '.join(map(repr, DECODE_CHOICES))}, got "
                         f"{short(repr(decode), 40)}.")
    return {"max_new_tokens": max_new, "temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed,
            "context": context, "decode": decode}


def _step_view(view: dict, step: int):
    st = view["steps"][step]
    chosen_index = st["top_ids"].index(st["token"]) if st["token"] in st["top_ids"] else None
    return figs.next_token_figure(
        st["top_text"], st["top_probs"], chosen_index=chosen_index, step=step, model_probs=st["model_probs"],
        ranks=list(range(len(st["top_ids"]))), chosen_text=st["token_text"], settings=view["settings"])


def _with_adapter(model, name: str) -> str:
    """The model's name, plus the user's LoRA adapter and its state when one is attached."""
    mode = adapter_mode(model)
    return name if mode is None else f"{name} + your LoRA adapter ({mode})"


class GenerationView(NamedTuple):
    """What the generation tab shows after one run (the event's outputs, in order)."""
    text: list  # HighlightedText: (prompt, None), (new text, "generated")
    view: dict  # the per-step view kept in the browser session for the step slider
    step: Any  # gr.Slider update
    probs: Any  # plotly Figures: step 0's next-token probabilities, the cache filling, time per token
    cache: Any
    timing: Any
    summary: str
    table: list  # one row per step


def _encode_prompt(tokenizer, prompt, chat: bool, room: int, max_seq_len: int, max_new: int):
    """Prompt ids (wrapped by the chat template when ``chat`` and the tokenizer has one) and whether it was."""
    use_chat = bool(chat) and text.has_chat_template(tokenizer)
    source = text.chat_prompt(tokenizer, prompt) if use_chat else prompt
    try:
        ids, _, _ = text.encode_with_notice(tokenizer, source, room, truncate=False, add_special_tokens=not use_chat)
    except PromptTooLong as exc:
        where = "the model's context" if max_seq_len <= MAX_CONTEXT else "this view's limit"
        raise ValueError(f"{exc} The prompt plus {max_new} new tokens must fit in {where} of "
                         f"{min(max_seq_len, MAX_CONTEXT)} tokens.") from None
    return ids, use_chat


def _highlighted(tokenizer, prompt_ids: list[int], new_ids: list[int], user_text: str | None = None) -> list:
    """HighlightedText segments: the prompt, the generated text, special tokens marked ``⟨…⟩``. With ``user_text``
    (the prompt the chat template wrapped), what the template put before the user's turn (a system prompt) is
    folded into one marked segment that says how many tokens it holds: unfolded it filled a 1280×720 screen and
    pushed the answer out of sight."""
    segments = text.decoded_segments(tokenizer, prompt_ids)
    out = [(t, "special" if sp else None) for t, sp in segments]
    turn = next((i for i in range(len(segments) - 1, -1, -1) if user_text and not segments[i][1]
                 and user_text.strip() in segments[i][0]), None)
    if turn is not None:
        start = turn - 1 if turn and segments[turn - 1][1] else turn  # the turn's own opening marker stays
        if any(not sp and t.strip() for t, sp in segments[:start]):
            n = _tokens_before(tokenizer, prompt_ids, segments[:start])
            out = [(f"⟨chat template and system prompt: {n} tokens, not shown⟩", "special"), *out[start:]]
    out += [(t, "special" if sp else "generated")
            for t, sp in text.decoded_segments(tokenizer, new_ids, after=prompt_ids)]
    return out


def _tokens_before(tokenizer, ids: list[int], segments: list) -> int:
    """How many of ``ids`` the decoded ``segments`` (a prefix of theirs, ending before a special token) cover."""
    special = text.special_ids(tokenizer)
    k = sum(1 for _, sp in segments if sp)  # the next segment is the (k+1)-th special token of ids
    at = [i for i, t in enumerate(ids) if t in special]
    if len(at) > k:
        return at[k]
    shown = "".join(t for t, _ in segments)
    for n in range(len(ids) + 1):
        if len(text.decode_marked(tokenizer, ids[:n])) >= len(shown):
            return n
    return len(ids)


def _run(model, tokenizer, name, prompt, s: dict, chat):
    """Stream one generation (``jobs.generation``): yields (the run so far, what the panel says about the prompt)."""
    c = model.config
    room = min(c.max_seq_len, MAX_CONTEXT) - s["max_new_tokens"]
    if room < 1:
        raise ValueError(f"ask for fewer new tokens: the model's context is {c.max_seq_len} tokens in all.")
    ids, use_chat = _encode_prompt(tokenizer, prompt, chat, room, c.max_seq_len, s["max_new_tokens"])
    ctx = {"chat": use_chat, "user_text": prompt if use_chat else None, "chat_ignored": bool(chat) and not use_chat,
           "name": name}
    for run in jobs.generation.stream(
            model, ids, max_new_tokens=s["max_new_tokens"], temperature=s["temperature"], top_k=s["top_k"],
            top_p=s["top_p"], seed=s["seed"], decode=s["decode"], stops=text.stop_token_ids(tokenizer, c), top=TOP):
        yield run, ctx


def _final_view(model, tokenizer, run, ctx: dict, s: dict) -> GenerationView:
    c, ids, steps = model.config, run.ids, run.steps
    new_ids = [st["token"] for st in steps]
    text_of = dict.fromkeys(i for st in steps for i in st["top_ids"] + [st["token"]])
    text_of = dict(zip(text_of, session.token_strings(tokenizer, list(text_of))))
    view = {"settings": prose.settings_text(s), "steps": [
        {"top_ids": st["top_ids"], "top_text": [text_of[i] for i in st["top_ids"]], "top_probs": st["top_probs"],
         "model_probs": st["model_probs"], "token": st["token"], "token_text": text_of[st["token"]]}
        for st in steps]}
    prov = probes.generation.provenance(model)
    cache_fig = figs.cache_growth_figure(
        [st["cache_length"] for st in steps], [st["cache_bytes_used_per_layer"] for st in steps],
        n_layers=c.n_layers, capacity_bytes_per_layer=steps[0]["cache_bytes_allocated_per_layer"], provenance=prov)
    measured = [st for st in steps if st["uncached_seconds"] is not None]
    timing_fig = figs.cache_timing_figure(
        [st["seconds"] for st in steps], [st["uncached_seconds"] for st in measured], provenance=prov,
        without_steps=[st["step"] + 1 for st in measured])
    table = [[st["step"], st["position"], st["token"], text_of[st["token"]], round(st["chosen_prob"], 6),
              st["chosen_rank"], st["cache_length"], round(st["seconds"] * 1e3, 3),
              round(st["uncached_seconds"] * 1e3, 3) if st["uncached_seconds"] is not None else None]
             for st in steps]
    last = len(steps) - 1
    slider = gr.Slider(minimum=0, maximum=max(last, 1), value=0, step=1, interactive=last > 0,
                       label=f"step (0–{last})")
    return GenerationView(text=_highlighted(tokenizer, ids, new_ids, ctx["user_text"]), view=view, step=slider,
                          probs=_step_view(view, 0), cache=cache_fig, timing=timing_fig,
                          summary=prose.summary(run, ctx, s, text_of, c, prov), table=table)


@user_errors
def generate(prompt, max_new_tokens, temperature, top_k, top_p, seed, state=None, chat=True,
             decode=DEFAULT_DECODE) -> GenerationView:
    """The finished view of ``generate_stream`` (for callers that want the result, not the stream)."""
    view = None
    for view in generate_stream(prompt, max_new_tokens, temperature, top_k, top_p, seed, state, chat, decode):
        pass
    return view


@user_errors
@gpu(120)
def generate_stream(prompt, max_new_tokens, temperature, top_k, top_p, seed, state=None, chat=True,
                    decode=DEFAULT_DECODE):
    """Stream a generation with the KV cache (text after every token, the charts at the end); the uncached
    forward is timed at a few steps beside it. Stop (the button) ends it between two steps. ``decode``: which code
    computes the tokens after the prompt (``DECODE_CHOICES``)."""
    model, tokenizer, name = session.get_model(state)
    name = _with_adapter(model, name)
    s = check_settings(max_new_tokens, temperature, top_k, top_p, seed, model.config.max_seq_len, decode)
    for run, ctx in _run(model, tokenizer, name, prompt, s, chat):
        if run.done:
            yield _final_view(model, tokenizer, run, ctx, s)
            return
        steps = run.steps
        progress = (f"Generating… token {len(steps)} of at most {s['max_new_tokens']} "
                    f"(last: {steps[-1]['seconds'] * 1e3:.1f} ms with the cache). The charts follow at the end.")
        yield GenerationView(text=_highlighted(tokenizer, run.ids, [st["token"] for st in steps], ctx["user_text"]),
                             view=gr.skip(), step=gr.skip(), probs=gr.skip(), cache=gr.skip(), timing=gr.skip(),
                             summary=progress, table=gr.skip())


@user_errors
def generate_example(prompt, max_new_tokens, temperature, top_k, top_p, seed, state=None, chat=True,
                     decode=DEFAULT_DECODE):
    """The opening example: computed once per model (and weights) at first use, served to every session."""
    model, tokenizer, name = session.get_model(state)
    name = _with_adapter(model, name)
    s = check_settings(max_new_tokens, temperature, top_k, top_p, seed, model.config.max_seq_len, decode)

    def compute():
        run = ctx = None
        for run, ctx in _run(model, tokenizer, name, prompt, s, chat):
            pass
        return _final_view(model, tokenizer, run, ctx, s)

    key = ("generation_example", weights_key(model), str(prompt), tuple(sorted(s.items())), bool(chat))
    view = results.get_or_compute(key, compute)
    return view._replace(summary="*Opening example, measured when this model was first used; press Generate "
                                 "to run it live.*\n\n" + view.summary)


@user_errors
def generate_step(view, step):
    if not view:
        raise ValueError("Press “Generate” first.")
    step = as_whole(step, "step", 0, len(view["steps"]) - 1)
    return _step_view(view, step)


# --- KV-cache calculator --------------------------------------------------------------------------------

def _real_configs() -> dict[str, object]:
    try:
        return {name: measure.real_config(name) for name in measure.load_real_configs()}
    except (OSError, ValueError, KeyError):
        return {}


def _config_for(name: str, state):
    if name == THIS_MODEL:
        model, _, model_name = session.get_model(state)
        return model.config, model_name
    configs = _real_configs()
    if not isinstance(name, str) or name not in configs:
        raise ValueError(f"unknown configuration {short(repr(name), 40)}: choose one from the list.")
    return configs[name], name


def _kind(n_heads: int, n_kv: int) -> str:
    return "MHA" if n_kv == n_heads else ("MQA" if n_kv == 1 else f"GQA ({n_heads // n_kv} per group)")


@user_errors
def kv_calculator(config_name, seq_len, batch, dtype, state):
    """KV-cache bytes of one configuration as MHA / its own GQA / MQA vs sequence length, and a table of all."""
    seq_len = as_whole(seq_len, "sequence length", 1, MAX_KV_SEQ)
    batch = as_whole(batch, "batch", 1, 1024)
    if dtype not in KV_DTYPES:
        raise ValueError(f"dtype must be one of {list(KV_DTYPES)}, got {dtype!r}.")
    config, label = _config_for(config_name, state)
    lens, t = [], 128
    while t < seq_len:
        lens.append(t)
        t *= 2
    lens.append(seq_len)
    series: dict[str, list[float]] = {}
    for T in lens:
        variants = measure.attention_variants(config, seq_len=T, dtype=dtype)
        for kind, v in variants.items():
            own = " (its own)" if kind == "GQA" or v["n_kv_heads"] == config.n_kv_heads else ""
            key = f"{label} as {kind}, {v['n_kv_heads']} KV heads{own}"
            if kind == "GQA" and v["n_kv_heads"] in (config.n_heads, 1):
                continue  # its own setting is MHA or MQA: already drawn
            series.setdefault(key, []).append(v["per_sequence"] * batch)
    own_key = next(k for k in series if "(its own)" in k)
    own = measure.kv_cache_bytes(config, seq_len=seq_len, batch=batch, dtype=dtype)
    fig = figs.kv_calculator_figure(lens, series, dtype=dtype, batch=batch, highlight=own_key,
                                    window=own["window"] if own["window"] and own["window"] < seq_len else None,
                                    local_note=_local_layers(config, own))
    rows = []
    configs = {THIS_MODEL: _config_for(THIS_MODEL, state)[0], **_real_configs()}
    for name, c in configs.items():
        kv = measure.kv_cache_bytes(c, seq_len=seq_len, batch=batch, dtype=dtype)
        mha = measure.kv_cache_bytes(ModelConfig.from_dict({**c.to_dict(), "n_kv_heads": c.n_heads}),
                                     seq_len=seq_len, batch=batch, dtype=dtype)
        rows.append([name, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, _kind(c.n_heads, c.n_kv_heads),
                     kv["per_token"], measure.format_bytes(kv["batch"]), kv["batch"],
                     f"{mha['batch'] / kv['batch']:.0f}×",
                     f"{len(kv['local_layers'])} of {c.n_layers} (window {kv['window']:,})" if kv["window"] else "none"])
    md = (f"**{label}**: {config.n_layers} layers × {config.n_kv_heads} KV heads × {config.head_dim} dims × 2 × "
          f"{measure.element_size(dtype)} bytes = **{own['per_token']:,} bytes per token**"
          + (" while the windows fill" if own["window"] else "") + "; "
          f"{seq_len:,} tokens × batch {batch} = **{measure.format_bytes(own['batch'])}** "
          f"({_kind(config.n_heads, config.n_kv_heads)}). ")
    if own["window"]:
        md += (f"{_local_layers(config, own)}: a local layer's cache is a ring of its last "
               f"{own['window']:,} positions, so it stops growing there. "
               + (f"At {seq_len:,} tokens that saves **{measure.format_bytes(own['saved'])}** "
                  f"({own['saved'] / own['all_global']:.0%}) against "
                  f"{measure.format_bytes(own['all_global'])} with every layer global. " if own["saved"] else
                  f"At {seq_len:,} tokens no window is full yet: every layer still holds every token. "))
    md += "Predicted from the configuration (no tensors allocated)."
    return fig, rows, md


def _local_layers(config, kv: dict) -> str:
    """'15 of 18 layers are local (sliding window 512: 0–4, 6–10, 12–16; global: 5, 11, 17)', or ''."""
    if not kv["window"]:
        return ""
    local = kv["local_layers"]
    shown = families.ranges(local)
    rest = families.ranges([i for i in range(config.n_layers) if i not in local])
    return (f"{len(local)} of {config.n_layers} layers are local (sliding window {kv['window']:,}: layers {shown}; "
            f"global: {rest})")


KV_HEADERS = ["configuration", "layers", "query heads", "KV heads", "head_dim", "attention", "KV bytes per token",
              "KV cache", "KV cache (bytes)", "saving vs MHA", "local layers"]


def build_generation(demo: gr.Blocks, state: gr.State) -> None:
    gr.Markdown(INTRO)
    # The step chart sits at the top of the right column, beside the prompt, the text and the settings: its top
    # stays in the first screen (and the whole chart, in projector mode) however long the generated text grows.
    with gr.Row():
        with gr.Column(scale=2, min_width=320):
            prompt = gr.Textbox(label="Prompt", value=DEFAULT_PROMPT, lines=2, max_lines=6)
            with gr.Row():
                run = gr.Button("Generate", variant="primary")
                stop = gr.Button("Stop", variant="stop")
                decode = gr.Radio(list(DECODE_CHOICES), value=DEFAULT_DECODE, label="decode with", min_width=220)
            step = gr.Slider(0, 1, value=0, step=1, label="step")  # the chart beside it shows this step
            output = gr.HighlightedText(label="Prompt + generated text", combine_adjacent=False,
                                        color_map={"generated": "#ffd37a", "special": "#c5b0d5"})
            with gr.Row():
                max_new = gr.Slider(1, MAX_NEW_TOKENS, value=DEFAULT_NEW_TOKENS, step=1, label="new tokens",
                                    min_width=160)
                seed = gr.Number(value=0, precision=0, label="seed", minimum=0, min_width=80)
            with gr.Row():
                temperature = gr.Number(value=0.0, label="temperature", min_width=100,
                                        info="0 = greedy; 1e-9 ≈ greedy; 1e9 ≈ uniform")
                top_k = gr.Number(value=50, precision=0, label="top-k", info="blank = no cut-off", min_width=80)
                top_p = gr.Number(value=0.95, label="top-p", info="(0, 1]; 1 = no cut-off", min_width=80)
            chat = gr.Checkbox(value=True, label="chat",
                               info="wrap the prompt with the model's chat template (when its tokenizer has one)")
        with gr.Column(scale=3):
            probs = gr.Plot(label="Next-token probabilities at this step", elem_id="generation-probs")
    summary = gr.Markdown()
    view_state = gr.State(None)
    with gr.Row():
        cache_plot = gr.Plot(label="KV cache fill", elem_id="generation-cache")
        timing_plot = gr.Plot(label="Time per token, with and without the cache", elem_id="generation-timing")
    table = gr.Dataframe(headers=["step", "position", "token id", "token", "probability (sampled from)",
                                  "rank by logit", "cache length", "ms with cache",
                                  "ms without cache (measured steps only)"],
                         label="Every step", interactive=False, max_height=300)

    gr.Markdown(KV_INTRO)
    names = [THIS_MODEL] + list(_real_configs())
    with gr.Row():
        with gr.Column(scale=1, min_width=260):
            kv_name = gr.Dropdown(names, value=names[1] if len(names) > 1 else names[0], label="configuration")
            kv_len = gr.Number(value=8192, precision=0, label="sequence length (tokens)", minimum=1,
                               maximum=MAX_KV_SEQ)
            kv_batch = gr.Number(value=1, precision=0, label="batch", minimum=1, maximum=1024)
            kv_dtype = gr.Dropdown(list(KV_DTYPES), value="float16", label="cache dtype")
            kv_btn = gr.Button("Compute", variant="primary")
            kv_md = gr.Markdown()
        with gr.Column(scale=3):
            kv_plot = gr.Plot(label="KV cache size vs sequence length", elem_id="generation-kv")
    kv_table = gr.Dataframe(headers=KV_HEADERS, label="All configurations at this length", interactive=False)

    gen_inputs = [prompt, max_new, temperature, top_k, top_p, seed, state, chat, decode]
    gen_outputs = outputs_of(GenerationView, text=output, view=view_state, step=step, probs=probs, cache=cache_plot,
                             timing=timing_plot, summary=summary, table=table)
    runs = [run.click(generate_stream, gen_inputs, gen_outputs, api_name="generate", **lane(GENERATION)),
            prompt.submit(generate_stream, gen_inputs, gen_outputs, api_name="generate_submit", api_visibility="private", **lane(GENERATION))]
    # the generator is closed between two steps: the worker is free within one token
    stop.click(None, None, None, cancels=runs, api_name="generate_stop", api_visibility="private")
    step.change(generate_step, [view_state, step], [probs], api_name="generate_step", show_progress="hidden", **lane(VIEW))
    kv_inputs = [kv_name, kv_len, kv_batch, kv_dtype, state]
    kv_outputs = [kv_plot, kv_table, kv_md]
    for control in (kv_name, kv_dtype):
        control.input(kv_calculator, kv_inputs, kv_outputs, api_name=f"kv_calculator_{control.label.split()[0]}",
                      api_visibility="private", **lane(VIEW))
    for control in (kv_len, kv_batch):
        control.submit(kv_calculator, kv_inputs, kv_outputs, api_name=f"kv_calculator_{control.label.split()[0]}",
                       api_visibility="private", **lane(VIEW))
    kv_btn.click(kv_calculator, kv_inputs, kv_outputs, api_name="kv_calculator", **lane(VIEW))
    demo.load(kv_calculator, kv_inputs, kv_outputs, api_name="kv_calculator_example", api_visibility="undocumented", **lane(VIEW))
    links.register(demo, "generation", generate_example, gen_inputs, gen_outputs, api_name="generate_example",
                   params=dict(prompt=prompt, tokens=max_new, temperature=temperature, top_k=top_k, top_p=top_p,
                               seed=seed, decode=decode),
                   focus=dict(probs=probs, cache=[cache_plot, timing_plot]), lane=GENERATION)
