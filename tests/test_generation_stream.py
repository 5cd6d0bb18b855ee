"""KV cache & generation streams: the handler yields before the last token, Stop ends a run, the uncached
comparison runs at a bounded set of steps only."""
from __future__ import annotations

import time

import pytest
import torch

from explorer import probes

from explorer.state import session
from explorer.panels import generation
from models import Decoder, ModelConfig
from models.generate import generate as generate_tokens


def tiny_model() -> Decoder:
    torch.manual_seed(0)
    return Decoder(ModelConfig(vocab_size=61, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                               max_seq_len=128)).eval()


def test_stream_generation_matches_generate_and_times_uncached_at_the_schedule_only():
    model = tiny_model()
    prompt = torch.randint(0, 61, (1, 5))
    schedule = probes.uncached_schedule(40)
    assert len(schedule) == 8 and {0, 39} <= schedule
    steps = list(probes.stream_generation(model, prompt, 40, temperature=0.9, top_k=20, seed=3, uncached_at=schedule))
    want = generate_tokens(model, prompt, 40, temperature=0.9, top_k=20, seed=3)[0, 5:].tolist()
    assert [s["token"] for s in steps] == want
    assert {s["step"] for s in steps if s["uncached_seconds"] is not None} == schedule
    for s in steps:
        if s["step"] in schedule:  # recomputing the sequence gives the cached logits (float32 rounding)
            assert s["uncached_max_abs_dlogit"] < 1e-4 and s["uncached_same_top"]
    stop = want[6]
    stopped = [s["token"] for s in probes.stream_generation(model, prompt, 40, temperature=0.9, top_k=20, seed=3,
                                                            stop_tokens=[stop])]
    assert stopped == want[:want.index(stop) + 1]


def test_the_handler_yields_text_before_the_last_token():
    state = session.new_state()
    stream = generation.generate_stream(generation.DEFAULT_PROMPT, 6, 0.0, None, None, 0, state, True)
    first = next(stream)
    generated = [seg for seg in first.text if seg[1] == "generated"]
    assert len(generated) == 1 and "token 1 of at most 6" in first.summary  # one token so far, not the last
    rest = list(stream)
    assert len(rest) == 6  # five more tokens, then the finished view with the charts
    final = rest[-1]
    assert len(final.table) <= 6 and "measured" in final.summary.lower()


@pytest.mark.slow
def test_stop_ends_a_run_through_the_api_and_the_worker_answers_next(client):
    job = client.submit(generation.DEFAULT_PROMPT, 128, 0.0, None, None, 0, api_name="/generate")
    deadline = time.time() + 120
    while len(job.outputs()) < 3 and time.time() < deadline and not job.done():
        time.sleep(0.05)
    seen = len(job.outputs())
    assert 3 <= seen and not job.done()  # streaming: outputs arrive while the run goes on
    job.cancel()
    while not job.done() and time.time() < deadline:
        time.sleep(0.05)
    assert len(job.outputs()) < 129  # it did not run to the end
    started = time.time()
    out = client.predict("Tom", 2, 0.0, None, None, 0, api_name="/generate")
    assert len(out[6]["data"]) == 2 and time.time() - started < 60


def test_chat_on_a_model_without_a_chat_template_says_the_prompt_went_in_as_plain_text():
    state = session.new_state()  # the shipped default model: its tokenizer has no chat template
    on = list(generation.generate_stream(generation.DEFAULT_PROMPT, 2, 0.0, None, None, 0, state, True))[-1]
    off = list(generation.generate_stream(generation.DEFAULT_PROMPT, 2, 0.0, None, None, 0, state, False))[-1]
    assert "has no chat template" in on.summary and "chat template" not in off.summary
    assert on.text == off.text  # the same plain prompt went in either way


# --- which code computed the tokens -------------------------------------------------------------------------------
def _final(decode, temperature=0.0, n=12):
    state = session.new_state()  # the shipped default model, laid out for decoding as the app serves it
    return list(generation.generate_stream(generation.DEFAULT_PROMPT, n, temperature, None, None, 0, state, True,
                                           decode))[-1]


def test_the_tab_decodes_with_the_modules_by_default_and_says_so(monkeypatch):
    from models.speed import step as speed_step

    monkeypatch.setattr(speed_step, "_torch_step", lambda *a: pytest.fail("the fast step ran by default"))
    monkeypatch.setattr(speed_step, "run_cpu_step", lambda *a: pytest.fail("the fast step ran by default"))
    view = list(generation.generate_stream(generation.DEFAULT_PROMPT, 6, 0.0, None, None, 0, session.new_state(),
                                           True))[-1]
    assert generation.DEFAULT_DECODE == "the modules"
    assert view.summary.startswith("**Computed by the modules**")


def test_the_fast_step_gives_the_modules_tokens_and_the_tab_checks_it_live():
    modules, fast = _final("the modules"), _final("the fast step")
    assert fast.text == modules.text  # the same tokens on this prompt
    assert "**Computed by the fast step**" in fast.summary and "the 11 tokens after it through" in fast.summary
    assert "same tokens as the modules on this prompt" in fast.summary
    sampled = _final("the fast step", temperature=0.8)
    assert "Sampled at temperature 0.8" in sampled.summary and "not checked here" in sampled.summary
    assert "same tokens as the modules" not in sampled.summary


def test_the_check_catches_an_edit_of_the_teaching_code_the_fast_step_cannot_see(monkeypatch):
    """A student edits RMSNorm.forward: the modules' tokens change, the fast step's do not, and the tab says that its
    tokens are not the modules' instead of claiming they are."""
    from models.layers import RMSNorm

    real = RMSNorm.forward
    before = _final("the fast step")
    monkeypatch.setattr(RMSNorm, "forward", lambda self, x: real(self, x) * torch.linspace(0.1, 3.0, x.shape[-1]))
    edited = _final("the fast step")
    assert "picks **another token at step" in edited.summary and "same tokens as the modules" not in edited.summary
    assert _final("the modules").text != before.text  # the modules show the edit


def test_the_fast_step_stepping_aside_is_said(monkeypatch):
    model, _ = session.load_default()
    handle = model.blocks[0].attn.hook_pattern.register_forward_hook(lambda m, a, o: None)
    try:
        view = _final("the fast step", n=4)
    finally:
        handle.remove()
    assert "stepped aside" in view.summary and "a hook or an edit is attached" in view.summary
    assert view.summary.startswith("**Computed by the modules**")


def test_an_unknown_decode_path_is_refused_with_a_sentence():
    with pytest.raises(Exception, match="decode with must be one of"):
        _final("the fastest step")
