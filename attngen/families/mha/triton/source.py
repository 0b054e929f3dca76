"""The MHA Triton library's sha256 (see :func:`attngen.evidence.library_sha256`):
importable without torch or the compiler."""

from __future__ import annotations

from pathlib import Path

from attngen.evidence import library_sha256

PACKAGE_DIR = Path(__file__).resolve().parent


def source_sha256() -> str:
    return library_sha256(PACKAGE_DIR)
