"""A small attngen repository in a temporary folder for review tests: this checkout's
attngen/, three of its specs (two lowered, one not lowered anywhere yet), placeholder
generated packages and evidence recorded for the kernel and runtime identities this code
gives (GPU checks on sm90, compile results on every arch, as the checked-in evidence has
them; made here so the tests do not depend on evidence/ being current), committed on
``main``. Each test gets its
own copy and changes its working tree; ``review`` compares it with HEAD."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attngen.evidence import COMPILE_DIR, GPU_CHECKS, compile_file, gpu_path
from attngen.testing.paths import REPO_ROOT
from review_repo import commit, compile_record, git

SPECS = ("mha/gqa_paged.yaml", "mha/bidirectional.yaml", "mla/deepseek_v3.yaml")
GPU_ARCH = "sm90"
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc")


def snapshot(repo: Path) -> dict:
    run = subprocess.run(
        [sys.executable, "-I", str(repo / "attngen/review/snapshot.py"), str(repo), str(repo)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(run.stdout)


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def _evidence(repo: Path, rows: list[dict]) -> None:
    results = [
        dict(
            identity=r["identity"],
            runtime=r["runtime"],
            module=f"{r['package']}/kernels.py",
            variant=r["uri"],
            check=check,
            passed=True,
            detail="",
        )
        for r in rows
        if r["arch"] == GPU_ARCH
        for check in GPU_CHECKS
    ]
    gpu = dict(arch=GPU_ARCH, device="test", commit="0" * 7, date="2026-01-01", results=results)
    _write(repo / gpu_path(GPU_ARCH), gpu)
    files: dict[str, list[dict]] = {}
    for r in rows:
        files.setdefault(compile_file(r["backend"], r["arch"]), []).append(compile_record(r))
    for rel, kernels in files.items():
        arch = rel.split("/")[-1].removesuffix(".json")
        _write(repo / COMPILE_DIR / rel, dict(arch=arch, compiler="test", kernels=kernels))


def _placeholder_packages(repo: Path, rows: list[dict]) -> None:
    """A file per generated package (the review compares generated/ as files; the real
    generator would take far longer than these tests should)."""
    for row in rows:
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
    for rel in SPECS:
        (repo / "specs" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO_ROOT / "specs" / rel, repo / "specs" / rel)
    (repo / ".gitignore").write_text("__pycache__/\n")
    _placeholder_packages(repo, snapshot(repo)["variants"])
    # runtime identities hash the generated packages: take them with the placeholders there
    _evidence(repo, snapshot(repo)["variants"])
    git(repo, "init", "-q", "-b", "main")
    commit(repo, "base")
    return repo


@pytest.fixture
def repo(template_repo: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "repo"
    shutil.copytree(template_repo, dest, ignore=IGNORED)
    return dest
