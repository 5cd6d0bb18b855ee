"""The one device choice: parsing the settings, the figure boundary, and ZeroGPU's decorator present or absent."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from lens import device as dev

REPO = Path(__file__).resolve().parent.parent


def test_auto_picks_cuda_only_when_available():
    assert dev.parse_device("auto", cuda_available=False) == torch.device("cpu")
    assert dev.parse_device(None, cuda_available=True) == torch.device("cuda")
    assert dev.parse_device(" CPU ", cuda_available=True) == torch.device("cpu")
    assert dev.parse_device("cuda:1", cuda_available=True) == torch.device("cuda", 1)


@pytest.mark.parametrize("text", ["gpu0", "mps", "tpu", "cuda:x", ""])
def test_bad_device_settings_are_refused_with_a_sentence(text):
    if text == "":  # empty means auto
        assert dev.parse_device(text, cuda_available=False) == torch.device("cpu")
        return
    with pytest.raises(ValueError, match="EXPLORER_DEVICE"):
        dev.parse_device(text, cuda_available=True)


def test_cuda_without_a_gpu_is_refused():
    with pytest.raises(ValueError, match="use auto or cpu"):
        dev.parse_device("cuda", cuda_available=False)


def test_dtype_defaults_per_device():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert dev.parse_dtype("auto", cpu, bf16_supported=True) == torch.float32
    assert dev.parse_dtype(None, cuda, bf16_supported=True) == torch.bfloat16
    assert dev.parse_dtype("auto", cuda, bf16_supported=False) == torch.float32
    assert dev.parse_dtype("fp32", cuda, bf16_supported=True) == torch.float32
    assert dev.parse_dtype("float16", cpu, bf16_supported=False) == torch.float16
    with pytest.raises(ValueError, match="EXPLORER_DTYPE"):
        dev.parse_dtype("int8", cpu, bf16_supported=False)


def test_to_host_widens_bf16_and_copies_once():
    t = torch.tensor([[1.5, -2.25]], dtype=torch.bfloat16)
    out = dev.to_host(t)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    np.testing.assert_array_equal(out, np.array([[1.5, -2.25]], dtype=np.float32))
    ints = dev.to_host(torch.arange(3))
    assert ints.dtype == np.int64 and ints.tolist() == [0, 1, 2]


def test_gpu_decorator_is_identity_without_spaces(monkeypatch):
    monkeypatch.setattr(dev, "spaces_available", lambda: False)

    def f(x):
        return x + 1

    assert dev.gpu(30)(f) is f


STAND_IN = textwrap.dedent("""
    # A stand-in for Hugging Face's ZeroGPU package: records what the app decorates.
    DECORATED = []

    def GPU(fn=None, duration=60):
        def wrap(f):
            DECORATED.append((f.__qualname__, duration))
            return f
        return wrap(fn) if callable(fn) else wrap
""")

CHECK = textwrap.dedent("""
    import spaces, torch
    import app
    demo = app.build_demo()
    assert not torch.cuda.is_initialized(), "CUDA was touched while building the app"
    print("DECORATED", len(spaces.DECORATED), sorted({d for _, d in spaces.DECORATED}))
""")


def _run(code: str, extra_path: Path | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (extra_path, REPO) if p)
    env.update(HF_HUB_OFFLINE="1", EXPLORER_DEVICE="cpu")
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_app_builds_with_a_zerogpu_stand_in(tmp_path):
    (tmp_path / "spaces.py").write_text(STAND_IN)
    done = _run(CHECK, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(l for l in done.stdout.splitlines() if l.startswith("DECORATED"))
    count = int(line.split()[1])
    assert count >= 5, f"the handlers that run models should be decorated for ZeroGPU: {line}"


@pytest.mark.slow
def test_app_builds_without_spaces():
    done = _run("import importlib.util, app; assert importlib.util.find_spec('spaces') is None; app.build_demo()",
                None)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_app_api_runs_on_the_configured_device(client):
    """The whole app's API in this test session runs through lens.device: forced to the CPU here (conftest),
    the code path a GPU deployment takes with EXPLORER_DEVICE=cuda."""
    from explorer.state import session
    from tests.api_answer import named

    assert dev.device() == dev.parse_device(os.environ["EXPLORER_DEVICE"], cuda_available=torch.cuda.is_available())
    model, _ = session.load_default()
    p = next(model.parameters())
    assert p.device.type == dev.device().type and p.dtype == dev.default_dtype()
    from explorer.panels.attention import AttentionView
    from tests.test_app import CAUSAL

    out = named(AttentionView, client.predict("The cat sat on the mat.", 0, 0, CAUSAL, api_name="/attention"))
    assert dev.describe() in out.info, "the screen names the device the numbers came from"


# Where a device may be named: the device module, and nowhere else (figures never see tensors).
ALLOWED = {Path("lens/device.py")}
CUDA_NAME = __import__("re").compile(r"^(cpu|cuda(:\d+)?)$")


def _device_mentions(path: Path) -> list[str]:
    """Code that names a device: ``.cpu()`` / ``.cuda()`` calls, ``torch.cuda`` attributes, and string constants
    that are exactly a device name (dictionary keys such as ``{"cpu": <model name>}`` and ``info["cpu"]`` are
    labels, not devices)."""
    import ast

    tree = ast.parse(path.read_text(), str(path))
    keys = {id(k) for node in ast.walk(tree) if isinstance(node, ast.Dict) for k in node.keys if k is not None}
    keys |= {id(node.slice) for node in ast.walk(tree) if isinstance(node, ast.Subscript)}  # info["cpu"]: a label
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("cpu", "cuda"):
            if node.attr == "cuda" and isinstance(node.value, ast.Name) and node.value.id == "torch" or \
                    isinstance(getattr(node, "ctx", None), ast.Load) and node.attr == "cpu":
                found.append(f"{path}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and CUDA_NAME.match(node.value) \
                and id(node) not in keys:
            found.append(f"{path}:{node.lineno}: {node.value!r}")
    return found


def test_no_device_is_hard_coded_outside_the_device_module():
    files = [p.relative_to(REPO) for d in ("explorer", "models", "training") if (REPO / d).is_dir()
             for p in (REPO / d).rglob("*.py")] + [Path("app.py")]
    found = [m for f in files if f not in ALLOWED for m in _device_mentions(REPO / f)]
    assert not found, "devices named outside lens/device.py:\n" + "\n".join(found)


def test_the_static_check_finds_what_it_looks_for(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('import torch\nx = torch.zeros(2).cpu()\ny = torch.cuda.is_available()\nz = torch.ones(1, device="cuda:1")\n'
                   'ok = {"cpu": "AMD EPYC"}\nname = ok["cpu"]\n')
    found = _device_mentions(bad)
    assert len(found) == 3 and not any("AMD" in f for f in found), found
