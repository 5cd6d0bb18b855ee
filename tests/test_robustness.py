"""Hostile input to every handler, called directly (no server): each returns a result or raises gr.Error with
a sentence; never a TypeError, IndexError, RuntimeError or NaN. Refusals happen before anything is loaded
or allocated (the loader and the allocating functions are replaced by ones that fail the test).

The handlers run on the same served model as the app tests (tests/conftest.py: the shipped default model,
or a tiny random checkpoint when it is absent), one torch thread so the box stays usable.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import gradio as gr
import numpy as np
import plotly.graph_objects as go
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from explorer import session

torch.set_num_threads(1)

SETTINGS = settings(max_examples=30, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# --- strategies -------------------------------------------------------------------------------------------

SPECIAL_TEXT = [
    "", "   \n\t ", "\x00\x00\x00", "a\x00b\x07c\x1b[31md", "\u202e\u200b\u2066", "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)> & &amp; \"quotes\"", "🦄🐳 the purple whale 🐋", "中文 日本語 한국어 العربية עברית",
    "Ω≈ç√∫˜µ≤≥÷ ĀĒĪŌŪ", "cat " * 2000, "x" * 20000, "\n\n\n", "\ufeffBOM", "\ud7ff\ue000\uffff",
]
GOOD_TEXT = ["The cat sat on the mat.", "Tom gave the red ball to Anna.", "🦄🐳 the purple whale 🐋",
             "中文 日本語 한국어 العربية עברית", "<script>alert(1)</script> and <b>bold</b>", "a", "Tom has a red ball. " * 40]
good_text = st.one_of(st.sampled_from(GOOD_TEXT), st.text(min_size=1, max_size=80))
any_text = st.one_of(st.sampled_from(SPECIAL_TEXT), st.text(max_size=120), st.none(), st.integers())
numbers = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", " ", "abc", "1e309", "nan", "-inf", "3", "0x10", "½"]),
    st.lists(st.integers(-3, 3), max_size=3))
junk = st.one_of(any_text, numbers)
index = st.integers(0, 1)  # a layer or head every served model has


@st.composite
def calls(draw, *pairs):
    """Arguments for one call; ``pairs`` are (plausible, hostile) strategies per argument.

    Half the calls use plausible values throughout (they must answer, or refuse with a sentence), the others
    make one argument, or any number of them, hostile.
    """
    mode = draw(st.sampled_from(["plausible", "plausible", "one bad", "one bad", "any bad"]))
    if mode == "plausible":
        bad = set()
    elif mode == "one bad":
        bad = {draw(st.integers(0, len(pairs) - 1))}
    else:
        bad = {i for i in range(len(pairs)) if draw(st.booleans())}
    return tuple(draw(hostile if i in bad else plausible) for i, (plausible, hostile) in enumerate(pairs))


def run(fn, *args):
    """Call a handler (consuming it when it is a generator): its result, or the gr.Error it raised.

    Anything else (TypeError, IndexError, RuntimeError, ...) propagates and fails the test.
    """
    name = getattr(fn, "__name__", "?")
    try:
        out = fn(*args)
        if hasattr(out, "__next__"):
            last = None
            for last in out:
                pass
            out = last
    except gr.Error as exc:
        assert str(exc.message).strip(), f"{name} raised a gr.Error without a message"
        OUTCOMES.setdefault(name, [0, 0])[1] += 1
        if os.environ.get("ROBUSTNESS_VERBOSE"):
            print(f"{name}{args!r:.200} -> {exc.message}")
        return exc
    check_finite(out)
    OUTCOMES.setdefault(name, [0, 0])[0] += 1
    return out


OUTCOMES: dict[str, list[int]] = {}  # handler -> [answered, refused], printed by the last test


def check_finite(out):
    """No figure in a handler's answer carries NaN or inf in its data (an empty-looking chart)."""
    items = out if isinstance(out, tuple) else (out,)
    for item in items:
        if isinstance(item, go.Figure):
            for trace in item.data:
                for key in ("x", "y", "z"):
                    value = getattr(trace, key, None)
                    if value is None:
                        continue
                    a = np.asarray(value, dtype=object).ravel()
                    nums = np.array([v for v in a if isinstance(v, (int, float, np.number)) and v is not None],
                                    dtype=float)
                    # NaN marks hidden cells (masked attention) by design; inf never does
                    assert not np.isinf(nums).any(), f"inf in {trace.type}.{key}"


