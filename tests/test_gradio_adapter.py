"""explorer/web/gradio_adapter: every Gradio internal it uses has the shape it expects (these tests fail when a
Gradio upgrade changes one), and each of its functions does on a small Blocks what the app relies on."""
from __future__ import annotations

import asyncio
import functools
import os
import types

import gradio as gr
import pytest

from tests.tiers import fast_first
from gradio.block_function import BlockFunction
from gradio.blocks import Blocks
from gradio.queueing import Queue
from gradio.state_holder import SessionState, StateHolder

from explorer.web import gradio_adapter as adapter


def test_the_installed_gradio_has_every_shape_the_adapter_uses():
    assert adapter.shape_problems() == []


def test_the_space_and_the_requirements_pin_the_gradio_the_adapter_was_tested_with():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    assert f"gradio=={adapter.TESTED_GRADIO}\n" in (root / "requirements.txt").read_text()
    assert re.search(rf"^sdk_version: {re.escape(adapter.TESTED_GRADIO)}$", (root / "README.md").read_text(), re.M)


async def _push_without_username(self, body, request):
    return True, "", "success"


def _preprocess_not_async(self, block_fn, inputs, state, explicit_call=False):
    return inputs


async def _process_api_renamed(self, fn, data, state=None):
    return {}


def _init_dropping(cls, attr):
    init = cls.__init__

    def made_without(self, *args, **kwargs):
        init(self, *args, **kwargs)
        delattr(self, attr)
    return made_without


