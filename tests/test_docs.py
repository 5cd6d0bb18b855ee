"""README.md and docs/: every relative link reaches a file (and a heading, for ``#anchor``), every docs page is
in the index, every environment variable the code reads is documented, the API examples run, and the README
stays short enough to be the Space's card.

Links are read the way GitHub renders them: code blocks and inline code are not links; a link that starts
with ``?`` is a deep link into the running app (``?tab=...``), not a file, and is left to tests/test_links.py.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
README_MAX_LINES = 160
# Where the app's code lives: every environment variable read here must be in docs/operating.md.
CODE = ("app.py", "explorer", "lens", "models", "training")

FENCE = re.compile(r"^(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with inline code removed."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, INLINE_CODE.sub("", line)))
    return out


def links(path: Path) -> list[tuple[int, str]]:
    return [(n, m.group(1)) for n, line in prose_lines(path.read_text(encoding="utf-8")) for m in LINK.finditer(line)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text lower-cased, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors on its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub gives the headings of ``path`` (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path, root: Path = REPO) -> list[str]:
    problems = []
    for number, target in links(path):
        if SCHEME.match(target) or target.startswith("?"):
            continue  # a web address, or a deep link into the running app
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(root)}:{number}: {target}"
        if root not in dest.parents:
            problems.append(f"{where}: leaves the repository")
        elif not dest.is_file():
            problems.append(f"{where}: no file {dest.relative_to(root)}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}: no heading with anchor #{anchor} in {dest.relative_to(root)}")
    return problems


def test_every_relative_link_reaches_a_file_and_a_heading():
    problems = [p for page in pages() for p in broken_links(page)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_the_link_check_finds_what_it_looks_for(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title\n\n## The models (`models/`)\n\n## Same\n\n## Same\n")
    page = tmp_path / "docs" / "b.md"
    page.write_text(
        "[ok](a.md#the-models-models) [ok](a.md#same-1) [ok](#here) [web](https://example.org/x)\n"
        "[app](?tab=attention&layer=1) `[code](missing.md)`\n"
        "```\n[fenced](missing.md)\n```\n"
        "# Here\n"
        "[bad file](nothere.md) [bad anchor](a.md#nope) ![bad image](../img/x.png) [out](../../x.md)\n")
    (tmp_path / "img").mkdir()
    found = broken_links(page, root=tmp_path)
    assert [f.split(": ")[1] for f in found] == ["nothere.md", "a.md#nope", "../img/x.png", "../../x.md"], found


def test_github_anchors():
    assert slug("The app from `gradio_client`") == "the-app-from-gradio_client"
    assert slug("What the tabs compute (`explorer/probes/`)") == "what-the-tabs-compute-explorerprobes"
    assert slug("Uploads, page loads, errors") == "uploads-page-loads-errors"
    assert slug("🔍 Run it") == "-run-it"


def test_every_docs_page_is_in_the_index():
    index = DOCS / "README.md"
    linked = {(index.parent / t.partition("#")[0]).resolve() for _, t in links(index)
              if not SCHEME.match(t) and not t.startswith("?")}
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p != index and p.resolve() not in linked]
    assert not missing, f"docs/README.md does not list: {missing}"
    assert "docs/README.md" in {t.partition("#")[0] for _, t in links(README)}, "the README links to the docs index"


def test_the_readme_stays_a_space_card():
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"
    assert lines[0] == "---", "the README opens with the Space's YAML front matter"
    front = lines[1:lines.index("---", 1)]
    fields = dict(line.split(":", 1) for line in front)
    fields = {k.strip(): v.strip().strip('"') for k, v in fields.items()}
    assert fields["sdk"] == "gradio" and fields["app_file"] == "app.py" and fields["python_version"] == "3.11"
    pinned = re.search(r"^gradio==(\S+)$", (REPO / "requirements.txt").read_text(), re.M).group(1)
    assert fields["sdk_version"] == pinned, "the Space runs the gradio version requirements.txt pins"


def test_the_readme_models_to_try_are_computed_from_their_configs():
    """Each row of the README's "Models to try": the family, parameters, bytes a load holds and the server setting
    the app computes from that model's published config (explorer/data/real_configs.json), none typed by hand."""
    from explorer import measure
    from explorer.state import checkpoints

    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Models to try"):text.index("## The tabs")]
    rows = [[cell.strip().strip("`") for cell in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| `")]
    by_repo = {entry["hf_repo"]: name for name, entry in measure.load_real_configs().items()}
    families = set()
    for repo, family, parameters, holds, setting in rows:
        c = measure.real_config(by_repo[repo])
        families.add(c.family)
        assert family == c.family, repo
        assert parameters == f"{measure.parameter_count(c)['total'] / 1e6:,.0f} M", repo
        assert holds == measure.format_bytes(checkpoints.load_bytes(c)), repo
        assert setting == checkpoints.budget_setting(c), repo
    assert families == {"llama", "mistral", "qwen2", "qwen3", "gemma3_text"}, "one model of each family"


def test_the_readme_commands_are_the_ones_ci_runs():
    text = README.read_text(encoding="utf-8")
    assert "python3 -m pip install -r requirements.txt && python3 app.py" in text
    assert "python3 -m pip install -r requirements-test.txt && python3 -m pytest -q tests" in text
    ci = (REPO / ".ci" / "run").read_text()
    assert "python3 -m pip install -q -r requirements-test.txt" in ci
    assert re.search(r"^python3 -m pytest -q tests\b", ci, re.M)


def _env_readers(tree: ast.AST) -> dict[str, int]:
    """Functions of one module that read the environment variable named by one of their parameters
    (``_env_int(name, ...)``, ``bytes_setting(name, ...)``): function name -> that parameter's position."""
    out = {}
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = [a.arg for a in fn.args.args]
            for node in ast.walk(fn):
                name = _env_name_node(node)
                if isinstance(name, ast.Name) and name.id in params:
                    out[fn.name] = params.index(name.id)
    return out


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and \
        isinstance(node.value, ast.Name) and node.value.id == "os"


def _env_name_node(node: ast.AST):
    """The expression naming the variable when ``node`` reads the environment, else None."""
    if isinstance(node, ast.Call) and node.args:
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "get" and _is_environ(f.value):
            return node.args[0]
        if isinstance(f, ast.Attribute) and f.attr == "getenv" and isinstance(f.value, ast.Name) and f.value.id == "os":
            return node.args[0]
    if isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
        return node.slice
    return None


def environment_read(files, root: Path = REPO) -> dict[str, str]:
    """Every environment variable the code reads by a constant name -> the first file reading it."""
    files = list(files)
    trees = {f: ast.parse(f.read_text(encoding="utf-8"), str(f)) for f in files}
    helpers: dict[str, int] = {}
    for tree in trees.values():
        helpers.update(_env_readers(tree))
    found: dict[str, str] = {}
    for f, tree in trees.items():
        for node in ast.walk(tree):
            name = _env_name_node(node)
            if name is None and isinstance(node, ast.Call):
                callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                if callee in helpers and len(node.args) > helpers[callee]:
                    name = node.args[helpers[callee]]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                found.setdefault(name.value, str(f.relative_to(root)))
    return found


def code_files():
    for entry in CODE:
        path = REPO / entry
        yield from ([path] if path.is_file() else sorted(path.rglob("*.py")))


def test_every_environment_variable_the_code_reads_is_documented():
    read = environment_read(code_files())
    assert {"EXPLORER_DEVICE", "EXPLORER_SESSION_QUEUE_CAP", "EXPLORER_RESULT_CACHE"} <= set(read), read
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", (DOCS / "operating.md").read_text(encoding="utf-8")))
    missing = {name: where for name, where in read.items() if name not in documented}
    assert not missing, f"read by the code but not in docs/operating.md's table: {missing}"


def test_the_environment_scan_finds_each_way_of_reading(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import os\n"
                 "def _num(name, default):\n    return int(os.environ.get(name) or default)\n"
                 "A = os.environ.get('ONE')\nB = os.getenv('TWO', '')\nC = os.environ['THREE']\n"
                 "D = _num('FOUR', 1)\nos.environ['NOT_READ'] = '1'\nE = {'NOT_READ_EITHER': 1}\n")
    assert set(environment_read([f], root=tmp_path)) == {"ONE", "TWO", "THREE", "FOUR"}


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(encoding="utf-8"), re.M | re.S)


@pytest.mark.slow
def test_the_api_examples_run_on_the_shipped_model(monkeypatch):
    if not (REPO / "assets" / "default-model" / "config.json").is_file():
        pytest.skip("the shipped default model is not in this checkout (python -m training makes it)")
    blocks = python_blocks(DOCS / "api.md")
    assert len(blocks) >= 4
    monkeypatch.chdir(REPO)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(DOCS / "api.md"), "exec"), namespace)
    # what the examples say they compute
    assert namespace["logits"].shape[:2] == namespace["tokens"].shape
    assert float((namespace["same"] - namespace["logits"]).detach().abs().max()) < 1e-4, "tiled and sdpa agree"
    assert namespace["patterns"].shape[0] == namespace["model"].config.n_layers
    assert namespace["layer"] == 1, "the shipped model's induction heads are in layer 1"
    assert float((namespace["edited"] - namespace["logits"]).detach().abs().max()) > 1e-3, "the knock-out changed the logits"
    assert not __import__("models.hooks", fromlist=["has_hooks"]).has_hooks(namespace["model"]), "edit removed"
    T = namespace["x"].shape[1]
    assert namespace["losses"].shape == (T - 1,) and namespace["sweep"]["knocked"].shape[2] == T - 1
    assert namespace["recovered"].shape == (namespace["model"].config.n_layers, T)
