"""models.speed: the fast step a caller passes to ``generate(..., step=fast_step)``, and the teaching path that runs
when none is passed.

Checked against the modules' own forward (the teaching code, independent of the flat step): logits within float
rounding at every step, identical greedy tokens, the same KV cache contents; never taken where it would skip
something (a hook, an edit, LoRA, int8, bf16, another attention implementation, a module or option it does not know);
and never taken unless passed: an edit of the teaching code changes what ``generate`` computes."""
import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from models import generate
from models.generate import decode_one, prefill
from models.hooks import HookPoint
from models.layers import RMSNorm, SwiGLU
from models.lora import attach_lora
from models.quant import quantize_int8
from models.speed import fast_step, narrow, torch_step, why_not
from tests.speed_pair import _Counted, _pair, _step_by_step, tiny

REPO = Path(__file__).resolve().parents[1]
STEPS = [fast_step, torch_step]


@pytest.mark.parametrize("batch", [1, 2], ids=["one-token-cpu-step", "batch-torch-step"])
@pytest.mark.parametrize("kw", [dict(), dict(n_kv_heads=6, tie_embeddings=False), dict(n_kv_heads=1)],
                         ids=["gqa-tied", "mha-untied", "mqa"])
def test_decode_step_matches_the_modules_forward(kw, batch):
    plain, fast = _pair(tiny(**kw))
    assert why_not(fast) is None and why_not(plain) is None  # the layout is a speed choice, not a condition
    prompt = torch.randint(0, 97, (batch, 7), generator=torch.Generator().manual_seed(1))
    ref_tokens, ref_logits, ref_cache = _step_by_step(plain, prompt, 20)
    for model, step in [(fast, fast_step), (fast, torch_step), (plain, fast_step)]:
        tokens, logits, cache = _step_by_step(model, prompt, 20, step=step)
        assert torch.equal(tokens, ref_tokens)
        torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
        assert logits.abs().max() > 1  # logits of a spread model, not a degenerate zero
        for layer in range(plain.config.n_layers):  # the KV-cache views see the same keys and values
            torch.testing.assert_close(cache.k[layer], ref_cache.k[layer], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(cache.v[layer], ref_cache.v[layer], atol=1e-5, rtol=1e-5)
        assert cache.length == ref_cache.length
    counted = _Counted(fast_step)
    assert torch.equal(generate(fast, prompt, 24, step=counted), generate(plain, prompt, 24))
    assert counted.ran == 23 and counted.aside == 0
    assert torch.equal(generate(fast, prompt, 24, step=fast_step), generate(fast, prompt, 24, use_cache=False))


@pytest.mark.slow
def test_decode_step_on_the_shipped_default_model():
    from explorer.state import session

    model, tokenizer = session.load_default()  # the app's copy, laid out by optimize_for_decode
    assert fast_step.why_not(model) is None
    plain = copy.deepcopy(model)
    prompt = torch.tensor([tokenizer("Once upon a time, there was a little girl named Lily.")["input_ids"]])
    ref_tokens, ref_logits, _ = _step_by_step(plain, prompt, 48)
    tokens, logits, _ = _step_by_step(model, prompt, 48, step=fast_step)
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=1e-5)
    counted = _Counted(fast_step)
    assert torch.equal(generate(model, prompt, 48, step=counted), generate(plain, prompt, 48))
    assert counted.ran == 47
    assert torch.equal(generate(model, prompt, 48), generate(plain, prompt, 48))  # the default: the modules


