"""Every tab's opening example arrives inside the page (explorer/opening.py): computed once at start-up by the code
shown, equal to what the same event answers when called now, and a page opened without a link sends no event.
A link runs its own tab's trigger and view only."""
from __future__ import annotations

import json
import re
import urllib.request

import pytest

from explorer.bench.page_client import page_plan


@pytest.fixture(scope="module")
def config(app_url):
    with urllib.request.urlopen(app_url + "config", timeout=30) as r:
        return json.load(r)


def _components(config):
    return {c["id"]: c for c in config["components"]}


# What may differ between the start-up answer and the same event now: a measured time, and whether the forward
# pass was run or reused from the (now warm) cache. Everything else must be equal.
_TIMED = re.compile(r"\d[\d,.]*\s?(ms|s|µs)\b|reused the forward already run|one forward with every hook")


def _untimed(value):
    return _TIMED.sub("#", value) if isinstance(value, str) else value


def _dep(config, api_name):
    return next(d for d in config["dependencies"] if d.get("api_name") == api_name)


def test_a_page_without_a_link_sends_no_event_to_the_server(config):
    assert page_plan(config).first == []
    assert page_plan(config, "present=1&__theme=dark").first == []
    loads = [d for d in config["dependencies"] if any(t[1] == "load" for t in d["targets"])]
    assert loads and all(not d["backend_fn"] for d in loads)  # only the page's own JS runs on load


def test_a_link_runs_its_tabs_trigger_then_that_tabs_view_only(config):
    plan = page_plan(config, "tab=attention&layer=1&head=2")
    assert [plan.api_names[f] for f in plan.first] == ["read_link_attention"]
    chained = [plan.api_names[f] for f, _ in plan.followers[plan.first[0]]]
    assert chained == ["attention_example"]
    assert plan.events == 3  # the link, the view, the view's naive-vs-fused follow-up
    unknown = page_plan(config, "tab=nope&layer=1")
    assert [unknown.api_names[f] for f in unknown.first] == ["read_link"]
    assert not unknown.followers.get(unknown.first[0])


@pytest.mark.parametrize("api_name", ["attention_example", "walkthrough_example", "rope_example",
                                      "encoder_decoder_example", "model_card", "kv_calculator_example",
                                      "memory_budget"])
def test_each_opening_example_in_the_page_equals_the_events_answer_now(config, client, api_name):
    """The page's initial values of the event's outputs are what the event answers now from the page's own
    input values (plots: the same figure JSON; texts and tables: the same value, but for measured times)."""
    components = _components(config)
    dep = _dep(config, api_name)
    inputs = [components[i]["props"].get("value") for i in dep["inputs"] if components[i]["type"] != "state"]
    answer = client.predict(*inputs, api_name="/" + api_name)
    answer = list(answer) if isinstance(answer, (tuple, list)) and len(dep["outputs"]) > 1 else [answer]
    outputs = [i for i in dep["outputs"] if components[i]["type"] != "state"]
    assert len(answer) == len(outputs)
    compared = 0
    for i, got in zip(outputs, answer):
        c = components[i]
        page = c["props"].get("value")
        if c["type"] == "plot":
            assert page and page.get("plot"), f"{api_name}: plot {i} has no opening figure in the page"
            assert json.loads(page["plot"]) == json.loads(got["plot"]), f"{api_name}: plot {i}"
            compared += 1
        elif c["type"] in ("markdown", "textbox", "dataframe", "highlightedtext", "json", "label", "html"):
            if isinstance(got, dict) and "__type__" in got:
                got = got.get("value")
            assert _untimed(page) == _untimed(got), f"{api_name}: {c['type']} {i}"
            compared += 1
    assert compared, f"{api_name}: nothing compared"


