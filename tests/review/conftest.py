"""A small attngen repository in a temporary folder for review tests: this checkout's
attngen/ and evidence/, three of its specs (two lowered, one not lowered anywhere yet),
placeholder generated packages, committed on ``main``. Each test gets its own copy and
changes its working tree; ``review`` compares it with HEAD."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attngen.testing.paths import REPO_ROOT
from review_repo import commit, git

SPECS = ("mha/gqa_paged.yaml", "mha/bidirectional.yaml", "mla/deepseek_v3.yaml")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc")


def _placeholder_packages(repo: Path) -> None:
    """A file per generated package (the review compares generated/ as files; the real
    generator would take far longer than these tests should)."""
    snap = subprocess.run(
        [sys.executable, "-I", str(repo / "attngen/review/snapshot.py"), str(repo), str(repo)],
        capture_output=True,
        text=True,
        check=True,
    )
    for row in json.loads(snap.stdout)["variants"]:
        path = repo / row["package"] / "kernels.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(f"# {row['uri']}\n")
    docs = repo / "generated/docs/support_matrix.md"
    docs.parent.mkdir(parents=True)
    docs.write_text("# placeholder matrix\n")


@pytest.fixture(scope="session")
def template_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("review") / "repo"
    shutil.copytree(REPO_ROOT / "attngen", repo / "attngen", ignore=IGNORED)
    shutil.copytree(REPO_ROOT / "evidence", repo / "evidence")
    for rel in SPECS:
        (repo / "specs" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO_ROOT / "specs" / rel, repo / "specs" / rel)
    (repo / ".gitignore").write_text("__pycache__/\n")
    _placeholder_packages(repo)
    git(repo, "init", "-q", "-b", "main")
    commit(repo, "base")
    return repo


@pytest.fixture
def repo(template_repo: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "repo"
    shutil.copytree(template_repo, dest, ignore=IGNORED)
    return dest