# --- the teaching path is the default -----------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [RMSNorm, SwiGLU])
def test_an_edit_of_the_teaching_code_changes_what_generate_computes_unless_the_fast_step_was_passed(monkeypatch,
                                                                                                      cls):
    """A student who edits models/layers.py sees the generated text change: every step runs the modules. The fast
    step is a second implementation: passed explicitly, it keeps computing the original math (which is why the
    generation tab checks its tokens against the modules and says so)."""
    _, model = _pair(tiny())  # laid out as the app serves it
    prompt = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(5))
    before = generate(model, prompt, 16)
    with_step = generate(model, prompt, 16, step=fast_step)
    assert torch.equal(before, with_step)
    real = cls.forward
    calls, prompt_only, decoding = [], [False], [False]

    def edited(self, x):
        calls.append(x.shape[1])
        out = real(self, x)
        if prompt_only[0] and decoding[0]:
            return out
        return -out if cls is SwiGLU else out * torch.linspace(0.2, 3.0, out.shape[-1])

    monkeypatch.setattr(cls, "forward", edited)
    after = generate(model, prompt, 16)
    assert not torch.equal(after[:, 6:], before[:, 6:])  # the edit changed the generated tokens
    assert calls.count(1) >= 15 * model.config.n_layers  # every decode step ran the edited module
    calls.clear()
    with torch.inference_mode():
        prefill(model, prompt, model.new_cache(1, 6))
    in_prefill, calls[:] = len(calls), []
    fast = generate(model, prompt, 16, step=fast_step)
    assert len(calls) == in_prefill > 0  # only the prompt ran the modules
    assert not torch.equal(fast[:, 7:], after[:, 7:])  # so the edit is missing from every later token:
    prompt_only[0] = True  # the reference: the modules, edited for the prompt only
    ref = generate(model, prompt, 16, on_step=lambda i, *a: decoding.__setitem__(0, True))
    assert torch.equal(fast, ref)  # they are the original math's, after an edited prompt


@pytest.mark.slow  # a fresh Python process
def test_generate_imports_no_speed_code():
    source = (REPO / "models" / "generate.py").read_text()
    assert "speed" not in re.sub(r'""".*?"""|#.*', "", source, flags=re.S)  # docstrings and comments may name it
    proc = subprocess.run([sys.executable, "-c", "import json, sys, models; print(json.dumps(sorted(sys.modules)))"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert not [m for m in json.loads(proc.stdout) if m.startswith("models.speed")]  # not even imported
    assert decode_one.__defaults__ == (None,)  # step=None: the modules


# --- stepping aside -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("step", STEPS, ids=["fast", "torch"])
def test_a_hook_anywhere_sends_decoding_through_the_modules(step):
    _, fast = _pair(tiny())
    prompt = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(2))
    for where in (fast.blocks[1].attn.hook_pattern, fast.blocks[2].mlp.hook_post, fast.norm.hook_scale,
                  fast.blocks[0], fast.lm_head, fast):
        seen = []
        handle = where.register_forward_hook(lambda m, i, o: seen.append(1))
        try:
            assert step.why_not(fast) == "a hook or an edit is attached"
            cache = fast.new_cache(1, 8)
            prefill(fast, prompt, cache)
            n = len(seen)
            counted = _Counted(step)
            decode_one(fast, prompt[:, :1], cache, 5, counted)
            assert len(seen) > n, f"the decode step skipped the hook on {type(where).__name__}"
            assert counted.aside == 1 and counted.ran == 0
        finally:
            handle.remove()
        assert step.why_not(fast) is None
    handle = fast.blocks[0].attn.register_forward_pre_hook(lambda m, a: None)
    assert step.why_not(fast) is not None
    cache = fast.new_cache(1, 8)
    prefill(fast, prompt, cache)
    assert step(fast, prompt[:, :1], cache, 5) is None
    handle.remove()
    handle = nn.modules.module.register_module_forward_hook(lambda m, i, o: None)  # a global hook
    try:
        assert step.why_not(fast) is not None
        cache = fast.new_cache(1, 8)
        prefill(fast, prompt, cache)
        assert step(fast, prompt[:, :1], cache, 5) is None
    finally:
        handle.remove()
    assert step.why_not(fast) is None


@pytest.mark.parametrize("step", STEPS, ids=["fast", "torch"])
def test_an_edit_or_a_hook_added_during_a_generation_is_seen_at_the_next_step(step):
    """The full check runs once per generation; each step re-checks hooks and edits on every module."""
    _, fast = _pair(tiny())
    prompt = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(3))
    plain_tokens = generate(fast, prompt, 12)
    point = fast.blocks[1].hook_resid_mid
    handles = []

    def attach_at_4(kind):
        def on_step(i, logits, nxt, cache):
            if i == 4:  # after the 5th token was chosen, before the 5th decode step: that step must see it
                handles.append(point.add_edit(lambda x, p: -x) if kind == "edit"
                               else point.register_forward_hook(lambda m, a, o: None))
        return on_step

    for kind in ("edit", "hook"):
        counted = _Counted(step)
        out = generate(fast, prompt, 12, step=counted, on_step=attach_at_4(kind))
        assert counted.ran == 4 and counted.aside == 7, (kind, counted.ran, counted.aside)
        assert why_not(fast) == "a hook or an edit is attached"
        handles.pop().remove()
        ref = generate(fast, prompt, 12, on_step=attach_at_4(kind))  # the modules throughout, the same edit
        handles.pop().remove()
        assert torch.equal(out, ref)
        assert torch.equal(out[:, :10], plain_tokens[:, :10])
        if kind == "edit":
            assert not torch.equal(out, plain_tokens)  # the edit changed the later tokens
        assert why_not(fast) is None


