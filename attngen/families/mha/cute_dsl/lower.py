"""Lowering of MHA variants to CuTe DSL plans: tiles per arch and page size, the plan.

sm90 forward: 128 query rows per CTA (two consumer warpgroups of 64), 128-key tiles (whole
pages of up to 128 tokens, when extend or decode reads a paged cache), two K/V stages in
shared memory (d128: Q 32 KiB + K and V 2 x 2 x 32 KiB = 160 KiB of 227), and the
intra-warpgroup overlap (S_j's softmax while P_{j-1} V_{j-1} runs). Measured on the H200:
the overlap took hd128 prefill from 0.80-0.90x FA4 (the serial loop) to about 0.94x
(bench/results/cute_mha_check_overlap1_2026-12-02-a3885ee.json); in paired rounds, which
cancel the drift between timings, the kernels of 07d98cb read 0.93-0.97x at S 1k-16k
(bench/results/cute-prefill-paired-2026-12-04-05b85b1.jsonl), and with GQA packing
(``pack_gqa``) and the mask-free steady loop of 8f316e0 0.97-0.98x at S 4k-16k
(bench/README.md); zero spills on sm_90a.

sm100 forward: 128 query rows (one per softmax thread), 64-key tiles: a softmax thread holds
its row of S in registers, and 128-key rows spilled on sm_100a (255 registers, ~320 B);
64-key tiles compile to 214-220 registers without spills.
"""

from __future__ import annotations

import dataclasses

from attngen.families.mha.cute_dsl.capability import GATHER_PAGE_SIZES, PAGED_PHASES
from attngen.families.mha.cute_dsl.config import MhaCuteConfig, MhaCuteTraits
from attngen.families.mha.cute_dsl.tiles import (
    gqa_packs,
    sm90_decode_resident_ctas,
    sm90_paged_tile_n,
    sm90_prefill_tile_n,
    sm90_tile_n,
)
from attngen.families.mha.key import MhaKey
from attngen.library_lowering import plan_module
from attngen.ir import GraphBuffer, ModulePlan
from attngen.spec.enums import Arch, Backend, Phase
from attngen.spec.model import Spec
from attngen.spec.variant import Variant

SEQ_LEN_FILL_VALUE = 1  # seq_len of padded rows in captured verify / draft-extend graphs
RUNTIME_CLASS = "attngen.families.mha.runtime:PagedMhaBackend"
FWD_TILE_M = 128
# sm90, head dims <= 64: the cache-free prefill runs 192-row tiles on three consumer
# warpgroups (the kernel's MAX_DIM_3WG; their S and O fit 160 registers a thread). H200,
# paired rounds against FA4 (2026-12-05): d64 prefill 0.90-0.94x FA4 against 0.77-0.89x at
# 128 rows (ab_trees m192); the paged extend (bench/run.py head_dims, prefix 0) measured
# 0.60-0.67x against 0.69-0.76x at S 1k and 0.82-0.84x against 0.77-0.78x at 4k, so the
# paged phases keep 128 rows (fwd_paged_tile_m) until a per-call choice exists.
FWD_TILE_M_3WG = 192
MAX_DIM_3WG = 64
FWD_TILE_N = {Arch.SM90: 128, Arch.SM100: 64}
FWD_NUM_STAGES = 2
FWD_INTRA_WG_OVERLAP = {Arch.SM90: 1, Arch.SM100: 0}  # a wgmma (sm90) schedule
FWD_STAGED_STORE = {Arch.SM90: 1, Arch.SM100: 0}  # O through shared memory (sm90 epilogue)
# decode KV splits per request: the split heuristic (attngen.families.mha.runtime) allows up
# to 4 waves of (request, kv head, split) programs, each split >= 256 keys
MAX_SPLITS = 16


@dataclasses.dataclass(frozen=True)
class MhaCutePlan(ModulePlan):
    """A CuTe DSL MHA module: the neutral plan, and its decode kernels' occupancy, which the
    runtime's split rule reads (``DECODE_RESIDENT_CTAS`` of the generated module)."""

    @property
    def decode_resident_ctas(self) -> dict[str, int]:
        """{uri: CTAs of its sm90 split-KV decode an SM holds}; empty on other archs, whose
        decode has not been timed (the runtime then keeps its TARGET_WAVES rule)."""
        if self.arch is not Arch.SM90 or Phase.DECODE not in self.spec.phases:
            return {}
        return {k.uri: _sm90_decode_resident_ctas(k.config) for k in self.kernels}


def _sm90_decode_resident_ctas(config: MhaCuteConfig) -> int:
    kv_bytes = 1 if config.kv_dtype.startswith("float8") else 2
    return sm90_decode_resident_ctas(
        config.head_dim,
        config.v_head_dim,
        config.decode_block_n,
        config.decode_num_stages,
        kv_bytes,
        gather=config.page_size in GATHER_PAGE_SIZES,
    )


