"""DeepSeek sparse attention: a lightning indexer (fp8) picks top-k tokens for sparse MLA.

No lowering yet: every backend reports DSA as "not lowered" through the registry.
"""

from __future__ import annotations

from attngen.arch import ArchFacts
from attngen.families.mla import DEEPSEEK_V3, latent_features, latent_variant
from attngen.registry import FamilyInfo, register_family
from attngen.spec.enums import Family
from attngen.families.dsa.spec import SPEC, DsaShape


def arch_limit(arch: ArchFacts) -> str | None:
    if arch.fp8_e4m3:
        return None
    return f"DSA's lightning indexer scores keys in fp8 e4m3, which {arch.arch.value} lacks"


register_family(
    FamilyInfo(
        Family.DSA,
        lambda: latent_features(Family.DSA),
        lambda: latent_variant(Family.DSA, DsaShape(DEEPSEEK_V3, 64, 128, 2048)),
        SPEC,
        arch_limit=arch_limit,
        title="DSA (DeepSeek sparse attention) backends",
    )
)