def test_an_edit_is_computed_by_the_modules_with_the_fast_step_passed():
    """With an edit present the fast step steps aside for the whole generation: the tokens are the modules' edited
    ones, different from the unedited tokens."""
    _, fast = _pair(tiny())
    prompt = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(4))
    unedited = generate(fast, prompt, 12, step=fast_step)
    handle = fast.blocks[1].hook_resid_post.add_edit(lambda x, p: -x)
    try:
        counted = _Counted(fast_step)
        edited = generate(fast, prompt, 12, step=counted)
        assert counted.ran == 0 and counted.aside == 11
        assert torch.equal(edited, generate(fast, prompt, 12))  # the modules' edited tokens
        assert not torch.equal(edited, unedited)
    finally:
        handle.remove()
    assert torch.equal(generate(fast, prompt, 12, step=fast_step), unedited)


def test_lora_bf16_and_other_attention_implementations_take_the_modules_path():
    plain, fast = _pair(tiny())
    prompt = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(3))

    lora = copy.deepcopy(fast)
    generate(lora, prompt, 3, step=fast_step)  # a generation checked it: attaching LoRA afterwards must be seen
    assert why_not(lora) is None
    attach_lora(lora, rank=2)
    assert "LoRALinear" in why_not(lora)
    with torch.no_grad():
        for m in lora.modules():
            if hasattr(m, "lora_B"):
                m.lora_B.normal_(0, 0.3)  # a trained adapter: it changes the output
    ref = lora(torch.cat([prompt, generate(lora, prompt, 1)[:, -1:]], 1))[:, -1]
    cache = lora.new_cache(1, 8)
    prefill(lora, prompt, cache)
    counted = _Counted(fast_step)
    torch.testing.assert_close(decode_one(lora, generate(lora, prompt, 1)[:, -1:], cache, 6, counted), ref,
                               atol=1e-5, rtol=1e-5)  # the adapter's contribution is in the decode step
    assert counted.aside == 1

    int8, _ = quantize_int8(fast)  # int8 runs where its kernel is built (tests/test_speed_int8.py), else steps aside
    assert (why_not(int8) is None) == (narrow.unavailable() is None)
    assert why_not(copy.deepcopy(fast).to(torch.bfloat16)) == "weights not in float32"
    for impl in ("naive", "tiled"):
        assert "attention" in why_not(copy.deepcopy(fast).set_attn_impl(impl))
    assert why_not(copy.deepcopy(fast)) is None and why_not(copy.deepcopy(fast).to(torch.float32)) is None
    assert fast_step(fast, prompt[:, :2], fast.new_cache(1, 8), 0) is None  # two tokens: the model's forward
    switched = copy.deepcopy(fast)  # set_attn_impl during a generation swaps no module: seen at the next step
    cache = switched.new_cache(1, 10)
    with torch.inference_mode():
        prefill(switched, prompt, cache)
        assert fast_step(switched, prompt[:, :1], cache, 6) is not None
        switched.set_attn_impl("naive")
        assert fast_step(switched, prompt[:, :1], cache, 7) is None


