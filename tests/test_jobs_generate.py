"""The one generation loop: every caller's tokens against a loop written out here (the whole sequence through the
model's forward at every step, no cache, no code from models/generate.py's loop), greedy and seeded sampling, with
and without the KV cache and with the fast step."""
from __future__ import annotations

import copy

import pytest
import torch

from explorer import probes
from models import Decoder
from models.generate import generate
from models.speed import fast_step, optimize_for_decode
from tests.tiny_decoder import spread, tiny

PROMPT_LEN, NEW = 5, 24
SAMPLED = dict(temperature=0.9, top_k=20, top_p=0.95)


def _model(seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    return spread(Decoder(tiny(vocab_size=61, max_seq_len=64)), std=0.2, norms=True)


def _prompt(batch: int = 1, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 61, (batch, PROMPT_LEN), generator=torch.Generator().manual_seed(seed))


def _distribution(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """The sampler's distribution from its definition, in float64: softmax of logits / temperature over the top_k
    largest, then the smallest set of the most likely tokens whose mass reaches top_p. logits (V,) -> (V,) fp32."""
    z = logits.double()
    if top_k is not None:
        z = z.masked_fill(z < torch.sort(z, descending=True).values[top_k - 1], float("-inf"))
    p = torch.softmax((z - z.max()) / temperature, -1)
    if top_p is not None:
        sorted_p, order = p.sort(descending=True)
        keep = torch.zeros_like(p, dtype=torch.bool)
        keep[order] = (sorted_p.cumsum(0) - sorted_p) < top_p
        p = torch.where(keep, p, 0.0)
        p = p / p.sum()
    return p.float()


def plain_loop(model, prompt: torch.Tensor, n: int, *, temperature: float = 0.0, top_k=None, top_p=None,
               seed: int | None = None, stop=()) -> list[list[int]]:
    """Each row continued by ``n`` tokens: the whole sequence through the model at every step (no cache), argmax for
    temperature 0, else one draw per row from ``_distribution`` with a generator seeded once. A row ends at a token
    of ``stop``."""
    g = torch.Generator().manual_seed(seed) if seed is not None else None
    rows = []
    for row in prompt.tolist():
        seq = list(row)
        with torch.no_grad():
            for _ in range(n):
                logits = model(torch.tensor([seq]))[0, -1]
                if temperature == 0:
                    nxt = int(logits.argmax())
                else:
                    p = _distribution(logits, temperature, top_k, top_p)
                    nxt = int(torch.multinomial(p[None], 1, generator=g)[0, 0])
                seq.append(nxt)
                if nxt in stop:
                    break
        rows.append(seq[len(row):])
    return rows


class Counted:
    """The fast step, counting the tokens it computed (it returns None where it steps aside)."""

    def __init__(self):
        self.ran = 0

    def __call__(self, *args):
        logits = fast_step(*args)
        self.ran += logits is not None
        return logits


@pytest.fixture(scope="module")
def models():
    plain = _model()
    return plain, optimize_for_decode(copy.deepcopy(plain))


@pytest.mark.parametrize("sampling", [{}, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("path", ["cache", "no-cache", "fast-step"])
def test_generate_gives_the_plain_loops_tokens(models, sampling, path):
    plain, laid_out = models
    prompt = _prompt()
    want = plain_loop(plain, prompt, NEW, seed=7, **sampling)
    step = Counted() if path == "fast-step" else None
    got = generate(laid_out if step else plain, prompt, NEW, seed=7, use_cache=path != "no-cache", step=step,
                   **sampling)
    assert got[:, :PROMPT_LEN].tolist() == prompt.tolist()
    assert got[:, PROMPT_LEN:].tolist() == want
    if step is not None:
        assert step.ran == NEW - 1  # every token after the prompt's came from the fast step


def test_a_batch_and_stop_tokens_follow_the_plain_loop_row_by_row(models):
    plain, _ = models
    prompt = _prompt(batch=2, seed=3)
    free = plain_loop(plain, prompt, NEW)
    stop = {free[0][6], free[1][9]}
    want = plain_loop(plain, prompt, NEW, stop=stop)
    for use_cache in (True, False):
        out = generate(plain, prompt, NEW, stop_tokens=stop, use_cache=use_cache)[:, PROMPT_LEN:].tolist()
        longest = max(len(w) for w in want)
        assert len(out[0]) == longest
        for row, w in zip(out, want):  # a row that ended first repeats its stop token
            assert row[:len(w)] == w and all(t == w[-1] for t in row[len(w):])


@pytest.mark.parametrize("sampling", [{}, SAMPLED], ids=["greedy", "sampled"])
def test_the_probes_stream_and_trace_give_the_plain_loops_tokens(models, sampling):
    plain, laid_out = models
    prompt = _prompt()
    want = plain_loop(plain, prompt, NEW, seed=7, **sampling)[0]
    stream = list(probes.stream_generation(plain, prompt, NEW, seed=7, uncached_at={0, 5}, **sampling))
    assert [st["token"] for st in stream] == want and not any(st["fast_step"] for st in stream)
    assert [st["positions_computed"] for st in stream] == [PROMPT_LEN] + [1] * (NEW - 1)
    step = Counted()
    fast = list(probes.stream_generation(laid_out, prompt, NEW, seed=7, step=step, **sampling))
    assert [st["token"] for st in fast] == want and step.ran == NEW - 1
    assert [st["fast_step"] for st in fast] == [False] + [True] * (NEW - 1)
    for use_cache in (True, False):
        trace = probes.generation_trace(plain, prompt, NEW, seed=7, use_cache=use_cache, **sampling)
        assert trace["new_tokens"] == want
    stop = want[7]
    stopped = [st["token"] for st in probes.stream_generation(plain, prompt, NEW, seed=7, stop_tokens=[stop],
                                                              **sampling)]
    assert stopped == want[:want.index(stop) + 1]


def test_the_stream_holds_its_lock_while_computing_and_never_while_the_caller_holds_a_step(models):
    plain, _ = models
    held = []

    class Lock:
        depth = 0

        def __enter__(self):
            Lock.depth += 1

        def __exit__(self, *exc):
            Lock.depth -= 1

    def watch(module, args, out):
        held.append(Lock.depth)

    handle = plain.register_forward_hook(watch)
    try:
        for _ in probes.stream_generation(plain, _prompt(), 6, step_lock=Lock()):
            assert Lock.depth == 0
    finally:
        handle.remove()
    assert held == [1] * 6
