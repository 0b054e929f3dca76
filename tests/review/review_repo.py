"""Helpers of the review tests' temporary repositories: git, evidence records."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git(repo: Path, *args: str) -> str:
    run = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return run.stdout


def commit(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message)


def compile_record(row: dict) -> dict:
    """One kernel of a variant compiled without spills (the AOT driver's record shape)."""
    return dict(
        identity=row["identity"],
        kernel="decode",
        module=f"{row['package']}/kernels.py",
        variant=row["uri"],
        registers=128,
        shared_bytes=0,
        spill_bytes=0,
    )
