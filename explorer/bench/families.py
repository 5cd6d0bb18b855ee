"""The Attention tab's first answer at each family's real shape, beside the SmolLM2-135M shape it was first
targeted at (``python -m explorer.bench.families`` runs these rows alone).

Each shape is its published config (explorer/data/real_configs.json: layers, heads, head_dim, vocabulary,
windows, local layers) with random N(0, 0.02) weights from ``Decoder``'s initializer, served to the app's own
``/attention`` handler as ``bench_app`` serves any model. In ``python -m explorer.bench`` the shapes are rows of
the Attention-tab table, built one at a time; run alone, all four are held (about 6 GB) and timed in turn, round
after round, so that on a shared machine each round's shapes meet the same load and their ratios stay readable.
"""
from __future__ import annotations

import argparse
from typing import Any, Callable

import torch

from explorer import measure
from lens.device import HOST
from models.config import ModelConfig
from models.decoder import Decoder

FAMILY_SHAPES = ("Qwen2.5-0.5B-Instruct", "Qwen3-0.6B", "Gemma-3-270m")


def shape_name(name: str) -> str:
    return f"{name} shape"


def family_model(name: str) -> Decoder:
    """``name``'s published shape with random weights (its context, windows and local layers as published)."""
    config = measure.real_config(name).to_dict()
    config.update(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    return Decoder(ModelConfig.from_dict(config)).eval()


def family_models() -> dict[str, Callable[[], Decoder]]:
    """{shape name: a function that builds it}: ``bench_app`` builds each when its turn comes."""
    return {shape_name(name): (lambda name=name: family_model(name)) for name in FAMILY_SHAPES}


def interleaved(models: dict[str, Decoder], repeats: int) -> dict[str, dict[str, Any]]:
    """The Attention tab's first answer (the result cache emptied first, as ``bench_app`` times it) for each model
    in turn, ``repeats`` rounds after a warm-up round: on a machine shared with other work, each round's shapes
    meet the same load, so the ratio to the first model is steadier than either time."""
    import statistics

    import app
    from explorer.state import session
    from explorer.state.cache import results as result_cache

    from .runs import payload_bytes, app_handler
    from .targets import APP_PROMPT_TOKENS

    demo = app.build_demo()
    app_handler(demo, "memory_example")()  # waits for the start-up measurement
    view = app_handler(demo, "attention")
    _, tokenizer = session.load_default()
    words = "Tom gave the red ball to Anna and Anna gave the red ball back to Tom".split()
    cut = tokenizer.decode(tokenizer(" ".join(words * 8))["input_ids"][:APP_PROMPT_TOKENS], skip_special_tokens=True)
    times: dict[str, list[float]] = {name: [] for name in models}
    payload: dict[str, int] = {}
    for r in range(repeats + 1):
        for name, model in models.items():
            state = {"source": name, "name": name, "model": model, "tokenizer": tokenizer}
            result_cache.clear()
            outputs, seconds = measure.timed(lambda: view(cut, 0, 0, "causal (as trained)", state))
            if r:
                times[name].append(seconds)
            payload[name] = payload_bytes(outputs)
    first = next(iter(models))
    return {name: {"parameters": models[name].num_parameters(), "seconds": statistics.median(t),
                   "fastest_seconds": min(t), "payload_bytes": payload[name],
                   "over_first": statistics.median(a / b for a, b in zip(t, times[first])), "runs": t}
            for name, t in times.items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import os

    from .runs import model_config, settings_for
    from .targets import APP_PROMPT_TOKENS, SMOL_NAME

    parser = argparse.ArgumentParser(prog="python -m explorer.bench.families", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="rounds of timed answers, after one warm-up round")
    args = parser.parse_args(argv)
    torch.set_num_threads(measure.cpu_cores())  # the handler sets the app's own count for each answer anyway
    torch.manual_seed(0)
    smol = Decoder(model_config(settings_for(False, False, HOST))).eval()
    models = {SMOL_NAME: smol, **{name: build() for name, build in family_models().items()}}
    load = os.getloadavg()[0]
    rows = interleaved(models, args.repeats)
    print(f"\nAttention tab, {APP_PROMPT_TOKENS}-token prompt, first answer, {args.repeats} rounds over the shapes "
          f"in turn, {measure.machine_info(HOST, torch.float32)['cpu']}, {torch.get_num_threads()} threads, "
          f"1-minute load average {load:.1f} at the start and {os.getloadavg()[0]:.1f} at the end:\n")
    print(f"| shape | parameters | first answer (median) | fastest | / {SMOL_NAME} (median of rounds) | payload |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['parameters'] / 1e6:.0f} M | {r['seconds'] * 1e3:.0f} ms | {r['fastest_seconds'] * 1e3:.0f} "
              f"ms | {r['over_first']:.2f} | {measure.format_bytes(r['payload_bytes'])} |")
    return rows


if __name__ == "__main__":
    main()
