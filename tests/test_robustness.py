"""Hostile input to every handler, called directly (no server): each returns a result or raises gr.Error with
a sentence; never a TypeError, IndexError, RuntimeError or NaN. Refusals happen before anything is loaded
or allocated (the loader and the allocating functions are replaced by ones that fail the test).

The handlers run on the same served model as the app tests (tests/conftest.py: the shipped default model,
or a tiny random checkpoint when it is absent, or always with EXPLORER_TEST_FIXTURE_MODEL=1), on one torch
thread so the box stays usable (set by the module's fixture and restored after it).
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import gradio as gr
import numpy as np
import plotly.graph_objects as go
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from explorer.state import threads

from explorer.state import session

from explorer.state import checkpoints

from explorer.state import private_models

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
# words a person types: letters, digits, punctuation and spaces, at least one of them visible
typed_text = st.text(st.characters(categories=["L", "N", "P", "Zs"]), min_size=1, max_size=80).filter(str.strip)
good_text = st.one_of(st.sampled_from(GOOD_TEXT), typed_text)
any_text = st.one_of(st.sampled_from(SPECIAL_TEXT), st.text(max_size=120), st.none(), st.integers())
numbers = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", " ", "abc", "1e309", "nan", "-inf", "3", "0x10", "½"]),
    st.lists(st.integers(-3, 3), max_size=3))
junk = st.one_of(any_text, numbers)
index = st.integers(0, 1)  # a layer or head every served model has


class Call(tuple):
    """One call's arguments; ``plausible`` when every one of them is a value a person could choose."""
    plausible: bool = False


@st.composite
def calls(draw, *pairs):
    """Arguments for one call; ``pairs`` are (plausible, hostile) strategies per argument.

    Two calls in five use plausible values throughout (they must be answered: see ``answered``), the others
    make one argument, or any number of them, hostile (answered, or refused with a sentence).
    """
    mode = draw(st.sampled_from(["plausible", "plausible", "one bad", "one bad", "any bad"]))
    if mode == "plausible":
        bad = set()
    elif mode == "one bad":
        bad = {draw(st.integers(0, len(pairs) - 1))}
    else:
        bad = {i for i in range(len(pairs)) if draw(st.booleans())}
    out = Call(draw(hostile if i in bad else plausible) for i, (plausible, hostile) in enumerate(pairs))
    out.plausible = not bad
    return out


def answered(args, out):
    """A call made of plausible values throughout is answered, not refused: a handler that refused everything
    with a fine sentence would pass every other check here."""
    if getattr(args, "plausible", False):
        assert not isinstance(out, gr.Error), f"plausible input {tuple(args)!r:.300} was refused: {out.message}"
    return out


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
        assert not INTERNAL.search(str(exc.message)), f"{name} answered with Python's words: {exc.message}"
        assert len(exc.message) <= 600, f"{name}: a {len(exc.message)}-character message"
        OUTCOMES.setdefault(name, [0, 0])[1] += 1
        if os.environ.get("ROBUSTNESS_VERBOSE"):
            print(f"{name}{args!r:.200} -> {exc.message}")
        return exc
    check_finite(out)
    OUTCOMES.setdefault(name, [0, 0])[0] += 1
    return out


# ValueErrors raised by Python or a library, not by our validation: they say nothing a visitor can act on
INTERNAL = re.compile(r"invalid literal for|values to unpack|could not convert|has no attribute|unsupported operand|"
                      r"must be less than maximum|object is not|index out of range|division by zero")
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
    n_threads, threads.DEFAULT_THREADS = threads.DEFAULT_THREADS, 1  # handlers end on this count: stay frugal
    torch.set_num_threads(1)  # here, not at import: other modules' tests compare with the start-up count
    yield session.load_default()
    threads.DEFAULT_THREADS = n_threads
    torch.set_num_threads(n_threads)


@pytest.fixture(scope="module", autouse=True)
def outcomes_report():
    """After the module: how many generated calls each handler answered and refused (read it with -s)."""
    yield
    for name, (ok, refused) in sorted(OUTCOMES.items()):
        print(f"\n{name:28s} answered {ok:3d}  refused {refused:3d}", end="")


@pytest.fixture(scope="module", autouse=True)
def hub_local_only():
    """Hub ids are among the inputs here ("HuggingFaceTB/SmolLM2-135M", ...): besides HF_HUB_OFFLINE=1 (conftest),
    any call that would ask the Hub rather than its local cache fails the test instead of downloading."""
    import huggingface_hub

    real = huggingface_hub.snapshot_download

    def local_only(repo_id, **kw):
        if not kw.get("local_files_only"):  # pytest.fail: a BaseException, which the loader's except cannot swallow
            pytest.fail(f"a test asked the Hugging Face Hub for {repo_id!r} (tests run offline)")
        return real(repo_id, **kw)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(huggingface_hub, "snapshot_download", local_only)
        yield


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

    answered(args, run(attention_view, *args, fresh()))


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

    answered(args, run(rope_view, *args, fresh()))


@SETTINGS
@given(args=calls((theta, junk), (st.integers(0, 63), junk), (pairs, bad_pairs)))
def test_rope_circle_any_input(args):
    from explorer.panels.positions import circle_only

    answered(args, run(circle_only, *args, fresh()))


@SETTINGS
@given(args=calls((good_text, junk), (index, junk), (index, junk), (st.integers(-3, 3), st.one_of(junk, st.integers()))))
def test_encoder_decoder_any_input(args):
    from explorer.panels.encoder_decoder import encoder_decoder_view

    answered(args, run(encoder_decoder_view, *args, fresh()))


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


@SETTINGS
@given(view=st.sampled_from(["real", None, {}, {"steps": []}]), step=st.one_of(st.integers(-2, 6), junk))
def test_generate_step_any_input(gen_view, view, step):  # the view is server-side state: never hostile
    from explorer.panels.generation import generate_step

    run(generate_step, gen_view if view == "real" else view, step)


@SETTINGS
@given(args=calls((st.sampled_from(["this app's model", "Llama-2-7B", "SmolLM2-135M"]), junk),
                  (st.integers(1, 10**6), st.one_of(junk, st.integers(-10, 10**9))), (st.integers(1, 64), junk),
                  (st.sampled_from(["float16", "bfloat16", "float32"]), junk)))
def test_kv_calculator_any_input(args):
    from explorer.panels.generation import kv_calculator

    answered(args, run(kv_calculator, *args, fresh()))


