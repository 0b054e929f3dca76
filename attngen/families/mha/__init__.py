"""MHA / GQA / MQA softmax attention over a paged KV cache."""

from __future__ import annotations

from attngen.families.mha import docs
from attngen.features import (
    Feature,
    decode_graph_column,
    has_phase,
    kv_cache_columns,
    only_phase,
    phase_checks,
    plain_variant,
    shape_column,
    with_mask,
)
from attngen.registry import FamilyInfo, register_family
from attngen.spec.enums import Family, MaskKind, Phase
from attngen.families.mha.spec import SPEC, MhaShape
from attngen.spec.variant import Variant

FAMILY = Family.MHA


def base_variant() -> Variant:
    return plain_variant(FAMILY, MhaShape(128, 128, 4))


def _shape(v: Variant) -> MhaShape:
    assert isinstance(v.shape, MhaShape)
    return v.shape


def _head_dims(shape: MhaShape) -> str:
    """A head-dims cell value: "128", or "192/128" when v's head dim differs from q/k's."""
    if shape.v_head_dim == shape.head_dim:
        return str(shape.head_dim)
    return f"{shape.head_dim}/{shape.v_head_dim}"


def _windowed(v: Variant) -> Variant:
    return with_mask(v, kind=MaskKind.SLIDING_WINDOW, window_left=4096)


def _mask_column(key: str, label: str, **mask: object) -> Feature:
    """A score/mask modifier column: variants whose mask sets it, probed by setting it."""
    ((name, _),) = mask.items()
    return Feature(
        key,
        label,
        FAMILY,
        lambda v: getattr(v.mask, name) not in (None, False),  # a cap set, or sinks on
        lambda v: with_mask(v, **mask),
        phase_checks,
    )


def _phase_mask(key: str, label: str, phase: Phase, kind: MaskKind) -> Feature:
    """A (phase, mask kind) column, e.g. bidirectional prefill."""
    return Feature(
        key,
        label,
        FAMILY,
        lambda v: v.mask.kind is kind and phase in v.phases,
        lambda v: with_mask(only_phase(phase)(v), kind=kind),
        phase_checks,
    )


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
            _phase_mask(
                "multimodal", "MultiModal (bidirectional prefill)", Phase.PREFILL, MaskKind.NONE
            ),
            _mask_column("softcap", "Logit softcap", logit_softcap=50.0),
            _mask_column("sinks", "Attention sinks", sinks=True),
            _phase_mask("non_causal", "Non-causal extend", Phase.EXTEND, MaskKind.NONE),
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
            shape_column("gqa", "GQA group", fam, lambda v: str(_shape(v).gqa_group)),
            Feature(
                "mqa",
                "MQA (one kv head)",
                fam,
                lambda v: bool({Phase.DECODE, Phase.EXTEND, Phase.PREFILL} & set(v.phases)),
                lambda v: v,
                lambda v: frozenset({"mqa"}),
            ),
            shape_column("head_dim", "Head dims", fam, lambda v: _head_dims(_shape(v))),
            decode_graph_column(fam),
        ]
    )


register_family(
    FamilyInfo(
        FAMILY,
        features,
        base_variant,
        SPEC,
        title="MHA backends",
        layer_keys=docs.layer_keys,
        hybrid_example=docs.hybrid_example,
    )
)
