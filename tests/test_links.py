"""Deep-link values are checked as typed input would be (explorer/links.py), without a browser."""
import gradio as gr
import pytest

from explorer import glossary

from explorer.web import links
from tests.tiers import fast_first


def _view():
    with gr.Blocks() as demo:
        prompt = gr.Textbox(value="hi")
        layer = gr.Dropdown(choices=[("layer 0", 0), ("layer 1", 1)], value=0)
        tokens = gr.Slider(1, 64, value=24, step=1)
        temperature = gr.Number(value=0.8, minimum=0, maximum=5)
        seed = gr.Number(value=0, precision=0, minimum=0)
        pairs = gr.Dropdown(choices=list(range(4)), value=[0], multiselect=True)
        causal = gr.Checkbox(value=True)
        links.register(demo, "attention", lambda *a: None, [prompt], [], api_name="x",
                       params=dict(prompt=prompt, layer=layer, tokens=tokens, temperature=temperature, seed=seed,
                                   pairs=pairs, causal=causal))
    return demo, links.views(demo)


def test_good_values_become_the_components_values():
    demo, views = _view()
    tab, values, notes = links.read_query(
        {"tab": "attention", "prompt": "<b>x</b>", "layer": "1", "tokens": "5", "temperature": "1.5", "seed": "7",
         "pairs": "1,3", "causal": "0", "present": "1"}, views)
    p = views["attention"].params
    assert tab == "attention" and notes == []
    assert values == {p["prompt"]: "<b>x</b>", p["layer"]: 1, p["tokens"]: 5, p["temperature"]: 1.5, p["seed"]: 7,
                      p["pairs"]: [1, 3], p["causal"]: False}


@pytest.mark.parametrize("key,raw,reason", fast_first([
    ("layer", "2", "must be one of 0, 1"), ("tokens", "65", "between 1 and 64"), ("tokens", "2.5", "multiple of 1"),
    ("temperature", "nan", "finite"), ("seed", "1.5", "whole number"), ("pairs", "0,9", "must be one of"),
    ("causal", "maybe", "1 or 0"), ("prompt", "x" * (links.MAX_TEXT + 1), "longer than"), ("colour", "red", "takes"),
], 4, unpack=True))
def test_a_bad_value_is_ignored_with_a_sentence(key, raw, reason):
    _, views = _view()
    tab, values, notes = links.read_query({"tab": "attention", key: raw}, views)
    assert tab == "attention" and values == {}
    assert len(notes) == 1 and notes[0].startswith(f"Ignored {key}=") and reason in notes[0]


def test_an_unknown_tab_or_a_missing_one_selects_nothing():
    _, views = _view()
    assert links.read_query({"tab": "nope"}, views)[0] is None
    tab, values, notes = links.read_query({"layer": "1"}, views)
    assert tab is None and values == {} and "tab=" in notes[0]


def test_the_glossary_defines_the_words_the_tabs_use():
    for word in ["induction head", "attention sink", "logit", "logit lens", "max |Δlogit|", "nats/token", "KV head",
                 "GQA", "RoPE", "RMSNorm", "SwiGLU", "KV cache", "softmax", "causal mask", "residual stream", "LoRA",
                 "int8", "bf16", "roofline"]:
        text = glossary.definition(word)
        assert 20 < len(text) < 320 and text.count(". ") <= 2, word
    assert 'title="Grouped-query' in glossary.term("GQA") and ">a&lt;b<" in glossary.term("GQA", "a<b")


def test_mark_puts_each_terms_definition_on_its_first_use_only():
    import re

    text = "The KV cache holds one KV head's keys; the `KV cache` in code and [a link](?tab=kv-cache) stay as they are. KV caches grow."
    out = glossary.mark(text)
    marks = re.findall(r'<abbr class="term" title="([^"]*)">([^<]*)</abbr>', out)
    assert [shown for _, shown in marks] == ["KV cache", "KV head"]  # "KV caches" later: already defined
    assert marks[0][0] == glossary.definition("KV cache")
    assert "`KV cache`" in out and "(?tab=kv-cache)" in out
    # a definition that uses other terms is one title, never marked inside
    logit = glossary.mark("a logit")
    assert logit.count("<abbr") == 1 and "softmax" in logit
    # a longer term wins over the shorter one inside it; a plural is the same term
    assert ">logit lens</abbr>" in glossary.mark("the logit lens") and ">logits</abbr>" in glossary.mark("two logits")


