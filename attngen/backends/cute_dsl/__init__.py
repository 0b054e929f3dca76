"""The CuTe DSL backend: kernels on wgmma (sm90) and tcgen05 (sm100).

Its ahead-of-time compile check (no GPU) is :mod:`attngen.backends.cute_dsl.aot`.
"""

from __future__ import annotations

from attngen.arch import ArchFacts
from attngen.registry import BackendInfo, register_backend
from attngen.spec.enums import Backend


def arch_limit(arch: ArchFacts) -> str | None:
    if arch.tensor_core in ("wgmma", "tcgen05"):
        return None
    return (
        "attngen's CuTe DSL kernels are built on wgmma (sm90) and tcgen05 (sm100); "
        f"{arch.arch.value} has neither"
    )


def cpu_limit(dtypes: tuple[str, ...]) -> str | None:
    return "CuTe DSL kernels run on CUDA devices only (no interpreter); pass a CUDA device"


def _aot_main(argv: list[str]) -> int:
    from attngen.backends.cute_dsl import aot

    return aot.main(argv)


# rank 0: auto-selection tries it first wherever it can exist (the arch's own tensor cores)
register_backend(BackendInfo(Backend.CUTE_DSL, "CuTe DSL", arch_limit, cpu_limit, 0, _aot_main))
