"""The layers of docs/architecture.md, enforced: every import in app.py, explorer/, models/, lens/ and training/
(at module level and inside functions, relative ones resolved) goes to the same floor or one below, no two modules
import each other (directly or round a longer loop), and models/, lens/ and training/ stay out of the app.

The floors are read from the doc's table, so the doc and this test cannot drift apart; the checker itself is tested
on small made-up packages first."""
import ast
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("app.py", "explorer", "models", "lens", "training")


# --- reading the code -------------------------------------------------------------------------------------------
def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def python_files(root: Path, roots=ROOTS) -> dict[str, Path]:
    files = {}
    for top in roots:
        path = root / top
        for f in ([path] if path.suffix == ".py" else sorted(path.rglob("*.py"))):
            files[module_name(root, f)] = f
    return files


def imports(root: Path, roots=ROOTS) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
    """(module -> {module of this code it imports: first line}, module -> {third-party top-level name: line}).
    ``from package import name`` counts as importing the submodule ``package.name`` when there is one, else the
    package; imports inside functions, classes and ``if`` blocks count like any other."""
    files = python_files(root, roots)
    internal: dict[str, dict[str, int]] = {}
    external: dict[str, dict[str, int]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        mine, theirs = internal.setdefault(name, {}), external.setdefault(name, {})
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module
                targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in files else module for a in node.names]
            else:
                continue
            for target in targets:
                known = target
                while known and known not in files:
                    known = known.rpartition(".")[0]
                if known:
                    if known != name:
                        mine.setdefault(known, node.lineno)
                else:
                    theirs.setdefault(target.split(".")[0], node.lineno)
    return internal, external


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = iter(range(10**9))
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(v):
        index[v] = low[v] = next(counter)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# --- the rules ----------------------------------------------------------------------------------------------------
