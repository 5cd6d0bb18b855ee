"""Lessons as data (lessons/*.toml, explorer/lessons.py): every deck is read and checked against the app's tabs,
link keys and figures; a malformed deck is refused with a sentence naming the step and the field; the numbers a
deck quotes equal what transformers computes on the same weights; a link's lesson step and model are read as the
header would read them."""
from __future__ import annotations

import gradio as gr
import numpy as np
import pytest
import torch

from explorer import lessons
from explorer.probes import lesson_numbers
from explorer.probes import questions as qs
from explorer.web import link_model, links

GOOD = {"title": "T", "steps": [{"title": "One", "tab": "attention", "focus": "heatmap", "text": "Hi {sink_share}.",
                                 "settings": {"layer": 0, "head": 1}, "question": "attention"}]}


def _deck(**change):
    step = {**GOOD["steps"][0], **change}
    return {"title": "T", "steps": [GOOD["steps"][0], {k: v for k, v in step.items() if v is not None}]}


def test_every_shipped_deck_reads_and_the_intro_is_the_lesson():
    decks = lessons.all_lessons()
    assert {"intro", "example"} <= set(decks)
    intro = decks["intro"]
    assert len(intro.steps) >= 12 and sum(s.minutes for s in intro.steps) <= 50
    assert [s.tab for s in intro.steps][:3] == ["walkthrough"] * 3
    assert {s.question for s in intro.steps} >= {"next_token", "attention", "knockout"}
    for lesson in decks.values():
        for step in lesson.steps:
            assert 1 <= step.text.count(". ") + 1 <= 5, step.title  # two to four sentences on the screen


def test_a_good_deck_parses_into_steps():
    lesson = lessons.parse("mine", GOOD)
    step = lesson.steps[0]
    assert (lesson.title, step.tab, step.focus, step.question) == ("T", "attention", "heatmap", "attention")
    assert step.settings == {"layer": "0", "head": "1"} and lessons.placeholders(step.text) == ["sink_share"]
    assert lessons.step_query(step) == {"tab": "attention", "layer": "0", "head": "1", "focus": "heatmap"}


@pytest.mark.parametrize("change, field", [
    ({"title": None}, "'title'"), ({"tab": 3}, "'tab'"), ({"text": ""}, "'text'"), ({"focus": None}, "'focus'"),
    ({"question": "poll"}, "'question'"), ({"settings": {"layer": True}}, "'settings'"),
    ({"minutes": -1}, "'minutes'"), ({"colour": "red"}, "'colour'"), ({"text": "a {b"}, "'text'"),
])
def test_a_malformed_step_is_refused_naming_the_step_and_the_field(change, field):
    with pytest.raises(ValueError, match="step 2") as err:
        lessons.parse("mine", _deck(**change))
    assert field in str(err.value) and "lessons/mine.toml" in str(err.value)