targets = st.lists(st.sampled_from(PROJ), min_size=1, max_size=3)
bad_targets = st.one_of(junk, st.lists(st.sampled_from(PROJ + ["lm_head", "", "x"]), max_size=4),
                        st.lists(junk, max_size=3))


@SETTINGS
@given(args=calls((st.integers(1, 16), st.one_of(junk, st.integers(-2, 100))), (st.floats(0.5, 64), junk),
                  (targets, bad_targets)))
def test_lora_counts_any_input(args):
    from explorer.panels.lora import lora

    answered(args, run(lora, *args, fresh()))


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
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


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
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


# --- refusals: the sentence, and nothing computed, loaded or allocated ------------------------------------------

def forbid(monkeypatch, owner, *names):
    """Replace ``owner.name`` by a function that fails the test: a refusal must come before it is called."""
    for name in names:
        def boom(*args, _name=name, **kwargs):
            raise AssertionError(f"{_name} was called for a request that should have been refused")
        monkeypatch.setattr(owner, name, boom)


def prompt_handlers():
    from explorer.panels.attention import attention_view
    from explorer.panels.encoder_decoder import encoder_decoder_view
    from explorer.panels.generation import generate
    from explorer.panels.lora import lora_compare, lora_finetune
    from explorer.panels.positions import rope_view

    quiet = lambda *a, **k: None  # noqa: E731 - stands in for gr.Progress
    return {
        "attention": lambda p: attention_view(p, 0, 0, VIEWS[0], fresh()),
        "rope": lambda p: rope_view(p, 10000.0, 5, [0, 1], 0, 0, fresh()),
        "encoder_decoder": lambda p: encoder_decoder_view(p, 0, 0, -1, fresh()),
        "generate": lambda p: generate(p, 4, 0.8, 50, 0.95, 0, fresh()),
        "lora_compare": lambda p: lora_compare(p, 0, 0, 4, fresh()),
        "lora_finetune": lambda p: list(lora_finetune(2, 4, ["q_proj"], p, 2, 1e-2, 5, fresh(), quiet)),
    }


def forbid_model_runs(monkeypatch):
    from explorer import finetune, probes

    forbid(monkeypatch, probes, "run_with_cache", "compare_cache", "generation_trace", "stream_generation", "rope_probe",
           "attention_pattern", "head_scores", "compare_impls")
    forbid(monkeypatch, session, "private_model")
    forbid(monkeypatch, finetune, "iter_finetune")


@pytest.mark.parametrize("handler", ["attention", "rope", "encoder_decoder", "generate", "lora_compare",
                                     "lora_finetune"])
@pytest.mark.parametrize("prompt", ["", "   \n\t  ", "\x00\x01\x7f\x1b", "\u200b\u202e\u2066", None])
def test_empty_prompts_are_refused_before_the_model_runs(monkeypatch, handler, prompt):
    call = prompt_handlers()[handler]
    forbid_model_runs(monkeypatch)
    with pytest.raises(gr.Error, match="empty"):
        call(prompt)


@pytest.mark.parametrize("handler", ["attention", "generate", "lora_finetune"])
def test_huge_texts_are_refused_before_tokenizing(monkeypatch, handler):
    call = prompt_handlers()[handler]
    forbid_model_runs(monkeypatch)
    with pytest.raises(gr.Error, match="characters long; paste at most"):
        call("The cat sat. " * 20_000)


@pytest.mark.parametrize("handler", ["attention", "rope", "encoder_decoder", "generate", "lora_compare"])
@pytest.mark.parametrize("prompt", ["🦄🐳 the purple whale 🐋", "中文 日本語 한국어", "العربية עברית",
                                    "Tom\x00 gave\x07 the\x1b ball\u200b."])
def test_emoji_non_latin_and_control_characters_work(handler, prompt):
    out = prompt_handlers()[handler](prompt)
    text = json.dumps([o.to_plotly_json() if isinstance(o, go.Figure) else o for o in out], default=str)
    for c in "\x00\x07\x1b\u200b":  # control characters were stripped, not shown
        assert c not in text


def test_html_in_a_prompt_is_shown_as_text():
    from explorer.panels.attention import attention_view
    from explorer.panels.generation import generate

    prompt = "<script>alert(1)</script> <img src=x onerror=alert(2)> <b>bold</b>"
    heat, table, info, *rest = attention_view(prompt, 0, 0, VIEWS[0], fresh())
    labels = list(heat.data[0].y)
    assert any("&lt;" in label for label in labels)  # plotly would render tags in labels: they are escaped
    for item in [heat, info, *rest]:
        text = item.to_json() if isinstance(item, go.Figure) else json.dumps(item, default=str)
        assert "<script" not in text and "<img" not in text and "<b>bold" not in text
    shown = "".join(str(row[1]) for row in table)  # the token table (plain text cells) keeps the characters
    assert "script" in shown
    out = generate(prompt, 3, 0.0, None, None, 0, fresh())
    assert "<script>" in next(t for t, kind in out.text if kind is None)  # HighlightedText shows the prompt as text


def test_a_prompt_longer_than_the_view_is_cut_with_a_notice():
    from explorer.panels.attention import MAX_TOKENS, attention_view

    heat, table, info, *_ = attention_view("the cat sat. " * 400, 0, 0, VIEWS[0], fresh())
    assert len(heat.data[0].y) == len(table) == MAX_TOKENS
    assert "only the first" in info


def test_a_prompt_longer_than_the_context_is_refused_by_generate(monkeypatch):
    from explorer import probes
    from explorer.panels.generation import generate

    forbid(monkeypatch, probes, "compare_cache", "generation_trace", "stream_generation")
    with pytest.raises(gr.Error, match="shorten it.*context"):
        generate("the cat sat. " * 2000, 8, 0.8, 50, 0.95, 0, fresh())
    with pytest.raises(gr.Error) as info:  # another refusal of the prompt keeps its own sentence, nothing added
        generate(" \n ", 8, 0.8, 50, 0.95, 0, fresh())
    assert "The prompt is empty" in info.value.message and "must fit" not in info.value.message


def test_a_prompt_too_long_is_its_own_error_type():
    from explorer.state.text import PromptTooLong, encode

    _, tokenizer = session.load_default()
    with pytest.raises(PromptTooLong) as info:
        encode(tokenizer, "the cat sat. " * 50, 10)
    assert isinstance(info.value, ValueError) and info.value.max_len == 10 and info.value.n_tokens > 10
    assert "shorten it" in str(info.value)
    ids, labels = encode(tokenizer, "the cat sat. " * 50, 10, truncate=True)
    assert len(ids) == len(labels) == 10


