"""Lowering of MLA variants to Triton plans: tiles per head count, latent dtype and arch,
the decode capture's static buffers, and the module plan.

The tiles were measured spill-free with Triton 3.6 (AOT, registers from ptxas) on sm_80,
sm_90a and sm_100a; a spec's ``tuning`` section overrides them per arch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from attngen.families.mla.key import MlaKey
from attngen.families.mla.triton.config import MlaTraits, MlaTritonConfig
from attngen.library_lowering import plan_module
from attngen.ir import GraphBuffer, ModulePlan
from attngen.spec.enums import KV_DTYPE_NAME, TORCH_DTYPE_NAME, Arch, Backend, DType
from attngen.spec.model import Spec
from attngen.families.mla.spec import MlaShape
from attngen.spec.variant import Variant

SEQ_LEN_FILL_VALUE = 1  # padded rows of a replayed decode batch read one (valid) latent row
RUNTIME_CLASS = "attngen.families.mla.runtime:PagedMlaBackend"
# KV splits per row: at most this many (the partials cost rows x H x MAX_SPLITS x 2 KiB of
# fp32 workspace); how many a batch gets follows the tile's `waves` (below).
MAX_SPLITS = 8


@dataclass(frozen=True)
class AbsorbedTile:
    """One absorbed tile: BLOCK_H query heads x BLOCK_N latent rows, warps, stages, latent
    column parts, keys-major products, value reload, and the KV-split target: a batch of P
    programs per split gets up to max(1, waves x SMs // P) splits."""

    block_h: int
    block_n: int
    warps: int
    stages: int
    parts: int = 1
    keys_major: int = 0
    value_reload: int = 0
    waves: int = 4
    # 1: an sm90 Gluon kernel: head-major (kernels/absorbed_wg.py, 16-bit or fp8 caches)
    # or, with keys_major, kernels/absorbed_keys_wg.py (16 or 32 heads, 16-bit caches) or
    # kernels/absorbed_keys_fp8.py (16 heads, fp8 caches)
    gluon: int = 0
    max_regs: int = 0  # the Gluon kernel's register cap (0: ptxas's choice)


# Absorbed tiles by the padded head count. The accumulator is BLOCK_H x 512 fp32 (128
# registers a thread at 64 heads on 8 warps); q stays in shared memory. Measured on the
# H200, page 64, B64 ctx4096 and B128 ctx8192 (bench/mla.py --sweep; bench/README.md):
# - 64 heads x 64 rows, 8 warps: 0.310 / 1.28 ms at h_q 128 (255 registers, 221 KB shared
#   memory: sm_90a only); every 2-part, keys-major and 128-head tile measured slower. The
#   tile is compute-bound with one program per SM: splits past one wave (5 at B64 with
#   4 waves) cost 16% (0.359 ms), so it targets one wave;
# - 16 heads x 32 rows, 4 warps: 2.98 / 3.54 TB/s at h_q 16 with 8 splits (vs 2.77 TB/s
#   with 5 at B128): several programs share an SM, so it targets 8 waves;
# - fp8 latent (upcast to fp16 in registers): reloading the value tile lets Triton pipeline
#   both loads (one consumer each): 16 x 64 on 4 warps 0.110 ms at h_q 16 B64 vs 0.160
#   without; at h_q 128, 64 heads in two column parts 0.869 ms vs 0.926 for 32 x 32.
ABSORBED_TILES = {
    16: AbsorbedTile(16, 32, 4, 2, waves=8),
    32: AbsorbedTile(32, 64, 8, 2),
    64: AbsorbedTile(64, 32, 8, 2),
}
SM90_WIDE_TILE = AbsorbedTile(64, 64, 8, 2, waves=1, gluon=1)
# Few heads on sm90 (16-bit latents): the keys-major Gluon kernel (64 latent rows as the
# MMA's M; one program an SM at 168-189 KB of shared memory, hence 2 waves of splits). On
# the H200 (bench/mla.py --sweep, CUDA-graph timing): 16 heads 0.083 / 0.301-0.310 ms at
# B64 ctx4096 / B128 ctx8192 (0.94-1.02x FlashMLA) against 0.094 / 0.336 for 16 x 32 on 4
# warps; 32 heads 0.095-0.100 / 0.356 ms against 0.158 / 0.580 for 32 x 64 on 8 warps.
SM90_KEYS_TILES = {
    16: AbsorbedTile(16, 64, 8, 2, keys_major=1, waves=2, gluon=1),
    32: AbsorbedTile(32, 64, 8, 2, keys_major=1, waves=2, gluon=1),
}
# fp8 latents, 16 heads, sm90: kernels/absorbed_keys_fp8.py (keys-major; fp8 tiles gathered
# 2 deep, the score on fp16 MMAs and the value product on fp8 MMAs, both latent operands
# built in registers; 4 warps, 235 registers and 94 KB of shared memory, so two programs
# share an SM: 2 waves of splits). On the H200 (bench/mla.py, CUDA-graph timing, 6499453):
# 0.075 / 0.253 ms at B64 ctx4096 / B128 ctx8192 against 0.088 / 0.305 for the bf16 cache;
# before it, 0.087 / 0.300 for the previous fp8 kernel (the tile widened into one fp16
# operand tile), and, in the prototype's runs, 0.10 / 0.36 at 3-4 stages (one program an SM).
SM90_FP8_KEYS_TILE = AbsorbedTile(16, 64, 4, 2, keys_major=1, waves=2, gluon=1)
# sm_80 (mma.sync keeps q in registers): 64 x 32 spilled 48 B there; unmeasured on a GPU.
SM80_64_ROW_TILE = AbsorbedTile(32, 32, 8, 2)
FP8_ABSORBED_TILES = {
    16: AbsorbedTile(16, 64, 4, 2, value_reload=1, waves=8),
    32: AbsorbedTile(32, 32, 8, 2, value_reload=1),
    64: AbsorbedTile(64, 32, 8, 2, parts=2, waves=1),
}
# NVFP4 latent (decoded in registers like MHA's NVFP4 K/V; not timed on a GPU yet):
# spill-free on sm_90a and sm_100a (32 x 32 spilled 56 B once the column helper came in).
FP4_ABSORBED_TILES = {
    16: AbsorbedTile(16, 32, 8, 2),
    32: AbsorbedTile(32, 16, 8, 2),
    64: AbsorbedTile(64, 32, 8, 2, parts=2),
}
# Ragged 192/128 tiles (BLOCK_M, BLOCK_N, warps, stages) by arch. On the H200 (causal 4 x 4096,
# 128 heads, bench/mla.py --prefill-tiles, bench/README.md): 128 x 64 on 8 warps with 3
# stages 7.61 ms (0.62x FA4) against 9.56 with 2 stages, 8.19 for 128 x 128 and 11.7-15.1 for
# 64-row tiles; 195 registers on sm_90a, 183 on sm_100a (there untimed). It spills 8 bytes on
# sm_80, which runs 64 x 64 on 8 warps (180 registers, no spill; on 4 warps the unmasked and
# masked loops spill 8 bytes); untimed.
RAGGED_TILES = {
    Arch.SM80: (64, 64, 8, 2),
    Arch.SM90: (128, 64, 8, 3),
    Arch.SM100: (128, 64, 8, 3),
}


def next_power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()


def absorbed_tiles(num_heads: int, kv_dtype: DType, arch: Arch, tree: bool) -> dict[str, int]:
    rows = min(64, max(16, next_power_of_two(num_heads)))
    sm90_gluon = arch is Arch.SM90 and not tree  # the tree mask spilled 8 B in it
    if sm90_gluon and rows == 64 and kv_dtype is not DType.NVFP4:  # 16-bit or fp8
        tile = SM90_WIDE_TILE
    elif sm90_gluon and rows in SM90_KEYS_TILES and kv_dtype not in (DType.FP8_E4M3, DType.NVFP4):
        tile = SM90_KEYS_TILES[rows]
    elif sm90_gluon and rows == 16 and kv_dtype is DType.FP8_E4M3:
        tile = SM90_FP8_KEYS_TILE
    elif kv_dtype is DType.NVFP4:
        tile = FP4_ABSORBED_TILES[rows]
    elif kv_dtype is DType.FP8_E4M3:
        tile = FP8_ABSORBED_TILES[rows]
    elif rows == 64 and arch is Arch.SM80:
        tile = SM80_64_ROW_TILE
    else:
        tile = ABSORBED_TILES[rows]
    return {
        "decode_block_h": tile.block_h,
        "decode_block_n": tile.block_n,
        "decode_num_warps": tile.warps,
        "decode_num_stages": tile.stages,
        "decode_lora_parts": tile.parts,
        "decode_keys_major": tile.keys_major,
        "decode_value_reload": tile.value_reload,
        "decode_waves": tile.waves,
        "decode_gluon": tile.gluon,
        "decode_max_registers": tile.max_regs,
        "max_splits": MAX_SPLITS,
        "combine_num_warps": 4,
    }


def ragged_tiles(arch: Arch) -> dict[str, int]:
    block_m, block_n, warps, stages = RAGGED_TILES[arch]
    return {
        "ragged_block_m": block_m,
        "ragged_block_n": block_n,
        "ragged_num_warps": warps,
        "ragged_num_stages": stages,
    }


def kernel_config(
    variant: Variant, arch: Arch, overrides: dict[str, int] | None = None
) -> MlaTritonConfig:
    shape = variant.shape
    assert isinstance(shape, MlaShape)
    assert variant.kv_dtype is not None and variant.page_size is not None
    key = MlaKey(
        num_heads=shape.num_heads,
        kv_lora_rank=shape.kv_lora_rank,
        qk_rope_head_dim=shape.qk_rope_head_dim,
        qk_nope_head_dim=shape.qk_nope_head_dim,
        v_head_dim=shape.v_head_dim,
        page_size=variant.page_size,
        dtype=TORCH_DTYPE_NAME[variant.dtype],
        kv_dtype=KV_DTYPE_NAME[variant.kv_dtype],
        spec_topk=variant.spec_topk or 0,
    )
    config = MlaTritonConfig(
        uri=variant.uri,
        **dataclasses.asdict(key),
        num_draft_tokens=variant.num_draft_tokens,
        **absorbed_tiles(shape.num_heads, variant.kv_dtype, arch, (variant.spec_topk or 0) > 1),
        **ragged_tiles(arch),
    )
    return dataclasses.replace(config, **(overrides or {}))


def decode_graph_buffers(fill: int) -> tuple[GraphBuffer, ...]:
    """Static buffers of a decode capture: metadata and the split partials."""
    return (
        GraphBuffer(
            "page_table", "int32", ("max_bs", "max_pages"), 0, "physical page of each page"
        ),
        GraphBuffer(
            "seq_lens", "int32", ("max_bs",), fill, "latent rows per request (padded: fill)"
        ),
        GraphBuffer("num_splits", "int32", ("max_bs",), 1, "KV splits per request, on device"),
        GraphBuffer(
            "partial_o",
            "float32",
            ("max_bs", "num_q_heads", "max_splits", "kv_lora_rank"),
            0,
            "split outputs",
        ),
        GraphBuffer(
            "partial_lse", "float32", ("max_bs", "num_q_heads", "max_splits"), 0, "split LSEs"
        ),
    )


def lower(spec: Spec, variants: tuple[Variant, ...], arch: Arch) -> ModulePlan:
    return plan_module(
        spec,
        variants,
        arch,
        Backend.TRITON,
        kernel_config=kernel_config,
        seq_len_fill=SEQ_LEN_FILL_VALUE,
        graph_buffers=decode_graph_buffers(SEQ_LEN_FILL_VALUE),
        runtime_class=RUNTIME_CLASS,
    )


def traits(plan: ModulePlan) -> MlaTraits:
    """The TRAITS the plan's generated kernels.py binds."""
    return MlaTraits(tuple(p.value for p in plan.spec.phases))