def test_modules_and_options_the_step_does_not_know_send_decoding_to_the_modules():
    """Conservative by construction: anything not in the step's own list takes the modules, such as a bias, an extra
    module (a QK norm), an extra setting on an attention layer (a sliding window) or an unknown config field."""
    import dataclasses

    from models.config import ModelConfig

    _, fast = _pair(tiny())
    cases = []
    biased = copy.deepcopy(fast)
    old = biased.blocks[1].attn.q_proj
    biased.blocks[1].attn.q_proj = nn.Linear(old.in_features, old.out_features, bias=True)
    cases.append(("bias", biased))
    qk_norm = copy.deepcopy(fast)
    for x in "qk":
        setattr(qk_norm.blocks[0].attn, f"{x}_norm", RMSNorm(qk_norm.config.head_dim))
        setattr(qk_norm.blocks[0].attn, f"hook_{x}_normed", HookPoint())
    cases.append(("QK norm", qk_norm))
    window = copy.deepcopy(fast)
    window.blocks[2].attn.sliding_window = 4
    cases.append(("sliding window", window))

    @dataclasses.dataclass
    class WindowConfig(ModelConfig):
        attention_sinks: int = 0  # a field ModelConfig does not have

    configured = copy.deepcopy(fast)
    configured.config = WindowConfig(**fast.config.to_dict())
    cases.append(("config field", configured))
    subclassed = copy.deepcopy(fast)

    class MyNorm(RMSNorm):
        pass

    subclassed.norm.__class__ = MyNorm
    cases.append(("subclass", subclassed))
    unbound = copy.deepcopy(fast)
    unbound.blocks[0].mlp.forward = lambda x: x  # an instance-level forward
    cases.append(("instance forward", unbound))
    prompt = torch.randint(0, 97, (1, 4), generator=torch.Generator().manual_seed(6))
    for label, model in cases:
        assert why_not(model) is not None, label
        cache = model.new_cache(1, 8)
        with torch.inference_mode():
            prefill(model, prompt, cache)
            assert fast_step(model, prompt[:, :1], cache, 4) is None, label
            assert torch_step(model, prompt[:, :1], cache, 4) is None, label
    assert "attention_sinks" in why_not(configured)
    switched = _pair(tiny())[1]
    switched.config = dataclasses.replace(switched.config, qk_norm=True)  # a family switch the step does not compute
    assert "qk_norm" in why_not(switched)


# --- nothing process-wide, nothing private ------------------------------------------------------------------------
@pytest.mark.slow  # a fresh Python process
def test_importing_models_registers_nothing_process_wide():
    proc = subprocess.run([sys.executable, "-m", "tests.torch_registries", "models", "models.speed", "lens.hooks",
                           "explorer.probes"], cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    sizes = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"_global_forward_hooks", "_global_module_registration_hooks",
            "_global_parameter_registration_hooks"} <= set(sizes["before"])  # the registries were looked at
    assert sizes["after"] == sizes["before"]


# Reading these couples a file to PyTorch's internals: only models/hooks.py may (it checks the torch version at
# import), and tests/torch_registries.py, which checks that nothing registers process-wide hooks.
PRIVATE_TORCH = re.compile(r"\._forward_hooks|\._forward_pre_hooks|\._backward_hooks|\._backward_pre_hooks|"
                           r"\._global_|\._modules\b|\._parameters\b|\._buffers\b|\._non_persistent_buffers_set|"
                           r"\._state_dict_hooks|\._load_state_dict_pre_hooks|\bnext_id\b|\btorch\._[A-Za-z]|"
                           r"\bfrom torch\._|\bimport torch\._|_EventType|experimental_event_tree|\bregister_module_"
                           r"(?:module|parameter|buffer)_registration_hook")
ALLOWED = {"models/hooks.py", "tests/torch_registries.py"}


def test_no_file_outside_models_hooks_reads_private_torch_state():
    files = [p for p in REPO.rglob("*.py") if not any(part.startswith(".") for part in p.relative_to(REPO).parts)]
    assert len(files) > 50
    found = []
    for path in files:
        rel = path.relative_to(REPO).as_posix()
        if rel in ALLOWED or rel == "tests/test_speed.py":  # this file names the patterns it looks for
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if PRIVATE_TORCH.search(line):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "private torch state read outside models/hooks.py:\n" + "\n".join(found)
    assert PRIVATE_TORCH.search((REPO / "models" / "hooks.py").read_text())  # the pattern does find what it is for
    assert PRIVATE_TORCH.search("from torch._C._profiler import _EventType")
    assert PRIVATE_TORCH.search("x = RemovableHandle.next_id") and PRIVATE_TORCH.search("m._modules.values()")
