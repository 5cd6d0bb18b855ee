""".ci/check-commits: a subject over 72 characters fails the check, one of 72 passes, and without the history to
check (no repository, or a clone without the base commit) it says so and passes."""
from __future__ import annotations

import subprocess
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / ".ci" / "check-commits"


def load_script():
    loader = SourceFileLoader("check_commits", str(SCRIPT))
    module = module_from_spec(spec_from_loader("check_commits", loader))
    loader.exec_module(module)
    return module


def commit(repo: Path, subject: str) -> None:
    (repo / "f.txt").write_text(subject, encoding="utf-8")
    for args in (["add", "f.txt"], ["commit", "-q", "-m", subject, "-m", "A body line that may be as long as it likes, "
                                                                         "since only the subject is checked."]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


@pytest.fixture()
def repo(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_AUTHOR_NAME", "t")
    monkeypatch.setenv("GIT_AUTHOR_EMAIL", "t@example.org")
    monkeypatch.setenv("GIT_COMMITTER_NAME", "t")
    monkeypatch.setenv("GIT_COMMITTER_EMAIL", "t@example.org")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_subject_over_72_characters_fails_and_one_of_72_passes(repo, capsys):
    check = load_script()
    commit(repo, "a" * 72)
    assert check.main(["HEAD"]) == 0
    commit(repo, "Ünïcode counts characters, not bytes: " + "b" * 34)  # 72 characters, more bytes
    assert check.main(["HEAD"]) == 0
    commit(repo, "c" * 73)
    capsys.readouterr()
    assert check.main(["HEAD"]) == 1
    err = capsys.readouterr().err
    assert "subject of 73 characters" in err and "c" * 73 in err
    assert check.main(["HEAD~1"]) == 0, "a range that leaves the long subject out passes"


def test_without_the_history_it_says_so_and_passes(repo, tmp_path_factory, monkeypatch, capsys):
    check = load_script()
    commit(repo, "d" * 80)
    assert check.main([]) == 0  # this repository does not hold the base commit
    assert f"base commit {check.BASE} is not in this clone's history" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path_factory.mktemp("not-a-repo"))
    assert check.main([]) == 0
    assert "is not a git repository" in capsys.readouterr().out


def test_ci_checks_the_subjects_before_the_tests():
    run = (SCRIPT.parent / "run").read_text(encoding="utf-8")
    assert run.index("python3 .ci/check-commits") < run.index("python3 -m pytest")
