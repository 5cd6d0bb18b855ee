"""Each listener declares its lane where it is registered (explorer/web/groups.py); an app with a server
listener that declares none is refused when it is built, naming it."""
from __future__ import annotations

import gradio as gr
import pytest

from explorer.web import groups, serving
from explorer.web.groups import CLASS, GENERATION, MEASURE, VIEW, lane


def _handler(text):
    return text.upper()


def _blocks(*, undeclared: bool):
    with gr.Blocks() as demo:
        box = gr.Textbox()
        gr.Button().click(_handler, [box], [box], api_name="a_view", **lane(VIEW))
        gr.Button().click(_handler, [box], [box], api_name="a_sweep", **lane(MEASURE))
        gr.Button().click(lambda t: _handler(t), [box], [box], api_name="a_wrapper", **lane(VIEW, _handler))
        gr.Button().click(None, [box], [box], js="(t) => t", api_name="in_the_page")  # runs nothing on the server
        if undeclared:
            box.submit(_handler, [box], [box], api_name="forgot_its_lane")
            box.input(_handler, [box], [box], api_name="wrong_limit", concurrency_id="measure", concurrency_limit=3)
    demo.queue(**serving.QUEUE)
    return demo


def test_a_listener_without_a_lane_fails_the_build_naming_it():
    demo = _blocks(undeclared=True)
    assert groups.undeclared(demo) == ["forgot_its_lane", "wrong_limit"]
    with pytest.raises(ValueError, match=r"2 listener\(s\) name no lane: forgot_its_lane, wrong_limit\. Register"):
        serving.apply(demo)  # the check comes first: nothing else is set up


def test_declared_listeners_pass_and_each_runs_in_its_lane():
    demo = _blocks(undeclared=False)
    assert groups.undeclared(demo) == []
    groups.check_lanes(demo)
    assert [groups.lane_of(demo, n) for n in ("a_view", "a_sweep", "a_wrapper")] == ["view", "measure", "view"]
    with pytest.raises(KeyError):
        groups.lane_of(demo, "in_the_page")  # no server function: no lane


def test_the_lanes_and_their_limits():
    assert lane(MEASURE) == {"concurrency_id": "measure", "concurrency_limit": 1}
    assert lane(GENERATION) == {"concurrency_id": "generation", "concurrency_limit": 2}
    assert lane(CLASS)["concurrency_limit"] > 1 and VIEW.limit > 1
    assert groups.LONG_GROUPS == {"measure", "generation", "finetune"}
    assert lane(VIEW) == {"concurrency_limit": VIEW.limit}  # Gradio's default group: the function's own


@pytest.fixture(scope="module")
def built_app(app_demo):
    """The whole app as the session's app fixture built it (``app.build_demo()``)."""
    return app_demo


def test_every_listener_of_the_app_declares_its_lane(built_app):
    from explorer.web import gradio_adapter as adapter

    assert groups.undeclared(built_app) == []
    lanes = {name: groups.lane_of(built_app, name) for name in adapter.server_events(built_app).values()}
    assert len(lanes) > 200 and set(lanes.values()) == {"view", "generation", "measure", "finetune", "train", "play", "class"}


@pytest.mark.parametrize("api_name, expected", [
    ("generate_step", "view"),  # the step slider shows a stored step: never behind two generations
    ("generate", "generation"), ("generate_submit", "generation"), ("generate_example", "generation"),
    ("memory_compare", "measure"), ("formats", "measure"), ("formats_example", "measure"),
    ("experiment_sweep", "measure"), ("lora_finetune", "finetune"), ("training_live", "train"), ("memory_trace_play", "play"),
    ("class_csv_walkthrough", "class"), ("class_tally_attention", "class"), ("kv_calculator", "view"), ("attention_example", "view"), ("load_model", "view"),
    ("clear_formats_after_load_0_0", "view"),  # after a model load: a view, never a long job
])
def test_each_listener_runs_in_the_lane_its_work_needs(built_app, api_name, expected):
    assert groups.lane_of(built_app, api_name) == expected


def test_the_listeners_that_give_a_client_a_model_of_its_own_get_its_request(built_app):
    """A model load or a fine-tune counts against the client address's share (explorer.state.private_models):
    their handlers take the ``gr.Request`` Gradio passes (explorer.web.clients.with_client)."""
    import inspect

    from explorer.web import gradio_adapter as adapter

    names = set(adapter.server_events(built_app).values())
    wanted = {"load_model", "load_model_submit", "model_reset", "header_load_model", "lora_finetune",
              "training_knock_out"} & names
    assert {"load_model", "header_load_model", "lora_finetune"} <= wanted
    for name in wanted:
        params = inspect.signature(adapter.event_function(built_app, name)).parameters
        assert params["client_request"].annotation is gr.Request, name
