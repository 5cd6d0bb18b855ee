"""The page's CSS and JavaScript live in files under explorer/web/page/ and reach Gradio through its public
``launch(css_paths=..., head=...)`` and ``js=``; only plotly_wrappers.js touches Plotly's private fields.

Read from the files and the built app's configuration, not from the loader's own idea of them."""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from explorer.web import page

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "explorer" / "web" / "page"
WRAPPERS = PAGE / "plotly_wrappers.js"
PRIVATE_PLOTLY = re.compile(r"\b_(fullLayout|fullData|context|categories)\b")
# What only page code says: a DOM call, a class toggle, an arrow function's body, a CSS override, Plotly's div.
PAGE_CODE = re.compile(r"\bdocument\.[A-Za-z]|\bwindow\.[A-Za-z]|querySelector|classList|=>\s*\{|!important"
                       r"|\.js-plotly-plot")


def project_files(root: Path, suffixes=(".py", ".js")) -> list[Path]:
    """Every .py and .js file of the project outside tests/ and hidden folders (a virtual environment, git)."""
    return sorted(p for p in root.rglob("*") if p.suffix in suffixes and p.is_file()
                  and not any(part.startswith(".") or part in ("tests", "node_modules", "__pycache__")
                              for part in p.relative_to(root).parts))


def private_plotly_reads(root: Path) -> dict[str, list[str]]:
    """{file relative to root: the private Plotly names it reads}, the one wrappers script left out."""
    found = {}
    for path in project_files(root):
        if path.resolve() == WRAPPERS.resolve():
            continue
        names = sorted(set(PRIVATE_PLOTLY.findall(path.read_text(encoding="utf-8"))))
        if names:
            found[str(path.relative_to(root))] = names
    return found


def test_only_the_wrappers_script_reads_plotlys_private_fields():
    assert private_plotly_reads(REPO) == {}
    wrappers = set(PRIVATE_PLOTLY.findall(WRAPPERS.read_text(encoding="utf-8")))
    assert {"fullLayout", "context", "categories"} <= wrappers  # the scan finds them where they are


def test_the_private_name_scan_finds_a_read_in_python_and_in_javascript(tmp_path):
    (tmp_path / "explorer").mkdir()
    (tmp_path / "explorer" / "a.py").write_text('JS = "(gd) => gd._fullLayout.height"\n')
    (tmp_path / "b.js").write_text("const c = el._context;\n")
    (tmp_path / "c.py").write_text("import ssl\nctx = ssl.create_default_context()  # ssl_context is no Plotly name\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text("gd._fullData\n")  # tests may read what they check
    assert private_plotly_reads(tmp_path) == {"explorer/a.py": ["fullLayout"], "b.js": ["context"]}


def test_no_python_string_holds_page_code():
    """CSS and JS in Python strings are what this layout replaced: each belongs in a file of explorer/web/page/."""
    found = []
    for path in project_files(REPO, (".py",)):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and PAGE_CODE.search(node.value):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert found == []


def test_the_launch_arguments_carry_the_files_through_gradios_public_parameters():
    import app

    kwargs = app.launch_kwargs()
    assert "css" not in kwargs and "js" not in kwargs
    assert [Path(p).resolve() for p in kwargs["css_paths"]] == [PAGE / "page.css", PAGE / "vote.css",
                                                                     PAGE / "deck.css"]
    head = kwargs["head"]
    assert head.startswith("<script>") and head.endswith("</script>") and head.count("</script>") == 1
    assert WRAPPERS.read_text(encoding="utf-8") in head


def test_the_served_page_carries_the_files_and_no_listener_reads_a_private_field(app_url):
    """The configuration a browser gets: the style sheets' text, the wrappers in the head, each listener's js as its
    file wrote it (placeholders filled) and none reading Plotly's private fields."""
    import json
    import urllib.request

    with urllib.request.urlopen(app_url + "config", timeout=30) as r:
        config = json.load(r)
    for name in page.STYLES:
        assert (PAGE / name).read_text(encoding="utf-8") in config["css"]
    assert WRAPPERS.read_text(encoding="utf-8") in config["head"]
    js = {d["api_name"]: d["js"] for d in config["dependencies"] if d.get("js")}
    assert js["projector_from_link"] == (PAGE / "page_load.js").read_text(encoding="utf-8")
    assert js["projector"] == (PAGE / "projector.js").read_text(encoding="utf-8")
    assert 'window.explorerSaveTab("attention", "svg")' in js["save_attention_svg"]
    assert js["open_link"].startswith("// Run on page load") and "$" not in js["open_link"]
    assert {name for name, text in js.items() if PRIVATE_PLOTLY.search(text)} == set()


def test_a_placeholder_is_filled_as_json_and_a_missing_or_extra_value_is_refused():
    js = page.script("save_tab.js", TAB_ID="it's", FORMAT="png")
    assert 'explorerSaveTab("it\'s", "png")' in js and "$" not in js
    with pytest.raises(ValueError, match="FORMAT"):
        page.script("save_tab.js", TAB_ID="attention")
    with pytest.raises(ValueError, match="give exactly those"):
        page.script("page_url.js", CODE="x")
    with pytest.raises(ValueError, match="not one of the page's files"):
        page.script("../links.py")


def test_every_page_file_is_loaded_and_not_ignored_by_git():
    """Each file of the folder is loaded by some code (a file no one loads is dead page code), and .gitignore
    leaves them in the repository that a Space deploys."""
    names = {p.name for p in PAGE.iterdir() if p.suffix in (".js", ".css")}
    code = "\n".join(p.read_text(encoding="utf-8") for p in project_files(REPO, (".py",)))
    assert names and all(f'"{name}"' in code for name in names), sorted(n for n in names if f'"{n}"' not in code)
    if shutil.which("git") and (REPO / ".git").exists():
        ignored = subprocess.run(["git", "check-ignore", *map(str, PAGE.iterdir())], cwd=REPO,
                                 capture_output=True, text=True).stdout.split()
        assert ignored == [p for p in ignored if "__pycache__" in p]


@pytest.mark.skipif(shutil.which("node") is None, reason="node checks the scripts' syntax")
@pytest.mark.parametrize("name", sorted(p.name for p in PAGE.glob("*.js")))
def test_each_script_parses(tmp_path, name):
    text = (PAGE / name).read_text(encoding="utf-8")
    if name != page.PLOTLY_WRAPPERS:  # a js= text is an expression: Gradio runs it as `return (<text>);`
        text = "const f = (\n" + re.sub(r"\$([A-Z][A-Z0-9_]*)\b", "null", text).rstrip().rstrip(";") + "\n);\n"
    script = tmp_path / "check.js"
    script.write_text(text, encoding="utf-8")
    result = subprocess.run(["node", "--check", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
