"""Lowering: (spec, variants) x backend x arch -> a checked IR plan, through the registry."""

from __future__ import annotations

from attngen import registry
from attngen.capabilities import supports
from attngen.ir import ModulePlan
from attngen.spec.enums import Arch, Backend
from attngen.spec.model import Spec
from attngen.spec.variant import Variant


def lower_module(
    spec: Spec, variants: tuple[Variant, ...], backend: Backend, arch: Arch
) -> ModulePlan | None:
    """The plan for one spec on one target, or None when no variant is lowered there."""
    lowered = tuple(v for v in variants if supports(v, backend, arch).ok)
    if not lowered:
        return None
    lowering = registry.lowering(spec.family, backend)
    assert lowering is not None, "supports() said SUPPORTED without a lowering"
    return lowering.lower(spec, lowered, arch)


def plan_files(plan: ModulePlan) -> dict[str, str]:
    """{path relative to generated/: text} of the plan's package, from its lowering."""
    lowering = registry.lowering(plan.family, plan.backend)
    assert lowering is not None
    return lowering.files(plan)


def plan_identities(plan: ModulePlan) -> dict[str, str]:
    """{variant uri: kernel identity} (what evidence is keyed by), from its lowering."""
    lowering = registry.lowering(plan.family, plan.backend)
    assert lowering is not None
    return lowering.identities(plan)
