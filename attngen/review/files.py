"""File-level facts of a review: the generated diff by kind, and which attngen sources
changed (kernel library, binding templates, runtime, ...). Kinds come from the layout
(``generated/<arch>/<backend>/<family>/<spec>/<file>``, ``attngen/families/<f>/<b>/``),
never from a family's or a backend's name."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from attngen.review.sides import FileChange

GENERATED_KINDS = ("kernels", "backends", "docs", "other")


@dataclass(frozen=True)
class DiffSize:
    kind: str
    added: int  # files
    modified: int
    deleted: int
    lines_added: int
    lines_removed: int

    @property
    def files(self) -> int:
        return self.added + self.modified + self.deleted


def generated_kind(path: str) -> str | None:
    """kernels / backends / docs / other for a path under generated/, else None."""
    parts = path.split("/")
    if parts[0] != "generated" or len(parts) < 2:
        return None
    if parts[1] == "docs":
        return "docs"
    if len(parts) == 6:  # generated/<arch>/<backend>/<family>/<spec>/<file>
        return "kernels" if parts[5].startswith("kernels") else "backends"
    return "other"


def generated_sizes(files: tuple[FileChange, ...]) -> tuple[DiffSize, ...]:
    per: dict[str, list[FileChange]] = defaultdict(list)
    for f in files:
        kind = generated_kind(f.path)
        if kind is not None:
            per[kind].append(f)
    return tuple(
        DiffSize(
            kind,
            sum(f.status == "A" for f in per[kind]),
            sum(f.status not in "AD" for f in per[kind]),
            sum(f.status == "D" for f in per[kind]),
            sum(f.added for f in per[kind]),
            sum(f.removed for f in per[kind]),
        )
        for kind in GENERATED_KINDS
        if per[kind]
    )


def source_group(path: str) -> str | None:
    """What an attngen/ source is to a reviewer, from where it lives; None outside attngen/."""
    parts = path.split("/")
    if parts[0] != "attngen" or len(parts) < 2:
        return None
    if parts[1] == "families" and len(parts) >= 5:  # a (family, backend) pair's package
        what = "binding template" if path.endswith(".jinja") else "kernel library / lowering"
        return f"{what} ({parts[2]} x {parts[3]})"
    if parts[1] == "runtime" or (parts[1] == "families" and parts[-1] == "runtime.py"):
        return "runtime"
    if parts[1] == "families" and len(parts) == 4:
        return f"family ({parts[2]})"
    if parts[1] == "backends" and len(parts) >= 4:
        return f"backend ({parts[2]})"
    if parts[1] == "templates":
        return "wrapper templates"
    return "spine"


def source_changes(files: tuple[FileChange, ...]) -> dict[str, tuple[FileChange, ...]]:
    """Changed attngen/ files by group (caches and compiled files left out)."""
    per: dict[str, list[FileChange]] = defaultdict(list)
    for f in files:
        group = source_group(f.path)
        if group is not None and "__pycache__" not in f.path:
            per[group].append(f)
    return {g: tuple(per[g]) for g in sorted(per)}


def generated_packages(paths: list[str]) -> set[str]:
    """Package directories (generated/<arch>/<backend>/<family>/<spec>) of file paths."""
    return {
        "/".join(p.split("/")[:5]) for p in paths if generated_kind(p) in ("kernels", "backends")
    }


def evidence_files(files: tuple[FileChange, ...]) -> tuple[FileChange, ...]:
    return tuple(f for f in files if f.path.startswith("evidence/"))
