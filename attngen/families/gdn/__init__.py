"""Gated delta rule linear attention: a per-head recurrent state, chunked prefill.

No lowering yet: every backend reports GDN as "not lowered" through the registry.
"""

from __future__ import annotations

from attngen.features import Feature, has_phase, only_phase, phase_checks, plain_variant
from attngen.features import speculative, topk_is
from attngen.registry import FamilyInfo, register_family
from attngen.spec.enums import DType, Family, Phase
from attngen.families.gdn.spec import SPEC, GdnShape
from attngen.spec.variant import Variant

FAMILY = Family.GDN


def base_variant() -> Variant:
    return plain_variant(FAMILY, GdnShape(128, 128, 1, DType.FP32, 64), paged=False)


def features() -> tuple[Feature, ...]:
    fam = FAMILY
    return (
        Feature(
            "decode", "Decode", fam, has_phase(Phase.DECODE), only_phase(Phase.DECODE), phase_checks
        ),
        Feature(
            "extend",
            "Prefill / Extend",
            fam,
            has_phase(Phase.EXTEND),
            only_phase(Phase.EXTEND),
            phase_checks,
        ),
        Feature(
            "spec_topk1",
            "Spec Decoding (Target Verify)",
            fam,
            topk_is(lambda k: k >= 1),
            lambda v: speculative(v, 1),
            phase_checks,
        ),
    )


register_family(
    FamilyInfo(FAMILY, features, base_variant, SPEC, title="GDN (gated delta rule) backends")
)
