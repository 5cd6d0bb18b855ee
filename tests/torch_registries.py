"""Run as a script: the sizes of torch's process-wide module registries (every ``_global_*`` dict of
``torch.nn.modules.module``: registration hooks, forward and backward hooks) before and after importing the modules
named on the command line, printed as JSON.

With models/hooks.py, the only file that looks at torch's private state (tests/test_speed.py checks): this is what
the check that importing ``models`` registers nothing process-wide has to look at.
"""
import importlib
import json
import sys

import torch.nn.modules.module as torch_module


def sizes() -> dict[str, int]:
    return {k: len(v) for k, v in vars(torch_module).items() if k.startswith("_global_") and isinstance(v, dict)}


if __name__ == "__main__":
    before = sizes()
    for name in sys.argv[1:]:
        importlib.import_module(name)
    print(json.dumps({"before": before, "after": sizes()}))