@pytest.fixture(scope="module")
def served(served_model_dir, model_root):
    os.environ["EXPLORER_DEFAULT_MODEL"] = str(served_model_dir)
    os.environ["EXPLORER_MODEL_ROOT"] = str(model_root)
    return session.load_default()


pytestmark = pytest.mark.usefixtures("served")  # not an argument: hypothesis would print the model


def fresh():
    return session.new_state()


# --- every handler, arbitrary text and numbers -------------------------------------------------------------

VIEWS = ["causal (as trained)", "bidirectional (mask removed)"]
PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
IMPLS = ["naive", "sdpa", "tiled"]


@SETTINGS
@given(args=calls((good_text, junk), (index, junk), (index, junk), (st.sampled_from(VIEWS), junk)))
def test_attention_view_any_input(args):
    from explorer.panels.attention import attention_view

    run(attention_view, *args, fresh())


@SETTINGS
@given(pick=st.one_of(junk, st.sampled_from(["0,1", "1,0", "9,9", ",", "a,b", "1,2,3", "1.5,2", " 0 , 1 "])))
def test_jump_to_head_any_input(pick):
    from explorer.panels.attention import jump_to_head

    run(jump_to_head, pick)


theta = st.one_of(st.floats(1.01, 1e9), st.sampled_from([10000.0, 100.0, 1e6]))
pairs = st.lists(st.integers(0, 3), min_size=1, max_size=4)
bad_pairs = st.one_of(junk, st.lists(st.one_of(st.integers(-3, 100), junk), max_size=12))


@SETTINGS
@given(args=calls((good_text, junk), (theta, junk), (st.integers(0, 63), junk), (pairs, bad_pairs), (index, junk),
                  (index, junk)))
def test_rope_view_any_input(args):
    from explorer.panels.positions import rope_view

    run(rope_view, *args, fresh())


@SETTINGS
@given(args=calls((theta, junk), (st.integers(0, 63), junk), (pairs, bad_pairs)))
def test_rope_circle_any_input(args):
    from explorer.panels.positions import circle_only

    run(circle_only, *args, fresh())


@SETTINGS
@given(args=calls((good_text, junk), (index, junk), (index, junk), (st.integers(-3, 3), st.one_of(junk, st.integers()))))
def test_encoder_decoder_any_input(args):
    from explorer.panels.encoder_decoder import encoder_decoder_view

    run(encoder_decoder_view, *args, fresh())


@SETTINGS
@given(args=calls((good_text, junk), (st.integers(1, 8), st.one_of(junk, st.integers(-5, 10**6))),
                  (st.sampled_from([0, 1e-30, 1e-9, 1e-3, 0.8, 1, 100, 1e9, 1e12, 5e-324]), junk),
                  (st.one_of(st.none(), st.integers(1, 10**6)), junk), (st.one_of(st.none(), st.floats(1e-9, 1)), junk),
                  (st.integers(0, 2**31 - 1), st.one_of(junk, st.integers(-5, 2**40)))))
def test_generate_any_input(args):
    from explorer.panels.generation import generate

    out = run(generate, *args, fresh())
    if not isinstance(out, gr.Error):
        for step in out[1]["steps"]:  # every drawn probability is a real number
            assert all(math.isfinite(p) for p in step["top_probs"] + step["model_probs"])


@pytest.fixture(scope="module")
def gen_view():
    from explorer.panels.generation import generate

    return generate("Tom has a red", 4, 0.8, 50, 0.95, 0, fresh())[1]


@SETTINGS
@given(view=st.sampled_from(["real", None, {}, {"steps": []}]), step=st.one_of(st.integers(-2, 6), junk))
def test_generate_step_any_input(gen_view, view, step):  # the view is server-side state: never hostile
    from explorer.panels.generation import generate_step

    run(generate_step, gen_view if view == "real" else view, step)


@SETTINGS
@given(args=calls((st.sampled_from(["this app's model", "Llama-3.1-8B"]), junk),
                  (st.integers(1, 10**6), st.one_of(junk, st.integers(-10, 10**9))), (st.integers(1, 64), junk),
                  (st.sampled_from(["float16", "bfloat16", "float32"]), junk)))
def test_kv_calculator_any_input(args):
    from explorer.panels.generation import kv_calculator

    run(kv_calculator, *args, fresh())


targets = st.lists(st.sampled_from(PROJ), min_size=1, max_size=3)
bad_targets = st.one_of(junk, st.lists(st.sampled_from(PROJ + ["lm_head", "", "x"]), max_size=4),
                        st.lists(junk, max_size=3))


