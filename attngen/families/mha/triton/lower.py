"""Lowering of MHA variants to Triton plans: tile heuristics per head dim and arch, the
decode capture's static buffers, and the module plan.

The numbers are starting points measured to compile without register spills on sm_90a
and sm_100a (see evidence/compile/); a spec's ``tuning`` section overrides them per arch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from attngen.families.mha.key import MhaKey
from attngen.families.mha.triton.config import MhaTraits, MhaTritonConfig
from attngen.library_lowering import plan_module
from attngen.ir import GraphBuffer, ModulePlan
from attngen.spec.enums import Arch, Backend, DType
from attngen.spec.model import Spec
from attngen.families.mha.spec import MhaShape
from attngen.spec.variant import Variant

SEQ_LEN_FILL_VALUE = 1  # padded rows of a replayed decode batch read one (valid) token
RUNTIME_CLASS = "attngen.families.mha.runtime:PagedMhaBackend"


@dataclass(frozen=True)
class MhaTritonPlan(ModulePlan):
    """A Triton MHA module: the neutral plan plus the arch's pointer quirk."""

    fp4_scales_as_bytes: bool = False  # sm80: no fp8e4nv pointers, NVFP4 scales as bytes


MAX_SPLITS = 16  # decode KV splits per request: enough to fill 132 SMs at batch 1 x 8 kv heads


def next_power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()


# (BLOCK_N, num_warps, num_stages) of the decode split kernel, by head dim; the same on every
# arch (checked spill-free on sm_80, sm_90a and sm_100a). Three stages keep page-1 gathers
# in flight (3.7 vs 3.2 TB/s on H200 at head_dim 128).
DECODE_TILES = {64: (128, 4, 2), 128: (64, 4, 3), 256: (32, 4, 3)}

# (BLOCK_M, BLOCK_N, num_warps, num_stages) of the extend kernel, by arch and head dim: the
# largest tiles that compile without spills (sm80's 8-warp 128x64 at d128 spills, sm100's
# register allocator caps some kernels near 128 or 168 registers: its d256 tile runs 4
# warps, its d64 tile 8 warps, which keeps the windowed + sinks variant at 102 registers).
EXTEND_TILES = {
    Arch.SM80: {64: (128, 64, 8, 2), 128: (128, 32, 8, 2), 256: (64, 32, 8, 2)},
    Arch.SM90: {64: (128, 64, 8, 3), 128: (64, 64, 4, 2), 256: (128, 32, 8, 2)},
    Arch.SM100: {64: (64, 64, 8, 2), 128: (128, 64, 8, 2), 256: (64, 32, 4, 2)},
}


# Quantized caches are decoded into registers next to the tile: their extend tiles hold at
# most 64 query rows x 32 keys (sm100: 16 keys) on 8 warps (measured spill-free on sm_80,
# sm_90a and sm_100a where the bf16 tiles spilled; sm_100a caps 8-warp 64-row tiles at 80
# registers: NVFP4 at page size 1 spilled there with 32 keys, and 128-row tiles spilled too). NVFP4 decode reads 32 keys per step (H200, B64 ctx4k d128:
# 0.60 ms at 32, 0.65 at 64, 0.69 at 128; sm80, whose scales are decoded from raw bytes,
# spilled at 64).
QUANT_EXTEND_MAX = {  # (BLOCK_M, BLOCK_N, num_warps)
    Arch.SM80: (64, 32, 8),
    Arch.SM90: (64, 32, 8),
    Arch.SM100: (64, 16, 8),
}
FP4_DECODE_BLOCK_N = 32


def tile_dim(shape: MhaShape) -> int:
    """The head dim the tile tables are keyed by: the wider of qk and v, padded to 2^k (at
    least 64: narrower heads take the 64 tiles, with fewer registers a row)."""
    return max(64, next_power_of_two(max(shape.head_dim, shape.v_head_dim)))


def decode_tiles(head_dim: int, gqa_group: int, arch: Arch, kv_dtype: DType) -> dict[str, int]:
    """Split-KV decode: one program per (request, kv head, split)."""
    block_n, warps, stages = DECODE_TILES[head_dim]
    if kv_dtype is DType.NVFP4:
        block_n = min(block_n, FP4_DECODE_BLOCK_N)
    return {
        "decode_block_n": block_n,
        "decode_block_h": max(16, next_power_of_two(gqa_group)),
        "decode_num_warps": warps,
        "decode_num_stages": stages,
        "max_splits": MAX_SPLITS,
        "combine_num_warps": 4,
    }