def test_a_link_can_choose_the_generation_tabs_decode_path():
    from explorer.panels import generation

    with gr.Blocks() as demo:
        generation.build_generation(demo, gr.State(None))
    views = links.views(demo)
    decode = views["generation"].params["decode"]
    assert isinstance(decode, gr.Radio) and decode.value == generation.DEFAULT_DECODE
    tab, values, notes = links.read_query({"tab": "generation", "decode": "the fast step"}, views)
    assert tab == "generation" and values == {decode: "the fast step"} and notes == []
    _, values, notes = links.read_query({"tab": "generation", "decode": "fastest"}, views)
    assert values == {} and "must be one of the modules, the fast step" in notes[0]


def test_walkthrough_steps_are_linked_by_name_so_added_steps_never_shift_a_link():
    from explorer.panels import walkthrough
    from explorer.probes import walkthrough as wt

    with gr.Blocks() as demo:
        walkthrough.build_walkthrough(demo, gr.State(None))
        page_model = gr.Textbox()
    views = links.views(demo)
    step = views["walkthrough"].params["step"]
    for name in ("scores", "mask", "softmax", "logits"):
        tab, values, notes = links.read_query({"tab": "walkthrough", "step": name}, views)
        assert values == {step: wt.STEP_KEYS.index(name)} and notes == []
    assert links.read_query({"tab": "walkthrough", "step": "4"}, views)[1] == {step: 4}  # old links still open
    _, values, notes = links.read_query({"tab": "walkthrough", "step": "score"}, views)
    assert values == {} and "or a name: embed, norm1" in notes[0]
    inputs, js = links.copy_link_js(demo, page_model)
    assert '"4": "scores"' in js and inputs[-1] is page_model  # the page's model id comes last  # "copy link" writes the name


def test_names_must_belong_to_a_link_key():
    with gr.Blocks() as demo:
        s = gr.Slider(0, 3, step=1)
        with pytest.raises(ValueError, match="not a link key"):
            links.register(demo, "x", lambda: None, [], [], api_name="x", params=dict(step=s), names=dict(stop={}))


def test_a_model_load_forgets_the_walkthrough_token_another_tokenizer_may_not_have():
    """Loading a model whose tokenizer cuts the prompt into fewer tokens left the old position in the picker,
    and every later walk-through failed ("token position must be 0 to 8, got 9") until the prompt changed."""
    from explorer.panels import walkthrough

    with gr.Blocks() as demo:
        state = gr.State(None)
        walkthrough.build_walkthrough(demo, state)
        load = gr.Button().click(lambda s: s, [state], [state])
        links.after_model_load(demo, [load], "_test")
    view = links.views(demo)["walkthrough"]
    token = next(c for c in view.inputs if isinstance(c, gr.Dropdown) and c.label == "Token to follow")
    fn = next(f for f in demo.fns.values() if f.api_name == "walkthrough_defaults_test_0")
    assert token in fn.outputs
    values = fn.fn(None)
    assert values[fn.outputs.index(token)] is None  # the last token of whatever the new tokenizer makes


def test_a_number_with_one_bound_refuses_a_value_past_it_with_a_sentence():
    """Issue 31: ``seed=-1`` on a Number bounded below only raised TypeError, and the whole link did nothing."""
    import gradio as gr

    from explorer.web.links import parse_value

    with pytest.raises(ValueError, match="must be at least 0"):
        parse_value("-1", gr.Number(minimum=0, precision=0, render=False))
    with pytest.raises(ValueError, match="must be at most 5"):
        parse_value("9", gr.Number(maximum=5, render=False))
    assert parse_value("7", gr.Number(minimum=0, precision=0, render=False)) == 7