def fwd_tile_n(variant: Variant, arch: Arch) -> int:
    """Keys per stage. The sm90 default is 128 keys, 64 where two 128-key stages of the head
    dims do not fit shared memory (``tiles.sm90_tile_n``: d 256); a paged phase fills the
    tile with whole pages, one TMA copy each, and a wider page is the tile
    (``tiles.sm90_paged_tile_n``)."""
    tile = FWD_TILE_N[arch]
    if arch is Arch.SM90:
        shape = variant.shape
        tile = min(tile, sm90_tile_n(shape.head_dim, shape.v_head_dim, FWD_NUM_STAGES))
    if arch is Arch.SM90 and PAGED_PHASES & set(variant.phases):
        assert variant.page_size is not None
        return sm90_paged_tile_n(variant.page_size, tile)
    return tile


def fwd_prefill_tile_n(variant: Variant, arch: Arch) -> int:
    """Keys per stage of the cache-free prefill: on sm90 the widest multiple of 16 that fits
    beside its Q tile (``tiles.sm90_prefill_tile_n``: 80 at d 256, where the paged phases
    keep 64), else the forward's tile."""
    if arch is Arch.SM90:
        shape = variant.shape
        rows = fwd_tile_m(variant, arch)
        return sm90_prefill_tile_n(shape.head_dim, shape.v_head_dim, FWD_NUM_STAGES, rows)
    return FWD_TILE_N[arch]


def pack_gqa(group: int, arch: Arch) -> bool:
    """Whether the forward packs a GQA group's query heads into one CTA's rows, so that each
    K/V tile brought into shared memory serves the whole group (FA4 packs on sm90 whenever
    the group exceeds 1): on sm90 for groups > 1 that divide the paged phases' 128-row tile
    (the cache-free prefill's rows then divide by the group too: ``fwd_tile_m``)."""
    return group > 1 and gqa_packs(arch.value, group, FWD_TILE_M)


def fwd_tile_m(variant: Variant, arch: Arch) -> int:
    """Query rows per CTA of the cache-free prefill: 192 (three consumer warpgroups) on sm90
    for head dims <= 64, unless the group packs into the paged phases' 128 rows and not into
    192 (one packing decision serves both tiles), else 128. A sliding window keeps 128: its
    key-range masking took the 160-register consumers onto the stack (80 bytes at d 64)."""
    shape = variant.shape
    three = arch is Arch.SM90 and max(shape.head_dim, shape.v_head_dim) <= MAX_DIM_3WG
    three = three and variant.mask.window_left is None
    packs_192 = gqa_packs(arch.value, shape.gqa_group, FWD_TILE_M_3WG)
    if three and (not pack_gqa(shape.gqa_group, arch) or packs_192):
        return FWD_TILE_M_3WG
    return FWD_TILE_M


def kernel_config(
    variant: Variant, arch: Arch, overrides: dict[str, int] | None = None
) -> MhaCuteConfig:
    """The variant's config on ``arch``: identity, tiles, then the spec's tuning."""
    key = MhaKey.of_variant(variant)
    config = MhaCuteConfig(
        uri=variant.uri,
        **dataclasses.asdict(key),
        num_draft_tokens=variant.num_draft_tokens,
        arch=arch.value,
        fwd_tile_m=fwd_tile_m(variant, arch),
        fwd_paged_tile_m=FWD_TILE_M,
        fwd_tile_n=fwd_tile_n(variant, arch),
        fwd_prefill_tile_n=fwd_prefill_tile_n(variant, arch),
        fwd_num_stages=FWD_NUM_STAGES,
        fwd_intra_wg_overlap=FWD_INTRA_WG_OVERLAP[arch],
        fwd_pack_gqa=int(pack_gqa(key.gqa_group, arch)),
        fwd_staged_store=FWD_STAGED_STORE[arch],
        max_splits=MAX_SPLITS,
    )
    return dataclasses.replace(config, **(overrides or {}))


def decode_graph_buffers(fill: int) -> tuple[GraphBuffer, ...]:
    """Static buffers of a decode capture: the split-KV metadata the runtime fills, then the
    two kernels' workspace in the order the launcher takes it (the layout is the Triton MHA
    lowering's too, as the shared runtime expects)."""
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


def lower(spec: Spec, variants: tuple[Variant, ...], arch: Arch) -> ModulePlan:
    """The plan of one spec's supported variants on ``arch`` (checked by the caller)."""
    return plan_module(
        spec,
        variants,
        arch,
        Backend.CUTE_DSL,
        kernel_config=kernel_config,
        seq_len_fill=SEQ_LEN_FILL_VALUE,
        graph_buffers=(
            decode_graph_buffers(SEQ_LEN_FILL_VALUE) if Phase.DECODE in spec.phases else ()
        ),
        runtime_class=RUNTIME_CLASS,
        plan_type=MhaCutePlan,
    )


def traits(plan: ModulePlan) -> MhaCuteTraits:
    """The TRAITS the plan's generated kernels.py binds (its template spells the same
    values as literals)."""
    return MhaCuteTraits(plan.hooks, tuple(p.value for p in plan.spec.phases))
