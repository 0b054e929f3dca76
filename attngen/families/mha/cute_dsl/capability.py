"""What the CuTe DSL MHA lowering covers: prefill and extend (and, through the extend kernel,
speculative verify of draft chains and draft extend; verify of draft trees through its
specialization that reads each request's bit-packed tree mask), split-KV paged decode (the forward
kernel's pipeline on tiles of a GQA group's heads, then a combine), on sm90 with the
Hopper forward kernel (TMA + wgmma, warp-specialized; GPU-verified) and on sm100 with the
Blackwell one (TMA + tcgen05 + tensor memory; compile-only so far); bf16/fp16 activations
and a cache of the same dtype, or (decode, pages of 16 .. 128 tokens, GQA groups up to 32 on
sm90 and 64 on sm100) an fp8 e4m3 cache with per-tensor scales; head dims 64 and 128,
192 / 128 and 256 (sm90: pages up to 64 tokens), decode 64 and 128 only; causal,
bidirectional and sliding-window masks, logit softcap and attention sinks; any GQA group
(decode: up to 64, one tile); extend and decode over pages of 16, 32, 64 or 128 tokens
(read by TMA, one copy per page) and of 1, 2, 4 or 8 tokens (K/V rows gathered with
cp.async). Everything else is "not lowered" with the reason."""

from __future__ import annotations

from attngen.spec.enums import Arch, DType, MaskKind, Phase, ScaleGranularity
from attngen.families.mha.cute_dsl.tiles import FP8_DECODE_MAX_GROUP, sm90_tile_n
from attngen.families.mha.spec import MhaShape, draft_tree_rules
from attngen.spec.variant import Variant
from attngen.verdict import Verdict, first_failure

ARCHS = frozenset({Arch.SM90, Arch.SM100})
PHASES = frozenset({Phase.PREFILL, Phase.EXTEND, Phase.VERIFY, Phase.DRAFT_EXTEND, Phase.DECODE})
# phases that read the paged cache: the extend kernel (verify of a draft chain is an extend
# of num_draft_tokens causal rows per request, draft extend one of 1 .. num_draft_tokens)
# and split-KV decode, which loads K/V as extend does
PAGED_PHASES = frozenset({Phase.EXTEND, Phase.VERIFY, Phase.DRAFT_EXTEND, Phase.DECODE})
DECODE_ARCHS = frozenset({Arch.SM90, Arch.SM100})  # sm100: compile-only, as its forward
MAX_DECODE_GROUP = 64  # decode packs the group's query heads into one tile (sm90: 64 rows)
# the e4m3 Q K^T MMAs (q's two parts) and V converted to fp16 in shared memory: sm90 puts a
# head's two parts in two rows of its 64-row tile (32 heads at most), sm100 runs two
# accumulating MMAs on the parts (a head a row: the whole decode tile)
FP8_DECODE_GROUPS = {Arch.SM90: FP8_DECODE_MAX_GROUP, Arch.SM100: MAX_DECODE_GROUP}
FP8_DECODE_ARCHS = frozenset(FP8_DECODE_GROUPS)
# an fp8 e4m3 cache with per-tensor scales: decode reads whole pages by TMA (16 .. 128
# tokens), runs Q K^T on e4m3 MMAs (each query head's q as two e4m3 parts) and converts V in
# shared memory; extend does not read fp8 yet
FP8_KV = DType.FP8_E4M3
FP8_PHASES = frozenset({Phase.DECODE})
# (qk, v) head dims of prefill / extend / verify / draft extend per arch: 256 on sm90 with
# 64-key tiles (Q 64 KiB + two K/V stages of 64 KiB fit; 128-key tiles do not), and on
# sm100 (S's 64 + O's 256 fp32 columns: all 512 of the SM's tensor memory); 192 / 128 (MLA
# prefill on decompressed K/V) on both. Decode: 64 and 128 only.
HEAD_DIMS = {
    Arch.SM90: frozenset({(64, 64), (128, 128), (256, 256), (192, 128)}),
    Arch.SM100: frozenset({(64, 64), (128, 128), (256, 256), (192, 128)}),
}
DECODE_HEAD_DIMS = frozenset({(64, 64), (128, 128)})
DTYPES = frozenset({DType.BF16, DType.FP16})
MASKS = frozenset({MaskKind.CAUSAL, MaskKind.NONE, MaskKind.SLIDING_WINDOW, MaskKind.CUSTOM})
# extend: TMA reads K/V one box per page: pages of 16 / 32 / 64 tokens fill a 128-key (sm90)
# tile with one copy each, a page of 128 tokens is the sm90 tile (tiles.sm90_paged_tile_n);
# sm100: 64-key tiles, one or two per page, or filled by 16 / 32-token pages. Smaller
# pages: K/V rows gathered with cp.async (sm90: the producer warpgroup; sm100: the load warp).
TMA_PAGE_SIZES = frozenset({16, 32, 64, 128})
GATHER_PAGE_SIZES = frozenset({1, 2, 4, 8})
EXTEND_PAGE_SIZES = {arch: TMA_PAGE_SIZES | GATHER_PAGE_SIZES for arch in ARCHS}
# sm90 reads a page of 128 tokens as one key tile: where a 128-key tile of the head dims
# does not fit shared memory (lower.sm90_tile_n: 64 keys), 128-token pages are not lowered
WIDE_TILE_PAGE_SIZES = (TMA_PAGE_SIZES - {128}) | GATHER_PAGE_SIZES


