"""The Triton backend: portable kernels for every arch in the arch table.

Triton's spellings of attngen's dtypes live here (:data:`POINTER_TYPES`), and its
ahead-of-time compile check in :mod:`attngen.backends.triton.aot`.
"""

from __future__ import annotations

from attngen.arch import ArchFacts
from attngen.registry import BackendInfo, register_backend
from attngen.spec.enums import Backend


def arch_limit(arch: ArchFacts) -> str | None:
    return None  # Triton targets mma.sync, wgmma and tcgen05 alike


def _aot_main(argv: list[str]) -> int:
    from attngen.backends.triton import aot

    return aot.main(argv)


# rank 1: the portable fallback after a backend built for the arch
register_backend(BackendInfo(Backend.TRITON, "Triton", arch_limit, 1, _aot_main))
