"""``run_bench`` (everything, in order, written to DIR) and the command line."""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from lens import device as dev
from explorer import measure
from models.decoder import Decoder
from models.speed import decode_blas
from models.loading import load_pretrained

from .experiments import bench_experiments
from .families import family_models
from .formats import bench_formats, bench_formats_view, bench_int8_agreement
from .generation import bench_generation
from .report import render_markdown
from .training import bench_live, bench_training
from .runs import (bench_app, bench_attention, bench_induction, bench_cache, bench_vs_transformers, default_budget,
                   load_transformers_copy, log, model_config, settings_for, weight_bytes_per_token)
from .targets import (EXPERIMENT_TOKENS, LOAD_CLASS, LOAD_MOST, PROMPT_LEN, SHIPPED_NAME, SMOL_NAME,
                      evaluate_targets)


def run_bench(out: Path, *, quick: bool = False, tiny: bool = False, device: str | None = None,
              dtype: str = "float32", budget_bytes: int | None = None) -> dict[str, Any]:
    t_start = time.perf_counter()
    device = dev.resolve(None if device in (None, "auto") else device)  # a GPU asked for where there is none: a sentence
    torch_dtype = measure.as_dtype(dtype)
    settings = settings_for(quick, tiny, device)
    budget = default_budget(device) if budget_bytes is None else budget_bytes
    cfg = model_config(settings)
    notes = []
    if settings["mode"] != "full":
        runs = "; ".join(f"{', '.join(i)} at T = {lens}" for lens, i in settings["attn_runs"])
        notes.append(f"{settings['mode']} mode: attention for {runs} only, {cfg.n_layers} layers instead of 30, "
                     "fewer repeats; run without --quick for the real numbers.")
    notes.append("Other processes may share this machine's cores; times are wall-clock medians and move with load.")
    report: dict[str, Any] = {"settings": settings, "budget_bytes": budget, "notes": notes,
                              "machine": measure.machine_info(device, torch_dtype),
                              "attention_memory_source": measure.memory_source(device)}
    log(f"settings: {settings['mode']}, device {device}, dtype {dtype}, {torch.get_num_threads()} threads")
    report["attention"] = bench_attention(settings, device, torch_dtype, budget)

    torch.manual_seed(0)
    model = Decoder(cfg).to(device=device, dtype=torch_dtype).eval()  # N(0, 0.02) weights from the initializer
    report["machine"]["decode_blas"] = decode_blas(model)  # the fast step's products' library (models.speed.cpu)
    n_params = model.num_parameters()
    report["model"] = {"config": cfg.to_dict(), "parameters": n_params,
                       "description": f"SmolLM2-135M shape, random N(0, 0.02) weights: {cfg.n_layers} layers, "
                                      f"d {cfg.d_model}, {cfg.n_heads}/{cfg.n_kv_heads} heads, d_ff {cfg.d_ff}, "
                                      f"vocab {cfg.vocab_size}, tied embeddings, {n_params / 1e6:.1f}M parameters, "
                                      f"{dtype}"}
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, cfg.vocab_size, (1, PROMPT_LEN), generator=g).to(device)
    report["cache"] = bench_cache(model, prompt, settings, device)
    report["generation"] = bench_generation(model, prompt, settings)
    log(f"generation stream: first token {report['generation']['first_token_seconds'] * 1e3:.0f} ms, "
        f"{report['generation']['new_tokens']} tokens in {report['generation']['total_seconds']:.1f} s")

    bandwidth = measure.copy_bandwidth(settings["bandwidth_bytes"], device=device)
    with tempfile.TemporaryDirectory() as tmp:
        hf = load_transformers_copy(model, Path(tmp), torch_dtype, device)
        report["vs_transformers"] = bench_vs_transformers(model, hf, settings, device, cfg, bandwidth,
                                                          weight_bytes_per_token(cfg, torch_dtype))
        if torch_dtype == torch.float32:  # the formats are conversions of an fp32 model
            report["formats"] = bench_formats(model, hf, prompt, settings, log)
            if not dev.is_cuda(device):  # the tab's view (Gradio's progress) is timed where the app serves
                report["formats_view"] = bench_formats_view(model, log)
        del hf
    app_models = {SMOL_NAME: model}
    from explorer.state.checkpoints import default_model_dir

    if (default_model_dir() / "config.json").is_file():
        shipped = load_pretrained(default_model_dir())
        app_models = {SHIPPED_NAME: shipped, **app_models}
        report["induction"] = bench_induction(shipped, shipped.config.bos_token_id)
        if torch_dtype == torch.float32 and not dev.is_cuda(device):
            from explorer.state import session

            report["int8_agreement"] = bench_int8_agreement(shipped, session.load_default()[1])
        if not dev.is_cuda(device) and torch_dtype == torch.float32:  # the tab serves float32 on the CPU
            report["training"] = bench_training()
            log(f"training tab: {report['training']}")
            if not tiny:
                report["live_training"] = bench_live(log=log)
    if not tiny:  # the Attention tab at each family's real shape (issue 29), built one at a time
        app_models.update(family_models())
    report["app"] = bench_app(app_models, settings) if not dev.is_cuda(device) and torch_dtype == torch.float32 else {
        "skipped": "the app serves float32 on the CPU; run the CPU float32 benchmark for these numbers"}
    report["experiments"] = bench_experiments(model, tokens=EXPERIMENT_TOKENS)
    log("experiments: " + ", ".join(f"{k} {v['seconds']:.1f} s" for k, v in report["experiments"].items()
                                    if isinstance(v, dict) and "seconds" in v))
    if tiny:  # tests/test_load.py runs the same clients against the served app
        report["load"] = {"skipped": "tiny mode: no classroom"}
        report["vote"] = {"skipped": "tiny mode: no class vote"}
        report["robust"] = {"skipped": "tiny mode: no flood (tests/test_robustness_flood.py runs the same clients)"}
        report["door"] = {"skipped": "tiny mode: no soak (tests/test_door_soak.py runs the same clients)"}
    elif dev.is_cuda(device):  # these rows time `python app.py`, which the CPU float32 run measures
        for row in ("load", "vote", "robust", "door"):
            report[row] = {"skipped": "served-app rows run with the CPU float32 benchmark"}
    else:
        from .load import bench_load

        report["load"] = bench_load((LOAD_CLASS, LOAD_MOST), log=log)
        from .vote import bench_vote

        report["vote"] = bench_vote(log=log)
        from .flood import bench_robust

        report["robust"] = bench_robust(log=log)
        from .door import bench_door

        report["door"] = bench_door(log=log)
    report["targets"] = evaluate_targets(report)
    if hasattr(os, "getloadavg"):
        m = report["machine"]
        m["load_average_1min_end"] = round(os.getloadavg()[0], 2)
        busy = max(m.get("load_average_1min", 0), m["load_average_1min_end"]) > 0.5 * m["cores"] + 0.5
        notes.append(f"1-minute load average {m.get('load_average_1min')} at the start and "
                     f"{m['load_average_1min_end']} at the end, on {m['cores']} cores"
                     + (": other processes were competing for the cores during this run, so the times (not the "
                        "memory figures) are slower and noisier than on an idle machine." if busy else "."))
    report["wall_seconds"] = time.perf_counter() - t_start
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "bench.md").write_text(render_markdown(report))
    log(f"wrote {out / 'bench.md'} and {out / 'bench.json'} in {report['wall_seconds']:.0f} s")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m explorer.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for bench.md and bench.json")
    parser.add_argument("--quick", action="store_true", help="smaller and faster (about a minute on 2 cores)")
    parser.add_argument("--device", default="auto", help="auto (a GPU when torch sees one), cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--budget", default=None, help="memory budget for one attention size, e.g. 8GiB")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the cores available)")
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # tests: a toy model, seconds
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads or measure.cpu_cores())
    try:
        budget = None if args.budget is None else measure.parse_bytes(args.budget)
        run_bench(args.out, quick=args.quick, tiny=args.tiny, device=args.device, dtype=args.dtype,
                  budget_bytes=budget)
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")
    return 0
