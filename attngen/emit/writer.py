"""The one module that touches generated/: write if different, remove stale, check drift."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from attngen.spec.enums import Arch

ARCH_DIRS = tuple(a.value for a in Arch)


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

    @property
    def clean(self) -> bool:
        return not (self.missing or self.changed or self.stale)

    def report(self, regenerate: str) -> str:
        lines = []
        for label, paths in (
            ("missing", self.missing),
            ("changed", self.changed),
            ("stale", self.stale),
        ):
            lines += [f"  {label}: {p}" for p in paths]
        lines.append(f"generated/ is out of date: run `{regenerate}` and commit the result")
        return "\n".join(lines)


def owned(relpath: str, archs: tuple[str, ...]) -> bool:
    """Files this run is responsible for: its archs' subtrees and everything arch-independent."""
    top = relpath.split("/", 1)[0]
    return top in archs or top not in ARCH_DIRS


def existing_files(out: Path, archs: tuple[str, ...]) -> list[str]:
    if not out.is_dir():
        return []
    found = []
    for path in sorted(out.rglob("*")):
        rel = path.relative_to(out).as_posix()
        if path.is_file() and "__pycache__" not in rel.split("/") and owned(rel, archs):
            found.append(rel)
    return found


def check_tree(out: Path, files: dict[str, str], archs: tuple[str, ...]) -> Drift:
    drift = Drift()
    for rel, text in sorted(files.items()):
        if not owned(rel, archs):
            continue
        path = out / rel
        if not path.is_file():
            drift.missing.append(f"{out.name}/{rel}")
        elif path.read_bytes() != text.encode("utf-8"):
            drift.changed.append(f"{out.name}/{rel}")
    drift.stale = [f"{out.name}/{rel}" for rel in existing_files(out, archs) if rel not in files]
    return drift


def write_tree(out: Path, files: dict[str, str], archs: tuple[str, ...]) -> Drift:
    """Bring ``out`` to exactly ``files`` (for the owned part); returns what it changed."""
    drift = check_tree(out, files, archs)
    for rel, text in sorted(files.items()):
        if owned(rel, archs):
            path = out / rel
            data = text.encode("utf-8")
            if not path.is_file() or path.read_bytes() != data:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
    for rel in existing_files(out, archs):
        if rel not in files:
            (out / rel).unlink()
    _remove_empty_dirs(out)
    return drift


def _remove_empty_dirs(out: Path) -> None:
    for path in sorted(out.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_dir() and path.name != "__pycache__" and not any(path.iterdir()):
            path.rmdir()