def _numbers_cases():
    from explorer.panels import encoder_decoder, generation, lora, memory, positions

    quiet = lambda *a, **k: None  # noqa: E731
    g = lambda **kw: generation.generate(**{**dict(prompt="Tom has a red", max_new_tokens=4, temperature=0.8,  # noqa
                                                     top_k=50, top_p=0.95, seed=0, state=fresh()), **kw})
    ft = lambda **kw: list(lora.lora_finetune(**{**dict(rank=2, alpha=4, targets=["q_proj"],  # noqa: E731
                                                         text="Tom has a red ball. Anna has a red ball.", steps=2,
                                                         lr=1e-2, max_seconds=5, state=fresh(), progress=quiet), **kw}))
    mc = lambda **kw: list(memory.memory_compare(**{**dict(max_T=128, n_heads=2, head_dim=16, n_kv_heads=2,  # noqa
                                                           impls=["naive"], causal=True, dtype="float32",
                                                           progress=quiet), **kw}))
    return {
        "negative length": (lambda: g(max_new_tokens=-1), "new tokens must be a whole number"),
        "zero length": (lambda: g(max_new_tokens=0), "new tokens must be a whole number"),
        "absurd length": (lambda: g(max_new_tokens=10**9), "new tokens must be a whole number"),
        "top_p above 1": (lambda: g(top_p=1.5), r"top-p must lie in \(0, 1\]"),
        "top_p 0": (lambda: g(top_p=0), r"top-p must lie in \(0, 1\]"),
        "top_p negative": (lambda: g(top_p=-0.2), r"top-p must lie in \(0, 1\]"),
        "negative temperature": (lambda: g(temperature=-1), "temperature must be 0"),
        "infinite temperature": (lambda: g(temperature=float("inf")), "temperature must be at most"),
        "NaN temperature": (lambda: g(temperature=float("nan")), "temperature must be a number"),
        "underflowing temperature": (lambda: g(temperature=1e-300), "at least 1e-9"),
        "denormal temperature": (lambda: g(temperature=5e-324), "at least 1e-9"),
        "top_k 0": (lambda: g(top_k=0), "top-k must be a whole number"),
        "rank 0": (lambda: lora.lora(0, 16, ["q_proj"], fresh()), "rank must be a whole number from 1"),
        "rank 0 fine-tune": (lambda: ft(rank=0), "rank must be a whole number from 1"),
        "absurd steps": (lambda: ft(steps=10**9), "steps must be a whole number from 1 to"),
        "negative steps": (lambda: ft(steps=-3), "steps must be a whole number from 1 to"),
        "absurd time limit": (lambda: ft(max_seconds=10**6), "time limit must lie in"),
        "huge learning rate": (lambda: ft(lr=1e9), "learning rate must lie in"),
        "negative sweep length": (lambda: mc(max_T=-5), "max sequence length must be a whole number"),
        "absurd sweep length": (lambda: mc(max_T=10**12), "max sequence length must be a whole number"),
        "infinite sweep length": (lambda: mc(max_T=float("inf")), "max sequence length must be a whole number"),
        "infinite trace block": (lambda: memory.memory_trace(64, float("inf"), True, 0), "block size must be"),
        "infinite fine-tune steps": (lambda: ft(steps=float("inf")), "steps must be a whole number from 1 to"),
        "KV heads not dividing": (lambda: mc(n_heads=3, n_kv_heads=2), "must divide"),
        "absurd trace": (lambda: memory.memory_trace(10**9, 8, True, 0), "trace length must be"),
        "negative KV length": (lambda: generation.kv_calculator("this app's model", -1, 1, "float16", fresh()),
                               "sequence length must be a whole number"),
        "theta below 1": (lambda: positions.rope_view("Tom", 0.5, 5, [0], 0, 0, fresh()), "rope_theta must lie"),
        "token far out": (lambda: encoder_decoder.encoder_decoder_view("Tom has", 0, 0, 10**6, fresh()),
                          "token position must be"),
        "layer far out": (lambda: encoder_decoder.encoder_decoder_view("Tom has", 10**6, 0, 0, fresh()),
                          "layer must be between"),
    }


@pytest.mark.parametrize("case", [
    "negative length", "zero length", "absurd length", "top_p above 1", "top_p 0", "top_p negative",
    "negative temperature", "infinite temperature", "NaN temperature", "underflowing temperature",
    "denormal temperature", "top_k 0", "rank 0", "rank 0 fine-tune",
    "absurd steps", "negative steps", "absurd time limit", "huge learning rate", "negative sweep length",
    "absurd sweep length", "infinite sweep length", "infinite trace block", "infinite fine-tune steps",
    "KV heads not dividing", "absurd trace", "negative KV length", "theta below 1",
    "token far out", "layer far out"])
def test_numbers_out_of_range_are_refused_before_anything_runs(monkeypatch, case):
    from explorer import finetune, measure

    call, message = _numbers_cases()[case]
    forbid_model_runs(monkeypatch)
    forbid(monkeypatch, measure, "attention_sweep", "attention_memory", "tiled_trace")
    forbid(monkeypatch, finetune, "count_adapted")
    with pytest.raises(gr.Error, match=message) as info:
        call()
    assert len(info.value.message) > 20  # a sentence, not a code


@pytest.mark.parametrize("temperature", [1e-9, 1e-6, 1e9, 1e12])
def test_extreme_temperatures_draw_finite_probabilities(temperature):
    from explorer.panels.generation import generate

    out = generate("Tom has a red", 4, temperature, None, None, 0, fresh())
    check_finite(out)
    for step in out.view["steps"]:
        probs = step["top_probs"] + step["model_probs"]
        assert all(math.isfinite(p) and 0 <= p <= 1 + 1e-6 for p in probs)
        assert sum(step["top_probs"]) <= 1 + 1e-5


# --- the memory budget ------------------------------------------------------------------------------------

def test_a_sweep_over_the_budget_is_refused_before_it_allocates(monkeypatch):
    from explorer import measure
    from explorer.panels.memory import memory_compare

    forbid(monkeypatch, measure.run, "attention_sweep", "attention_memory")
    with pytest.raises(gr.Error, match="over the memory budget"):
        list(memory_compare(16384, 64, 256, 64, ["naive", "sdpa", "tiled"], False, "float32", lambda *a, **k: None))
    monkeypatch.setattr(measure.units, "MEMORY_BUDGET_BYTES", 2**20)  # a small machine: 1 MiB per request
    with pytest.raises(gr.Error, match="over the memory budget of 1 MiB"):
        list(memory_compare(1024, 8, 64, 8, ["naive"], True, "float32", lambda *a, **k: None))


