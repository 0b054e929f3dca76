"""What the Triton MHA lowering covers: every phase; causal / bidirectional / sliding-window
masks, speculative draft chains and trees, logit softcap and attention sinks; bf16/fp16
activations over a bf16/fp16, fp8 (e4m3, e5m2; per-tensor or per-head scales) or NVFP4
(e2m1 + e4m3 block scales + a global scale) cache; head dims padded to a power of two."""

from __future__ import annotations

from attngen.verdict import Verdict, first_failure, phases_and_dtype
from attngen.spec.enums import DType, MaskKind, Phase, ScaleGranularity
from attngen.families.mha.spec import MhaShape, draft_tree_rules
from attngen.spec.variant import Variant

PHASES = frozenset(Phase)
HEAD_DIMS = frozenset({32, 64, 72, 80, 96, 128, 192, 256})  # padded to a power of two in the tiles
DTYPES = frozenset({DType.BF16, DType.FP16})
MAX_GQA_GROUP = 64  # query-head rows per decode program stay <= 64
MASKS = frozenset({MaskKind.CAUSAL, MaskKind.NONE, MaskKind.SLIDING_WINDOW, MaskKind.CUSTOM})
QUANT_KV = frozenset({DType.FP8_E4M3, DType.FP8_E5M2, DType.NVFP4})
FP8_SCALES = frozenset({ScaleGranularity.PER_TENSOR, ScaleGranularity.PER_HEAD})


def supports(variant: Variant) -> Verdict:
    shape = variant.shape
    assert isinstance(shape, MhaShape)
    kind = variant.mask.kind
    kv_name = variant.kv_dtype.value if variant.kv_dtype is not None else "no"
    return first_failure(
        [
            *phases_and_dtype(variant, PHASES, DTYPES),
            (
                variant.kv_dtype is variant.dtype or variant.kv_dtype in QUANT_KV,
                f"{kv_name} KV cache is not lowered yet",
                "kv_cache.dtype",
            ),
            (
                variant.kv_dtype not in (DType.FP8_E4M3, DType.FP8_E5M2)
                or variant.kv_scale in FP8_SCALES,
                f"an fp8 KV cache takes per-tensor or per-head scales, not "
                f"{variant.kv_scale.value if variant.kv_scale else 'none'}",
                "kv_cache.scale",
            ),
            (
                variant.kv_dtype is not DType.NVFP4
                or all(d & (d - 1) == 0 for d in (shape.head_dim, shape.v_head_dim)),
                "NVFP4 KV needs power-of-two head dims (its packed rows are not lane-padded)",
                "kv_cache.dtype",
            ),
            (kind in MASKS, f"mask {kind.value} is not lowered yet", "mask.kind"),
            *draft_tree_rules(variant),
            (
                shape.head_dim in HEAD_DIMS,
                f"head_dim {shape.head_dim} is not lowered yet",
                "heads.head_dim",
            ),
            (
                shape.v_head_dim in HEAD_DIMS,
                f"v_head_dim {shape.v_head_dim} is not lowered yet",
                "heads.v_head_dim",
            ),
            (
                shape.gqa_group <= MAX_GQA_GROUP,
                f"gqa_group {shape.gqa_group} > {MAX_GQA_GROUP} is not lowered",
                "heads.gqa_group",
            ),
        ]
    )
