"""bench.run.tree_commit: the commit a bench result names for the tree it timed."""

from __future__ import annotations

import subprocess
import sys

from attngen.testing.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT))

from bench import run  # noqa: E402


def _git(repo, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


def test_tree_commit_marks_changed_tracked_files(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(run, "ROOT", tmp_path)
    assert run.tree_commit() == "unknown"  # no repository
    _git(tmp_path, "init", "-q")
    (tmp_path / "kernel.py").write_text("x = 1\n")
    _git(tmp_path, "add", "kernel.py")
    _git(tmp_path, "commit", "-q", "-m", "one")
    sha = _git(tmp_path, "rev-parse", "--short", "HEAD")
    (tmp_path / "untracked.txt").write_text("results\n")
    assert run.tree_commit() == sha  # untracked files (results, carries) do not count
    (tmp_path / "kernel.py").write_text("x = 2\n")  # e.g. a copied tree newer than its .git
    assert run.tree_commit() == f"{sha}-dirty"
