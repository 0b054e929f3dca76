"""What the DSA Triton library is made of, and its sha256 (importable without torch or
triton: the generator records it in every generated kernels.py).

The library launches MLA's split combine kernel, so MLA's absorbed kernel file (and the
MHA file it imports) count as its sources too: editing them makes DSA's evidence stale.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
FAMILIES_DIR = PACKAGE_DIR.parents[1]
SOURCE_FILES = ("library.py", "config.py", "kernels/*.py", "host/*.py")
BORROWED_FILES = ("mla/triton/kernels/absorbed.py", "mha/triton/kernels/fp4.py")


def source_sha256() -> str:
    """sha256 over the library's source files (sorted relative paths and bytes)."""
    digest = hashlib.sha256()
    own = sorted({p for pattern in SOURCE_FILES for p in PACKAGE_DIR.glob(pattern)})
    for path in own + [FAMILIES_DIR / rel for rel in BORROWED_FILES]:
        digest.update(path.relative_to(FAMILIES_DIR).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()