def test_a_malformed_file_or_deck_gets_a_sentence(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("title = \n")
    with pytest.raises(ValueError, match="bad.toml is not valid TOML"):
        lessons.read(bad)
    with pytest.raises(ValueError, match="needs steps"):
        lessons.parse("x", {"title": "T"})
    with pytest.raises(ValueError, match="lowercase"):
        lessons.parse("../etc", GOOD)


KEYS = {"attention": ["prompt", "layer", "head"], "walkthrough": ["prompt", "step"]}
FOCUS = {"attention": ["heatmap", "scores"], "walkthrough": ["step"]}


@pytest.mark.parametrize("change, words", [
    ({"tab": "nope"}, "'tab' is 'nope'"), ({"settings": {"colour": 1}}, "'settings' has 'colour'"),
    ({"focus": "grid"}, "'focus' is 'grid'"), ({"question": "knockout"}, "which the experiments tab asks"),
    ({"text": "{nothing}"}, "quotes {nothing}"),
])
def test_a_deck_naming_what_the_app_lacks_is_refused(change, words):
    lesson = lessons.parse("mine", _deck(**change))
    with pytest.raises(ValueError, match="step 2") as err:
        lessons.check_links(lesson, KEYS, FOCUS, lesson_numbers.NUMBERS)
    assert words in str(err.value)


def test_a_lesson_link_is_its_steps_link_with_the_model_and_projector_kept():
    intro = link_model.deck("intro")
    k = next(i for i, s in enumerate(intro.steps) if s.tab == "experiments")
    query, notes, found = link_model.expand_lesson({"lesson": "intro", "step": str(k + 1), "model": "m",
                                                    "present": "1", "layer": "9"})
    assert notes == [] and found == (intro, k)
    assert query == {**lessons.step_query(intro.steps[k]), "model": "m", "present": "1"}
    for step, words in [("0", "from 1 to"), ("x", "whole number"), (str(len(intro.steps) + 1), "from 1 to")]:
        query, notes, found = link_model.expand_lesson({"lesson": "intro", "step": step})
        assert query == {} and found is None and words in notes[0]
    query, notes, _ = link_model.expand_lesson({"lesson": "<b>nope</b>"})
    assert query == {} and "There is no lesson" in notes[0] and "intro" in notes[0]


@pytest.mark.slow
def test_every_deck_names_tabs_keys_figures_and_numbers_the_app_has():
    """Every tab built (about 10 s): each step's settings are accepted by its tab's link reader as they are."""
    import app
    from explorer.state import session

    with gr.Blocks() as demo:
        state = gr.State(session.new_state())
        for _, _, build in app.TABS:
            build(demo, state)
    views = links.views(demo)
    focus = {tab: list(names) for tab, names in links.focus_targets(demo).items()}
    for lesson in link_model.all_decks().values():
        lessons.check_links(lesson, links.link_keys(demo), focus, lesson_numbers.NUMBERS)
        for k, step in enumerate(lesson.steps):
            tab, values, notes = links.read_query({"lesson": lesson.name, "step": str(k + 1)}, views)
            assert tab == step.tab and notes == [], (lesson.name, k + 1, notes)
            assert len(values) == len(step.settings)


# --- the numbers, against transformers on the same weights ---------------------------------------------------

@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from transformers import AutoTokenizer, LlamaForCausalLM

    from models import load_pretrained
    from tests.conftest import make_tiny_checkpoint

    folder = make_tiny_checkpoint(tmp_path_factory.mktemp("deck-model"), seed=3, n_layers=2)
    ref = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    return load_pretrained(folder), ref, AutoTokenizer.from_pretrained(str(folder))


PROMPT = "Tom gave the red ball to Anna. Anna gave the red ball to Tom."
REPEATED = "x the cat sat on the mat the cat sat on the mat"


def _ids(tok, text):
    return tok(text)["input_ids"]


def test_attention_numbers_equal_transformers_eager_weights(pair):
    model, ref, tok = pair
    ids = _ids(tok, PROMPT)
    with torch.no_grad():
        att = ref(torch.tensor([ids]), output_attentions=True).attentions[1][0, 2].double().numpy()  # (T, T)
    settings = {"prompt": PROMPT, "layer": "1", "head": "2"}
    T = len(ids)
    assert lesson_numbers.sink_share(model, tok, settings) == f"{att[1:, 0].mean():.2f}"
    assert lesson_numbers.previous_share(model, tok, settings) == f"{np.mean([att[i, i - 1] for i in range(1, T)]):.2f}"


def test_next_token_numbers_equal_transformers_softmax(pair):
    model, ref, tok = pair
    ids = _ids(tok, PROMPT)
    with torch.no_grad():
        p = torch.softmax(ref(torch.tensor([ids])).logits[0, -1].double(), -1)
    best = int(torch.argmax(p))
    assert lesson_numbers.top_prob(model, tok, {"prompt": PROMPT}) == f"{float(p[best]):.2f}"
    assert lesson_numbers.top_token(model, tok, {"prompt": PROMPT}) == f"“{tok.decode([best])}”"


def _repeated_part_losses(ref, ids, layer, head):
    """The repeated second half's mean loss, with the head's output zeroed as o_proj's input columns (an
    independent road to what ``ablate_heads`` does at the hook point), before and after."""
    n = 0
    for span in range(len(ids) // 2, 0, -1):
        if ids[-2 * span:-span] == ids[-span:]:
            n = span
            break
    assert n >= 3

    def loss():
        with torch.no_grad():
            logits = ref(torch.tensor([ids])).logits[0].double()
        per = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]), reduction="none")
        return float(per[len(ids) - n - 1:].mean()), float(per.mean())

    before = loss()
    attn = ref.model.layers[layer].self_attn
    D = attn.head_dim
    saved = attn.o_proj.weight.detach().clone()
    with torch.no_grad():
        attn.o_proj.weight[:, head * D:(head + 1) * D] = 0
    after = loss()
    with torch.no_grad():
        attn.o_proj.weight.copy_(saved)
    return before, after


def test_the_knockout_numbers_and_question_score_the_repeated_part(pair):
    model, ref, tok = pair
    ids = _ids(tok, REPEATED)
    (rb, wb), (ra, wa) = _repeated_part_losses(ref, ids, 1, 2)
    settings = {"prompt": REPEATED, "heads": "1.2"}
    assert lesson_numbers.repeat_before(model, tok, settings) == f"{rb:.3f}"
    assert lesson_numbers.repeat_after(model, tok, settings) == f"{ra:.3f}"
    assert lesson_numbers.repeat_change(model, tok, settings) == f"{ra - rb:+.3f}"
    q = qs.knockout_effect(model, ids, [(1, 2)])
    hit = next(k for k, (lo, hi, _) in enumerate(qs.KNOCKOUT_BINS) if lo <= ra - rb < hi)
    assert q.values[hit] == 1.0 and "repeated part" in q.text and f"{ra - rb:+.3f}" in q.answer
    plain = qs.knockout_effect(model, _ids(tok, PROMPT), [(1, 2)])  # nothing repeated at the end: the whole prompt
    assert "repeated" not in plain.text


def test_fill_writes_each_number_and_says_when_one_cannot_be_computed(pair):
    model, _, tok = pair
    text = "{n_layers} layers; {repeat_before}; {{braces}}; {top_token}"
    out = lesson_numbers.fill(text, model, tok, {"prompt": PROMPT}, escape=lambda s: s.upper())
    assert out.startswith("2 layers; (NOT COMPUTABLE ON THIS MODEL:") and "{braces}" in out


# --- a link's model ----------------------------------------------------------------------------------------------

def test_a_link_model_that_cannot_load_keeps_the_page_model_and_says_so(monkeypatch):
    from explorer.state import session

    state = session.new_state()
    for wanted, words in [("../../etc", "was not loaded"), ("owner/" + "x" * 300, "longer than")]:
        out, said, loaded = link_model.ensure_model(state, wanted)
        assert not loaded and words in said and link_model.page_model_id(out) == "default"
    assert link_model.ensure_model(state, "default") == (state, "", False)
    assert link_model.ensure_model(state, "") == (state, "", False)


def test_docs_lesson_lists_the_intro_deck_as_it_is():
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "lesson.md").read_text()
    listed = text[text.index("<!-- deck:intro -->\n") + len("<!-- deck:intro -->\n"):text.index("<!-- /deck:intro -->")]
    assert listed == lessons.lesson_markdown(link_model.deck("intro"))
    assert text.index("## The lesson as a deck") < text.index("## Links")  # the page leads with the deck
