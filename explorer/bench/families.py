"""The Attention tab's first answer at each family's real shape, beside the SmolLM2-135M shape it was first
targeted at (``python -m explorer.bench.families`` runs these rows alone).

Each shape is its published config (explorer/data/real_configs.json: layers, heads, head_dim, vocabulary,
windows, local layers) with random N(0, 0.02) weights from ``Decoder``'s initializer, served to the app's own
``/attention`` handler as ``bench_app`` serves any model; one shape is built at a time, and freed after.
"""
from __future__ import annotations

import argparse
from typing import Any, Callable

import torch

from explorer import measure
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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from models.speed import optimize_for_decode

    from .runs import bench_app, model_config, settings_for
    from .targets import APP_PROMPT_TOKENS, SMOL_NAME

    parser = argparse.ArgumentParser(prog="python -m explorer.bench.families", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed answers per shape, after one warm-up")
    args = parser.parse_args(argv)
    torch.set_num_threads(measure.cpu_cores())
    settings = {**settings_for(False, False, "cpu"), "app_repeats": args.repeats}

    def smol():
        torch.manual_seed(0)
        return optimize_for_decode(Decoder(model_config(settings)).eval())  # as run_bench serves it

    rows = bench_app({SMOL_NAME: smol, **family_models()}, settings)
    print(f"\nAttention tab, {APP_PROMPT_TOKENS}-token prompt, first answer (median of {args.repeats}), "
          f"{measure.machine_info('cpu', torch.float32)['cpu']}, {torch.get_num_threads()} threads:\n")
    print("| shape | parameters | first answer | head switch | payload |\n|---|---|---|---|---|")
    for name, r in rows.items():
        if isinstance(r, dict) and "seconds" in r:
            print(f"| {name} | {r['parameters'] / 1e6:.0f} M | {r['seconds'] * 1e3:.0f} ms | "
                  f"{r['switch_seconds'] * 1e3:.0f} ms | {measure.format_bytes(r['payload_bytes'])} |")
    return rows


if __name__ == "__main__":
    main()
