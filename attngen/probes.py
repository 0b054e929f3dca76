"""Asking supports() about the docs columns: each family's columns and plainest variant (from
its registered package), a column's probe verdict, and the header lines of a package."""

from __future__ import annotations

from attngen import registry
from attngen.capabilities import Status, Verdict, supports
from attngen.features import Feature
from attngen.spec.enums import Arch, Backend, Family
from attngen.spec.variant import Variant


def family_features(family: Family) -> tuple[Feature, ...]:
    """The docs columns of a family, from its package."""
    return registry.family(family).features()


def base_variant(family: Family) -> Variant:
    """The plainest variant of a family (bf16, page 1, causal, extend + decode)."""
    return registry.family(family).base_variant()


def probe_verdict(feature: Feature, backend: Backend, arch: Arch) -> Verdict:
    return supports(feature.probe(base_variant(feature.family)), backend, arch)


def feature_lines(
    variants: tuple[Variant, ...], family: Family, backend: Backend, arch: Arch
) -> tuple[str, ...]:
    """Header lines of a generated package: what its variants cover, and for the rest
    whether this target lowers them (another spec may) or why not."""
    lines = [f"Covers ({family.value} on {backend.value} {arch.value}; one line per docs column):"]
    for feature in family_features(family):
        used = [v for v in variants if feature.applies(v)]
        if used:
            detail = ""
            if feature.detail is not None:
                values = sorted({feature.detail(v) for v in used}, key=lambda s: (len(s), s))
                detail = f": {', '.join(values)}"
            lines.append(f"  yes:           {feature.label}{detail}")
            continue
        verdict = probe_verdict(feature, backend, arch)
        if verdict.status is Status.SUPPORTED:
            lines.append(
                f"  not here:      {feature.label} (lowered for this target; not in this spec)"
            )
        elif verdict.status is Status.NOT_LOWERED:
            lines.append(f"  not lowered:   {feature.label} ({verdict.reason})")
        else:
            lines.append(f"  not supported: {feature.label} ({verdict.reason})")
    return tuple(lines)
