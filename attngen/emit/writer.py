"""The one module that touches generated/: write if different, remove stale, check drift."""

from __future__ import annotations

import difflib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from attngen.spec.enums import Arch

ARCH_DIRS = tuple(a.value for a in Arch)
FILE_MODE = 0o644  # generated files are plain, non-executable files
DIFF_LINES = 12  # lines of unified diff shown per changed file
DIFF_FILES = 8  # changed files shown with a diff


class DuplicateWrite(Exception):
    """Two producers wrote the same generated path."""


def write_once(
    files: dict[str, str], owners: dict[str, str], new: dict[str, str], owner: str
) -> None:
    """Add ``new`` to ``files``; a path some other producer already wrote is an error
    naming both (a second plan must never silently replace the first one's file)."""
    for rel, text in new.items():
        if rel in files:
            raise DuplicateWrite(f"generated/{rel}: written by {owners[rel]} and again by {owner}")
        files[rel] = text
        owners[rel] = owner


@dataclass
class Drift:
    missing: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    stale_dirs: list[str] = field(default_factory=list)  # folders holding no generated file
    modes: list[str] = field(default_factory=list)  # files whose mode is not FILE_MODE
    links: list[str] = field(default_factory=list)  # symbolic links (never written through)
    diffs: dict[str, list[str]] = field(default_factory=dict)  # changed file -> diff lines

    @property
    def clean(self) -> bool:
        found = (self.missing, self.changed, self.stale, self.stale_dirs, self.modes, self.links)
        return not any(found)

    def report(self, regenerate: str, tree: str = "generated/") -> str:
        lines = []
        for label, paths in (
            ("missing", self.missing),
            ("changed", self.changed),
            ("stale", self.stale),
            ("stale folder", self.stale_dirs),
            ("mode is not 644", self.modes),
            ("link, not a plain file or folder", self.links),
        ):
            lines += [f"  {label}: {p}" for p in paths]
        shown = list(self.diffs.items())[:DIFF_FILES]
        for path, diff in shown:
            lines.append(f"--- diff of {path} (generated vs on disk, first lines) ---")
            lines += [f"    {line}" for line in diff]
        if len(self.diffs) > len(shown):
            lines.append(f"  ... and {len(self.diffs) - len(shown)} more changed files")
        lines.append(f"{tree} is out of date: run `{regenerate}` and commit the result")
        return "\n".join(lines)


def owned(relpath: str, archs: tuple[str, ...]) -> bool:
    """Files this run is responsible for: its archs' subtrees and everything arch-independent."""
    top = relpath.split("/", 1)[0]
    return top in archs or top not in ARCH_DIRS


def _entries(out: Path, archs: tuple[str, ...]) -> list[tuple[str, Path]]:
    """(relpath, path) of everything in the owned part of ``out`` outside ``__pycache__``;
    a link is listed, never followed."""
    if not out.is_dir():
        return []
    found = []
    for path in sorted(out.rglob("*")):
        rel = path.relative_to(out).as_posix()
        if "__pycache__" not in rel.split("/") and owned(rel, archs):
            found.append((rel, path))
    return found


def existing_files(out: Path, archs: tuple[str, ...]) -> list[str]:
    """The plain files of the owned part of ``out`` (links are :func:`links`)."""
    return [rel for rel, path in _entries(out, archs) if path.is_file() and not path.is_symlink()]


def links(out: Path, archs: tuple[str, ...]) -> list[str]:
    """Symbolic links in the owned part of ``out``: generate writes plain files and folders
    only, and writing through a link would change what lies outside the tree."""
    return [rel for rel, path in _entries(out, archs) if path.is_symlink()]


def check_tree(out: Path, files: dict[str, str], archs: tuple[str, ...]) -> Drift:
    drift = Drift()
    for rel, text in sorted(files.items()):
        if not owned(rel, archs):
            continue
        path, name = out / rel, f"{out.name}/{rel}"
        if path.is_symlink():
            continue  # reported with the links
        if not path.is_file():
            drift.missing.append(name)
            continue
        on_disk = path.read_bytes()
        if on_disk != text.encode("utf-8"):
            drift.changed.append(name)
            drift.diffs[name] = _short_diff(on_disk.decode("utf-8", "replace"), text, name)
        if path.stat().st_mode & 0o777 != FILE_MODE:
            drift.modes.append(f"{name} ({path.stat().st_mode & 0o777:o})")
    drift.stale = [f"{out.name}/{rel}" for rel in existing_files(out, archs) if rel not in files]
    drift.links = [f"{out.name}/{rel}" for rel in links(out, archs)]
    drift.stale_dirs = [f"{out.name}/{rel}" for rel in stale_dirs(out, files, archs)]
    return drift


def stale_dirs(out: Path, files: dict[str, str], archs: tuple[str, ...]) -> list[str]:
    """Owned folders of ``out`` that hold no generated folder and no file but bytecode
    (``__pycache__``): what is left of a package whose spec is gone."""
    wanted = {str(Path(rel).parent) for rel in files}
    wanted |= {str(p) for d in list(wanted) for p in Path(d).parents}
    return [
        rel
        for rel, path in _entries(out, archs)
        if path.is_dir()
        and not path.is_symlink()
        and rel not in wanted
        and not any(p.is_file() for p in path.rglob("*") if "__pycache__" not in p.parts)
    ]


def _short_diff(old: str, new: str, name: str) -> list[str]:
    diff = difflib.unified_diff(
        old.splitlines(), new.splitlines(), f"{name} (on disk)", f"{name} (generated)", n=1
    )
    lines = [line for line in diff][: DIFF_LINES + 2]
    return [line[:160] for line in lines[2:]]  # skip the ---/+++ header


def write_tree(out: Path, files: dict[str, str], archs: tuple[str, ...]) -> Drift:
    """Bring ``out`` to exactly ``files`` (for the owned part); returns what it changed.
    Links and stale files go first, so that nothing stands where a generated file or
    folder goes; each file is replaced in one step (an interrupted run leaves it old or
    new, never cut short, and never writes through a link)."""
    drift = check_tree(out, files, archs)
    for rel in links(out, archs):
        (out / rel).unlink()
    for rel in existing_files(out, archs):
        if rel not in files:
            (out / rel).unlink()
    for rel in stale_dirs(out, files, archs):  # outermost first
        if (out / rel).is_dir():
            shutil.rmtree(out / rel)
    _remove_empty_dirs(out)
    for rel, text in sorted(files.items()):
        if owned(rel, archs):
            _write_file(out / rel, text.encode("utf-8"))
    return drift


def _write_file(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` with mode FILE_MODE afterwards; an unchanged file is not
    rewritten (its mode is fixed in place)."""
    if path.is_file() and path.read_bytes() == data:
        if path.stat().st_mode & 0o777 != FILE_MODE:
            path.chmod(FILE_MODE)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.attngen-tmp")  # stale if left behind
    temporary.write_bytes(data)
    temporary.chmod(FILE_MODE)
    os.replace(temporary, path)


def _remove_empty_dirs(out: Path) -> None:
    if not out.is_dir():
        return
    for path in sorted(out.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if (
            path.is_dir()
            and not path.is_symlink()
            and path.name != "__pycache__"
            and not any(path.iterdir())
        ):
            path.rmdir()