def test_a_fine_tune_over_the_budget_is_refused_before_copying_the_model(monkeypatch):
    from explorer import finetune, measure
    from explorer.panels.lora import lora_finetune

    model, _ = session.load_default()
    forbid_model_runs(monkeypatch)
    forbid(monkeypatch, finetune, "evaluate_loss")
    monkeypatch.setattr(measure.units, "MEMORY_BUDGET_BYTES", 2**20)
    state = fresh()
    with pytest.raises(gr.Error, match="predicted to need .* over the memory budget of 1 MiB: paste a shorter text"):
        list(lora_finetune(2, 4, ["q_proj"], "Tom has a red ball. " * 100, 2, 1e-2, 5, state, lambda *a, **k: None))
    assert state["model"] is None  # no copy was made
    rows = finetune.make_rows(list(range(300)), 127)
    tokens = finetune.step_tokens(rows)
    assert tokens == 4 * 128  # four overlapping windows of 128 tokens, all in one step of up to 8 rows
    need = finetune.activation_bytes(model.config, tokens)
    assert need > 1.5 * 2 * 128 * model.config.vocab_size * 4  # logits are counted
    assert need > 1.5 * 3 * tokens * model.config.vocab_size * 4  # logits, log-softmax and gradient, every token
    with pytest.raises(ValueError, match="paste a shorter text"):
        finetune.check_step_memory(model.config, rows)  # the same prediction the handler refused with


def test_running_out_of_memory_answers_with_a_sentence(monkeypatch):
    from explorer import probes
    from explorer.panels.attention import attention_view

    def oom(*a, **k):
        raise MemoryError()

    monkeypatch.setattr(probes.patterns, "run_with_cache", oom)  # where the Attention tab's patterns run it
    with pytest.raises(gr.Error, match="ran out of memory .* choose smaller sizes"):
        attention_view("A prompt nobody asked for before 7.", 0, 0, VIEWS[0], fresh())


def test_the_budget_is_configurable(monkeypatch):
    from explorer import measure

    monkeypatch.setenv("EXPLORER_MEMORY_BUDGET", "12GiB")
    assert measure._budget_from_env() == 12 * 2**30
    monkeypatch.delenv("EXPLORER_MEMORY_BUDGET")
    assert measure._budget_from_env() <= 16 * 2**30  # the default fits a 16 GB CPU Space with room to spare
    monkeypatch.setenv("EXPLORER_PRIVATE_MODELS_BUDGET", "2GiB")
    assert private_models._private_budget() == 2 * 2**30
    monkeypatch.setenv("EXPLORER_PRIVATE_MODELS_BUDGET", "lots")
    assert private_models._private_budget() == 4 * 2**30  # a bad setting falls back, the app still starts
    # one measurement, one fine-tune step and every visitor's own models at once still fit 16 GB, with 2 GB spare
    assert 2 * measure.DEFAULT_MEMORY_BUDGET_BYTES + private_models._private_budget() <= 14 * 2**30


# --- model loading: sources, files, configs ---------------------------------------------------------------

@pytest.fixture()
def root(tmp_path, monkeypatch, model_root):
    """An allowed root of our own holding a good checkpoint ("good") to copy from."""
    import shutil

    r = tmp_path / "root"
    shutil.copytree(model_root / "tiny-local", r / "good")
    monkeypatch.setenv("EXPLORER_MODEL_ROOT", str(r))
    return r


def forbid_loading(monkeypatch):
    import huggingface_hub
    import safetensors.torch

    forbid(monkeypatch, session, "load_pretrained", "load_tokenizer")
    forbid(monkeypatch, safetensors.torch, "load_file")
    forbid(monkeypatch, torch, "load")
    forbid(monkeypatch, huggingface_hub, "snapshot_download")


def load(source):
    from explorer.panels.model import load_model

    state = fresh()
    try:
        return load_model(source, state, lambda *a, **k: None)
    finally:
        if state["model"] is None:
            assert state["source"] == "default"


@pytest.mark.parametrize("source, message", [
    ("/etc", "must be inside"), ("/etc/passwd", "must be inside"), ("../../etc", "must be inside"),
    ("good/../../..", "must be inside"), ("~", "must be inside"), ("link-out", "must be inside"),
    ("owner/name/extra", "not a folder"), ("-bad/repo", "not a folder"), ("a" * 97 + "/b", "not a folder"),
    ("https://huggingface.co/gpt2", "not a folder"), ("good\x00", "control characters"),
    ("x" * 5000, "not a usable folder name|not a folder"),
])
def test_sources_outside_the_root_or_not_repo_ids_are_refused_before_loading(monkeypatch, root, source, message):
    (root / "link-out").symlink_to("/etc")
    forbid_loading(monkeypatch)
    with pytest.raises(gr.Error, match=message):
        load(source)


def test_unknown_hub_ids_never_reach_the_network_offline(monkeypatch, root):
    import huggingface_hub

    calls = []

    def fake(repo_id, **kw):
        calls.append(kw)
        raise FileNotFoundError(repo_id)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    forbid(monkeypatch, checkpoints, "load_pretrained")
    with pytest.raises(gr.Error, match="offline"):
        load("nobody-here/no-such-model-12345")
    assert calls and all(kw.get("local_files_only") for kw in calls)  # only the local cache was asked


def _write_config(folder: Path, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("change, message", [
    (dict(num_attention_heads=0), "config.json is not a readable Llama config"),
    (dict(hidden_size=30), "config.json is not a readable Llama config"),
    (dict(num_hidden_layers=-2), "config.json is not a readable Llama config"),
    (dict(vocab_size="many"), "config.json is not a readable Llama config"),
    (dict(rope_parameters="yes"), "config.json is not a readable Llama config"),
    (dict(model_type="gpt2"), "Only Llama-family"),
    (dict(max_position_embeddings=10**9), "rotary tables"),
    (dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
          num_key_value_heads=8, head_dim=128), "M parameters"),
    ("[1, 2, 3]", "config.json is not a readable Llama config"),
    ("{not json", "config.json is not a readable Llama config"),
])
def test_configs_that_cannot_be_built_are_refused_before_reading_weights(monkeypatch, root, change, message):
    import shutil

    bad = root / "bad"
    shutil.copytree(root / "good", bad)
    if isinstance(change, str):
        (bad / "config.json").write_text(change)
    else:
        _write_config(bad, **change)
    forbid_loading(monkeypatch)
    with pytest.raises(gr.Error, match=message):
        load("bad")