def floors_from_doc(text: str) -> list[list[str]]:
    """The doc's floor table, bottom floor first: each row ``| n | `a`, `b` | ... |`` gives floor n's modules."""
    section = text.split("## Floors", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\|\s*(\d+)\s*\|([^|]*)\|", section, re.M)
    assert rows, "docs/architecture.md has no floor table under '## Floors'"
    assert [int(n) for n, _ in rows] == list(range(1, len(rows) + 1)), "floors numbered 1, 2, ... from the bottom"
    return [re.findall(r"`([\w.]+)`", cell) for _, cell in rows]


def floor_of(module: str, floors: list[list[str]]) -> int | None:
    """The floor whose entry is the longest prefix of ``module`` (a package names every module in it)."""
    best, length = None, -1
    for n, entries in enumerate(floors):
        for entry in entries:
            if (module == entry or module.startswith(entry + ".")) and len(entry) > length:
                best, length = n, len(entry)
    return best


# Who may not import what at all, whatever the floors say: the teaching code and the lens know nothing of the
# app or of gradio; training imports models and lens only, and the app never imports it; jobs run without a UI.
FORBIDDEN = {"models": ("explorer", "app", "training", "gradio"), "lens": ("explorer", "app", "training", "gradio"),
             "training": ("explorer", "app", "gradio"), "explorer": ("training",), "app": ("training",),
             "explorer.jobs": ("gradio",)}
# The one way through that wall: a job (and the benchmark) may run the live training that the Training tab streams.
ALLOWED = {"explorer.jobs": ("training.live",), "explorer.bench": ("training.live",)}


def allowed(module: str, target: str) -> bool:
    return any((module == prefix or module.startswith(prefix + ".")) and target in targets
               for prefix, targets in ALLOWED.items())


def violations(root: Path, floors: list[list[str]], roots=ROOTS) -> list[str]:
    internal, external = imports(root, roots)
    found = []
    for module in sorted(internal):
        if floor_of(module, floors) is None:
            found.append(f"{module}: on no floor of docs/architecture.md's table (add it)")
    for module, targets in sorted(internal.items()):
        mine = floor_of(module, floors)
        for target, line in sorted(targets.items()):
            theirs = floor_of(target, floors)
            if mine is not None and theirs is not None and theirs > mine:
                found.append(f"{module} (line {line}) imports {target}: floor {theirs + 1} is above its floor "
                             f"{mine + 1}")
    for component in cycles(internal):
        edges = [f"{a} -> {b} (line {internal[a][b]})" for a in component for b in component if b in internal[a]]
        found.append(f"import cycle between {', '.join(component)}: " + "; ".join(edges))
    for module in sorted(internal):
        for prefix, banned in FORBIDDEN.items():
            if module == prefix or module.startswith(prefix + "."):
                names = {**{t: n for t, n in internal[module].items()}, **external[module]}
                for target, line in sorted(names.items()):
                    if any(target == b or target.startswith(b + ".") for b in banned) and not allowed(module, target):
                        found.append(f"{module} (line {line}) imports {target}: {prefix} may not import {banned}")
    return found


# --- the checker on made-up packages ------------------------------------------------------------------------------
def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


FLOORS = [["models"], ["lens"], ["explorer.state"], ["explorer.panels"], ["app"]]
CLEAN = {"models/__init__.py": "", "models/config.py": "import math\n",
         "models/families.py": "from .config import math\n",
         "lens/__init__.py": "from models import config\n",
         "explorer/state/__init__.py": "", "explorer/state/cache.py": "from models.families import math\n",
         "explorer/panels/__init__.py": "from ..state import cache\n", "app.py": "import explorer.panels\n"}
ROOTS_SMALL = ("app.py", "explorer", "models", "lens")


def test_the_checker_passes_clean_code(tmp_path):
    root = _write(tmp_path, {**CLEAN, "explorer/__init__.py": ""})
    assert violations(root, [["explorer", *FLOORS[0]], *FLOORS[1:]], ROOTS_SMALL) == []


@pytest.mark.parametrize("rel, text, message", [
    ("explorer/state/cache.py", "def f():\n    from explorer.panels import x\n",
     "explorer.state.cache (line 2) imports explorer.panels: floor 4 is above its floor 3"),
    ("models/config.py", "def f():\n    from .families import g\n",
     "import cycle between models.config, models.families: models.config -> models.families (line 2); "
     "models.families -> models.config (line 1)"),
    ("lens/__init__.py", "import gradio as gr\n", "lens (line 1) imports gradio: lens may not import"),
    ("explorer/state/cache.py", "from ..panels import x\n",
     "explorer.state.cache (line 1) imports explorer.panels: floor 4 is above its floor 3"),
    ("explorer/panels/__init__.py", "from training.live import train_live\n",
     "explorer.panels (line 1) imports training: explorer may not import"),
], ids=["upward-inside-a-function", "cycle-inside-a-function", "gradio-in-lens", "upward-relative",
        "training-outside-jobs"])
def test_the_checker_names_the_offending_import(tmp_path, rel, text, message):
    files = {**CLEAN, "explorer/__init__.py": "", rel: text}
    found = violations(_write(tmp_path, files), [["explorer", *FLOORS[0]], *FLOORS[1:]], ROOTS_SMALL)
    assert any(message in f for f in found), found


def test_only_jobs_and_the_bench_may_import_the_live_training(tmp_path):
    files = {**CLEAN, "explorer/__init__.py": "", "training/__init__.py": "", "training/live.py": "import math\n",
             "training/loop.py": "import math\n", "explorer/jobs/__init__.py": "",
             "explorer/jobs/live.py": "from training.live import math\n",
             "explorer/jobs/other.py": "from training.loop import math\n"}
    floors = [["explorer", *FLOORS[0]], FLOORS[1], ["training"], FLOORS[2], ["explorer.jobs"], *FLOORS[3:]]
    found = violations(_write(tmp_path, files), floors, (*ROOTS_SMALL, "training"))
    assert found == ["explorer.jobs.other (line 1) imports training.loop: explorer may not import ('training',)"]


def test_a_module_on_no_floor_is_named(tmp_path):
    root = _write(tmp_path, {"models/__init__.py": "", "models/a.py": "", "lens/__init__.py": "from models import a\n"})
    assert violations(root, [["models"]], ("models", "lens")) == [
        "lens: on no floor of docs/architecture.md's table (add it)"]


# --- the project --------------------------------------------------------------------------------------------------
def test_the_doc_names_every_floor_the_code_has():
    floors = floors_from_doc((REPO / "docs" / "architecture.md").read_text())
    flat = [entry for floor in floors for entry in floor]
    assert len(flat) == len(set(flat)), "a module on two floors"
    for top in ("models", "lens", "training", "explorer.state", "explorer.panels", "explorer.web", "app"):
        assert floor_of(top, floors) is not None, top
    order = [floor_of(m, floors) for m in ("models", "lens", "training", "explorer.state", "explorer.measure",
                                           "explorer.web", "explorer.panels", "app", "explorer.bench")]
    assert order == sorted(order), "the floors' order, bottom to top, is the one the doc's rule states"


def test_nothing_imports_upward_or_in_a_cycle():
    floors = floors_from_doc((REPO / "docs" / "architecture.md").read_text())
    internal, _ = imports(REPO)
    assert len(internal) > 100 and sum(map(len, internal.values())) > 300  # the whole code base was read
    found = violations(REPO, floors)
    assert not found, "imports that break docs/architecture.md's floors:\n" + "\n".join(found)
