"""MHA / GQA / MQA softmax attention over a paged KV cache."""

from __future__ import annotations

from attngen.families.mha import docs
from attngen.features import (
    Feature,
    has_phase,
    kv_cache_columns,
    only_phase,
    phase_checks,
    probe_mask,
    with_mask,
)
from attngen.registry import FamilyInfo, register_family
from attngen.spec.enums import DType, Family, MaskKind, Phase
from attngen.spec.variant import MhaShape, Variant

FAMILY = Family.MHA


def base_variant() -> Variant:
    return Variant(
        spec=None,
        family=FAMILY,
        shape=MhaShape(128, 128, 4),
        phases=(Phase.EXTEND, Phase.DECODE),
        dtype=DType.BF16,
        page_size=1,
        kv_dtype=DType.BF16,
        kv_scale=None,
        mask=probe_mask(),
        spec_topk=None,
    )


def _shape(v: Variant) -> MhaShape:
    assert isinstance(v.shape, MhaShape)
    return v.shape


def _windowed(v: Variant) -> Variant:
    return with_mask(v, kind=MaskKind.SLIDING_WINDOW, window_left=4096)


def features() -> tuple[Feature, ...]:
    fam = FAMILY
    return tuple(
        kv_cache_columns(fam)
        + [
            Feature(
                "sliding_window",
                "Sliding Window",
                fam,
                lambda v: v.mask.kind is MaskKind.SLIDING_WINDOW,
                _windowed,
                phase_checks,
            ),
            Feature(
                "multimodal",
                "MultiModal (bidirectional prefill)",
                fam,
                lambda v: v.mask.kind is MaskKind.NONE and Phase.PREFILL in v.phases,
                lambda v: with_mask(only_phase(Phase.PREFILL)(v), kind=MaskKind.NONE),
                phase_checks,
            ),
            Feature(
                "softcap",
                "Logit softcap",
                fam,
                lambda v: v.mask.logit_softcap is not None,
                lambda v: with_mask(v, logit_softcap=50.0),
                phase_checks,
            ),
            Feature(
                "sinks",
                "Attention sinks",
                fam,
                lambda v: v.mask.sinks,
                lambda v: with_mask(v, sinks=True),
                phase_checks,
            ),
            Feature(
                "non_causal",
                "Non-causal extend",
                fam,
                lambda v: v.mask.kind is MaskKind.NONE and Phase.EXTEND in v.phases,
                lambda v: with_mask(only_phase(Phase.EXTEND)(v), kind=MaskKind.NONE),
                phase_checks,
            ),
            Feature(
                "decode",
                "Decode",
                fam,
                has_phase(Phase.DECODE),
                only_phase(Phase.DECODE),
                phase_checks,
            ),
            Feature(
                "extend",
                "Extend (cached prefix)",
                fam,
                has_phase(Phase.EXTEND),
                only_phase(Phase.EXTEND),
                phase_checks,
            ),
            Feature(
                "gqa",
                "GQA group",
                fam,
                lambda v: True,
                lambda v: v,
                phase_checks,
                lambda v: str(_shape(v).gqa_group),
            ),
            Feature(
                "mqa",
                "MQA (one kv head)",
                fam,
                lambda v: bool({Phase.DECODE, Phase.EXTEND, Phase.PREFILL} & set(v.phases)),
                lambda v: v,
                lambda v: frozenset({"mqa"}),
            ),
            Feature(
                "head_dim",
                "Head dims",
                fam,
                lambda v: True,
                lambda v: v,
                phase_checks,
                lambda v: str(_shape(v).head_dim),
            ),
            Feature(
                "cuda_graph",
                "CUDA graph (decode)",
                fam,
                has_phase(Phase.DECODE),
                only_phase(Phase.DECODE),
                lambda v: frozenset({"cuda_graph"}),
            ),
        ]
    )


register_family(
    FamilyInfo(
        FAMILY,
        features,
        base_variant,
        title="MHA backends",
        layer_keys=docs.layer_keys,
        hybrid_example=docs.hybrid_example,
    )
)
