"""Helpers and fixtures shared by the tests/test_robustness_*.py files: hostile input to every handler, called
directly (no server): each returns a result or raises gr.Error with a sentence; never a TypeError, IndexError,
RuntimeError or NaN. Refusals happen before anything is loaded or allocated (the loader and the allocating
functions are replaced by ones that fail the test).

The handlers run on the same served model as the app tests (tests/conftest.py: the shipped default model,
or a tiny random checkpoint when it is absent, or always with EXPLORER_TEST_FIXTURE_MODEL=1), on one torch
thread so the box stays usable (set by the ``served`` fixture of each module that uses it, restored after it).
"""
from __future__ import annotations

import os
import re

import gradio as gr
import numpy as np
import plotly.graph_objects as go
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from explorer.state import session, threads

# examples, deadline and seed come from the Hypothesis profile (tests/conftest.py: 30 examples each under "ci")
SETTINGS = settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

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


def fresh():
    return session.new_state()


VIEWS = ["causal (as trained)", "bidirectional (mask removed)"]
PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
IMPLS = ["naive", "sdpa", "tiled"]


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


# --- every endpoint that takes a text ------------------------------------------------------------------------------

def _prompt_endpoints():
    """Every handler that takes a text from a visitor, called with ``p`` as that text."""
    from explorer.panels.encoder_decoder import fill_in_blank_view
    from explorer.panels.formats import formats_view
    from explorer.panels.walkthrough import walkthrough

    return {**prompt_handlers(),
            "walkthrough": lambda p: walkthrough(p, None, 0, 0, fresh()),
            "fill_in_blank": lambda p: fill_in_blank_view(p, None, fresh()),
            "formats": lambda p: formats_view(p, fresh())}
