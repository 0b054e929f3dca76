"""DeepSeek multi-head latent attention: a compressed KV latent plus a decoupled rope part.

Lowered in Triton (attngen/families/mla/triton/); other backends report "not lowered".
"""

from __future__ import annotations

from collections.abc import Callable

from attngen.features import Feature, decode_graph_column, has_phase, kv_cache_columns
from attngen.features import only_phase, phase_checks, plain_variant, shape_column
from attngen.registry import FamilyInfo, register_family
from attngen.spec.enums import Family, Phase
from attngen.families.mla.spec import SPEC, MlaShape
from attngen.spec.family import Shape
from attngen.spec.variant import Variant

DEEPSEEK_V3 = MlaShape(512, 64, 128, 128, 16)  # latent 512 + rope 64, 16 heads per rank


def latent_variant(family: Family, shape: Shape) -> Variant:
    """The plainest variant of a latent-cache family (MLA, DSA)."""
    return plain_variant(family, shape)


def latent_features(family: Family, latent: Callable[[Variant], MlaShape]) -> tuple[Feature, ...]:
    """The reference doc's MLA columns (shared by DSA, whose attention is sparse MLA), then
    attngen's: the query heads per rank verified, and decode under CUDA graphs. ``latent``:
    a variant's MLA shape."""
    return tuple(
        kv_cache_columns(family)
        + [
            Feature(
                "decode",
                "Decode",
                family,
                has_phase(Phase.DECODE),
                only_phase(Phase.DECODE),
                phase_checks,
            ),
            Feature(
                "extend",
                "Chunked Prefix Cache (extend)",
                family,
                has_phase(Phase.EXTEND),
                only_phase(Phase.EXTEND),
                phase_checks,
            ),
            shape_column("heads", "Heads (per rank)", family, lambda v: str(latent(v).num_heads)),
            decode_graph_column(family),
        ]
    )


def _latent(v: Variant) -> MlaShape:
    assert isinstance(v.shape, MlaShape)
    return v.shape


register_family(
    FamilyInfo(
        Family.MLA,
        lambda: latent_features(Family.MLA, _latent),
        lambda: latent_variant(Family.MLA, DEEPSEEK_V3),
        SPEC,
        title="MLA backends",
    )
)
