"""The lecture's long actions timed on a model: each head knocked out in turn, resid_pre patching and head patching
of a prompt pair, the Patch button's whole experiment (both sites), and the Attention tab's induction scores at span
120 (``python -m explorer.bench.experiments`` runs these rows alone).

24 tokens covers the lesson's own prompts (docs/lesson.md: the Experiments tab's list of 16 words given twice, its
patching pair of 11 words), which a word-piece tokenizer may split into more tokens than words."""
from __future__ import annotations

import time
from typing import Any

import torch

from explorer import interventions as iv
from lens.heads import induction_scores

PROMPT_TOKENS = 24  # explorer.bench.targets.EXPERIMENT_TOKENS states the target at this length
INDUCTION_SPAN = 120  # the longest span of the Attention tab's menu; 4 rows of 240 tokens (and BOS, if any)


def bench_experiments(model, *, tokens: int = PROMPT_TOKENS, seed: int = 0) -> dict[str, Any]:
    """Seconds for each action on one ``tokens``-long prompt (and a copy with its middle token changed)."""
    c = model.config
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, c.vocab_size, (1, tokens), generator=g)
    corrupt = clean.clone()
    corrupt[0, tokens // 2] = (clean[0, tokens // 2] + 1) % c.vocab_size
    answer = (1, 2)
    out: dict[str, Any] = {"prompt_tokens": tokens, "layers": c.n_layers, "heads": c.n_heads}
    for name, run in (("knockout_sweep", lambda: iv.knockout_sweep(model, clean)),
                      ("patch_resid_pre", lambda: iv.patched_metrics(model, corrupt, clean, "resid_pre", answer)),
                      ("patch_head", lambda: iv.patched_metrics(model, corrupt, clean, "head", answer)),
                      ("patching_experiment", lambda: iv.patching_experiment(model, clean, corrupt, answer)),
                      (f"induction_span_{INDUCTION_SPAN}", lambda: induction_scores(model, INDUCTION_SPAN))):
        t0, c0 = time.perf_counter(), time.process_time()
        run()
        # CPU seconds beside wall seconds: on a shared machine the wall time grows with the load, the CPU time less
        out[name] = {"seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0}
    out["interventions"] = {"knockout_sweep": c.n_layers * c.n_heads, "patch_resid_pre": c.n_layers * tokens,
                            "patch_head": c.n_layers * c.n_heads,
                            "patching_experiment": c.n_layers * (tokens + c.n_heads)}
    return out


if __name__ == "__main__":
    from lens.device import device
    from models import Decoder

    from .runs import model_config, settings_for

    torch.manual_seed(0)
    m = Decoder(model_config(settings_for(False, False, str(device())))).eval()
    for key, value in bench_experiments(m).items():
        print(key, value)
