"""Where the app's tensors live: one device and one default dtype, chosen once per process.

``EXPLORER_DEVICE``: ``auto`` (default: CUDA when a GPU is visible, else the CPU), ``cpu``, ``cuda`` or
``cuda:N``. ``EXPLORER_DTYPE``: ``auto`` (default: float32 on the CPU; bfloat16 on a GPU that supports it,
else float32), ``float32``, ``bfloat16`` or ``float16``.

This module and the figure boundary (``to_host``) are the only places in explorer/ that name a device.
Models are moved once, where they are loaded (``place``); every other tensor is created on the device of
the model or tensor it comes from (``device_of``).

Hugging Face ZeroGPU: ``gpu(seconds)`` decorates a function that needs the GPU with
``spaces.GPU(duration=seconds)`` when the ``spaces`` package is importable (it is only on Spaces), and
returns the function unchanged otherwise. Nothing here touches CUDA at import time: the choice is made on
first use, after ``app.py`` has imported ``spaces``.
"""
from __future__ import annotations

import functools
import importlib.util
import os
from typing import Any, Callable

import numpy as np
import torch

HOST = torch.device("cpu")  # where figures are made and the CPU profiler counts allocations

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16, "float64": torch.float64}


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}.")
    return DTYPES[dtype]


def parse_device(text: str | None, *, cuda_available: bool) -> torch.device:
    """The device named by ``EXPLORER_DEVICE``'s value; ValueError with what to change for a bad value."""
    name = (text or "auto").strip().lower()
    if name == "auto":
        return torch.device("cuda" if cuda_available else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ValueError(f"EXPLORER_DEVICE={text!r} is not a device: use auto, cpu, cuda or cuda:N.") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"EXPLORER_DEVICE={text!r}: this app runs on cpu or cuda; use auto, cpu, cuda or cuda:N.")
    if dev.type == "cuda" and not cuda_available:
        raise ValueError(f"EXPLORER_DEVICE={text!r} asks for a GPU but torch sees none (torch {torch.__version__}"
                         f"{' is a CPU build' if torch.version.cuda is None else ''}): use auto or cpu.")
    return dev


def parse_dtype(text: str | None, device: torch.device, *, bf16_supported: bool) -> torch.dtype:
    """The default dtype for models on ``device``: float32 on the CPU (no native bf16 matmul on most CPUs;
    measured slower here), bfloat16 on a GPU that supports it, float32 on one that does not."""
    name = (text or "auto").strip().lower()
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" and bf16_supported else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"EXPLORER_DTYPE={text!r} is not a dtype: use auto, float32, bfloat16 or float16.")
    return _DTYPES[name]


@functools.lru_cache(maxsize=1)
def device() -> torch.device:
    """The app's device (``EXPLORER_DEVICE``), decided on first call."""
    return parse_device(os.environ.get("EXPLORER_DEVICE"), cuda_available=torch.cuda.is_available())


def resolve(dev: torch.device | str | None = None) -> torch.device:
    """``dev`` as a torch.device (``None``: the app's device); a GPU asked for where there is none is a
    ValueError saying to use the CPU."""
    if dev is None:
        return device()
    return parse_device(str(dev), cuda_available=torch.cuda.is_available())


@functools.lru_cache(maxsize=1)
def default_dtype() -> torch.dtype:
    """The dtype models are loaded in (``EXPLORER_DTYPE``), decided on first call."""
    dev = device()
    bf16 = dev.type == "cuda" and torch.cuda.is_bf16_supported()
    return parse_dtype(os.environ.get("EXPLORER_DTYPE"), dev, bf16_supported=bf16)


def is_cuda(dev: torch.device | str | None = None) -> bool:
    return torch.device(dev if dev is not None else device()).type == "cuda"


def compute_capability(dev: torch.device | str | None = None) -> tuple[int, int]:
    """A CUDA device's compute capability (major, minor), e.g. (8, 0) for an A100: bf16 products from 8 on."""
    return torch.cuda.get_device_capability(resolve(dev))


