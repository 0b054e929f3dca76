"""THE capability model: ``supports(variant, backend, arch)``.

Validation, the lowering, the emitters, the docs and the tests all ask this one function,
so the support matrix cannot disagree with what is generated. A verdict is one of:

- SUPPORTED: attngen lowers this variant for this backend and arch;
- NOT_LOWERED: possible on that hardware and backend, but no lowering exists yet;
- UNSUPPORTED: the backend or hardware cannot do it (the reason says why).

The answer is asked in a fixed order: hardware facts (the arch table, what the backend needs
of an arch, what the family needs of it for this variant, what the KV dtype needs), then the
registered (family, backend) lowering; a pair with no lowering is NOT_LOWERED.
"""

from __future__ import annotations

from attngen import registry
from attngen.arch import ArchFacts, facts
from attngen.spec.enums import Arch, Backend, DType
from attngen.spec.variant import Variant
from attngen.verdict import SUPPORTED, Status, Verdict, first_failure, not_lowered

__all__ = [
    "SUPPORTED",
    "Status",
    "Verdict",
    "alternatives",
    "first_failure",
    "hardware_limit",
    "not_lowered",
    "supports",
]


# Storage dtypes whose conversion the hardware must have (ArchFacts field, reason).
DTYPE_NEEDS: dict[DType, tuple[str, str]] = {
    DType.FP8_E4M3: (
        "fp8_e4m3",
        "fp8 e4m3 conversion needs sm89+; {arch} has no e4m3 hardware type",
    ),
}


def supports(variant: Variant, backend: Backend, arch: Arch) -> Verdict:
    """Can ``backend`` on ``arch`` run ``variant``? See the module docstring."""
    hardware = hardware_limit(variant, backend, facts(arch))
    if hardware is not None:
        return Verdict(Status.UNSUPPORTED, hardware)
    lowering = registry.lowering(variant.family, backend)
    if lowering is None:
        title = registry.backend(backend).title
        return not_lowered(f"no {title} lowering for {variant.family.value} yet")
    return lowering.supports(variant, arch)


def alternatives(variant: Variant) -> list[tuple[Backend, Arch]]:
    """Every (backend, arch) that is not UNSUPPORTED for ``variant``, in enum order."""
    return [
        (b, a)
        for b in Backend
        for a in Arch
        if supports(variant, b, a).status is not Status.UNSUPPORTED
    ]


def hardware_limit(variant: Variant, backend: Backend, arch: ArchFacts) -> str | None:
    """Reasons no lowering could ever fix, from the arch table."""
    why = registry.backend(backend).arch_limit(arch)
    if why is None and variant.kv_dtype in DTYPE_NEEDS:
        fact, text = DTYPE_NEEDS[variant.kv_dtype]
        why = None if getattr(arch, fact) else text.format(arch=arch.arch.value)
    return why or registry.family(variant.family).arch_limit(variant, arch)
