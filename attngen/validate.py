"""Spec-level capability check: every target must be able to run every variant."""

from __future__ import annotations

from attngen.capabilities import Status, alternatives, supports
from attngen.spec.errors import SpecError
from attngen.spec.expand import expand
from attngen.spec.model import Spec
from attngen.spec.variant import Variant


def validate(spec: Spec) -> tuple[Variant, ...]:
    """Expand ``spec`` and reject targets that cannot run one of its variants."""
    variants = expand(spec)
    for target in spec.targets:
        for arch in target.archs:
            for variant in variants:
                verdict = supports(variant, target.backend, arch)
                if verdict.status is Status.UNSUPPORTED:
                    can = (
                        ", ".join(f"{b.value} {a.value}" for b, a in alternatives(variant))
                        or "none"
                    )
                    raise SpecError(
                        target.location,
                        f"targets.{target.backend.value}",
                        f"{arch.value} cannot run variant {variant.uri}: {verdict.reason}"
                        f" (possible on: {can})",
                    )
    return variants