def device_of(obj: torch.nn.Module | torch.Tensor) -> torch.device:
    """The device a model's parameters (or a tensor) live on: new tensors for it are made there."""
    if isinstance(obj, torch.Tensor):
        return obj.device
    p = next(iter(obj.parameters()), None)
    return p.device if p is not None else device()


def place(model: torch.nn.Module, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """Move a freshly loaded model to the app's device and dtype (the one place models are moved)."""
    return model.to(device=device(), dtype=dtype or default_dtype())


def synchronize(dev: torch.device | str | None = None) -> None:
    """Wait for queued GPU work before reading a clock or an allocator counter; nothing to do on the CPU."""
    if is_cuda(dev):
        torch.cuda.synchronize(dev)


def cuda_peak_bytes(fn: Callable[[], Any], dev: torch.device | str | None = None) -> tuple[Any, int]:
    """Run ``fn`` once on a GPU; (its result, peak bytes the caching allocator handed out above the start),
    from ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``."""
    dev = torch.device(dev if dev is not None else device())
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    start = torch.cuda.memory_allocated(dev)
    result = fn()
    torch.cuda.synchronize(dev)
    return result, torch.cuda.max_memory_allocated(dev) - start


def free_bytes(dev: torch.device | str | None = None) -> int | None:
    """Free memory on a GPU (bytes), None on the CPU (the memory budget speaks for it there)."""
    if not is_cuda(dev):
        return None
    free, _ = torch.cuda.mem_get_info(torch.device(dev if dev is not None else device()))
    return int(free)


def sdpa_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> str:
    """Which fused kernel ``F.scaled_dot_product_attention`` runs for these inputs: the first of torch's
    backends, in its own order of preference, that accepts them (flash, memory-efficient, cuDNN, math)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    order = [("flash", SDPBackend.FLASH_ATTENTION), ("memory-efficient", SDPBackend.EFFICIENT_ATTENTION),
             ("cuDNN", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH)]
    enable_gqa = q.shape[1] != k.shape[1]
    q1, k1, v1 = q[:, :, :2], k[:, :, :2], v[:, :, :2]  # two positions decide the kernel as well as all of them
    for name, backend in order:
        try:
            with sdpa_kernel([backend]), torch.inference_mode():
                F.scaled_dot_product_attention(q1, k1, v1, is_causal=causal, enable_gqa=enable_gqa)
        except RuntimeError:
            continue
        return name
    return "none"


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX tiles (Intel Sapphire Rapids and later): torch's CPU kernels take other paths
    there (see ``explorer.measure.predict.predict_sdpa_bytes``)."""
    supported = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(supported and supported())


def to_host(t: torch.Tensor) -> np.ndarray:
    """The figure boundary: one copy of a tensor to host memory as a float NumPy array (bf16 widened)."""
    t = t.detach()
    if t.is_floating_point() and t.dtype not in (torch.float32, torch.float64):
        t = t.float()
    return t.to(HOST).numpy()


def describe(dev: torch.device | str | None = None) -> str:
    """How a device is named on screen: ``cpu`` or ``cuda:0 (NVIDIA H200)``."""
    dev = torch.device(dev if dev is not None else device())
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return dev.type


def spaces_available() -> bool:
    """True on a Hugging Face Space with the ``spaces`` package (ZeroGPU's decorator) installed."""
    return importlib.util.find_spec("spaces") is not None


def gpu(seconds: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a function as needing the GPU for up to ``seconds`` (ZeroGPU allots the GPU per call).

    With ``spaces`` importable this is ``spaces.GPU(duration=seconds)``; elsewhere the function is
    returned unchanged, so the same code runs on a laptop, a CPU Space and a GPU Space.
    """
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        if not spaces_available():
            return fn
        import spaces

        return spaces.GPU(duration=seconds)(fn)
    return decorate
