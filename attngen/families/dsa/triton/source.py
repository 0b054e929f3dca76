"""The DSA Triton library's sha256 (see :func:`attngen.evidence.library_sha256`):
importable without torch or the compiler.

It covers this package's own sources. The library also launches MLA's split combine kernel
(``attngen/families/mla/triton/kernels/absorbed.py``), whose edits do not change it.
"""

from __future__ import annotations

import functools

from pathlib import Path

from attngen.evidence import library_sha256

PACKAGE_DIR = Path(__file__).resolve().parent


@functools.cache
def source_sha256(arch: str | None = None) -> str:
    """The library's sha256 for ``arch`` (None: over all its sources)."""
    return library_sha256(PACKAGE_DIR, arch=arch)
