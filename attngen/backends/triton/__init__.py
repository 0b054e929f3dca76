"""The Triton backend: portable kernels for every arch in the arch table.

Triton's spellings of attngen's dtypes live here (:data:`POINTER_TYPES`), and its
ahead-of-time compile check in :mod:`attngen.backends.triton.aot`.
"""

from __future__ import annotations

import os

from attngen.arch import ArchFacts
from attngen.registry import BackendInfo, register_backend
from attngen.spec.enums import Backend


def arch_limit(arch: ArchFacts) -> str | None:
    return None  # Triton targets mma.sync, wgmma and tcgen05 alike


def cpu_limit(dtypes: tuple[str, ...]) -> str | None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        return (
            "Triton kernels take CPU tensors only in Triton's interpreter (TRITON_INTERPRET=1, "
            "set before triton is first imported); pass a CUDA device"
        )
    if "bfloat16" in dtypes:  # the interpreter runs fp16 / fp32 / fp8 kernels (slowly: tests)
        return (
            "Triton's interpreter multiplies bfloat16 tl.dot operands as raw bits (Triton 3.6, "
            "triton-lang/triton#11584: bf16 is not supported there), so a bf16 backend on CPU "
            "would return garbage; run bf16 on a GPU, or fp16 on CPU"
        )
    return None


def _aot_main(argv: list[str]) -> int:
    from attngen.backends.triton import aot

    return aot.main(argv)


# rank 1: the portable fallback after a backend built for the arch
register_backend(BackendInfo(Backend.TRITON, "Triton", arch_limit, cpu_limit, 1, _aot_main))