@SETTINGS
@given(args=calls((st.integers(1, 16), st.one_of(junk, st.integers(-2, 100))), (st.floats(0.5, 64), junk),
                  (targets, bad_targets)))
def test_lora_counts_any_input(args):
    from explorer.panels.lora import lora

    run(lora, *args, fresh())


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(args=calls((st.integers(1, 4), junk), (st.floats(0.5, 64), junk), (targets, bad_targets),
                  (good_text, junk), (st.integers(1, 3), st.one_of(junk, st.integers(-3, 10**6))),
                  (st.sampled_from([1e-2, 1e-3, 0.1, 1e-5]), st.one_of(junk, st.sampled_from([10.0, 1e9, 0, -1]))),
                  (st.floats(0.2, 2), st.one_of(junk, st.integers(61, 10**6)))))
def test_lora_finetune_any_input(args):
    from explorer.panels.lora import lora_finetune

    run(lora_finetune, *args, fresh(), lambda *a, **k: None)
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
    run(lora_adapter, mode, adapted_state if with_adapter else fresh())


@SETTINGS
@given(args=calls((good_text, junk), (index, junk), (index, junk), (st.integers(1, 8), st.one_of(junk, st.integers(-2, 100)))),
       with_adapter=st.booleans())
def test_lora_compare_any_input(adapted_state, args, with_adapter):
    from explorer.panels.lora import lora_compare

    run(lora_compare, *args, adapted_state if with_adapter else fresh())


impls = st.lists(st.sampled_from(IMPLS), min_size=1, max_size=3, unique=True)
bad_impls = st.one_of(junk, st.lists(st.sampled_from(IMPLS + ["flash", ""]), max_size=4), st.lists(junk, max_size=2))
small_T = st.sampled_from([128, 200, 256])
# hostile lengths are out of range or junk: an in-range 16384 would be a real (long, budgeted) measurement
bad_T = st.one_of(st.integers(-10**6, 127), st.integers(16385, 10**12),
                  junk.filter(lambda v: not (isinstance(v, (int, float)) and not isinstance(v, bool) and 256 < v <= 16384)))


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(args=calls((small_T, bad_T), (st.integers(1, 4), st.one_of(junk, st.integers(-1, 10**4))),
                  (st.sampled_from([8, 16]), st.one_of(junk, st.sampled_from([0, 7, 10**6]))),
                  (st.sampled_from([1, 2, 4]), st.one_of(junk, st.integers(-1, 100))), (impls, bad_impls),
                  (st.booleans(), junk), (st.sampled_from(["float32", "bfloat16"]), junk)))
def test_memory_compare_any_input(args):
    from explorer.panels.memory import memory_compare

    run(memory_compare, *args, lambda *a, **k: None)


@SETTINGS
@given(args=calls((st.integers(1, 64), st.one_of(junk, st.integers(-1, 10**4))),
                  (st.sampled_from([16, 32, 64, 128]), st.one_of(junk, st.sampled_from([0, 7, 512]))),
                  (st.sampled_from([1, 2, 4, 8]), st.one_of(junk, st.integers(-1, 100))), (impls, bad_impls),
                  (st.booleans(), junk), (st.sampled_from(["float32", "bfloat16", "float16"]), junk)))
def test_memory_budget_any_input(args):
    from explorer.panels.memory import memory_budget

    run(memory_budget, *args)


@SETTINGS
@given(args=calls((st.integers(4, 64), st.one_of(junk, st.integers(-4, 10**6))),
                  (st.sampled_from([4, 8, 16]), st.one_of(junk, st.integers(-1, 10**6))), (st.booleans(), junk),
                  (st.integers(0, 1), junk)),
       step=st.one_of(st.integers(-1, 20), junk))
def test_memory_trace_any_input(args, step):
    from explorer.panels.memory import _user_errors_gen, memory_trace, memory_trace_play, memory_trace_step

    out = run(memory_trace, *args)
    trace = None if isinstance(out, gr.Error) else out[0]
    run(memory_trace_step, trace, step, args[3])
    if trace is None:  # playing a real trace sleeps 0.6 s per block
        run(_user_errors_gen(memory_trace_play), trace, args[3])  # wrapped as where it is wired


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


def test_zz_outcomes_report():
    """Not a check: how many generated calls each handler answered and refused (run with -s to read)."""
    for name, (ok, refused) in sorted(OUTCOMES.items()):
        print(f"{name:28s} answered {ok:3d}  refused {refused:3d}")
