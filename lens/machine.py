"""The machine the numbers come from: CPU, cores, threads, versions, device and dtype."""
from __future__ import annotations

import os
import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from lens import device as dev
from lens.device import as_dtype


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def runtime_info(model: torch.nn.Module | None = None, *, device: str | torch.device | None = None,
                 dtype: torch.dtype | str | None = None) -> dict[str, str]:
    """Device, dtype and torch version a number was computed with: the model's own (its first parameter)
    when a model is given, else ``device`` and ``dtype`` (``None``: the app's, from lens.device).
    The provenance line on every chart."""
    p = next(model.parameters(), None) if model is not None else None
    if p is not None:
        device, dtype = p.device, p.dtype
    device = dev.resolve(device)
    dtype = dev.default_dtype() if dtype is None else dtype
    return {"device": dev.describe(device), "dtype": str(as_dtype(dtype)).replace("torch.", ""),
            "torch": torch.__version__}


def machine_info(device: str | torch.device | None = None, dtype: torch.dtype | str | None = None) -> dict[str, Any]:
    """Where the numbers come from: CPU, cores, threads, versions, device, dtype, UTC date."""
    run = runtime_info(device=device, dtype=dtype)
    info = {"cpu": cpu_model(), "cores": cpu_cores(), "torch_threads": torch.get_num_threads(),
            "torch": run["torch"], "python": platform.python_version(), "device": run["device"],
            "dtype": run["dtype"], "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    if hasattr(os, "getloadavg"):  # other processes on the same cores move every time measured here
        info["load_average_1min"] = round(os.getloadavg()[0], 2)
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    if dev.is_cuda(dev.resolve(device)):
        info["gpu"] = run["device"]
    return info

