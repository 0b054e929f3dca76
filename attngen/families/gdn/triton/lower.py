"""Lowering of GDN variants to Triton plans: tiles per head dim, the graph buffers, the plan.

Tiles are starting points checked to compile without spills (sm_80, sm_90a, sm_100a; see
evidence/compile/); a spec's ``tuning`` section overrides them per arch.
"""

from __future__ import annotations

from attngen.arch import facts
from attngen.families.gdn.triton.config import GdnTraits, GdnTritonConfig
from attngen.library_lowering import plan_module
from attngen.ir import GraphBuffer, ModulePlan
from attngen.spec.enums import Arch, Backend, Phase
from attngen.spec.model import Spec
from attngen.families.gdn.spec import GdnShape, config_identity
from attngen.spec.variant import Variant

RUNTIME_CLASS = "attngen.families.gdn.runtime:GdnBackend"
SEQ_LEN_FILL_VALUE = 1  # padded rows of a replayed batch (their slot is 0: nothing is touched)


def tiles(shape: GdnShape, arch: Arch) -> dict[str, int]:
    """Decode / verify: value blocks of 8 rows on one warp (an 8 x K fp32 state slice at a
    time), the shape flash-linear-attention's recurrent kernel uses, one block per program
    (H200, 2026-12-03, against 2, 4, 8 and 16 blocks walked in a pipelined loop: B64 72 us
    against 74 / 79 / 87 / 85, B256 272 us against 277 / 283 / 288 / 309; the loop had
    measured ahead in an earlier run, 291-299 us against 296). Chunked prefill: prepare on 4
    warps over [chunk, K] tiles, W / U / KT on 4 warps (8 x 4k x 32 heads: 1201 us against
    1334 on 8); the sequential state kernel on the widest value block of 16 .. 32 that still
    gives one program per SM (1 x 32k tokens x 16 heads: 16, spread over 128 SMs; 64 spilled
    on sm_80 and sm_100a, and on sm_90a with its int arguments specialized as the JIT does;
    on sm_90a every batch wide enough for 64 takes the transposed kernel below, whose
    threshold is half of it), 4 warps, W, KT and U loaded two steps ahead at 16
    values (H200, 1 x 32k: 783 us, one step ahead 1123) and one step ahead at wider blocks
    (two would overflow shared memory); on sm_90a, for batches of at least half an SM's
    worth of 64-value programs, the transposed-state kernel instead (``state_transposed``:
    S^T in registers as both wgmmas' left operand, 64-value blocks, TMA loads three stages
    deep; 255 registers, no spill; H100, fc938f6: 4 x 8k x 16 heads 490 us against 792,
    8 x 4k x 32 heads 970 against 1157, but 1 x 32k x 16 heads 1968 against 768); output
    on [chunk, 64] tiles, 4 warps (sm_80: 8; 4 spilled); the per-chunk states in the
    activation dtype (bf16 operands of Q S0). Conv prefill: 16 tokens x 64 channels (32 x
    128 spilled on sm_90a)."""
    return {
        "decode_block_v": 8,
        "decode_tiles": 1,
        "decode_num_warps": 1,
        "prepare_num_warps": 4,
        "wu_num_warps": 4,
        "state_block_v": 16,
        "state_block_v_max": min(32, shape.value_dim),
        "state_min_programs": facts(arch).num_sms,
        "state_num_warps": 4,
        "state_num_stages": 3,
        "output_block_v": min(64, shape.value_dim),
        "output_num_warps": 8 if arch is Arch.SM80 else 4,
        "chunk_state_bits": 16,
        "state_transposed": int(arch is Arch.SM90),
        "state_t_min_programs": facts(arch).num_sms // 2,
        "conv_block_c": 64,
        "conv_block_t": 16,
        "conv_num_warps": 4,
    }


def kernel_config(
    variant: Variant, arch: Arch, overrides: dict[str, int] | None = None
) -> GdnTritonConfig:
    shape = variant.shape
    assert isinstance(shape, GdnShape)
    values = tiles(shape, arch)
    values.update(overrides or {})
    return GdnTritonConfig(**config_identity(variant), **values)


def graph_buffers(verify: bool) -> tuple[GraphBuffer, ...]:
    """Static buffers of a decode / verify capture: the requests' state slots (0: padding,
    never written) and their row offsets; trees add the drafts' parents."""
    buffers = (
        GraphBuffer("cache_indices", "int32", ("max_bs",), 0, "state pool slot per request"),
        GraphBuffer(
            "query_start_loc",
            "int32",
            ("max_bs_plus_one",),
            0,
            "first row of each request (set to b * tokens per request)",
        ),
    )
    if verify:
        buffers += (
            GraphBuffer(
                "parents", "int32", ("max_bs", "max_drafts"), -1, "draft tree parents (-1: root)"
            ),
        )
    return buffers


def lower(spec: Spec, variants: tuple[Variant, ...], arch: Arch) -> ModulePlan:
    return plan_module(
        spec,
        variants,
        arch,
        Backend.TRITON,
        kernel_config=kernel_config,
        seq_len_fill=SEQ_LEN_FILL_VALUE,
        graph_buffers=graph_buffers(Phase.VERIFY in spec.phases),
        runtime_class=RUNTIME_CLASS,
    )


def traits(plan: ModulePlan) -> GdnTraits:
    return GdnTraits(tuple(p.value for p in plan.spec.phases))