def _grouped_by_name(cls):
    init = cls.__init__

    def made_grouped_by_name(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.concurrency_id = str(self.name)
    return made_grouped_by_name


def _holder_getitem_renamed(self, key):
    return None


def _sets_no_holder(self, blocks):
    self.blocks = blocks


def _queue_kept_elsewhere(self, **kwargs):
    self.the_queue = Queue(live_updates=False, concurrency_count=1, update_intervals=1, max_size=None, blocks=self)
    return self


def _plot_copies(self, value):
    return None if value is None else value.model_copy()


@pytest.mark.parametrize("owner, name, replacement, named", fast_first([
    (Queue, "push", _push_without_username, "Queue.push takes"),
    (Blocks, "preprocess_data", _preprocess_not_async, "Blocks.preprocess_data is no longer a coroutine"),
    (Blocks, "process_api", _process_api_renamed, "Blocks.process_api takes"),
    (StateHolder, "__getitem__", _holder_getitem_renamed, "StateHolder.__getitem__ takes"),
    (Queue, "__init__", _init_dropping(Queue, "pending_event_ids_session"), "Queue has no attribute pending_event_ids"),
    (Queue, "__init__", _init_dropping(Queue, "event_ids_to_events"), "Queue has no attribute event_ids_to_events"),
    (StateHolder, "set_blocks", _sets_no_holder, "Blocks has no attribute state_holder"),
    (Blocks, "queue", _queue_kept_elsewhere, "Blocks.queue() no longer keeps the queue"),
    (gr.Plot, "postprocess", _plot_copies, "gr.Plot no longer passes a PlotData"),
    (BlockFunction, "__init__", _init_dropping(BlockFunction, "targets"), "BlockFunction has no attribute targets"),
    (BlockFunction, "__init__", _init_dropping(BlockFunction, "trigger_after"), "trigger_after"),
    (StateHolder, "__init__", _init_dropping(StateHolder, "time_last_used"), "StateHolder has no attribute time_last"),
    (BlockFunction, "__init__", _grouped_by_name(BlockFunction), "is no longer in its function's own group"),
], 4, unpack=True))
def test_a_changed_shape_is_named_and_stops_the_app(monkeypatch, owner, name, replacement, named):
    monkeypatch.setattr(owner, name, replacement)
    problems = adapter.shape_problems()
    assert any(named in p for p in problems), problems
    with pytest.raises(RuntimeError, match=adapter.TESTED_GRADIO.replace(".", r"\.")):
        adapter.check_gradio()


def test_another_version_with_every_shape_intact_gets_a_warning_naming_the_tested_one(monkeypatch):
    monkeypatch.setattr(gr, "__version__", "6.99.0")
    with pytest.warns(UserWarning, match=r"6\.99\.0.*tested with 6\.31\.0"):
        adapter.check_gradio()


# --- each function on a small Blocks -----------------------------------------------------------------------

def _tiny():
    """A page-load event writing a text and a state, a dropdown widened by the event chained after it, and a
    button's event."""
    with gr.Blocks() as demo:
        state = gr.State({"n": 0})
        choice = gr.Dropdown(["a", "b"], value="a")
        out = gr.Markdown()
        more = gr.Markdown()

        def show(c, s):
            return f"chose {c}", {"n": s["n"] + 1}

        first = demo.load(show, [choice, state], [out, state], api_name="show")
        first.then(lambda c: gr.Dropdown(choices=["a", "b", "c"], value="c"), [choice], [choice], api_name="widen")
        gr.Button().click(show, [choice, state], [more, state], api_name="other")
        gr.Button().click(show, [choice, state], [more, state], api_name="long_job", concurrency_id="long",
                          concurrency_limit=1)
        demo.load(None, js="() => {}", api_name="front_end_only")
    demo.queue()
    return demo, types.SimpleNamespace(state=state, choice=choice, out=out, more=more)


def _by_name(demo):
    return {name: i for i, name in adapter.server_events(demo).items()}


def test_events_their_chain_and_the_page_load():
    demo, _ = _tiny()
    ids = _by_name(demo)
    assert set(ids) == {"show", "widen", "other", "long_job"}  # the front-end-only load runs nothing on the server
    assert adapter.page_load_events(demo) == [ids["show"]]
    assert adapter.events_after(demo, [ids["show"]]) == [ids["show"], ids["widen"]]
    assert adapter.event_name(demo, ids["other"]) == "other"


def test_answers_written_into_the_page_and_page_loads_detached():
    demo, c = _tiny()
    ids = _by_name(demo)
    for i in adapter.events_after(demo, adapter.page_load_events(demo)):
        asyncio.run(adapter.answer_into_page(demo, i))
    assert c.out.value == "chose a"
    assert c.state.value == {"n": 1}
    assert c.choice.value == "c" and [v for _, v in c.choice.choices] == ["a", "b", "c"]
    assert [v for _, v in c.choice.constructor_args["choices"]] == ["a", "b", "c"]  # a later update starts here
    config = demo.get_config_file()
    props = {comp["id"]: comp["props"] for comp in config["components"]}
    assert props[c.out._id]["value"] == "chose a" and props[c.choice._id]["value"] == "c"

    adapter.detach_page_loads(demo, adapter.page_load_events(demo))
    assert adapter.page_load_events(demo) == []
    loads = [d for d in demo.get_config_file()["dependencies"] if any(t[1] == "load" for t in d["targets"])]
    assert loads and all(not d["backend_fn"] for d in loads)
    assert ids["show"] in adapter.server_events(demo)  # still callable by name


def test_set_initial_takes_a_value_or_an_update():
    md = gr.Markdown("before", render=False)
    adapter.set_initial(md, "after")
    assert md.get_config()["value"] == "after"
    acc = gr.Accordion("closed", render=False)
    adapter.set_initial(acc, gr.update(label="relabelled"))
    assert acc.get_config()["label"] == "relabelled" and acc.constructor_args["label"] == "relabelled"


def test_a_value_gradio_refuses_is_answered_with_the_sentence():
    demo, _ = _tiny()
    ids = _by_name(demo)
    said = []

    def say(api_name, exc):
        said.append((api_name, str(exc)))
        return f"{api_name} got a value it does not accept"

    adapter.sentence_for_bad_values(demo, say)
    with pytest.raises(gr.Error, match="other got a value it does not accept"):
        asyncio.run(demo.process_api(ids["other"], ["not a choice", None], state=SessionState(demo),
                                     in_event_listener=False))
    assert said and said[0][0] == "other" and "not a choice" in said[0][1]
    answer = asyncio.run(demo.process_api(ids["other"], ["b", None], state=SessionState(demo),
                                          in_event_listener=False))
    assert answer["data"][0] == "chose b"


def test_one_session_holds_at_most_cap_events_and_others_go_on():
    demo, _ = _tiny()
    queue = adapter.queue_of(demo)
    pushed, joined = [], []

    async def push(body, request, username):
        pushed.append(body.session_hash)
        return True, "event-id", "success"

    queue.push = push  # what the adapter wraps: Gradio's own push is not started here
    adapter.cap_per_session(demo, 2, "too many", on_join=joined.append)
    queue.pending_event_ids_session["busy"] = {"e1", "e2"}
    queue.pending_event_ids_session["calm"] = {"e3"}
    fn_index = next(i for i, fn in demo.fns.items() if fn.fn is not None)
    body = functools.partial(types.SimpleNamespace, fn_index=fn_index)
    assert asyncio.run(queue.push(body(session_hash="busy"), None, None)) == (False, "too many", "queue_full")
    assert asyncio.run(queue.push(body(session_hash="calm"), None, None)) == (True, "event-id", "success")
    assert pushed == ["calm"] and joined == ["busy", "calm"]
    queue.event_ids_to_events.update({"e1": object()})  # e2 finished, its answer never read
    assert adapter.events_held(demo, "busy") == 1 and adapter.events_held(demo, "nobody") == 0


def test_the_queue_is_the_one_demo_queue_made():
    demo, _ = _tiny()
    demo.queue(max_size=17)
    assert adapter.queue_of(demo).max_size == 17
    with pytest.raises(RuntimeError, match=r"demo\.queue\(\)"):
        adapter.queue_of(types.SimpleNamespace())


def test_the_timing_summary_frequency_is_gradios_environment_variable(monkeypatch):
    from explorer.web import serving

    assert os.environ["GRADIO_ANALYTICS_CACHE_FREQUENCY"] == str(serving.ANALYTICS_EVERY)  # set when it is imported
    demo, _ = _tiny()
    assert adapter.queue_of(demo).ANAYLTICS_CACHE_FREQUENCY == serving.ANALYTICS_EVERY
    monkeypatch.setenv("GRADIO_ANALYTICS_CACHE_FREQUENCY", "7")  # an operator's own setting wins
    demo, _ = _tiny()
    assert adapter.queue_of(demo).ANAYLTICS_CACHE_FREQUENCY == 7


def test_a_lane_declared_at_registration_is_the_one_the_queue_uses():
    from explorer.web.groups import MEASURE, VIEW, lane

    with gr.Blocks() as demo:
        box = gr.Textbox()
        gr.Button().click(str, [box], [box], api_name="sweep", **lane(MEASURE))
        gr.Button().click(str.upper, [box], [box], api_name="view", **lane(VIEW))
    demo.queue(default_concurrency_limit=9)
    ids = _by_name(demo)
    queue = adapter.queue_of(demo)
    for i in ids.values():
        queue.create_event_queue_for_fn(demo.fns[i])
    assert queue.event_queue_per_concurrency_id["measure"].concurrency_limit == 1
    group, limit, fn = adapter.event_lane(demo, ids["view"])
    assert fn is str.upper and limit == VIEW.limit
    assert queue.event_queue_per_concurrency_id[group].concurrency_limit == VIEW.limit  # its own group, its limit


def test_sessions_read_and_forgotten():
    demo, c = _tiny()
    StateHolder().set_blocks(demo)  # what launch() does: a new holder
    assert adapter.sessions_last_used(demo) == {}  # Gradio keeps no session yet
    value = adapter.fresh_state_value(demo, "s1", c.state._id)
    assert value == {"n": 0}
    value["n"] = 5  # the session's own copy
    assert adapter.session_values(demo, "s1") == {c.state._id: {"n": 5}}
    assert adapter.fresh_state_value(demo, "s1", c.state._id) == {"n": 5}
    assert set(adapter.sessions_last_used(demo)) == {"s1"}
    adapter.queue_of(demo).pending_event_ids_session["s1"] = {"e"}
    adapter.forget_session(demo, "s1")
    assert adapter.sessions_last_used(demo) == {} and adapter.session_values(demo, "s1") == {}
    assert adapter.events_held(demo, "s1") == 0
    assert adapter.fresh_state_value(demo, "s1", c.state._id) == {"n": 0}  # back afresh


def test_the_function_an_event_runs_and_what_an_update_carries():
    demo, _ = _tiny()
    assert adapter.event_function(demo, "other")("b", {"n": 1}) == ("chose b", {"n": 2})
    with pytest.raises(KeyError, match="no endpoint /nope"):
        adapter.event_function(demo, "nope")
    update = gr.Dropdown(choices=["x", "y"], value="y", render=False)
    assert adapter.update_props(update)["value"] == "y" and "choices" in adapter.update_props(update)


def test_a_wrapper_given_its_functions_default_group_waits_with_its_events():
    def handler(x):
        return x

    def wrapper(x):
        return handler(x)

    with gr.Blocks() as demo:
        box = gr.Textbox()
        gr.Button().click(handler, [box], [box], api_name="own")
        gr.Button().click(wrapper, [box], [box], api_name="wrapped", concurrency_id=adapter.default_group(handler))
        gr.Button().click(wrapper, [box], [box], api_name="alone")
    ids = _by_name(demo)
    assert adapter.event_lane(demo, ids["own"])[0] == adapter.event_lane(demo, ids["wrapped"])[0]
    assert adapter.event_lane(demo, ids["alone"])[0] != adapter.event_lane(demo, ids["own"])[0]


# --- the queue outlives any client (issue 31) -------------------------------------------------------------------

def test_the_message_books_drop_an_idle_session_before_one_with_events_pending():
    """Gradio's books (an LRU of 2,000 sessions) would drop the oldest session even with an event still queued;
    ours drop the oldest idle one, and fall back to Gradio's choice only when every session has one pending."""
    pending = {"s0": {"e0"}, "s2": {"e2"}}
    books = adapter.SessionBooks(3, pending)
    for key in ("s0", "s1", "s2"):
        books[key] = key
    books["s3"] = "s3"
    assert list(books) == ["s0", "s2", "s3"]  # s1 had nothing pending
    pending["s3"] = {"e3"}
    books["s4"] = "s4"  # every session busy: the oldest goes, as in Gradio
    assert list(books) == ["s2", "s3", "s4"]


def test_a_message_for_a_forgotten_session_drops_its_events_instead_of_stopping_the_queue():
    demo, _ = _tiny()
    queue = adapter.queue_of(demo)
    size = adapter.keep_sessions_with_events(demo)
    assert size == adapter.session_books_size(demo) == 2000  # Gradio 6.31's LRU
    assert queue.max_size <= size // 2
    fn = demo.fns[_by_name(demo)["other"]]
    from gradio.queueing import Event

    event = Event("gone", fn, None, None)
    cleaned = []

    async def clean_events(*, session_hash=None, event_id=None):
        cleaned.append(session_hash)

    queue.clean_events = clean_events

    async def send():
        queue.send_message(event, types.SimpleNamespace(event_id=None))  # Gradio's own raises KeyError here
        await asyncio.sleep(0)

    asyncio.run(send())
    assert event.alive is False and cleaned == ["gone"]


def test_a_sessions_component_configurations_made_on_demand_equal_gradios_eager_ones():
    demo, c = _tiny()
    eager = SessionState(demo)
    adapter.configs_on_demand(demo)
    lazy = demo.state_holder["lazy"]  # a new session, as a request's first event makes it
    assert dict.__len__(lazy.config_values) == 0  # nothing copied when the session starts
    assert lazy.config_values[c.out._id] == eager.config_values[c.out._id]
    ids = _by_name(demo)
    for state in (eager, lazy):  # an event that updates a component, run as a request is
        asyncio.run(demo.process_api(demo.fns[ids["widen"]], ["a"], state=state))
    assert lazy.config_values[c.choice._id] == eager.config_values[c.choice._id]
    assert lazy.config_values[c.choice._id]["props"]["choices"] == eager.config_values[c.choice._id]["props"]["choices"]
    assert dict(lazy.config_values.items()) == dict(eager.config_values.items())  # Gradio's deep-link copy: all
    other, _ = _tiny()
    assert dict.__len__(other.state_holder["s"].config_values) > 0  # another Blocks keeps Gradio's own way
    assert dict.__len__(SessionState(demo).config_values) > 0  # no class-wide change: only demo's holder's sessions
    StateHolder().set_blocks(demo)  # launch makes a new holder: eager until configs_on_demand is called again
    assert dict.__len__(demo.state_holder["s"].config_values) > 0
    adapter.configs_on_demand(demo)
    assert dict.__len__(demo.state_holder["t"].config_values) == 0
