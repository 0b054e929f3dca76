"""The GDN CuTe DSL library's sha256 (see :func:`attngen.evidence.library_sha256`):
importable without torch or the compiler."""

from __future__ import annotations

from pathlib import Path

from attngen.evidence import library_source_sha256

PACKAGE_DIR = Path(__file__).resolve().parent
source_sha256 = library_source_sha256(PACKAGE_DIR)  # (arch=None: over all its sources)
