"""The tiny decoders, (plain, prepared) pairs, counting step and step-by-step greedy decoding that the speed tests
share (tests/test_speed*.py)."""
import copy

import torch

from models import Decoder
from models.generate import prefill
from models.speed import optimize_for_decode
from tests.tiny_decoder import spread
from tests.tiny_decoder import tiny as tiny_config


def tiny(**kw):
    return tiny_config(**{"vocab_size": 97, "n_layers": 3, "n_heads": 6, **kw})


def _pair(config, seed=0):
    """(plain, prepared): the same weights, one as the tutorial builds it, one through optimize_for_decode."""
    torch.manual_seed(seed)
    plain = spread(Decoder(config), norms=True)
    return plain, optimize_for_decode(copy.deepcopy(plain))


class _Counted:
    """A step that counts how often it computed a token (not None) and how often it stepped aside."""

    def __init__(self, step):
        self.step, self.ran, self.aside = step, 0, 0

    def __call__(self, *args):
        logits = self.step(*args)
        if logits is None:
            self.aside += 1
        else:
            self.ran += 1
        return logits


def _step_by_step(model, prompt, n, *, step=None):
    """Greedy decoding by hand: logits of each step from ``step`` (which must not step aside) or the model's forward."""
    cache = model.new_cache(prompt.shape[0], prompt.shape[1] + n)
    logits, steps, tokens = prefill(model, prompt, cache), [], []
    with torch.inference_mode():
        for i in range(n):
            tok = logits.argmax(-1, keepdim=True)  # (B, 1)
            tokens.append(tok)
            pos = prompt.shape[1] + i
            if step is not None:
                logits = step(model, tok, cache, pos)
                assert logits is not None
            else:
                logits = model(tok, start_pos=pos, cache=cache, last_only=True)[:, -1]
            steps.append(logits)
    return torch.cat(tokens, 1), torch.stack(steps), cache