def test_the_page_is_sent_gzipped_to_a_browser_that_accepts_it_and_reads_the_same(app_url):
    import httpx

    plain = httpx.get(app_url, headers={"Accept-Encoding": "identity"}, timeout=60)
    zipped = httpx.get(app_url, headers={"Accept-Encoding": "gzip, deflate"}, timeout=60)
    again = httpx.get(app_url, headers={"Accept-Encoding": "identity"}, timeout=60)
    assert plain.status_code == zipped.status_code == again.status_code == 200
    assert zipped.headers.get("content-encoding") == "gzip" and "content-encoding" not in again.headers
    assert int(zipped.headers["content-length"]) < len(plain.content) / 3
    assert zipped.content == plain.content == again.content  # httpx un-gzips: the same page


def test_the_page_says_its_opening_examples_were_computed_at_start_up(config):
    about = next(c for c in config["components"] if c.get("props", {}).get("elem_id") == "glossary")
    label = about["props"]["label"]
    assert re.search(r"each tab opens on an example computed at start-up \(\d\d:\d\d UTC\)", label), label
    assert "what you change is computed now" in label


@pytest.mark.slow  # builds and fills in a second whole app
def test_python_app_py_answers_first_then_fills_in_its_first_tab_then_the_rest(served_model_dir, model_root,
                                                                                monkeypatch):
    """``python app.py`` builds with ``openings_later``: the page it serves at once says the examples are being
    computed and carries no figure (never a stored one); the first tab's examples come first, then every tab's,
    equal to what the synchronous build puts in its page; the status line then hides."""
    import app
    from explorer.bench.server import computed_page, openings_pending
    from explorer.web import serving

    monkeypatch.setenv("EXPLORER_DEFAULT_MODEL", str(served_model_dir))
    monkeypatch.setenv("EXPLORER_MODEL_ROOT", str(model_root))
    stages = []
    monkeypatch.setattr(serving, "refresh_page", lambda demo: stages.append(demo.get_config_file()))
    demo = app.build_demo(openings_later=True)
    before = demo.get_config_file()
    assert openings_pending(before) and not computed_page(before)
    assert not any(c["type"] == "plot" and c["props"].get("value") for c in before["components"])
    status = next(c for c in before["components"] if c["props"].get("elem_id") == "opening-status")
    assert status["props"]["value"] == serving.COMPUTING_ALL
    assert all(not d["backend_fn"] for d in before["dependencies"] if any(t[1] == "load" for t in d["targets"]))
    import gc

    gc.unfreeze()
    serving.start_openings(demo, *app.OPENING_PLACES.pop(demo)).join(timeout=600)
    assert len(stages) == 2
    assert gc.get_freeze_count() > 0  # what start-up made is left out of full collections from now on
    first, done = stages
    assert computed_page(first) and openings_pending(first)
    assert next(c for c in first["components"] if c["props"].get("elem_id") == "opening-status")["props"][
        "value"] == serving.COMPUTING_REST
    assert computed_page(done) and not openings_pending(done)
    plots = [c for c in done["components"] if c["type"] == "plot" and c["props"].get("value")]
    first_plots = [c for c in first["components"] if c["type"] == "plot" and c["props"].get("value")]
    assert len(first_plots) < len(plots)  # the other tabs' figures came in the second stage
    for elem_id in ("experiments-sweep", "experiments-circuit", "walkthrough-step"):
        assert any(c["props"].get("elem_id") == elem_id for c in plots), elem_id


