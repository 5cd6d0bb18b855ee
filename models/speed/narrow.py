"""One-row products that read int8 weights (``models.quant.Int8Linear``'s) at the speed of memory, for the fast step.

torch's CPU kernels for a one-row product with a narrow weight are slower than the fp32 product on a CPU without
VNNI or native bf16 (``_weight_int8pack_mm`` about 6x slower for the 49152 x 576 LM head on a 2-core AMD EPYC,
bench/notes/int8.md), and fbgemm's dynamic int8 product quantises the activations too. This module builds a small C
kernel (kernels/gemv.c: each int8 weight widened to fp32 in registers, multiplied and added in fp32) with the
machine's C compiler the first time it is needed, keeps the library on disk, and calls it through ctypes. It
computes what the readable reference computes, ``x @ (scale * Q).T`` in fp32, up to the order of the additions.
A large product's rows are shared between the calling thread and the kernel's own helper threads (torch's thread
count less one), which the caller never waits for unless one is holding rows: on a busy machine a descheduled
helper costs nothing (bench/notes/int8.md). The result does not depend on the number of threads.
The same library holds kernels/layers.c: an int8 model's blocks for one token in one call around those products
(``int8_layers_at``): the ~25 numpy calls a layer between them took a sixth of the step or more (bench/notes/int8.md).

Where there is no compiler, or ``EXPLORER_NARROW_KERNELS=off``, ``unavailable()`` says why and the fast step steps
aside for int8 (the modules run, as before).

Notation: ``in``/``out`` the features of a linear layer; a weight is (out, in) row-major.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import NamedTuple

import torch

# gemv.c: the product; layers.c: an int8 model's blocks for one token in one call, around gemv.c's products
SOURCES = tuple(Path(__file__).with_name("kernels") / name for name in ("gemv.c", "layers.c"))
FLAGS = ("-O3", "-pthread", "-shared", "-fPIC")
LIBS = ("-lm",)  # expf and sqrt in layers.c
# "auto": build the kernel where a C compiler is found; "off": never (int8 then decodes through the modules).
SWITCH = os.environ.get("EXPLORER_NARROW_KERNELS", "auto").strip().lower() or "auto"


class Int8Weight(NamedTuple):
    """Several ``Int8Linear`` layers' rows stacked: ``q`` (out, in) int8 contiguous, ``scale`` (out,) fp32."""
    q: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.q.shape


def stack_int8(layers) -> tuple[Int8Weight, int]:
    """The rows of ``layers`` (``Int8Linear``s of one input width) as one ``Int8Weight``, and the bytes copied (0 for
    one layer, whose own buffers are read)."""
    if len(layers) == 1:
        return Int8Weight(layers[0].qweight.contiguous(), layers[0].scale.float().contiguous()), 0
    w = Int8Weight(torch.cat([m.qweight for m in layers]), torch.cat([m.scale.float() for m in layers]))
    return w, w.q.numel() + w.scale.numel() * 4


def _cache_dir() -> Path:
    return Path(os.environ.get("EXPLORER_KERNEL_CACHE") or Path.home() / ".cache" / "transformer-explorer")


_lock = threading.Lock()
_loaded: list = []  # [(library or None, reason or None)] once tried: a failed build is not retried in this process


def _build() -> tuple[ctypes.CDLL | None, str | None]:
    if SWITCH == "off":
        return None, "EXPLORER_NARROW_KERNELS=off"
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        return None, "no C compiler on this machine to build the int8 kernel"
    source = b"".join(path.read_bytes() for path in SOURCES)
    tag = hashlib.sha256(source + " ".join((compiler, *FLAGS, *LIBS)).encode()).hexdigest()[:16]
    target = _cache_dir() / f"gemv-{tag}.so"
    if not target.exists():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                built = Path(tmp) / "gemv.so"
                subprocess.run([compiler, *FLAGS, *map(str, SOURCES), "-o", str(built), *LIBS], check=True,
                               capture_output=True, timeout=120)
                os.replace(built, target)  # atomic: two processes building at once both end with a whole file
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"the int8 kernel did not build ({type(e).__name__})"
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as e:
        return None, f"the int8 kernel did not load ({e})"
    lib.gemv_i8.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 2 + [ctypes.c_float, ctypes.c_int, ctypes.c_int]
    lib.gemv_i8.restype = None
    lib.int8_layers.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 2 + \
        [ctypes.c_int64] * 5 + [ctypes.c_void_p, ctypes.c_int]
    lib.int8_layers.restype = None
    lib.narrow_simd.restype = ctypes.c_int
    lib.narrow_helped.restype = ctypes.c_int64
    return lib, None


