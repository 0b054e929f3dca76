"""The two sides of a review: BASE (a git revision) and the working tree.

Each side's model comes from :mod:`attngen.review.snapshot`, run in a fresh interpreter on
that side's own code: BASE's attngen/, specs/ and evidence/ are unpacked from ``git
archive`` into a temporary folder (nothing is checked out, nothing is generated). The two
run at once. File-level facts (the generated diff by kind, the attngen/ sources that
changed) come from git, with untracked files counted through a throw-away index so the
author's index is never touched.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

SNAPSHOT = Path(__file__).with_name("snapshot.py")
# What a side's model is computed from (generated/: the packages' runtime identities).
MODEL_PATHS = ("attngen", "specs", "evidence", "generated")
DIFF_PATHS = ("attngen", "specs", "evidence", "generated")
MAIN_REFS = ("main", "origin/main")  # the default BASE is where HEAD left the first


class ReviewError(Exception):
    """The review cannot run (bad revision, not a git repository, a side that fails)."""


@dataclass(frozen=True)
class FileChange:
    path: str
    status: str  # A added, D deleted, M modified (R renamed: the new path)
    added: int  # lines; 0 for binary files
    removed: int


@dataclass(frozen=True)
class Sides:
    base_rev: str  # what the user asked for, or "merge-base(HEAD, main)"
    base_commit: str
    base: dict  # snapshot of BASE
    now: dict  # snapshot of the working tree
    files: tuple[FileChange, ...]  # BASE -> working tree under DIFF_PATHS
    generated_now: tuple[str, ...]  # the working tree's generated/ files, repo-relative
    notes: tuple[str, ...]  # how the sides were computed, when not the plain way


def git(repo: Path, *args: str, env: dict | None = None, text: bool = True) -> str | bytes:
    run = subprocess.run(
        ["git", "-C", str(repo), *args],
        capture_output=True,
        text=text,
        env={**os.environ, **(env or {})},
    )
    if run.returncode != 0:
        err = run.stderr if text else run.stderr.decode(errors="replace")
        raise ReviewError(f"git {' '.join(args)}: {err.strip()}")
    return run.stdout


def resolve_base(repo: Path, base: str | None) -> tuple[str, str]:
    """(label, commit) of BASE: the revision given, or the merge base of HEAD and main."""
    if base:
        return base, git(repo, "rev-parse", "--verify", f"{base}^{{commit}}").strip()
    for main in MAIN_REFS:
        try:
            return f"merge-base(HEAD, {main})", git(repo, "merge-base", "HEAD", main).strip()
        except ReviewError:
            continue
    raise ReviewError(f"no merge base of HEAD with {' or '.join(MAIN_REFS)}: give BASE")


def unpack(repo: Path, commit: str, dest: Path) -> None:
    """BASE's MODEL_PATHS into ``dest`` (those BASE has)."""
    have = set(git(repo, "ls-tree", "--name-only", commit).split())
    paths = [p for p in MODEL_PATHS if p in have]
    if "attngen" not in paths:
        raise ReviewError(f"{commit[:12]} has no attngen/ package")
    data = git(repo, "archive", "--format=tar", commit, "--", *paths, text=False)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")


def start_snapshot(code_root: Path, data_root: Path) -> subprocess.Popen:
    # -I: neither the script's folder nor PYTHONPATH comes first; the script puts
    # code_root first itself and checks that attngen came from there
    return subprocess.Popen(
        [sys.executable, "-I", str(SNAPSHOT), str(code_root), str(data_root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish_snapshot(proc: subprocess.Popen, what: str) -> dict:
    out, err = proc.communicate()
    if proc.returncode != 0:
        tail = "\n".join(err.strip().splitlines()[-6:])
        raise ReviewError(f"computing the model of {what} failed:\n{tail}")
    return json.loads(out)


def load_sides(repo: Path, base: str | None) -> Sides:
    repo = Path(git(repo, "rev-parse", "--show-toplevel").strip())
    label, commit = resolve_base(repo, base)
    old, now, notes = snapshots(repo, label, commit)
    notes += [f"{label}: {e}" for e in old["errors"]]
    notes += [f"working tree: {e}" for e in now["errors"]]
    on_disk = sorted(
        p.relative_to(repo).as_posix()
        for p in repo.glob("generated/**/*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    files = changed_files(repo, commit)
    return Sides(label, commit, old, now, files, tuple(on_disk), tuple(notes))


def snapshots(repo: Path, label: str, commit: str) -> tuple[dict, dict, list[str]]:
    """(BASE's snapshot, the working tree's, notes), both computed at once."""
    notes = []
    with tempfile.TemporaryDirectory(prefix="attngen-review-") as tmp:
        base_root = Path(tmp)
        unpack(repo, commit, base_root)
        now_proc = start_snapshot(repo, repo)
        base_proc = start_snapshot(base_root, base_root)
        try:
            now = finish_snapshot(now_proc, "the working tree")
        except ReviewError:
            base_proc.kill()
            base_proc.communicate()
            raise
        try:
            old = finish_snapshot(base_proc, f"{label} with its own code")
        except ReviewError as err:
            # BASE's spine predates what the snapshot asks of it: read BASE's specs and
            # evidence with the working tree's code (kernel code changes are then invisible;
            # BASE's attngen/ stays as data: runtime identities hash its runtime sources)
            old = finish_snapshot(start_snapshot(repo, base_root), label)
            notes.append(
                f"{label}'s code could not compute its model ({str(err).splitlines()[-1]}); "
                "its specs and evidence were read with the working tree's code, so kernel "
                "code changes between the two are not visible below"
            )
    return old, now, notes


def changed_files(repo: Path, commit: str) -> tuple[FileChange, ...]:
    """DIFF_PATHS changed from ``commit`` to the working tree, untracked files included
    (through a temporary copy of the index; the author's index is not modified)."""
    index = Path(git(repo, "rev-parse", "--git-path", "index").strip())
    if not index.is_absolute():
        index = repo / index
    with tempfile.TemporaryDirectory(prefix="attngen-review-index-") as tmp:
        tmp_index = Path(tmp) / "index"
        if index.is_file():
            shutil.copyfile(index, tmp_index)
        env = {"GIT_INDEX_FILE": str(tmp_index)}
        present = [p for p in DIFF_PATHS if (repo / p).exists()]
        if present:
            git(repo, "add", "-A", "--", *present, env=env)
        numstat = git(
            repo,
            "diff",
            "--cached",
            "--numstat",
            "-z",
            "--no-renames",
            commit,
            "--",
            *DIFF_PATHS,
            env=env,
        )
        status = git(
            repo,
            "diff",
            "--cached",
            "--name-status",
            "-z",
            "--no-renames",
            commit,
            "--",
            *DIFF_PATHS,
            env=env,
        )
    return _parse(numstat, status)


def _parse(numstat: str, status: str) -> tuple[FileChange, ...]:
    kinds = {}
    parts = status.split("\0")
    for i in range(0, len(parts) - 1, 2):
        kinds[parts[i + 1]] = parts[i][0]
    out = []
    for row in numstat.split("\0"):
        if not row:
            continue
        added, removed, path = row.split("\t", 2)
        out.append(
            FileChange(
                path,
                kinds.get(path, "M"),
                int(added) if added.isdigit() else 0,
                int(removed) if removed.isdigit() else 0,
            )
        )
    return tuple(sorted(out, key=lambda f: f.path))
