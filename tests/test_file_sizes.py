"""Every source file reads in one sitting: at most 450 lines (app.py at most 200), tests and page code included."""
from __future__ import annotations

import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIMIT, APP_LIMIT = 450, 200
SOURCES = ("app.py", "explorer", "models", "lens", "training", "tests", ".ci")
SUFFIXES = {".py", ".js", ".css", ""}  # "" : the scripts under .ci/


def source_files() -> list[pathlib.Path]:
    found = []
    for name in SOURCES:
        path = ROOT / name
        found += [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES
                                                and "__pycache__" not in p.parts]
    return found


def lines(path: pathlib.Path) -> int:
    return len(path.read_text(encoding="utf-8", errors="replace").splitlines())


def test_the_scan_sees_the_files_it_should():
    names = {p.relative_to(ROOT).as_posix() for p in source_files()}
    assert {"app.py", "models/decoder.py", "explorer/web/page/page.css", ".ci/run", "tests/conftest.py"} <= names


def test_no_source_file_is_over_450_lines_and_app_py_over_200():
    long = {p.relative_to(ROOT).as_posix(): n for p in source_files() if (n := lines(p)) > LIMIT}
    assert not long, f"files over {LIMIT} lines (split them by concern): {long}"
    assert lines(ROOT / "app.py") <= APP_LIMIT, "app.py holds the tab list, build_demo and launch only"