def extend_tiles(head_dim: int, arch: Arch, quantized: bool) -> dict[str, int]:
    """Extend: one program per (block of new tokens, q head, request)."""
    block_m, block_n, warps, stages = EXTEND_TILES[arch][head_dim]
    if quantized:
        max_m, max_n, warps = QUANT_EXTEND_MAX[arch]
        block_m, block_n = min(block_m, max_m), min(block_n, max_n)
    return {
        "extend_block_m": block_m,
        "extend_block_n": block_n,
        "extend_num_warps": warps,
        "extend_num_stages": stages,
    }


def verify_tiles(num_draft_tokens: int, gqa_group: int, extend_block_n: int) -> dict[str, int]:
    """Verify packs (draft, group head) pairs into the rows: 16 .. 64 of them per program;
    64-row tiles (trees of 8 drafts x 8 heads) run 8 warps over 32 keys (4 warps spilled on
    sm_80 and sm_100a)."""
    if num_draft_tokens == 0:
        return {"verify_block_m": 0, "verify_block_n": 0, "verify_num_warps": 0}
    block_m = min(64, max(16, next_power_of_two(num_draft_tokens * gqa_group)))
    wide = block_m > 32
    return {
        "verify_block_m": block_m,
        "verify_block_n": min(extend_block_n, 32 if wide else 64),
        "verify_num_warps": 8 if wide else 4,
    }


def kernel_config(
    variant: Variant, arch: Arch, overrides: dict[str, int] | None = None
) -> MhaTritonConfig:
    """The variant's config on ``arch``: identity, heuristic tiles, then the spec's tuning."""
    shape = variant.shape
    assert isinstance(shape, MhaShape)
    key = MhaKey.of_variant(variant)
    quantized = variant.kv_dtype is not variant.dtype
    config = MhaTritonConfig(
        uri=variant.uri,
        **dataclasses.asdict(key),
        num_draft_tokens=variant.num_draft_tokens,
        **decode_tiles(tile_dim(shape), shape.gqa_group, arch, variant.kv_dtype),
        **extend_tiles(tile_dim(shape), arch, quantized),
    )
    verify = verify_tiles(variant.num_draft_tokens, shape.gqa_group, config.extend_block_n)
    return dataclasses.replace(config, **{**verify, **(overrides or {})})


def decode_graph_buffers(fill: int) -> tuple[GraphBuffer, ...]:
    """Static buffers of a decode capture: split-KV decode's metadata and its workspace."""
    return (
        GraphBuffer(
            "page_table", "int32", ("max_bs", "max_pages"), 0, "physical page of each logical page"
        ),
        GraphBuffer(
            "seq_lens", "int32", ("max_bs",), fill, "cached tokens per request (padded rows: fill)"
        ),
        GraphBuffer(
            "num_splits", "int32", ("max_bs",), 1, "KV splits per request, chosen on device"
        ),
        GraphBuffer(
            "partial_o",
            "float32",
            ("max_bs", "num_q_heads", "max_splits", "v_head_dim"),
            0,
            "split outputs",
        ),
        GraphBuffer(
            "partial_lse",
            "float32",
            ("max_bs", "num_q_heads", "max_splits"),
            0,
            "split log-sum-exps",
        ),
    )


def lower(spec: Spec, variants: tuple[Variant, ...], arch: Arch) -> MhaTritonPlan:
    """The plan of one spec's supported variants on ``arch`` (checked by the caller)."""
    plan = plan_module(
        spec,
        variants,
        arch,
        Backend.TRITON,
        kernel_config=kernel_config,
        seq_len_fill=SEQ_LEN_FILL_VALUE,
        graph_buffers=decode_graph_buffers(SEQ_LEN_FILL_VALUE),
        runtime_class=RUNTIME_CLASS,
        plan_type=MhaTritonPlan,
        fp4_scales_as_bytes=arch is Arch.SM80,
    )
    assert isinstance(plan, MhaTritonPlan)
    return plan


def traits(plan: ModulePlan) -> MhaTraits:
    """The TRAITS the plan's generated kernels.py binds (the binding template spells the
    same values as literals)."""
    assert isinstance(plan, MhaTritonPlan)
    phases = tuple(p.value for p in plan.spec.phases)
    return MhaTraits(plan.hooks, phases, fp4_scales_as_bytes=plan.fp4_scales_as_bytes)