def test_a_failing_opening_is_named_on_the_page_and_the_others_still_computed(monkeypatch):
    import gradio as gr

    from explorer.bench.server import openings_pending
    from explorer.web import gradio_adapter as adapter
    from explorer.web import serving

    def boom():
        raise RuntimeError("broken on purpose")

    with gr.Blocks() as demo:
        status = gr.Markdown(serving.COMPUTING_ALL, elem_id="opening-status")
        with gr.Tabs():
            with gr.Tab("one") as first:
                a = gr.Markdown(elem_id="a")
            with gr.Tab("two"):
                b, c = gr.Markdown(elem_id="b"), gr.Markdown(elem_id="c")
        demo.load(lambda: "second, computed", None, c, api_name="second_ok")
        demo.load(boom, None, b, api_name="second_broken")
        demo.load(lambda: "first, computed", None, a, api_name="first_ok")
    pages = []
    monkeypatch.setattr(serving, "refresh_page", lambda d: pages.append(d.get_config_file()))
    serving._LATER[demo] = adapter.page_load_events(demo)
    serving.start_openings(demo, first, status).join(timeout=60)
    values = {x["props"].get("elem_id"): x["props"].get("value") for x in pages[-1]["components"]}
    assert values["a"] == "first, computed" and values["c"] == "second, computed" and not values["b"]
    assert values["opening-status"].startswith("⚠ 1 opening example(s) could not be computed (second_broken;")
    # the first refresh came after the first tab's example, before the other tab's
    first_values = {x["props"].get("elem_id"): x["props"].get("value") for x in pages[0]["components"]}
    assert first_values["a"] == "first, computed" and not first_values["c"]
    assert openings_pending(pages[0])
    with pytest.raises(RuntimeError, match="second_broken"):
        openings_pending(pages[-1])


@pytest.mark.slow  # Measure runs the whole formats measurement
def test_the_roofline_opens_on_the_shipped_model_measured_at_start_up_and_measure_measures_anew(config, client):
    """The Weight formats section opens on a roofline computed at start-up by ``_measure`` (never a stored one),
    saying which model and when; Measure then measures the loaded model itself, without that sentence."""
    components = _components(config)
    dep = _dep(config, "formats_example")
    by_type = {components[i]["type"]: components[i] for i in dep["outputs"]}
    plot = by_type["plot"]["props"].get("value")
    assert plot and "read per decoded token" in plot["plot"]
    notes = by_type["markdown"]["props"]["value"]
    assert re.search(r"Opening example: the shipped default model \(.+\), measured when the app started "
                     r"\(\d\d:\d\d UTC\)", notes), notes
    assert "Memory read bandwidth" in notes and "Press **Measure** to measure the loaded model now" in notes
    prompt = next(components[i]["props"]["value"] for i in dep["inputs"] if components[i]["type"] == "textbox")
    answer = client.predict(prompt, api_name="/formats")
    measured_notes = answer[3]
    assert "Memory read bandwidth" in measured_notes and "Opening example" not in measured_notes


def test_after_a_model_load_the_roofline_of_the_previous_model_is_cleared_and_names_the_new_one(config):
    """The formats section measures only on request: a model load clears its opening example (the shipped model's)
    from the screen and says which model Measure would measure now."""
    from explorer.panels.formats import formats_after_load
    from explorer.state import session

    followers = [d for d in config["dependencies"]
                 if (d.get("api_name") or "").startswith("clear_formats_after_load")]
    assert followers  # each a view, never a long job: tests/test_lanes.py
    loads = {_dep(config, name)["id"] for name in ("load_model", "load_model_submit", "model_reset")}
    assert {d["trigger_after"] for d in followers} >= loads and all(d["trigger_only_on_success"] for d in followers)
    assert set(followers[0]["outputs"]) == set(_dep(config, "formats_example")["outputs"])
    state = session.new_state()
    table, top, roofline, notes, summary, numbers = formats_after_load(state)
    assert table == [] and top == [] and roofline is None and numbers is None
    assert f"measure **{session.default_model_name()}** now" in notes


# A Python format field left in a sentence ("{room_store.ROOM_MINUTES:g}"): a string that lost its f prefix
_FIELD = re.compile(r"(?<!%)\{[A-Za-z_][\w.]*(?:\[[^\]]*\])?(?:![rsa])?(?::[^{}]*)?\}")


def test_no_text_on_the_page_shows_an_unfilled_format_field(config):
    def texts(value):
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for v in value.values():
                yield from texts(v)
        elif isinstance(value, list):
            for v in value:
                yield from texts(v)

    assert _FIELD.search("Rooms last {room_store.ROOM_MINUTES:g} minutes")  # the check sees what it looks for
    found = [(c.get("type"), m.group(0)) for c in config["components"] if c.get("type") != "plot"
             for text in texts(c.get("props", {})) for m in _FIELD.finditer(text)]
    assert not found, found