@pytest.mark.parametrize("kind, message", [
    ("pickle only", "holds no .safetensors"),
    ("truncated", "not a readable safetensors"),
    ("corrupt", "not a readable safetensors"),
    ("empty", "not a readable safetensors"),
])
def test_weight_files_that_are_not_safetensors_or_broken_are_refused(monkeypatch, root, kind, message):
    import shutil

    bad = root / "bad"
    shutil.copytree(root / "good", bad)
    weights = bad / "model.safetensors"
    data = weights.read_bytes()
    if kind == "pickle only":
        weights.unlink()
        torch.save({"x": torch.zeros(2)}, bad / "pytorch_model.bin")
    elif kind == "truncated":
        weights.write_bytes(data[: len(data) // 2])
    elif kind == "corrupt":
        weights.write_bytes(os.urandom(len(data)))
    else:
        weights.write_bytes(b"")
    forbid(monkeypatch, torch, "load")  # pickled weights are never opened
    with pytest.raises(gr.Error, match=message):
        load("bad")


def test_weight_files_too_large_are_refused_before_reading(monkeypatch, root):
    import shutil

    bad = root / "bad"
    shutil.copytree(root / "good", bad)
    with open(bad / "model-00002.safetensors", "wb") as f:  # sparse: 5 GiB on paper, nothing on disk
        f.truncate(5 * 2**30)
    forbid_loading(monkeypatch)
    with pytest.raises(gr.Error, match="were not read"):
        load("bad")


def test_a_good_local_checkpoint_still_loads(root):
    status, *_, state = load("good")
    assert "Loaded" in status and state["model"] is not None


def test_visitors_own_models_are_capped_in_total(monkeypatch, root):
    """Private copies and loaded checkpoints of all sessions together stay under a cap: past it, the next copy or
    load is refused before it allocates; once a session's model is gone, there is room again."""
    import gc

    shared, _ = session.load_default()
    one = private_models.model_bytes(shared)
    gc.collect()
    monkeypatch.setattr(private_models, "PRIVATE_MODELS_BUDGET_BYTES", private_models.private_models_bytes() + int(1.5 * one))
    alice = fresh()
    session.private_model(alice)  # fits
    # now full, whatever the sizes of the default model and the checkpoint below, with no idle model to free
    # (freeing the one idle longest is tested below): the cap refuses
    monkeypatch.setattr(private_models, "_owners", {})
    monkeypatch.setattr(private_models, "PRIVATE_MODELS_BUDGET_BYTES", private_models.private_models_bytes() + 1)
    forbid(monkeypatch, checkpoints, "load_pretrained")
    monkeypatch.setattr(session, "prepared_copy", lambda m: pytest.fail("copied past the cap"))
    with pytest.raises(ValueError, match="visitors' own models already hold"):
        session.private_model(fresh())
    with pytest.raises(gr.Error, match="visitors' own models already hold"):
        load("good")
    monkeypatch.undo()  # the real loader and copy again
    monkeypatch.setattr(private_models, "PRIVATE_MODELS_BUDGET_BYTES", private_models.private_models_bytes() + int(0.5 * one))
    del alice
    bob = fresh()
    session.private_model(bob)  # alice's copy was released: room again
    assert bob["model"] is not None


def _deterministic(out):
    """A handler's answer without what depends on timing (markdown with milliseconds, timing figures)."""
    keep = []
    for item in out if isinstance(out, tuple) else (out,):
        if isinstance(item, go.Figure):
            keep.append(item.to_plotly_json()["data"])
        elif isinstance(item, (list, tuple)) and not isinstance(item, str):
            keep.append(json.dumps(item, default=str))
    return keep


def test_another_sessions_model_and_adapter_leave_this_sessions_answers_unchanged(model_root):
    """Alice loads another checkpoint, then fine-tunes an adapter on her copy of the default model; Bob's
    answers on every tab are the same, to the bit, before and after, and the shared model is untouched."""
    from explorer.panels.attention import attention_view
    from explorer.panels.encoder_decoder import encoder_decoder_view
    from explorer.panels.generation import generate
    from explorer.panels.lora import lora_compare, lora_finetune
    from explorer.panels.model import load_model
    from explorer.panels.positions import rope_view

    shared, _ = session.load_default()
    weights = {k: v.clone() for k, v in shared.state_dict().items()}
    bob = fresh()

    def bobs_answers():
        return [
            _deterministic(attention_view("Tom gave the red ball to Anna.", 1, 1, VIEWS[0], bob)[:2]),
            _deterministic(rope_view("Tom gave the red ball to Anna.", 500.0, 5, [0, 1], 1, 0, bob)[:4]),
            _deterministic(encoder_decoder_view("The dog found a ball.", 1, 1, -1, bob)[:4]),
            _deterministic(((g := generate("Tom has a red", 5, 0.7, 20, 0.9, 1, bob))[0], g[3],
                            [row[:6] for row in g[7]])),  # without the milliseconds
            _deterministic(lora_compare("Tom has a red", 0, 1, 5, bob)[:3]),
        ]

    before = bobs_answers()
    alice = fresh()
    load_model("tiny-local", alice, lambda *a, **k: None)
    assert alice["model"] is not None and bob["model"] is None
    assert bobs_answers() == before
    load_model("default", alice, lambda *a, **k: None)
    out = list(lora_finetune(2, 8, ["q_proj", "v_proj"], "Tom has a red ball. Anna has a red ball too.", 3, 1e-2,
                             10, alice, lambda *a, **k: None))
    assert "done" in out[-1].status and alice["model"] is not None
    assert bobs_answers() == before
    for k, v in shared.state_dict().items():
        assert torch.equal(v, weights[k]), k


# --- the code itself: no unsafe loading, no shell, no uploads without limits ---------------------------------

SOURCE_FILES = [p for d in ("explorer", "models") for p in (checkpoints.REPO_ROOT / d).rglob("*.py")] + \
    [checkpoints.REPO_ROOT / "app.py"]


def test_no_pickle_loading_remote_code_or_shell_in_the_app():
    import re

    for path in SOURCE_FILES:
        text = path.read_text()
        for call in re.findall(r"torch\.load\([^)]*\)", text):
            assert "weights_only=True" in call, f"{path.name}: {call}"
        assert not re.search(r"trust_remote_code\s*=\s*True", text), path
        assert "shell=True" not in text and "os.system(" not in text and "os.popen(" not in text, path
        assert "pickle.load" not in text and "eval(" not in text.replace(".eval(", ""), path
        if path.parent.name == "panels" or path.name in ("app.py", "session.py", "checkpoints.py", "private_models.py", "text.py"):
            assert "subprocess" not in text, path


def test_uploads_are_size_limited_and_the_queue_bounded():
    import app

    assert app.launch_kwargs()["max_file_size"] == app.MAX_UPLOAD == "1mb"  # Gradio's /upload route always exists
    assert app.QUEUE["max_size"] >= 12 * 32  # 32 visitors' page loads (about a dozen events each) fit the line
    assert app.QUEUE["default_concurrency_limit"] >= 1


# --- the served queue (explorer/serving.py) -----------------------------------------------------------------

def _fn_index(app_url: str, api_name: str) -> int:
    import urllib.request

    with urllib.request.urlopen(app_url + "config", timeout=10) as r:
        config = json.load(r)
    return next(d["id"] for d in config["dependencies"] if d.get("api_name") == api_name)


def _join(app_url: str, fn_index: int, data: list, session_hash: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    body = json.dumps({"data": data, "fn_index": fn_index, "session_hash": session_hash, "event_data": None,
                       "trigger_id": None}).encode()
    req = urllib.request.Request(app_url + "gradio_api/queue/join", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_one_session_flooding_the_queue_is_capped_and_others_are_answered(app_url):
    """A client that joins the queue in a loop and never reads its results holds at most SESSION_QUEUE_CAP
    places; its extra joins get a sentence, and another session's request is still answered."""
    from gradio_client import Client

    from explorer.web import serving

    fn = _fn_index(app_url, "memory_budget")
    args = [8, 64, 8, ["naive", "sdpa", "tiled"], True, "float32"]
    codes = [_join(app_url, fn, args, "flooding-session") for _ in range(serving.SESSION_QUEUE_CAP + 6)]
    accepted = [c for c, _ in codes if c == 200]
    refused = [text for c, text in codes if c != 200]
    assert len(accepted) <= serving.SESSION_QUEUE_CAP
    assert refused and all(c == 503 for c, _ in codes if c != 200)
    assert "requests waiting or running" in refused[0]
    answer = Client(app_url, verbose=False).predict(*args, api_name="/memory_budget")
    assert "Predicted to fit" in answer


def test_events_run_in_groups_by_what_they_hold(app_url):
    """Measurements share one group of one; views get more than one place each, so the idle core is used."""
    from explorer.web import serving

    assert serving.group_of("memory_compare") == ("measure", 1)
    assert serving.group_of("generate") == ("measure", 1)
    assert serving.group_of("attention_example") == (None, serving.VIEW_CONCURRENCY)
    assert serving.VIEW_CONCURRENCY > 1


@pytest.mark.parametrize("api_name, args", [
    ("/memory_budget", ["many", 64, 8, ["naive"], True, "float32"]),
    ("/memory_budget", [None, 64, 8, ["naive"], True, "float32"]),
    ("/memory_budget", [8, 64, 8, ["naive"], True, "x" * 100_000]),
])
def test_values_gradio_refuses_get_a_short_sentence(app_url, api_name, args):
    """Gradio checks a Slider's number and a Dropdown's choice before the handler: the answer is a sentence,
    not a bare "Error", and it echoes only a short prefix of what was sent."""
    from gradio_client import Client

    with pytest.raises(Exception) as caught:
        Client(app_url, verbose=False).predict(*args, api_name=api_name)
    message = str(caught.value)
    assert "is not one its controls accept" in message, message[:300]
    assert len(message) < 700


def test_error_popups_show_markup_as_text_and_cut_long_echoes():
    from explorer.panels import as_index, user_errors

    @user_errors
    def handler(text):
        raise ValueError(f"cannot read {text!r}")

    with pytest.raises(gr.Error) as caught:
        handler("<b>bold</b> \ud800")
    assert "<b>" not in caught.value.message and "&lt;b&gt;bold&lt;/b&gt;" in caught.value.message
    for value in (float("inf"), 1e308, "9" * 100_000):
        with pytest.raises(ValueError, match="layer must be") as caught:
            as_index(value, 4, "layer")
        assert len(str(caught.value)) < 120


def test_symlinks_out_of_the_model_root_are_refused_and_the_shipped_model_costs_no_private_copy(tmp_path,
                                                                                                monkeypatch):
    from explorer.state import checkpoints
    from explorer.state.private_models import private_models_bytes

    root = tmp_path / "root"
    outside = tmp_path / "outside"
    (root / "ckpt").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.txt").write_text("not a model card")
    (root / "ckpt" / "config.json").write_text("{}")
    (root / "ckpt" / "README.md").symlink_to(outside / "secret.txt")
    monkeypatch.setenv("EXPLORER_MODEL_ROOT", str(root))
    with pytest.raises(ValueError, match="links to a file outside the allowed model folder") as caught:
        checkpoints.load_checkpoint("ckpt")
    assert str(tmp_path) not in str(caught.value)  # no server path in the sentence
    with pytest.raises(ValueError) as caught:
        checkpoints.load_checkpoint("/etc")
    assert "must be inside" in str(caught.value) and str(root) not in str(caught.value)

    from explorer.panels.model import _card_text

    assert "not a model card" not in _card_text(root / "ckpt")

    shipped = checkpoints.default_model_dir().resolve()
    monkeypatch.setenv("EXPLORER_MODEL_ROOT", str(shipped.parent))
    before = private_models_bytes()
    for _ in range(5):
        model, _, _, source = checkpoints.load_checkpoint(shipped.name)
        assert model is None and source == "default"  # the shared model, not a private copy
    assert private_models_bytes() == before


def test_private_models_expire_when_idle_and_make_room_oldest_idle_first(monkeypatch):
    """A session's own model is freed after the idle time, or when another visitor needs the room (oldest idle
    first); its owner is told on the next action, once, and then sees the shared model."""
    import gc
    import time as clock

    from explorer.state import session

    from explorer.state import private_models

    gc.collect()
    monkeypatch.setattr(private_models, "_owners", {})  # other tests' sessions are not candidates here
    a, b, c = session.new_state(), session.new_state(), session.new_state()
    shared = session.get_model(a)[0]
    one = private_models.model_bytes(shared)
    base = private_models.private_models_bytes()
    monkeypatch.setattr(private_models, "PRIVATE_MODELS_BUDGET_BYTES", base + 2 * one + one // 2)  # two fit

    session.private_model(a)
    clock.sleep(0.01)
    session.private_model(b)
    clock.sleep(0.01)
    session.get_model(a)  # a used again: b is now the one idle longest
    session.private_model(c)  # no room for three: b goes
    assert a["model"] is not None and c["model"] is not None and b["model"] is None
    with pytest.raises(ValueError, match="was freed to make room"):
        session.get_model(b)
    assert session.is_shared(session.get_model(b)[0])  # told once, then the shared model
    gc.collect()
    assert private_models.private_models_bytes() <= base + 2 * one

    assert private_models.expire_idle(now=clock.monotonic() + private_models.IDLE_SECONDS + 1) == 2
    for state in (a, c):
        with pytest.raises(ValueError, match="minutes without use"):
            session.get_model(state)
    gc.collect()
    assert private_models.private_models_bytes() <= base


def test_opening_examples_are_computed_once_and_shared(app_url):
    """Two sessions' page loads: the second is served from explorer.state.cache (no new computation), same answer."""
    from gradio_client import Client

    from explorer.state.cache import results

    import urllib.request

    with urllib.request.urlopen(app_url + "config", timeout=10) as r:
        config = json.load(r)
    components = {c["id"]: c for c in config["components"]}

    def page_values(api_name):  # what the page sends on load: each input's initial value (State is the client's)
        dep = next(d for d in config["dependencies"] if d.get("api_name") == api_name)
        return [components[i]["props"].get("value") for i in dep["inputs"] if components[i]["type"] != "state"]

    calls = ["walkthrough_example", "encoder_decoder_example", "model_card", "memory_budget"]
    first = Client(app_url, verbose=False)
    answers = [first.predict(*page_values(api), api_name="/" + api) for api in calls]
    misses = results.stats()["misses"]
    second = Client(app_url, verbose=False)
    again = [second.predict(*page_values(api), api_name="/" + api) for api in calls]
    assert results.stats()["misses"] == misses  # nothing computed for the second session
    with results._guard:
        kept = {key[1] for key in results._entries if isinstance(key, tuple) and key[0] == "opening"}
    assert kept >= {"walkthrough", "encoder_decoder", "model_card", "memory_budget"}
    assert [str(a)[:2000] for a in again] == [str(a)[:2000] for a in answers]


def test_memory_lab_stop_returns_within_a_second_while_a_long_size_runs(app_url):
    """Stop (gradio's cancel) during a sweep whose current size takes seconds: the event ends within 1 s."""
    import time as clock

    from gradio_client import Client

    c = Client(app_url, verbose=False)
    job = c.submit(4096, 8, 64, 8, ["naive", "tiled"], True, "float32", api_name="/memory_compare")
    clock.sleep(3.0)  # inside the sweep's larger sizes
    assert not job.done()
    t0 = clock.perf_counter()
    job.cancel()
    while not job.done() and clock.perf_counter() - t0 < 10:
        clock.sleep(0.05)
    waited = clock.perf_counter() - t0
    assert job.done() and waited < 1.0, f"Stop took {waited:.2f} s"
    from explorer.state.locks import MEASURE_LOCK

    assert MEASURE_LOCK.acquire(timeout=120)  # the abandoned worker finished its step and let go
    MEASURE_LOCK.release()


# --- the last bare "Error"s: each answered with a sentence ----------------------------------------------------

def _prompt_endpoints():
    """Every handler that takes a text from a visitor, called with ``p`` as that text."""
    from explorer.panels.encoder_decoder import fill_in_blank_view
    from explorer.panels.formats import formats_view
    from explorer.panels.walkthrough import walkthrough

    return {**prompt_handlers(),
            "walkthrough": lambda p: walkthrough(p, None, 0, 0, fresh()),
            "fill_in_blank": lambda p: fill_in_blank_view(p, None, fresh()),
            "formats": lambda p: formats_view(p, fresh())}


@pytest.mark.parametrize("handler", ["attention", "rope", "encoder_decoder", "generate", "lora_compare",
                                     "lora_finetune", "walkthrough", "fill_in_blank", "formats"])
@pytest.mark.parametrize("prompt", ["Tom \ud800 has a ball", "\ud800", "a \udfff\ud83d b"])
def test_a_lone_surrogate_in_a_prompt_gets_a_sentence_on_every_endpoint(monkeypatch, handler, prompt):
    """Half of a UTF-16 pair (what JSON's "\\ud800" decodes to) is no character: the tokenizer raised a bare
    TypeError on it; now each endpoint refuses it with a sentence before the model runs."""
    forbid_model_runs(monkeypatch)
    with pytest.raises(gr.Error, match="broken character") as caught:
        _prompt_endpoints()[handler](prompt)
    assert "\ud800" not in caught.value.message and "\udfff" not in caught.value.message


@pytest.mark.parametrize("config", [[], {}, ["SmolLM2-135M"], 3.5])
def test_kv_calculator_with_a_configuration_that_is_not_a_name_gets_a_sentence(config):
    from explorer.panels.generation import kv_calculator

    with pytest.raises(gr.Error, match="unknown configuration .*: choose one from the list"):
        kv_calculator(config, 1024, 1, "float16", fresh())


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), 1e308, 10**400, "1e308"])
def test_layer_and_head_far_out_of_range_get_a_short_sentence(value):
    """JSON Infinity and 1e308 (a whole number of 309 digits) as a layer or head: a short sentence quoting the
    value as it was sent (1e+308), never its 309 digits."""
    from explorer.panels.attention import attention_view
    from explorer.panels.encoder_decoder import encoder_decoder_view

    for call in (lambda: attention_view("Tom has a ball.", value, 0, VIEWS[0], fresh()),
                 lambda: attention_view("Tom has a ball.", 0, value, VIEWS[0], fresh()),
                 lambda: encoder_decoder_view("Tom has a ball.", value, 0, -1, fresh())):
        with pytest.raises(gr.Error, match="(layer|head) must be") as caught:
            call()
        assert len(caught.value.message) < 120 and not re.search(r"\d{16}", caught.value.message), \
            caught.value.message


def test_messages_never_show_absolute_server_paths(tmp_path):
    """A ValueError that names a file by its server path (from a library, say) reaches the visitor with the
    path cut to its last part."""
    from explorer.panels import user_errors

    secret = tmp_path / "srv" / "models" / "config.json"

    @user_errors
    def handler():
        raise ValueError(f"cannot parse {secret}: expected a number at line 3")

    with pytest.raises(gr.Error) as caught:
        handler()
    assert str(tmp_path) not in caught.value.message and "/srv/" not in caught.value.message
    assert "config.json: expected a number" in caught.value.message


def test_memory_lab_refusals_say_what_the_visitor_can_change_not_the_servers_setting(monkeypatch):
    from explorer import measure
    from explorer.panels.memory import memory_compare

    forbid(monkeypatch, measure.run, "attention_sweep", "attention_memory")
    with pytest.raises(gr.Error) as caught:
        list(memory_compare(16384, 64, 256, 64, ["naive", "sdpa", "tiled"], False, "float32", lambda *a, **k: None))
    message = caught.value.message
    assert "EXPLORER_" not in message and "raise the budget" not in message
    assert "choose a sequence length of at most" in message or "fewer heads" in message


def test_the_generation_tabs_per_step_view_is_small_plain_data():
    """The finished generation's per-step view is the one thing the tab keeps in gr.State (its step slider
    reads it): ids, token texts and the probabilities the step chart draws, no figures or tensors, and a few
    tens of KB at the tab's longest run."""
    from explorer.panels.generation import MAX_NEW_TOKENS as MAX_NEW, generate

    out = generate("Tom has a red", MAX_NEW, 0.8, 50, 0.95, 0, fresh())
    text = json.dumps(out.view)  # plain JSON: raises on a figure, a tensor or an array
    assert len(out.view["steps"]) == MAX_NEW
    assert len(text) < 96 * 1024, f"{len(text)} bytes for {MAX_NEW} steps"  # measured: 65 KB for 128 steps


# --- uploads, through the real route -------------------------------------------------------------------------

def _gradio_upload_dir() -> Path:
    import tempfile

    return Path(os.environ.get("GRADIO_TEMP_DIR") or Path(tempfile.gettempdir()) / "gradio")


def _names_under(folder: Path) -> set[str]:
    return {p.name for p in folder.rglob("*")} if folder.exists() else set()


def test_multi_file_uploads_are_refused_before_anything_is_written(app_url):
    """No component of this app takes files, so Gradio's /gradio_api/upload (whose own limit is per file) is
    refused outright: one request of 1,000 files of 1 KB, and one of 100 files of 1 MB, get a sentence and
    leave nothing in Gradio's upload folder."""
    import http.client
    import urllib.parse

    import httpx

    tag = f"probe-{os.getpid()}-{np.random.default_rng().integers(1 << 30)}"
    before = _names_under(_gradio_upload_dir())
    many = [("files", (f"{tag}-{i}.txt", b"x" * 1024, "text/plain")) for i in range(1000)]
    r = httpx.post(app_url + "gradio_api/upload", files=many, timeout=60)
    assert r.status_code == 403 and "takes no files" in r.text, (r.status_code, r.text[:200])

    # 100 files of 1 MB: the refusal comes on the headers, before the 100 MB body is read
    boundary = "explorerboundary"
    part = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"{tag}-big.bin\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode() + b"y" * 2**20 + b"\r\n"
    length = 100 * len(part) + len(f"--{boundary}--\r\n")
    url = urllib.parse.urlsplit(app_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    conn.putrequest("POST", "/gradio_api/upload")
    conn.putheader("Content-Type", f"multipart/form-data; boundary={boundary}")
    conn.putheader("Content-Length", str(length))
    conn.endheaders()
    try:
        conn.send(part)  # the first file; the server answers without reading the rest
    except (BrokenPipeError, ConnectionResetError):
        pass
    answer = conn.getresponse()
    text = answer.read().decode()
    conn.close()
    assert answer.status == 403 and "takes no files" in text, (answer.status, text[:200])
    after = _names_under(_gradio_upload_dir())
    assert not {n for n in after - before if tag in n}, "an upload was written to disk"


def test_with_a_component_that_takes_files_one_request_is_bounded_in_all(monkeypatch):
    """Where a component takes files, one request may carry at most UPLOAD_REQUEST_BYTES in all, whatever
    Gradio's per-file limit allows."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from explorer.web import middleware

    async def upload(request):
        return PlainTextResponse(f"read {len(await request.body())} bytes")

    app = Starlette(routes=[Route("/gradio_api/upload", upload, methods=["POST"])],
                    middleware=[Middleware(middleware.UploadLimit)])
    monkeypatch.setattr(middleware, "ACCEPTS_FILES", True)
    monkeypatch.setattr(middleware, "UPLOAD_REQUEST_BYTES", 10_000)
    with TestClient(app) as client:
        assert client.post("/gradio_api/upload", content=b"z" * 5_000).text == "read 5000 bytes"
        refused = client.post("/gradio_api/upload", content=b"z" * 20_000)
        assert refused.status_code == 413 and "at most" in refused.text
    monkeypatch.setattr(middleware, "ACCEPTS_FILES", False)
    with TestClient(app) as client:
        assert client.post("/gradio_api/upload", content=b"z").status_code == 403


def test_the_page_and_its_configuration_are_built_once(app_url):
    """The page (its configuration inside) is the same for every visitor: served from memory after the first."""
    import httpx

    first, second = httpx.get(app_url, timeout=30), httpx.get(app_url, timeout=30)
    assert first.status_code == second.status_code == 200 and first.content == second.content
    assert httpx.get(app_url + "config", timeout=30).json()["dependencies"]


def test_the_sweep_drops_results_nobody_used_but_keeps_the_opening_examples(monkeypatch):
    """After the idle time, per-prompt results go (a class's prompts leave with the class); the opening
    examples, computed once per model for every visitor, stay."""
    import time as clock

    from explorer.state.cache import ResultCache
    from explorer.web import sweeper

    cache = ResultCache(2**20)
    cache.put(("opening", "attention", 1, ()), "shared")
    cache.put(("attention.forward", 1, (5, 6)), "one prompt")
    cache.put(("attention.forward", 1, (7, 8)), "another")
    assert cache.drop_unused(60, keep=sweeper._is_opening) == 0  # all used just now
    later = clock.monotonic() + 120
    monkeypatch.setattr("explorer.state.cache.time.monotonic", lambda: later)
    assert cache.get(("attention.forward", 1, (7, 8))) == "another"  # read again "now"
    assert cache.drop_unused(60, keep=sweeper._is_opening) == 1
    assert cache.get(("opening", "attention", 1, ())) == "shared"
    assert cache.get(("attention.forward", 1, (5, 6))) is None
    assert cache.stats()["entries"] == 2
