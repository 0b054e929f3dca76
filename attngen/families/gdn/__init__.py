"""Gated delta rule linear attention: a per-head recurrent state, chunked prefill.

The family: its docs columns and plainest variant. Lowered by ``triton/`` (chunked
prefill/extend, recurrent decode, speculative verify); ``runtime.py`` is the backend every
generated GDN package subclasses, ``reference.py`` the float64 oracle.
"""

from __future__ import annotations

from attngen.features import Feature, decode_graph_column, has_phase, only_phase, phase_checks
from attngen.features import plain_variant, shape_column, speculative, topk_is
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
        # attngen's own columns: the shapes verified, and graph capture
        shape_column(
            "gva",
            "Value heads per key head",
            fam,
            lambda v: str(_shape(v).v_heads_per_k_head),
        ),
        shape_column("head_dim", "Head dims (key/value)", fam, lambda v: _head_dims(_shape(v))),
        decode_graph_column(fam),
        Feature(
            "cuda_graph_verify",
            "CUDA graph (verify)",
            fam,
            topk_is(lambda k: k >= 1),
            lambda v: speculative(v, 1),
            lambda v: frozenset({"cuda_graph_verify"}),
        ),
    )


def _shape(v: Variant) -> GdnShape:
    assert isinstance(v.shape, GdnShape)
    return v.shape


def _head_dims(shape: GdnShape) -> str:
    """A head-dims cell value: "128", or "64/128" when the key and value dims differ."""
    if shape.key_dim == shape.value_dim:
        return str(shape.key_dim)
    return f"{shape.key_dim}/{shape.value_dim}"


register_family(
    FamilyInfo(FAMILY, features, base_variant, SPEC, title="GDN (gated delta rule) backends")
)
