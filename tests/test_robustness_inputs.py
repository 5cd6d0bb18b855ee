"""Every handler called with arbitrary text and numbers (hypothesis): answered, or refused with a sentence.

Shared helpers and fixtures: tests/hostile.py.
"""
from __future__ import annotations

import math

import gradio as gr
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from explorer.state import session

from tests.hostile import (  # noqa: F401 - fixtures are found by their names here
    IMPLS, OUTCOMES, PROJ, SETTINGS, VIEWS, answered, calls, fresh, good_text, hub_local_only, index, junk, run, served,
)

pytestmark = pytest.mark.usefixtures("served")  # not an argument: hypothesis would print the model

# The handlers that train or measure draw five sixths of the profile's examples (25 under "ci").
SLOW_HANDLER_SETTINGS = settings(SETTINGS, max_examples=max(1, SETTINGS.max_examples * 5 // 6))


@pytest.fixture(scope="module", autouse=True)
def outcomes_report():
    """After the module: how many generated calls each handler answered and refused (read it with -s)."""
    yield
    for name, (ok, refused) in sorted(OUTCOMES.items()):
        print(f"\n{name:28s} answered {ok:3d}  refused {refused:3d}", end="")


@pytest.mark.slow
@SETTINGS
@given(args=calls((good_text, junk), (index, junk), (index, junk), (st.sampled_from(VIEWS), junk)))
def test_attention_view_any_input(args):
    from explorer.panels.attention import attention_view

    answered(args, run(attention_view, *args, fresh()))


@pytest.mark.slow
@SETTINGS
@given(pick=st.one_of(junk, st.sampled_from(["0,1", "1,0", "9,9", ",", "a,b", "1,2,3", "1.5,2", " 0 , 1 "])))
def test_jump_to_head_any_input(pick):
    from explorer.panels.attention import jump_to_head

    run(jump_to_head, pick)


theta = st.one_of(st.floats(1.01, 1e9), st.sampled_from([10000.0, 100.0, 1e6]))
pairs = st.lists(st.integers(0, 3), min_size=1, max_size=4)
bad_pairs = st.one_of(junk, st.lists(st.one_of(st.integers(-3, 100), junk), max_size=12))


@pytest.mark.slow
@SETTINGS
@given(args=calls((good_text, junk), (theta, junk), (st.integers(0, 63), junk), (pairs, bad_pairs), (index, junk),
                  (index, junk)))
def test_rope_view_any_input(args):
    from explorer.panels.positions import rope_view

    answered(args, run(rope_view, *args, fresh()))


@pytest.mark.slow
@SETTINGS
@given(args=calls((theta, junk), (st.integers(0, 63), junk), (pairs, bad_pairs)))
def test_rope_circle_any_input(args):
    from explorer.panels.positions import circle_only

    answered(args, run(circle_only, *args, fresh()))


@pytest.mark.slow
@SETTINGS
@given(args=calls((good_text, junk), (index, junk), (index, junk), (st.integers(-3, 3), st.one_of(junk, st.integers()))))
def test_encoder_decoder_any_input(args):
    from explorer.panels.encoder_decoder import encoder_decoder_view

    answered(args, run(encoder_decoder_view, *args, fresh()))


@pytest.mark.slow
@SETTINGS
@given(args=calls((good_text, junk), (st.integers(1, 8), st.one_of(junk, st.integers(-5, 10**6))),
                  (st.sampled_from([0, 1e-30, 1e-9, 1e-3, 0.8, 1, 100, 1e9, 1e12, 5e-324]), junk),
                  (st.one_of(st.none(), st.integers(1, 10**6)), junk), (st.one_of(st.none(), st.floats(1e-9, 1)), junk),
                  (st.integers(0, 2**31 - 1), st.one_of(junk, st.integers(-5, 2**40)))))
def test_generate_any_input(args):
    from explorer.panels.generation import generate

    out = answered(args, run(generate, *args, fresh()))
    if not isinstance(out, gr.Error):
        for step in out.view["steps"]:  # every drawn probability is a real number
            assert all(math.isfinite(p) for p in step["top_probs"] + step["model_probs"])


@pytest.fixture(scope="module")
def gen_view():
    from explorer.panels.generation import generate

    return generate("Tom has a red", 4, 0.8, 50, 0.95, 0, fresh()).view


@pytest.mark.slow  # many generated examples, each a generation step
@SETTINGS
@given(view=st.sampled_from(["real", None, {}, {"steps": []}]), step=st.one_of(st.integers(-2, 6), junk))
def test_generate_step_any_input(gen_view, view, step):  # the view is server-side state: never hostile
    from explorer.panels.generation import generate_step

    run(generate_step, gen_view if view == "real" else view, step)


@SETTINGS
@pytest.mark.slow
@given(args=calls((st.sampled_from(["this app's model", "Llama-2-7B", "SmolLM2-135M"]), junk),
                  (st.integers(1, 10**6), st.one_of(junk, st.integers(-10, 10**9))), (st.integers(1, 64), junk),
                  (st.sampled_from(["float16", "bfloat16", "float32"]), junk)))
def test_kv_calculator_any_input(args):
    from explorer.panels.generation import kv_calculator

    answered(args, run(kv_calculator, *args, fresh()))


targets = st.lists(st.sampled_from(PROJ), min_size=1, max_size=3)
bad_targets = st.one_of(junk, st.lists(st.sampled_from(PROJ + ["lm_head", "", "x"]), max_size=4),
                        st.lists(junk, max_size=3))


@pytest.mark.slow
@SETTINGS
@given(args=calls((st.integers(1, 16), st.one_of(junk, st.integers(-2, 100))), (st.floats(0.5, 64), junk),
                  (targets, bad_targets)))
def test_lora_counts_any_input(args):
    from explorer.panels.lora import lora

    answered(args, run(lora, *args, fresh()))


@pytest.mark.slow
@SLOW_HANDLER_SETTINGS
@given(args=calls((st.integers(1, 4), junk), (st.floats(0.5, 64), junk), (targets, bad_targets),
                  (good_text, junk), (st.integers(1, 3), st.one_of(junk, st.integers(-3, 10**6))),
                  (st.sampled_from([1e-2, 1e-3, 0.1, 1e-5]), st.one_of(junk, st.sampled_from([10.0, 1e9, 0, -1]))),
                  (st.floats(0.2, 2), st.one_of(junk, st.integers(61, 10**6)))))
def test_lora_finetune_any_input(args):
    from explorer.panels.lora import lora_finetune

    answered(args, run(lora_finetune, *args, fresh(), lambda *a, **k: None))
    shared, _ = session.load_default()
    assert not any("lora" in n for n, _ in shared.named_modules())  # the shared model never gets an adapter


@pytest.fixture(scope="module")
def adapted_state(served):
    """A session whose private copy carries an adapter (B nudged off zero, so it changes the outputs)."""
    from models.lora import attach_lora, lora_layers

    state = fresh()
    model, _, _ = session.private_model(state)
    attach_lora(model, ("q_proj", "v_proj"), rank=2, alpha=4)
    with torch.no_grad():
        for layer in lora_layers(model):
            layer.lora_B.normal_(0, 0.1)
    return state


@SETTINGS
@given(args=calls((st.sampled_from(["off", "on", "merged"]), junk), (st.just(True), st.just(False))))
def test_lora_adapter_any_input(adapted_state, args):
    from explorer.panels.lora import lora_adapter

    mode, with_adapter = args
    answered(args, run(lora_adapter, mode, adapted_state if with_adapter else fresh()))


@pytest.mark.slow
@SETTINGS
@given(args=calls((good_text, junk), (index, junk), (index, junk), (st.integers(1, 8), st.one_of(junk, st.integers(-2, 100)))),
       with_adapter=st.booleans())
def test_lora_compare_any_input(adapted_state, args, with_adapter):
    from explorer.panels.lora import lora_compare

    answered(args, run(lora_compare, *args, adapted_state if with_adapter else fresh()))


impls = st.lists(st.sampled_from(IMPLS), min_size=1, max_size=3, unique=True)
bad_impls = st.one_of(junk, st.lists(st.sampled_from(IMPLS + ["flash", ""]), max_size=4), st.lists(junk, max_size=2))
small_T = st.sampled_from([128, 200, 256])
# hostile lengths are out of range or junk: an in-range 16384 would be a real (long, budgeted) measurement
bad_T = st.one_of(st.integers(-10**6, 127), st.integers(16385, 10**12),
                  junk.filter(lambda v: not (isinstance(v, (int, float)) and not isinstance(v, bool) and 256 < v <= 16384)))


@pytest.mark.slow
@SLOW_HANDLER_SETTINGS
@given(args=calls((small_T, bad_T), (st.sampled_from([2, 4]), st.one_of(junk, st.integers(-1, 10**4))),
                  (st.sampled_from([8, 16]), st.one_of(junk, st.sampled_from([0, 7, 10**6]))),
                  (st.sampled_from([1, 2]), st.one_of(junk, st.integers(-1, 100))), (impls, bad_impls),
                  (st.booleans(), junk), (st.sampled_from(["float32", "bfloat16"]), junk)))
def test_memory_compare_any_input(args):
    from explorer.panels.memory import memory_compare

    answered(args, run(memory_compare, *args, lambda *a, **k: None))


@SETTINGS
@given(args=calls((st.sampled_from([8, 16, 24, 64]), st.one_of(junk, st.integers(-1, 10**4))),
                  (st.sampled_from([16, 32, 64, 128]), st.one_of(junk, st.sampled_from([0, 7, 512]))),
                  (st.sampled_from([1, 2, 4, 8]), st.one_of(junk, st.integers(-1, 100))), (impls, bad_impls),
                  (st.booleans(), junk), (st.sampled_from(["float32", "bfloat16", "float16"]), junk)))
def test_memory_budget_any_input(args):
    from explorer.panels.memory import memory_budget

    answered(args, run(memory_budget, *args))


@pytest.mark.slow
@SETTINGS
@given(args=calls((st.integers(4, 64), st.one_of(junk, st.integers(-4, 10**6))),
                  (st.sampled_from([4, 8, 16]), st.one_of(junk, st.integers(-1, 10**6))), (st.booleans(), junk),
                  (st.integers(0, 1), junk)),
       step=st.one_of(st.integers(-1, 20), junk))
def test_memory_trace_any_input(args, step):
    from explorer.panels import user_errors
    from explorer.panels.memory import memory_trace, memory_trace_play, memory_trace_step

    out = answered(args, run(memory_trace, *args))
    trace = None if isinstance(out, gr.Error) else out.trace
    run(memory_trace_step, trace, step, args[3])
    if trace is None:  # playing a real trace sleeps 0.6 s per block
        run(user_errors(memory_trace_play), trace, args[3])  # wrapped as where it is wired


SOURCES = ["/etc", "/etc/passwd", "../../etc", "~/.ssh", "tiny-local/../../..", "HuggingFaceTB/SmolLM2-135M", "a/b",
           "owner/name/extra", "-bad/repo", "org/" + "x" * 200, "file:///etc/passwd", "https://huggingface.co/gpt2",
           "default", "tiny-local", "..", ".", "/", "\\\\server\\share", "C:\\Windows", "tiny-local/\x00"]


@SETTINGS
@given(source=st.one_of(st.sampled_from(SOURCES), junk))
def test_load_model_any_input(source):
    from explorer.panels.model import load_model

    state = fresh()
    out = run(load_model, source, state, lambda *a, **k: None)
    if isinstance(out, gr.Error):
        assert state["model"] is None and state["source"] == "default"  # the model the user had stays