def _dims(pairs) -> str:
    return ", ".join(f"{d}/{dv}" for d, dv in sorted(pairs))


def supports(variant: Variant, arch: Arch) -> Verdict:
    shape = variant.shape
    assert isinstance(shape, MhaShape)
    extra_phases = set(variant.phases) - PHASES
    kv_name = variant.kv_dtype.value if variant.kv_dtype is not None else "no"
    kind = variant.mask.kind
    dims = (shape.head_dim, shape.v_head_dim)
    return first_failure(
        [
            (arch in ARCHS, f"no CuTe DSL MHA kernels for {arch.value}"),
            (
                not extra_phases,
                f"phase {', '.join(sorted(p.value for p in extra_phases))} is not lowered in "
                "CuTe DSL yet",
                "phases",
            ),
            (
                Phase.DECODE not in variant.phases or arch in DECODE_ARCHS,
                f"decode is not lowered in CuTe DSL on {arch.value} yet (split-KV decode: "
                f"{', '.join(sorted(a.value for a in DECODE_ARCHS))})",
                "phases",
            ),
            (
                Phase.DECODE not in variant.phases or shape.gqa_group <= MAX_DECODE_GROUP,
                f"decode packs a GQA group into one {MAX_DECODE_GROUP}-row tile: group "
                f"{shape.gqa_group} is not lowered",
                "heads.gqa_group",
            ),
            (
                variant.dtype in DTYPES,
                f"activation dtype {variant.dtype.value} is not lowered",
                "dtype",
            ),
            (
                variant.kv_dtype is variant.dtype or variant.kv_dtype is FP8_KV,
                f"{kv_name} KV cache is not lowered in CuTe DSL yet (the activation dtype; "
                "fp8_e4m3 for decode)",
                "kv_cache.dtype",
            ),
            (
                variant.kv_dtype is not FP8_KV
                or (
                    set(variant.phases) <= FP8_PHASES
                    and arch in FP8_DECODE_ARCHS
                    and variant.kv_scale is ScaleGranularity.PER_TENSOR
                    and variant.page_size in TMA_PAGE_SIZES
                ),
                f"fp8_e4m3 KV cache in CuTe DSL: decode only, on "
                f"{', '.join(sorted(a.value for a in FP8_DECODE_ARCHS))}, per-tensor scales, pages "
                f"of {sorted(TMA_PAGE_SIZES)} tokens (got {', '.join(p.value for p in variant.phases)}"
                f" on {arch.value}, {variant.kv_scale.value if variant.kv_scale else 'no'} scales, "
                f"page {variant.page_size})",
                "kv_cache.dtype",
            ),
            (
                variant.kv_dtype is not FP8_KV or shape.gqa_group <= FP8_DECODE_GROUPS.get(arch, 0),
                f"fp8_e4m3 KV cache in CuTe DSL on {arch.value}: GQA groups up to "
                f"{FP8_DECODE_GROUPS.get(arch, 0)} (sm90 puts each query head's two e4m3 parts "
                f"in two rows of its 64-row tile; got {shape.gqa_group})",
                "heads.gqa_group",
            ),
            (kind in MASKS, f"mask {kind.value} is not lowered in CuTe DSL yet", "mask.kind"),
            *draft_tree_rules(variant),
            (
                dims in HEAD_DIMS.get(arch, ()),
                f"head dims {shape.head_dim}/{shape.v_head_dim} are not lowered in CuTe DSL on "
                f"{arch.value} (qk/v: {_dims(HEAD_DIMS.get(arch, ()))})",
                "heads.head_dim",
            ),
            (
                Phase.DECODE not in variant.phases or dims in DECODE_HEAD_DIMS,
                f"decode with head dims {shape.head_dim}/{shape.v_head_dim} is not lowered in "
                f"CuTe DSL (decode: {_dims(DECODE_HEAD_DIMS)})",
                "heads.head_dim",
            ),
            (
                not (PAGED_PHASES & set(variant.phases))
                or arch is not Arch.SM90
                or sm90_tile_n(shape.head_dim, shape.v_head_dim) == 128
                or variant.page_size in WIDE_TILE_PAGE_SIZES,
                f"page size {variant.page_size} with head dims {shape.head_dim}/"
                f"{shape.v_head_dim} is not lowered in CuTe DSL on sm90: a 128-token page is one "
                "key tile there, and 128 keys of these head dims do not fit shared memory "
                f"(pages of {sorted(WIDE_TILE_PAGE_SIZES)} tokens are)",
                "kv_cache.page_size",
            ),
            (
                not PAGED_PHASES & set(variant.phases)
                or variant.page_size in EXTEND_PAGE_SIZES.get(arch, ()),
                f"page size {variant.page_size} is not lowered in CuTe DSL on {arch.value} yet: "
                f"extend reads K/V through TMA, one copy per page (pages of "
                f"{sorted(TMA_PAGE_SIZES)} tokens); smaller pages are gathered with cp.async "
                f"(pages of {sorted(GATHER_PAGE_SIZES)} tokens)",
                "kv_cache.page_size",
            ),
        ]
    )