def test_focus_names_a_registered_figure_and_a_wrong_name_says_which_exist():
    with gr.Blocks() as demo:
        prompt = gr.Textbox(value="hi")
        heat = gr.Plot(elem_id="x-heat")
        sentence = gr.Markdown(elem_id="x-sentence")
        links.register(demo, "attention", lambda *a: None, [prompt], [], api_name="x", params=dict(prompt=prompt),
                       focus=dict(heatmap=[heat, sentence]))
    views = links.views(demo)
    assert links.focus_targets(demo) == {"attention": {"heatmap": ["x-heat", "x-sentence"]}}
    tab, values, notes = links.read_query({"tab": "attention", "focus": "heatmap", "prompt": "a"}, views)
    assert tab == "attention" and notes == [] and list(values.values()) == ["a"]  # focus is no component's value
    _, _, notes = links.read_query({"tab": "attention", "focus": "<b>lens</b>"}, views)
    assert notes == ["Ignored focus='<b>lens</b>': the attention tab has heatmap."]
    _, _, notes = links.read_query({"focus": "heatmap"}, views)
    assert "focus" in notes[0] and "tab=" in notes[0]  # a focus without its tab is explained, not dropped
    js = links.link_js(links.focus_targets(demo))
    assert '"heatmap": ["x-heat", "x-sentence"]' in js and '["present", "__theme"]' in js


def test_a_focus_target_needs_an_element_id():
    with gr.Blocks() as demo:
        with pytest.raises(ValueError, match="elem_id"):
            links.register(demo, "x", lambda: None, [], [], api_name="x", focus=dict(lens=gr.Plot()))


def test_every_lesson_link_names_a_figure_its_tab_has():
    """docs/lesson.md's links are read as the app reads them: each focus names a registered figure."""
    import re
    from pathlib import Path
    from urllib.parse import parse_qsl

    import app

    demo = _app_demo(app)
    text = (Path(__file__).resolve().parent.parent / "docs" / "lesson.md").read_text()
    lesson = text[text.index("## A 50-minute lesson"):]
    found = re.findall(r"`\?([^`]+)`", lesson)
    assert len(found) >= 10
    for query in found:
        tab, _, notes = links.read_query(dict(parse_qsl(query)), links.views(demo))
        assert tab is not None and notes == [], (query, notes)
        assert "focus" in dict(parse_qsl(query)), f"{query}: a lesson link lands on its figure (focus=…)"


def _app_demo(app):
    """Every tab of the app, built as app.py builds them (no server, no opening examples computed)."""
    from explorer.state import session

    session.load_default()
    with gr.Blocks() as demo:
        state = gr.State(None)
        with gr.Tabs():
            for label, tab_id, build in app.TABS:
                with gr.Tab(label, id=tab_id):
                    build(demo, state)
    return demo


def test_a_model_load_gives_the_lora_tab_the_new_models_layers_and_heads():
    """The LoRA tab's layer and head menus kept the default model's choices after another model was loaded."""
    from explorer.panels import lora
    from explorer.state import session
    from models import Decoder, ModelConfig

    with gr.Blocks() as demo:
        state = gr.State(None)
        lora.build_lora(demo, state)
        load = gr.Button().click(lambda s: s, [state], [state])
        links.after_model_load(demo, [load], "_test")
    view = links.views(demo)["lora"]
    fn = next(f for f in demo.fns.values() if f.api_name == "lora_defaults_test_0")
    layer, head = view.params["layer"], view.params["head"]
    config = ModelConfig(vocab_size=64, d_model=48, n_layers=7, n_heads=6, n_kv_heads=2, d_ff=96, max_seq_len=32)
    _, tokenizer, _ = session.get_model(None)
    loaded = session.set_model(session.new_state(), Decoder(config).eval(), tokenizer, "seven layers", "test")
    values = fn.fn(loaded)
    new_layer, new_head = values[fn.outputs.index(layer)], values[fn.outputs.index(head)]
    assert [v for _, v in new_layer.choices] == list(range(7)) and new_layer.value == 0
    assert [v for _, v in new_head.choices] == list(range(6)) and new_head.value == 0
