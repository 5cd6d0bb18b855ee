#!/usr/bin/env bash
# The CUDA checks, in one run on a GPU machine: python3 there holds torch with CUDA but not Gradio, so the
# app-level test and the served-app bench rows run on the CPU instead. Writes its logs and reports to $1.
set -uo pipefail
out=${1:-bench/cuda}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
} 2>&1 | tee "$out/machine.txt"
python3 - <<'PY' 2>&1 | tee "$out/sdpa-backends.txt"
# Which fused kernel SDPA picks at the shapes the app serves (the Memory lab names it on its chart).
import torch
from lens.device import sdpa_backend
for dtype in (torch.float32, torch.bfloat16):
    for (h, hkv, d) in ((9, 3, 64), (8, 8, 64), (4, 1, 16)):
        q = torch.randn(1, h, 128, d, device="cuda", dtype=dtype)
        k = torch.randn(1, hkv, 128, d, device="cuda", dtype=dtype)
        for causal in (True, False):
            print(f"{str(dtype):15} heads {h}/{hkv} d {d:3} causal {causal!s:5}: {sdpa_backend(q, k, k, causal=causal)}")
PY
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -k "not app_endpoints" 2>&1 | tee "$out/test_cuda.txt"
for dtype in bfloat16 float32; do
  timeout 170 python3 -m explorer.bench --device cuda --dtype $dtype --out "$out/$dtype" 2>&1 | tail -25
done