def _library() -> tuple[ctypes.CDLL | None, str | None]:
    if not _loaded:
        with _lock:
            if not _loaded:
                _loaded.append(_build())
    return _loaded[0]


def unavailable() -> str | None:
    """None when the int8 kernel is built and loaded (the first call builds it: about a second); else why not."""
    return _library()[1]


def simd() -> bool:
    """Whether the kernel runs its AVX2 + FMA loop here (else its portable C loop)."""
    lib = _library()[0]
    return bool(lib is not None and lib.narrow_simd())


def helped_chunks() -> int:
    """How many chunks of rows the kernel's helper threads have computed in this process (0: every product so far
    ran on the calling thread alone)."""
    lib = _library()[0]
    return 0 if lib is None else int(lib.narrow_helped())


def gemv_int8(w: Int8Weight, x: torch.Tensor, out: torch.Tensor, alpha: float = 1.0, accumulate: bool = False) -> None:
    """``out = alpha * scale * (Q @ x)`` (``accumulate``: ``out +=`` that) for ``w`` (out, in), ``x`` (in,) and
    ``out`` (out,), fp32 contiguous CPU tensors; ``out`` must not overlap ``x``. Call after ``unavailable()`` is
    None."""
    rows, cols = w.q.shape
    _check(w.q, x, out)
    _library()[0].gemv_i8(x.data_ptr(), w.q.data_ptr(), w.scale.data_ptr(), out.data_ptr(), rows, cols, alpha,
                          int(accumulate), torch.get_num_threads())


def gemv_int8_at(w: Int8Weight, x_at: int, out_at: int, alpha: float, accumulate: bool) -> None:
    """``gemv_int8`` on vectors given by address (``x`` (in,), ``out`` (out,) fp32, contiguous, not overlapping) and
    without its checks: the fast step's own vectors, made to fit, about 2 us a call less."""
    q = w.q
    _library()[0].gemv_i8(x_at, q.data_ptr(), w.scale.data_ptr(), out_at, q.shape[0], q.shape[1], alpha, accumulate,
                          torch.get_num_threads())


def int8_layers_at(x_at: int, weights_at: int, cache_at: int, eps_at: int, layers: int, pos: int, cos_at: int,
                   sin_at: int, sizes: tuple[int, int, int, int, int], scratch_at: int) -> None:
    """An int8 model's ``layers`` blocks for one token at ``pos`` (kernels/layers.c, addresses of the fast step's
    own arrays; ``sizes`` C, H, Hkv, D, F): the residual stream ``x`` (C,) updated in place, the cache written."""
    _library()[0].int8_layers(x_at, weights_at, cache_at, eps_at, layers, pos, cos_at, sin_at, *sizes, scratch_at,
                              torch.get_num_threads())


def _check(w: torch.Tensor, x: torch.Tensor, out: torch.Tensor) -> None:
    rows, cols = w.shape
    if x.shape != (cols,) or out.shape != (rows,) or not (x.is_contiguous() and out.is_contiguous()):
        raise ValueError(f"the product takes x ({cols},) and out ({rows},) contiguous, got {tuple(x.shape)} and "
                         f"{tuple(out.shape)}.")
    if x.dtype != torch.float32 or out.dtype != torch.float32 or not (x.is_cpu and out.is_cpu and w.is_cpu):
        raise ValueError("the product takes float32 CPU vectors.")
