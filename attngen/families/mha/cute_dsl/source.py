"""What the MHA CuTe DSL library is made of, and its sha256: importable without torch or
cutlass, so the generator records it in every generated kernels.py and the kernel
identities of the evidence include it."""

from __future__ import annotations

import hashlib
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_FILES = ("library.py", "config.py", "kernels/*.py", "host/*.py")


def source_sha256() -> str:
    """sha256 over the library's source files (sorted relative paths and bytes)."""
    digest = hashlib.sha256()
    for rel in sorted({p for pattern in SOURCE_FILES for p in PACKAGE_DIR.glob(pattern)}):
        digest.update(rel.relative_to(PACKAGE_DIR).as_posix().encode() + b"\0")
        digest.update(rel.read_bytes() + b"\0")
    return digest.hexdigest()
