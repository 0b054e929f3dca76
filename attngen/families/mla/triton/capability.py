"""What the Triton MLA lowering covers: absorbed decode, extend, draft extend, draft-chain
verify and (at
page size 1) draft-tree verify over a bf16/fp16, fp8 e4m3 (per-tensor scale) or NVFP4
(sm90+) latent cache of DeepSeek's dims, and the ragged 192/128 path with LSE for new tokens
and prefix chunks; any page size; up to 128 heads."""

from __future__ import annotations

from attngen.spec.enums import Arch, DType, MaskKind, Phase, ScaleGranularity
from attngen.families.mla.spec import MlaShape
from attngen.spec.variant import Variant
from attngen.verdict import Verdict, first_failure, first_off, phases_and_dtype

PHASES = frozenset({Phase.DECODE, Phase.EXTEND, Phase.VERIFY, Phase.DRAFT_EXTEND})
DTYPES = frozenset({DType.BF16, DType.FP16})
# The kernels' tiles are these dims (tl.arange extents), measured spill-free at them.
DIMS = (512, 64, 128, 128)
DIM_NAMES = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
MAX_HEADS = 128


def supports(variant: Variant, arch: Arch) -> Verdict:
    shape = variant.shape
    assert isinstance(shape, MlaShape)
    dims = (shape.kv_lora_rank, shape.qk_rope_head_dim, shape.qk_nope_head_dim, shape.v_head_dim)
    kv = variant.kv_dtype
    kv_name = kv.value if kv is not None else "no"
    topk = variant.spec_topk or 0
    return first_failure(
        [
            *phases_and_dtype(variant, PHASES, DTYPES),
            (
                kv in (variant.dtype, DType.FP8_E4M3, DType.NVFP4),
                f"{kv_name} latent cache is not lowered yet",
                "kv_cache.dtype",
            ),
            (
                kv is not DType.FP8_E4M3 or variant.kv_scale is ScaleGranularity.PER_TENSOR,
                "an fp8 latent cache takes one per-tensor scale (one KV head)",
                "kv_cache.scale",
            ),
            (
                kv is not DType.NVFP4 or arch is not Arch.SM80,
                "the NVFP4 latent is lowered for sm90 and sm100 (its e4m3 block scales are "
                "read through fp8e4nv pointers)",
            ),
            (
                dims == DIMS,
                f"latent/rope/nope/v dims {dims} are not lowered (DeepSeek's {DIMS} are)",
                "mla." + first_off(DIM_NAMES, dims, DIMS),
            ),
            (
                shape.num_heads <= MAX_HEADS,
                f"num_heads {shape.num_heads} > {MAX_HEADS}",
                "mla.num_heads",
            ),
            (
                topk <= 1 or variant.page_size == 1,
                "MLA draft trees (topk > 1) are lowered at page size 1 only",
                "kv_cache.page_size",
            ),
            (
                variant.mask.kind is (MaskKind.CUSTOM if topk > 1 else MaskKind.CAUSAL),
                "MLA takes a causal mask, or a custom one for draft trees (topk > 1)",
                "mask.kind",
            ),
        ]
    )
