"""File kinds of the review (pure), and the review package staying spine-only."""

from __future__ import annotations

import re
from pathlib import Path

import attngen.review
from attngen.review.files import generated_kind, generated_sizes, source_group
from attngen.review.sides import FileChange, _parse
from attngen.spec.enums import Arch, Backend, Family


def test_generated_kinds_follow_the_layout() -> None:
    assert generated_kind("generated/sm90/triton/mha/mha_x/kernels.py") == "kernels"
    assert generated_kind("generated/sm90/cute_dsl/mla/mla_x/backend.py") == "backends"
    assert generated_kind("generated/sm90/cute_dsl/mla/mla_x/graph.py") == "backends"
    assert generated_kind("generated/docs/support_matrix.mdx") == "docs"
    assert generated_kind("generated/sm90/triton/__init__.py") == "other"
    assert generated_kind("generated/MANIFEST.json") == "other"
    assert generated_kind("specs/mha/x.yaml") is None
    sizes = generated_sizes(
        (
            FileChange("generated/sm80/b/f/s/kernels.py", "A", 10, 0),
            FileChange("generated/sm90/b/f/s/kernels.py", "M", 2, 1),
            FileChange("generated/sm90/b/f/t/backend.py", "D", 0, 7),
            FileChange("specs/f/s.yaml", "A", 5, 0),
        )
    )
    assert [
        (s.kind, s.added, s.modified, s.deleted, s.lines_added, s.lines_removed) for s in sizes
    ] == [
        ("kernels", 1, 1, 0, 12, 1),
        ("backends", 0, 0, 1, 0, 7),
    ]


def test_source_groups_follow_the_layout() -> None:
    assert source_group("attngen/families/f/b/kernels/x.py") == "kernel library / lowering (f x b)"
    assert source_group("attngen/families/f/b/library.py") == "kernel library / lowering (f x b)"
    assert source_group("attngen/families/f/b/kernels.py.jinja") == "binding template (f x b)"
    assert source_group("attngen/families/f/runtime.py") == "runtime"
    assert source_group("attngen/runtime/graph.py") == "runtime"
    assert source_group("attngen/families/f/__init__.py") == "family (f)"
    assert source_group("attngen/backends/b/aot.py") == "backend (b)"
    assert source_group("attngen/templates/wrapper/backend.py.jinja") == "wrapper templates"
    assert source_group("attngen/capabilities.py") == "spine"
    assert source_group("tests/x.py") is None


def test_git_output_parsing() -> None:
    numstat = "3\t1\tgenerated/a.py\0-\t-\tevidence/b.bin\0"
    status = "M\0generated/a.py\0A\0evidence/b.bin\0"
    assert _parse(numstat, status) == (
        FileChange("evidence/b.bin", "A", 0, 0),
        FileChange("generated/a.py", "M", 3, 1),
    )


def test_review_package_names_no_family_backend_or_arch() -> None:
    """The review is spine code: families, backends and archs are values it reads."""
    names = {m.value for enum in (Family, Backend, Arch) for m in enum}
    word = re.compile(r"\b(" + "|".join(sorted(names)) + r")\b", re.IGNORECASE)
    for path in Path(attngen.review.__file__).parent.glob("*.py"):
        hits = word.findall(path.read_text())
        assert not hits, f"{path.name} names {sorted(set(hits))}"
