"""What the Triton DSA lowering covers: the lightning indexer (fp8, paged and ragged) with
top-k selection, and sparse absorbed MLA over the selected slots for decode, extend and
draft-chain verify (topk 1), over a bf16/fp16 latent cache or DeepSeek-V3.2's 656-byte fp8
rows; DeepSeek's dims (latent 512 + rope 64, indexer 64 x 128), 64-token pages, up to 128
heads; on sm90 and sm100."""

from __future__ import annotations

from attngen.families.dsa.spec import PAGE_SIZE, DsaShape
from attngen.spec.enums import Arch, DType, MaskKind, Phase, ScaleGranularity
from attngen.spec.variant import Variant
from attngen.verdict import Verdict, first_failure, first_off, phases_and_dtype

PHASES = frozenset({Phase.DECODE, Phase.EXTEND, Phase.VERIFY})
DTYPES = frozenset({DType.BF16, DType.FP16})
# The kernels' tiles are these dims (tl.arange extents; the latent is four 128-wide
# chunks, one fp8 scale each), measured spill-free at them.
LATENT_DIMS = (512, 64)  # kv_lora_rank, qk_rope_head_dim
INDEX_DIMS = (64, 128)  # index_heads, index_head_dim
# The mla section's per-head nope / v dims: the sparse kernels run absorbed over the latent
# in every phase and never read them, so only DeepSeek's are generated (any other value
# would give the same package, silently).
HEAD_DIMS = (128, 128)  # qk_nope_head_dim, v_head_dim
MAX_HEADS = 128
# Archs whose tiles were measured and whose kernels are compile-checked. sm80 cannot run the
# fp8 indexer (the family's hardware limit); the bf16 / fp16 / fp32 indexers and the 16-bit
# latent need no fp8, but no sm80 plan is lowered or compile-checked yet (a one-off probe,
# Triton 3.6, built the sm90/sm100 Triton tiles for sm_80 spill-free, the 64-head sparse
# kernel at 255 registers: a spec targeting sm80 and its compile evidence are what is missing).
ARCHS = (Arch.SM90, Arch.SM100)


def supports(variant: Variant, arch: Arch) -> Verdict:
    shape = variant.shape
    assert isinstance(shape, DsaShape)
    kv = variant.kv_dtype
    kv_name = kv.value if kv is not None else "no"
    latent = (shape.mla.kv_lora_rank, shape.mla.qk_rope_head_dim)
    index = (shape.index_heads, shape.index_head_dim)
    heads = (shape.mla.qk_nope_head_dim, shape.mla.v_head_dim)
    return first_failure(
        [
            (
                arch in ARCHS,
                f"dsa.index_dtype {shape.index_dtype.value} needs no fp8, but DSA is not "
                f"lowered for {arch.value} yet (its Triton kernels are tiled and "
                f"compile-checked for {' and '.join(a.value for a in ARCHS)} only)",
            ),
            *phases_and_dtype(variant, PHASES, DTYPES),
            (
                kv in (variant.dtype, DType.FP8_E4M3),
                f"{kv_name} latent cache is not lowered (the activations' dtype or the "
                "656-byte fp8 rows are)",
                "kv_cache.dtype",
            ),
            (
                kv is not DType.FP8_E4M3 or variant.kv_scale is ScaleGranularity.PER_BLOCK,
                "DSA's fp8 latent carries one scale per 128 values (kv_cache.scale: per_block)",
                "kv_cache.scale",
            ),
            (
                variant.page_size == PAGE_SIZE,
                f"DSA's caches come in {PAGE_SIZE}-token pages",
                "kv_cache.page_size",
            ),
            (
                latent == LATENT_DIMS,
                f"latent/rope dims {latent} are not lowered ({LATENT_DIMS} are)",
                "mla." + first_off(("kv_lora_rank", "qk_rope_head_dim"), latent, LATENT_DIMS),
            ),
            (
                heads == HEAD_DIMS,
                f"nope/v head dims {heads} are not lowered (DeepSeek's {HEAD_DIMS} are; the "
                "sparse kernels run absorbed over the latent and never read them)",
                "mla." + first_off(("qk_nope_head_dim", "v_head_dim"), heads, HEAD_DIMS),
            ),
            (
                index == INDEX_DIMS,
                f"indexer dims {index} are not lowered ({INDEX_DIMS} are)",
                "dsa." + first_off(("index_heads", "index_head_dim"), index, INDEX_DIMS),
            ),
            (
                shape.mla.num_heads <= MAX_HEADS,
                f"num_heads {shape.mla.num_heads} > {MAX_HEADS}",
                "mla.num_heads",
            ),
            (
                (variant.spec_topk or 0) <= 1,
                "DSA verifies draft chains (topk 1) only",
                "speculative.topk",
            ),
            (
                variant.mask.kind is MaskKind.CAUSAL,
                "DSA's indexer is causal by position",
                "mask.kind",
            ),
        ]
    )
