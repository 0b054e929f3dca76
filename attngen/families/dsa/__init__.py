"""DeepSeek sparse attention: a lightning indexer (fp8, or the model's own bf16 / fp16 / fp32)
picks top-k tokens for sparse MLA.

Lowered in Triton (attngen/families/dsa/triton/); other backends report "not lowered".
"""

from __future__ import annotations

import dataclasses

from attngen.arch import ArchFacts
from attngen.families.mla import DEEPSEEK_V3, latent_features, latent_variant
from attngen.registry import FamilyInfo, register_family
from attngen.spec.enums import DType, Family
from attngen.families.dsa.spec import PAGE_SIZE, SPEC, DsaShape
from attngen.families.mla.spec import MlaShape
from attngen.spec.variant import Variant


def arch_limit(variant: Variant, arch: ArchFacts) -> str | None:
    """Only an fp8 indexer (``dsa.index_dtype``) needs e4m3 hardware; the others score in the
    model's own dtype."""
    shape = variant.shape
    assert isinstance(shape, DsaShape)
    if arch.fp8_e4m3 or shape.index_dtype is not DType.FP8_E4M3:
        return None
    return f"DSA's lightning indexer scores keys in fp8 e4m3, which {arch.arch.value} lacks"


def _latent(v: Variant) -> MlaShape:
    assert isinstance(v.shape, DsaShape)
    return v.shape.mla


def base_variant() -> Variant:
    """DeepSeek-V3.2 at 16 heads, bf16 latent, 64-token pages (the only page size)."""
    plain = latent_variant(Family.DSA, DsaShape(DEEPSEEK_V3, 64, 128, 2048))
    return dataclasses.replace(plain, page_size=PAGE_SIZE)


register_family(
    FamilyInfo(
        Family.DSA,
        lambda: latent_features(Family.DSA, _latent),
        base_variant,
        SPEC,
        arch_limit=arch_limit,
        title="DSA (DeepSeek sparse attention) backends",
    )
)
