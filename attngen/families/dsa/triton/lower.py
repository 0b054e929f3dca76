"""Lowering of DSA variants to Triton plans: tiles per head count and latent layout, the
decode capture's static buffers, and the module plan.

Tiles were checked spill-free with Triton 3.6 (AOT, registers from ptxas) on sm_90a and
sm_100a; a spec's ``tuning`` section overrides them per arch.
"""

from __future__ import annotations

import dataclasses

from attngen.families.dsa.spec import DsaShape
from attngen.families.dsa.triton.config import DsaKey, DsaTraits, DsaTritonConfig
from attngen.library_lowering import plan_module
from attngen.ir import GraphBuffer, ModulePlan
from attngen.spec.enums import KV_DTYPE_NAME, TORCH_DTYPE_NAME, Arch, Backend, DType
from attngen.spec.model import Spec
from attngen.spec.variant import Variant

SEQ_LEN_FILL_VALUE = 1  # padded rows of a replayed batch see one (valid) key
RUNTIME_CLASS = "attngen.families.dsa.runtime:DsaBackend"
MAX_SPLITS = 8  # top-k splits per row when rows x head blocks leave SMs idle

# Sparse MLA tiles (BLOCK_H heads, BLOCK_N slots, warps, stages) by the padded head count:
# four fp32 accumulators of BLOCK_H x 128, every slot tile a gather of 1152-byte (bf16) or
# 656-byte (fp8) rows. Spill-free on sm_90a and sm_100a (Triton 3.6, ptxas): bf16 64 x 32
# (223 registers on sm_90a; ran 160 TFLOP/s at h_q 128 on the H200 vs 98 for 64 x 16),
# 16 x 32 (128); the fp8 rows (e4m3 -> fp16 in registers, a scale per chunk) spill at
# 64 x 32 (544 bytes) and run 64 x 16; 16 x 32 (194).
SPARSE_TILES = {16: (16, 32, 8, 2), 32: (32, 32, 8, 2), 64: (64, 32, 8, 2)}
FP8_SPARSE_TILES = {16: (16, 32, 8, 2), 32: (32, 16, 8, 2), 64: (64, 16, 8, 2)}
# sm90, 64 heads and more: the Gluon kernels, 64 heads x 64 slots on two warpgroups that
# split the score by slots and the output by columns (MLA's absorbed_wg.py split). 16-bit
# rows: kernels/sparse_wg.py, 198 registers on sm_90a, no spill; on the H200 (bench/dsa.py,
# a87ce0b) sparse prefill 0.62x FlashMLA (Triton 0.32x), bf16 decode 266-314 TFLOP/s at
# h_q 128 (Triton 136). The 656-byte fp8 rows (bf16 activations): kernels/sparse_fp8_wg.py,
# e4m3 widened exactly to fp16, each chunk's scale applied per slot after its score product
# and on P for its value product (a first version that rounded e4m3 * scale to fp16 moved
# the LSE past its 1e-3 bound).
SM90_GLUON_TILE = (64, 64, 8, 1)
# Indexer: one 64-key page per tensor-core tile (64 heads x 128 fp8, bf16 or fp16), 1024
# keys a program. fp32 scores are IEEE FMA products (no tensor cores), their operand tiles
# held in registers: 64-key tiles spilled 30 KB on sm_90a (Triton 3.6); 32 keys on 8 warps
# take 62 registers, no spill.
INDEXER = dict(indexer_block_n=64, indexer_block_s=1024, indexer_num_warps=4)
INDEXER_FP32 = dict(indexer_block_n=32, indexer_block_s=1024, indexer_num_warps=8)
# Top-k: 2048 scores per pass step on 8 warps.
TOPK = dict(topk_block=2048, topk_num_warps=8)


def next_power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()


def sparse_tiles(num_heads: int, kv_dtype: DType, arch: Arch, bf16: bool) -> dict[str, int]:
    """The sparse kernel's tiles; bf16: the activations are bf16 (the fp8 rows' Gluon
    kernel multiplies the bf16 rope with q's rope as it is)."""
    rows = min(64, max(16, next_power_of_two(num_heads)))
    table = FP8_SPARSE_TILES if kv_dtype is DType.FP8_E4M3 else SPARSE_TILES
    block_h, block_n, warps, stages = table[rows]
    gluon = int(rows == 64 and arch is Arch.SM90 and (kv_dtype is not DType.FP8_E4M3 or bf16))
    if gluon:
        block_h, block_n, warps, stages = SM90_GLUON_TILE
    return {
        "sparse_gluon": gluon,
        "sparse_block_h": block_h,
        "sparse_block_n": block_n,
        "sparse_num_warps": warps,
        "sparse_num_stages": stages,
        "max_splits": MAX_SPLITS,
        "combine_num_warps": 4,
    }


def kernel_config(
    variant: Variant, arch: Arch, overrides: dict[str, int] | None = None
) -> DsaTritonConfig:
    shape = variant.shape
    assert isinstance(shape, DsaShape)
    assert variant.kv_dtype is not None and variant.page_size is not None
    key = DsaKey(
        num_heads=shape.mla.num_heads,
        kv_lora_rank=shape.mla.kv_lora_rank,
        qk_rope_head_dim=shape.mla.qk_rope_head_dim,
        index_heads=shape.index_heads,
        index_head_dim=shape.index_head_dim,
        index_topk=shape.index_topk,
        index_dtype=TORCH_DTYPE_NAME[shape.index_dtype],
        page_size=variant.page_size,
        dtype=TORCH_DTYPE_NAME[variant.dtype],
        kv_dtype=KV_DTYPE_NAME[variant.kv_dtype],
        spec_topk=variant.spec_topk or 0,
    )
    config = DsaTritonConfig(
        uri=variant.uri,
        **dataclasses.asdict(key),
        num_draft_tokens=variant.num_draft_tokens,
        **sparse_tiles(shape.mla.num_heads, variant.kv_dtype, arch, variant.dtype is DType.BF16),
        **(INDEXER_FP32 if shape.index_dtype is DType.FP32 else INDEXER),
        **TOPK,
    )
    return dataclasses.replace(config, **(overrides or {}))


def decode_graph_buffers(fill: int) -> tuple[GraphBuffer, ...]:
    """Static buffers of a decode capture: metadata, selections and the split partials."""
    return (
        GraphBuffer(
            "page_table", "int32", ("max_bs", "max_pages"), 0, "physical page of each page"
        ),
        GraphBuffer("seq_lens", "int32", ("max_bs",), fill, "keys per request (padded: fill)"),
        GraphBuffer(
            "logits", "float32", ("max_bs", "max_context_len"), 0, "indexer scores per key"
        ),
        GraphBuffer("topk_pos", "int32", ("max_bs", "index_topk"), -1, "selected positions"),
        GraphBuffer("topk_slots", "int32", ("max_bs", "index_topk"), -1, "selected slots"),
        GraphBuffer("num_splits", "int32", ("max_bs",), 1, "top-k splits per row"),
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


def traits(plan: ModulePlan) -> DsaTraits:
    """The TRAITS the plan's generated kernels.py binds."""
    return DsaTraits(tuple(p.value for p in plan.spec.phases))
