"""Hardware facts of every arch attngen targets: ONE table, asked by everything else.

Capability rules (``supports()``), the lowerings (SM counts for split heuristics), the AOT
compile check (cubin targets, shared-memory limits) and the runtime (which generated arch a
device runs) all read :data:`ARCHS`; nothing restates a number that lives here.
"""

from __future__ import annotations

from dataclasses import dataclass

from attngen.spec.enums import Arch


@dataclass(frozen=True)
class ArchFacts:
    arch: Arch
    capability: int  # compute capability x 10 of the arch's kernels (90 -> sm_90a)
    device_capabilities: tuple[tuple[int, int | None], ...]  # (major, minor or any) it runs on
    part: str  # the reference part its numbers describe
    num_sms: int  # SM count of that part: sizes grids and split heuristics
    cubin_target: str  # ptxas target of its kernels
    smem_optin_bytes: int  # cudaDevAttrMaxSharedMemoryPerBlockOptin of that part
    tensor_core: str  # the matrix instruction family: "mma.sync", "wgmma", "tcgen05"
    fp8_e4m3: bool  # hardware e4m3 conversion (sm89+)


ARCHS: dict[Arch, ArchFacts] = {
    Arch.SM80: ArchFacts(
        Arch.SM80, 80, ((8, None),), "A100", 108, "sm_80", 166912, "mma.sync", fp8_e4m3=False
    ),
    Arch.SM90: ArchFacts(
        Arch.SM90, 90, ((9, 0),), "H100/H200", 132, "sm_90a", 232448, "wgmma", fp8_e4m3=True
    ),
    Arch.SM100: ArchFacts(
        Arch.SM100, 100, ((10, None),), "B200", 148, "sm_100a", 232448, "tcgen05", fp8_e4m3=True
    ),
}


def facts(arch: Arch | str) -> ArchFacts:
    return ARCHS[Arch(arch)]


def arch_for_device(major: int, minor: int) -> Arch | None:
    """The generated arch whose kernels run on a GPU of compute capability major.minor."""
    for f in ARCHS.values():
        if any(m == major and n in (None, minor) for m, n in f.device_capabilities):
            return f.arch
    return None
