"""MHA / GQA forward (prefill and extend) on Hopper: TMA loads, wgmma, warp-specialized.

One CTA computes one (query tile, query head, request): ``tile_m`` query rows against every
key tile the mask lets it see, newest key tile first. With ``FwdShape.pack_gqa`` = G > 1
(GQA packing) one CTA computes (query tile, kv head, request) instead: its rows are
``tile_m / G`` tokens x the G query heads of the kv head (row r: token r // G, head r % G),
copied by the consumers with cp.async, so each K/V tile brought in serves the G heads.

Warp roles (3 warpgroups, 384 threads; 4 and 512 with 192-row tiles at head dims <= 64):

- warpgroup 0, **producer**: its first warp issues the bulk tensor copies (TMA) of the Q tile
  (once) and of each K and V tile into a ``num_stages`` ring in shared memory, through
  mbarrier pipelines; it gives most of its registers to the consumers.
- warpgroups 1 and 2 (and 3), **consumers**: 64 query rows each. Per key tile: S = Q K^T
  (wgmma, both operands in shared memory), score_mod (softcap), mask_mod (key length,
  causal, window), online softmax in registers, then O += P V (wgmma with P in registers,
  V^T from shared memory). Two consumers run independently, so one's softmax overlaps the
  other's MMAs; three take turns to issue their wgmmas (``TURN_BARRIER``), which keeps
  their softmaxes from meeting on the exp2 unit.

Layouts (what ``__call__`` takes; the host passes torch tensors through DLPack):

- q ``[T, Hq, D]``, out ``[T, Hq, Dv]``: ragged requests, ``cu_seqlens_q[b] .. [b+1]``;
  lse ``[T, Hq]`` fp32: each row's natural-log sum of exp of its scaled scores (sinks
  included; -inf for a row that sees nothing), written when ``write_lse`` is nonzero (the
  launchers pass a one-element tensor and 0 otherwise, so one kernel serves both);
- contiguous K/V (``page_table`` None, prefill): ``[T, Hkv, D]`` rows aligned with q's;
- paged K/V (extend): ``[num_pages, page_size, Hkv, D]`` read through ``page_table[b, j]``,
  one TMA copy per page: ``page_size == tile_n`` (a page is a key tile) or
  ``tile_n = pages_per_tile * page_size`` (pages of 16 / 32 tokens, each copied into its rows
  of the tile, all on the stage's mbarrier) or, for pages of fewer than 16 tokens, rows
  gathered by the whole producer warpgroup with 16-byte ``cp.async`` copies that arrive on
  the stage's mbarrier (the consumers fence the async proxy before wgmma reads them);
  request ``b`` has ``prefix_lens[b]`` cached tokens followed by its new tokens (already
  written), so its key length is prefix + new.

Mask (attngen.hooks.MaskHooks, compile-time): a query row ``i`` of a request with key
length ``Lk`` and query length ``Lq`` sits at position ``p = i + Lk - Lq``; it sees key ``k``
when ``k < Lk``, ``k <= p`` if causal and ``k >= p - window_left`` with a window (key tiles
wholly outside are never loaded). Verify of draft trees (``FwdShape.tree``, not causal):
the request's rows are its drafts, its last ``Lq`` keys; row ``i`` sees every key before
them and draft ``j`` when bit ``i * Lq + j`` of its mask is set. Scores ``s = q.k *
sm_scale`` become ``cap * tanh(s / cap)`` with a softcap; with sinks, ``exp(sinks[h])``
joins each row's softmax denominator. A row that sees no key gives zeros.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import cuda.bindings.driver as cuda
import cutlass
import cutlass.memory
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup

from attngen.families.mha.cute_dsl.kernels.common import (
    DTYPES,
    KV_DTYPES,
    LN2,
    LOG2_E,
    SMEM_ALIGN,
    FwdShape,
    convert_fp8_rows,
    mode_select,
    page_slice,
    rows_aligned,
    smem_layout,
    split_blocks,
)
from attngen.families.mha.cute_dsl.kernels.fragments import (
    mma_a,
    rows_cols,
    transpose_smem,
    wgmma_group,
)
from attngen.families.mha.cute_dsl.tiles import FP8_DECODE_MAX_GROUP

WARPGROUP = 128  # threads
# Registers per thread after setmaxnreg, (producer, consumer), by consumer warpgroups: the
# CTA's sum stays within what it launched with (ptxas gives 3 x 128 threads 168 each, 4 x 128
# threads 128). A producer that issues one TMA copy a tile needs 24; one that looks pages up
# holds a tile's page indices and addresses: at 24 a TMA copy per page spilled them to the
# stack, and cp.async row gathers spilled at 40 (pages of 8 tokens, with every mask hook).
REGS = {2: (24, 240), 3: (24, 160)}  # S and O accumulators, P: 240 (2 warpgroups)
PAGED_REGS = {2: (40, 232), 3: (40, 152)}  # a TMA copy per page of a key tile
GATHER_REGS = {2: (48, 224), 3: (48, 152)}  # cp.async row gathers
MAX_DIM_3WG = 64  # a 192-row tile's consumer holds S (64 x tile_n) and O (64 x Dv) in 160 regs
CHUNK = 8  # elements per cp.async of a gathered row (16 bytes)
# threads that gather one row together: each copies every 4th chunk, so a thread handles a
# quarter of the rows of a thread a chunk and holds a quarter of the page lookups (a thread
# a chunk at hd 128 held 16 rows' pages and addresses and spilled them at 40 registers)
GATHER_LANES_PER_ROW = 4
# an fp8 cache: query head j's two e4m3 parts go to rows 16 (j // 8) + j % 8 and that + 8 of
# the 64-row tile (one thread's two accumulator rows), so FP8_DECODE_MAX_GROUP (32) at most
E4M3_MAX = 448.0
# Turns (pingpong): with three consumer warpgroups (192-row tiles, head dims <= 64) consumer c
# waits on named barrier TURN_BARRIER + c to issue its wgmmas and then passes the turn to c + 1
# (mod 3), so the three softmaxes are spread in time instead of meeting on the MUFU queue (ncu,
# 2026-12-07: attngen's `mio` stalls, 94% on MUFU.EX2, were twice FA4's, which takes turns);
# +2.5-3% at hd 64 causal S >= 4k. With two consumers turns did not pay: +-1% at hd 128, and
# -5-9% with 128-row tiles at hd 64 (bench/README.md). Ids 1-3 are the per-warpgroup barriers.
TURN_BARRIER = 4
TURN_CONSUMERS = 3


# What the design relies on, checked in every compiled kernel by the AOT check: wgmma and
# bulk tensor copies (TMA), in the PTX and in the SASS ptxas made of it.
REQUIRES = {"ptx": ("wgmma.mma_async", "cp.async.bulk.tensor"), "sass": ("HGMMA", "UTMALDG")}
# gathered K/V: 16-byte cp.async copies that arrive on the stage's mbarrier, and the proxy
# fence before wgmma reads what they wrote
GATHER_REQUIRES = ("cp.async.ca.shared.global", "cp.async.mbarrier.arrive", "fence.proxy.async")


@dataclass(frozen=True)
class OverlapLoop:
    """What every step of the overlapped loop reads (``MhaFwdSm90.mainloop_overlapped``):
    one consumer warpgroup's fragments, accumulators (updated in place), MMAs, K/V
    pipelines, scales and the query tile's place in the request."""

    acc_O: cute.Tensor
    tOrP: cute.Tensor
    tSrQ: cute.Tensor
    tSrK: cute.Tensor
    tOrV: cute.Tensor
    tScS: cute.Tensor
    row_max: cute.Tensor
    row_sum: cute.Tensor
    rescale: Optional[cute.Tensor]  # what O's rows are multiplied by (the loop makes it)
    tiled_mma_qk: cute.TiledMma
    tiled_mma_pv: cute.TiledMma
    pipe_k: pipeline.PipelineAsync
    pipe_v: pipeline.PipelineAsync
    softmax_scale: Float32
    scale_log2: Float32
    seqlen_k: Int32
    offset: Int32
    m_block: Int32
    mTree: Optional[cute.Tensor]
    wg: Int32 = 0


def requires(shape: FwdShape) -> dict[str, tuple[str, ...]]:
    """Instructions the compiled kernel of ``shape`` must contain (PTX, SASS)."""
    if shape.gather and shape.pack_gqa > 1:  # Q copied by the consumers too: no TMA at all
        return {"ptx": ("wgmma.mma_async", *GATHER_REQUIRES), "sass": ("HGMMA",)}
    if shape.gather:
        return {**REQUIRES, "ptx": REQUIRES["ptx"] + GATHER_REQUIRES}
    return REQUIRES


def shared_bytes(shape: FwdShape) -> int:
    """Dynamic shared memory of one CTA: mbarriers (padded to SMEM_ALIGN), the Q tile and
    ``num_stages`` K and V tiles (each a multiple of SMEM_ALIGN); checked at compile time."""
    elem = 2  # bf16 / fp16
    # an fp8 cache: Q as e4m3 parts (the QK MMAs read the fp8 K stages), one V tile in fp16
    q = shape.tile_m * shape.head_dim * (1 if shape.kv_fp8 else elem)
    kv_row = shape.tile_n * (shape.head_dim + shape.v_head_dim)
    kv = shape.num_stages * kv_row * shape.kv_elem_bytes
    converted = shape.tile_n * shape.v_head_dim * elem if shape.kv_fp8 else 0
    return SMEM_ALIGN + q + kv + converted


class MhaFwdSm90:
    """The kernel of one :class:`FwdShape`; ``cute.compile(obj, ...)`` builds it."""

    def __init__(self, shape: FwdShape):
        # two consumer warpgroups of 64 rows, or three at head dims <= 64; decode packs at
        # most 64 rows: one
        tiles_m = (64,) if shape.decode else (128, 192)
        assert shape.tile_m in tiles_m, "consumer warpgroups of 64 rows"
        assert shape.tile_m < 192 or max(shape.head_dim, shape.v_head_dim) <= MAX_DIM_3WG
        assert shape.head_dim % 16 == 0 and shape.v_head_dim % 16 == 0
        self.shape = shape
        self.dtype = DTYPES[shape.dtype]
        self.kv_dtype = KV_DTYPES[shape.kv_dtype or shape.dtype]
        # the wgmma operands' type: over an fp8 cache fp16 whatever the activations, since
        # e4m3 -> f16x2 is one conversion (to bf16 it is three more, through fp32); Q is
        # rounded to fp16 once (|q| > 65504 would overflow), P in [0, 1] loses nothing
        self.mma_dtype = cutlass.Float16 if shape.kv_fp8 else self.dtype
        # the QK MMAs' type: over an fp8 cache e4m3, on the K stages as TMA wrote them, with
        # q split into two e4m3 parts (see load_q_rows_fp8); PV stays on fp16 V tiles
        self.qk_dtype = cutlass.Float8E4M3FN if shape.kv_fp8 else self.mma_dtype
        if shape.kv_fp8:  # V converted by the consumers: one warpgroup, whole-page TMA tiles
            assert shape.decode and not shape.gather and not shape.overlap
            assert shape.decode_group <= FP8_DECODE_MAX_GROUP, "two q parts a head in 64 rows"
        self.tile_m, self.tile_n = shape.tile_m, shape.tile_n
        assert shape.tile_m % shape.pack_gqa == 0 and (shape.pack_gqa == 1 or not shape.decode)
        self.pack = shape.pack_gqa  # query heads a CTA's rows hold
        self.rows_tok = shape.tile_m // shape.pack_gqa  # tokens a CTA's rows hold
        self.num_consumers = shape.tile_m // 64
        # the overlapped loop's consumers take turns to issue wgmmas (TURN_BARRIER)
        self.takes_turns = shape.overlap and self.num_consumers == TURN_CONSUMERS
        self.num_threads = WARPGROUP * (1 + self.num_consumers)
        # after setmaxnreg (the producers give theirs up); decode's one consumer warpgroup
        # takes the two-warpgroup figures (a CTA of 256 threads launched with 240 each, or
        # 128 at two CTAs an SM: MhaDecodeSm90 lowers the consumers' share then)
        split = REGS
        if shape.gather:
            split = GATHER_REGS
        elif shape.paged and shape.pages_per_tile > 1:
            split = PAGED_REGS
        self.gather_rows_per_pass = WARPGROUP // GATHER_LANES_PER_ROW
        self.gather_passes = shape.tile_n // self.gather_rows_per_pass
        if shape.gather:
            assert shape.tile_n % self.gather_rows_per_pass == 0, "whole passes of rows"
        self.producer_regs, self.consumer_regs = split[max(2, self.num_consumers)]

    # -- host side: layouts, TMA descriptors, launch ----

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,
        mCuSeqlensQ: cute.Tensor,
        mPrefixLens: Optional[cute.Tensor],
        mPageTable: Optional[cute.Tensor],
        mSinks: Optional[cute.Tensor],
        mTreeMask: Optional[cute.Tensor],  # draft trees: uint8 bit-packed masks, back to back
        mTreeIndptr: Optional[cute.Tensor],  # draft trees: [B] int32 byte offset of each
        mLSE: cute.Tensor,
        softmax_scale: Float32,
        max_seqlen_q: Int32,
        write_lse: Int32,
        stream: cuda.CUstream,
    ):
        shape = self.shape
        mQ, mK, mV, mO = (rows_aligned(t) for t in (mQ, mK, mV, mO))
        # (T, H, D) -> (T, D, H): TMA tiles the first two modes
        mQ = mode_select(mQ, [0, 2, 1])
        kv_modes = [1, 3, 2, 0] if const_expr(shape.paged) else [0, 2, 1]
        mK, mV = mode_select(mK, kv_modes), mode_select(mV, kv_modes)
        tma, smem, mmas, SharedStorage = self.setup(mQ, mK, mV)
        num_m_blocks = (max_seqlen_q + self.rows_tok - 1) // self.rows_tok
        num_heads = cute.size(mQ.shape[2]) // self.pack  # packed: one CTA per kv head
        grid = (num_m_blocks, num_heads, cute.size(mCuSeqlensQ.shape[0]) - 1)
        # packed GQA: the consumers read Q's rows from the tensor itself, not through TMA
        q_arg = mQ if const_expr(self.pack > 1) else tma[0]
        self.kernel(
            q_arg, tma[1], tma[2], mK, mV, mO, mCuSeqlensQ, mPrefixLens, mPageTable, mSinks,
            None, mLSE, None, None, mTreeMask, mTreeIndptr, *tma[3:], softmax_scale,
            self.scale_log2(softmax_scale), write_lse, *smem, *mmas, SharedStorage,
        ).launch(
            grid=grid,
            block=[self.num_threads, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
        )  # fmt: skip

    def scale_log2(self, softmax_scale: Float32) -> Float32:
        """The factor of scores in exp2: exp(s * scale) = exp2(s * scale * log2(e))."""
        if const_expr(self.shape.logit_softcap is None):
            return softmax_scale * LOG2_E
        return Float32(LOG2_E)  # the capped scores are already scaled

    def setup(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor):
        """Shared-memory layouts, MMAs, TMA atoms and the shared storage of the (mode-selected)
        q, k and v tensors: (TMA tensors and atoms of Q, K, V), (sQ, sK, sV layouts),
        (QK and PV tiled MMAs), SharedStorage."""
        shape = self.shape
        d, dv = shape.head_dim, shape.v_head_dim
        sQ_layout = smem_layout(self.qk_dtype, self.tile_m, d, None)
        sK_layout = smem_layout(self.kv_dtype, self.tile_n, d, shape.num_stages)
        sV_layout = smem_layout(self.kv_dtype, self.tile_n, dv, shape.num_stages)
        tiled_mma_qk = sm90.make_trivial_tiled_mma(
            self.qk_dtype,
            self.qk_dtype,
            sm90.OperandMajorMode.K,
            sm90.OperandMajorMode.K,
            Float32,
            atom_layout_mnk=(self.num_consumers, 1, 1),
            tiler_mn=(64, self.tile_n),
        )
        tiled_mma_pv = sm90.make_trivial_tiled_mma(
            self.mma_dtype,
            self.mma_dtype,
            sm90.OperandMajorMode.K,
            sm90.OperandMajorMode.MN,
            Float32,
            atom_layout_mnk=(self.num_consumers, 1, 1),
            tiler_mn=(64, dv),
            a_source=sm90.OperandSource.RMEM,
        )
        load = cpasync.CopyBulkTensorTileG2SOp()
        # Q's atom in q's own type (the fp8 decode's sQ holds fp16: that atom goes unused)
        sQ_tma = smem_layout(self.dtype, self.tile_m, d, None)
        tma_atom_Q, tma_Q = cpasync.make_tiled_tma_atom(load, mQ, sQ_tma, (self.tile_m, d))
        sK_one, sV_one = (cute.select(s, mode=[0, 1]) for s in (sK_layout, sV_layout))
        rows = shape.page_rows  # one TMA copy per page: rows of the tile it fills
        sK_box, sV_box = sK_one, sV_one
        if const_expr(shape.gather):  # K/V gathered by cp.async: these atoms go unused
            rows = self.tile_n
        elif const_expr(shape.pages_per_tile > 1):
            sK_box, sV_box = (page_slice(s, rows) for s in (sK_one, sV_one))
        tma_atom_K, tma_K = cpasync.make_tiled_tma_atom(load, mK, sK_box, (rows, d), 1)
        tma_atom_V, tma_V = cpasync.make_tiled_tma_atom(load, mV, sV_box, (rows, dv), 1)
        self.tx_bytes_q = cute.size_in_bytes(self.dtype, sQ_tma)
        self.tx_bytes_k = cute.size_in_bytes(self.kv_dtype, sK_one)
        self.tx_bytes_v = cute.size_in_bytes(self.kv_dtype, sV_one)

        stages = shape.num_stages

        def tile(layout: cute.ComposedLayout, dtype: type = self.mma_dtype) -> type:
            return cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(layout)], 1024]

        # built from a dict: this module's annotations are strings (PEP 563), and cute.struct
        # reads the class's __annotations__ as given
        members = {
            "mbar_q": cute.struct.MemRange[cutlass.Int64, 2],
            "mbar_k": cute.struct.MemRange[cutlass.Int64, 2 * stages],
            "mbar_v": cute.struct.MemRange[cutlass.Int64, 2 * stages],
        }
        if const_expr(shape.kv_fp8):  # 1 / (q's part scale) per row, beside the barriers
            members["q_scale"] = cute.struct.MemRange[Float32, self.tile_m]
        members |= {
            "sQ": tile(sQ_layout, self.qk_dtype),
            "sK": tile(sK_layout, self.kv_dtype),
            "sV": tile(sV_layout, self.kv_dtype),
        }
        if const_expr(shape.kv_fp8):  # the converted V tile the PV wgmma reads
            members["sV16"] = tile(smem_layout(self.mma_dtype, self.tile_n, dv, None))
        SharedStorage = cute.struct(type("SharedStorage", (), {"__annotations__": members}))

        assert SharedStorage.size_in_bytes() == shared_bytes(shape), "shared_bytes() is stale"
        return (
            (tma_Q, tma_K, tma_V, tma_atom_Q, tma_atom_K, tma_atom_V),
            (sQ_layout, sK_layout, sV_layout),
            (tiled_mma_qk, tiled_mma_pv),
            SharedStorage,
        )

    # -- device side ----

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mK_rows: cute.Tensor,  # the cache itself (gathers read rows of it)
        mV_rows: cute.Tensor,
        mO: cute.Tensor,
        mCuSeqlensQ: cute.Tensor,
        mPrefixLens: Optional[cute.Tensor],
        mPageTable: Optional[cute.Tensor],
        mSinks: Optional[cute.Tensor],
        mNumSplits: Optional[cute.Tensor],  # decode: [B] KV splits per request
        mLSE: Optional[cute.Tensor],  # decode: [B, Hq, max_splits] fp32 (mO: partial outputs);
        # prefill / extend: [T, Hq] fp32, written when write_lse != 0
        mKScale: Optional[cute.Tensor],  # fp8 cache: [1] fp32 dequant scales of K and V
        mVScale: Optional[cute.Tensor],
        mTreeMask: Optional[cute.Tensor],  # draft trees: the bit-packed masks (uint8)
        mTreeIndptr: Optional[cute.Tensor],  # draft trees: [B] byte offset of each request's
        tma_atom_Q: cute.CopyAtom,
        tma_atom_K: cute.CopyAtom,
        tma_atom_V: cute.CopyAtom,
        softmax_scale: Float32,
        scale_log2: Float32,
        write_lse: Int32,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        shape = self.shape
        split = Int32(0)
        if const_expr(shape.decode):  # (split, kv head, request); mCuSeqlensQ: seq_lens
            split, head_kv, batch = cute.arch.block_idx()
            m_block, seqlen_q, q_start = Int32(0), Int32(1), batch
            seqlen_k = mCuSeqlensQ[batch]
            head = head_kv * shape.decode_group  # the group's first query head
        else:
            m_block_rev, head, batch = cute.arch.block_idx()
            num_m_blocks, num_heads, _ = cute.arch.grid_dim()
            head, num_heads = head * self.pack, num_heads * self.pack  # packed: first head
            # longest (causal: last) query tiles first, so the tail of the grid is short work
            m_block = num_m_blocks - 1 - m_block_rev
            q_start = mCuSeqlensQ[batch]
            seqlen_q = mCuSeqlensQ[batch + 1] - q_start
            seqlen_k = seqlen_q
            if const_expr(mPrefixLens is not None):
                seqlen_k = seqlen_q + mPrefixLens[batch]
            head_kv = head // (num_heads // mK.shape[2])

        # a CTA with no work (a split past the request's count, a query tile past its rows)
        # leaves before any barrier or shared-memory setup
        active = m_block * self.rows_tok < seqlen_q
        num_splits = Int32(1)
        if const_expr(shape.decode):
            num_splits = cutlass.max(cutlass.min(mNumSplits[batch], mLSE.shape[2]), 1)
            active = split < num_splits
        if active:
            if warp_idx == 0:
                for atom in (tma_atom_Q, tma_atom_K, tma_atom_V):
                    cpasync.prefetch_descriptor(atom)
            smem = cutlass.memory.SmemAllocator()
            storage = smem.allocate(SharedStorage)
            producer = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
            consumers = pipeline.CooperativeGroup(
                pipeline.Agent.Thread, self.num_consumers * WARPGROUP // 32
            )
            pipe_q = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.mbar_q.data_ptr(),
                num_stages=1,
                producer_group=producer,
                consumer_group=consumers,
                tx_count=self.tx_bytes_q,
                defer_sync=True,
            )
            if const_expr(self.shape.gather):
                # every producer thread arrives (when its copies land); every consumer thread
                # releases (the cp.async pipeline has no one-lane-per-warp signalling)
                gatherers = pipeline.CooperativeGroup(pipeline.Agent.Thread, WARPGROUP)
                releasers = pipeline.CooperativeGroup(
                    pipeline.Agent.Thread, self.num_consumers * WARPGROUP
                )
                pipe_k = pipeline.PipelineCpAsync.create(
                    barrier_storage=storage.mbar_k.data_ptr(),
                    num_stages=self.shape.num_stages,
                    producer_group=gatherers,
                    consumer_group=releasers,
                    defer_sync=True,
                )
                pipe_v = pipeline.PipelineCpAsync.create(
                    barrier_storage=storage.mbar_v.data_ptr(),
                    num_stages=self.shape.num_stages,
                    producer_group=gatherers,
                    consumer_group=releasers,
                    defer_sync=True,
                )
            else:
                pipe_k = pipeline.PipelineTmaAsync.create(
                    barrier_storage=storage.mbar_k.data_ptr(),
                    num_stages=self.shape.num_stages,
                    producer_group=producer,
                    consumer_group=consumers,
                    tx_count=self.tx_bytes_k,
                    defer_sync=True,
                )
                pipe_v = pipeline.PipelineTmaAsync.create(
                    barrier_storage=storage.mbar_v.data_ptr(),
                    num_stages=self.shape.num_stages,
                    producer_group=producer,
                    consumer_group=consumers,
                    tx_count=self.tx_bytes_v,
                    defer_sync=True,
                )
            cute.arch.mbarrier_init_fence()
            cute.arch.barrier()

            sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
            sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
            sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
            sQScale, sV16, v_scale = None, None, Float32(1.0)
            if const_expr(shape.kv_fp8):
                sV16_layout = smem_layout(self.mma_dtype, self.tile_n, shape.v_head_dim, None)
                sV16 = storage.sV16.get_tensor(sV16_layout.outer, swizzle=sV16_layout.inner)
                sQScale = storage.q_scale.get_tensor(cute.make_layout(self.tile_m))
                # exp(s * k_scale * scale): K's scale folds into the softmax scale (and into the
                # softcap's argument); V's into the output
                k_scale, v_scale = Float32(mKScale[0]), Float32(mVScale[0])
                softmax_scale = softmax_scale * k_scale
                if const_expr(shape.logit_softcap is None):
                    scale_log2 = scale_log2 * k_scale

            n_block_min, n_block_max = self.key_blocks(m_block, seqlen_q, seqlen_k)
            mO_rows, mLSE_rows, mQ_rows = mO, mLSE, None
            mTree = None
            if const_expr(shape.tree):  # the request's seqlen_q x seqlen_q bits
                mTree = cute.domain_offset((mTreeIndptr[batch],), mTreeMask)
            if const_expr(shape.decode):
                n_block_min, n_block_max = split_blocks(
                    split, num_splits, n_block_min, n_block_max, seqlen_k, self.tile_n
                )
                mO_rows = cute.domain_offset((head, 0), mO[batch, None, split, None])
                mLSE_rows = cute.domain_offset((head,), mLSE[batch, None, split])
                mQ_rows = cute.domain_offset((head, 0), mQ[batch, None, None])
            elif const_expr(self.pack > 1):
                mQ_rows = mQ  # (T, D, Hq): the consumers copy the packed rows
            if warp_idx < 4:
                cute.arch.setmaxregister_decrease(self.producer_regs)
                if const_expr(self.shape.gather):
                    self.gather(
                        mQ, mK_rows, mV_rows, sQ, sK, sV, mPageTable, tma_atom_Q, pipe_q,
                        pipe_k, pipe_v, tidx, warp_idx, q_start, head, head_kv, batch, m_block,
                        seqlen_k, n_block_min, n_block_max,
                    )  # fmt: skip
                else:
                    if warp_idx == 0:
                        self.load(
                            mQ, mK, mV, sQ, sK, sV, mPageTable, tma_atom_Q, tma_atom_K,
                            tma_atom_V, pipe_q, pipe_k, pipe_v, q_start, head, head_kv, batch,
                            m_block, n_block_min, n_block_max,
                        )  # fmt: skip
            else:
                cute.arch.setmaxregister_increase(self.consumer_regs)
                self.attend(
                    mO_rows, mSinks, sQ, sK, sV, tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k,
                    pipe_v, tidx - WARPGROUP, softmax_scale, scale_log2, q_start, seqlen_q,
                    seqlen_k, head, m_block, n_block_min, n_block_max, mQ_rows, mLSE_rows,
                    sQScale, sV16, v_scale, write_lse, mTree,
                )  # fmt: skip

    @cute.jit
    def key_blocks(self, m_block: Int32, seqlen_q: Int32, seqlen_k: Int32):
        """[n_block_min, n_block_max): the key tiles some row of this query tile sees."""
        shape = self.shape
        offset = seqlen_k - seqlen_q  # position of query row 0
        n_block_max = (seqlen_k + self.tile_n - 1) // self.tile_n
        if const_expr(shape.causal):
            last_key = cutlass.min((m_block + 1) * self.rows_tok + offset, seqlen_k)
            n_block_max = cutlass.max((last_key + self.tile_n - 1) // self.tile_n, 1)
        n_block_min = Int32(0)
        if const_expr(shape.window_left is not None):
            first_key = cutlass.max(m_block * self.rows_tok + offset - shape.window_left, 0)
            n_block_min = cutlass.min(first_key // self.tile_n, n_block_max - 1)
        return n_block_min, n_block_max

    # -- producer: TMA ----

    @cute.jit
    def load(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        sQ: cute.Tensor,
        sK: cute.Tensor,
        sV: cute.Tensor,
        mPageTable: Optional[cute.Tensor],
        tma_atom_Q: cute.CopyAtom,
        tma_atom_K: cute.CopyAtom,
        tma_atom_V: cute.CopyAtom,
        pipe_q: pipeline.PipelineAsync,
        pipe_k: pipeline.PipelineAsync,
        pipe_v: pipeline.PipelineAsync,
        q_start: Int32,
        head: Int32,
        head_kv: Int32,
        batch: Int32,
        m_block: Int32,
        n_block_min: Int32,
        n_block_max: Int32,
    ):
        d, dv = self.shape.head_dim, self.shape.v_head_dim
        # decode and packed GQA: the consumers copy the Q rows
        if const_expr(not self.shape.decode and self.pack == 1):
            gQ = cute.local_tile(
                cute.domain_offset((q_start, 0), mQ[None, None, head]),
                (self.tile_m, d),
                (m_block, 0),
            )
            tQsQ, tQgQ = cpasync.tma_partition(
                tma_atom_Q,
                0,
                cute.make_layout(1),
                cute.group_modes(sQ, 0, 2),
                cute.group_modes(gQ, 0, 2),
            )
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
            pipe_q.producer_acquire(q_state)
            cute.copy(tma_atom_Q, tQgQ, tQsQ, tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
        rows, ppt = self.shape.page_rows, self.shape.pages_per_tile
        if const_expr(self.shape.paged):  # (rows, D, page): one page per TMA copy
            gK = cute.local_tile(mK[None, None, head_kv, None], (rows, d), (0, 0, None))
            gV = cute.local_tile(mV[None, None, head_kv, None], (rows, dv), (0, 0, None))
        else:  # (tile_n, D, n_block) of this request's rows
            gK = cute.local_tile(
                cute.domain_offset((q_start, 0), mK[None, None, head_kv]),
                (self.tile_n, d),
                (None, 0),
            )
            gV = cute.local_tile(
                cute.domain_offset((q_start, 0), mV[None, None, head_kv]),
                (self.tile_n, dv),
                (None, 0),
            )
        # smem: (rows, D, (page of the tile, 1, stage))
        sK_pages = cute.group_modes(cute.flat_divide(sK, (rows, d)), 2, 5)
        sV_pages = cute.group_modes(cute.flat_divide(sV, (rows, dv)), 2, 5)
        tKsK, tKgK = cpasync.tma_partition(
            tma_atom_K,
            0,
            cute.make_layout(1),
            cute.group_modes(sK_pages, 0, 2),
            cute.group_modes(gK, 0, 2),
        )
        tVsV, tVgV = cpasync.tma_partition(
            tma_atom_V,
            0,
            cute.make_layout(1),
            cute.group_modes(sV_pages, 0, 2),
            cute.group_modes(gV, 0, 2),
        )
        last_page = Int32(0)
        if const_expr(self.shape.paged):
            last_page = mPageTable.shape[1] - 1  # table entries past it are never read

        state = pipeline.make_pipeline_state(
            pipeline.PipelineUserType.Producer, self.shape.num_stages
        )
        for i in cutlass.range(n_block_max - n_block_min, unroll=1):
            n_block = n_block_max - 1 - i
            # the tile's pages, looked up once for K and V, before the wait for a free stage
            pages = cute.make_rmem_tensor(cute.make_layout(ppt), Int32)
            for p in cutlass.range_constexpr(ppt):
                pages[p] = self.page_of(mPageTable, batch, n_block * ppt + p, last_page)
            pipe_k.producer_acquire(state)
            for p in cutlass.range_constexpr(ppt):
                cute.copy(
                    tma_atom_K,
                    tKgK[None, pages[p]],
                    tKsK[None, (p, 0, state.index)],
                    tma_bar_ptr=pipe_k.producer_get_barrier(state),
                )
            pipe_v.producer_acquire(state)
            for p in cutlass.range_constexpr(ppt):
                cute.copy(
                    tma_atom_V,
                    tVgV[None, pages[p]],
                    tVsV[None, (p, 0, state.index)],
                    tma_bar_ptr=pipe_v.producer_get_barrier(state),
                )
            state.advance()

    def row_token_head(self, m_block: Int32, row: Int32, head: Int32) -> tuple[Int32, Int32]:
        """Tile row -> (token of the request, query head). Packed GQA interleaves a kv head's
        ``pack`` query heads row by row, so a tile holds ``rows_tok`` tokens; unpacked,
        ``pack`` is 1 and the row is the token of ``head``."""
        return m_block * self.rows_tok + row // self.pack, head + row % self.pack

    @cute.jit
    def page_of(
        self, mPageTable: Optional[cute.Tensor], batch: Int32, j: Int32, last_page: Int32
    ) -> Int32:
        """Where key block j (of page_rows tokens) lives: its page (paged), else block j of
        the request's rows. Blocks past the table's width (the last tile's pages past the
        sequence) read its last entry: a TMA copy of any page stays in bounds (coordinates
        out of the cache are zero-filled), and those keys are masked."""
        src = j
        if const_expr(self.shape.paged):
            src = mPageTable[batch, cutlass.min(j, last_page)]
        return src

    # -- producer: cp.async gathers (pages smaller than GATHER_BELOW tokens) ----

    @cute.jit
    def gather(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        sQ: cute.Tensor,
        sK: cute.Tensor,
        sV: cute.Tensor,
        mPageTable: cute.Tensor,
        tma_atom_Q: cute.CopyAtom,
        pipe_q: pipeline.PipelineAsync,
        pipe_k: pipeline.PipelineAsync,
        pipe_v: pipeline.PipelineAsync,
        tidx: Int32,
        warp_idx: Int32,
        q_start: Int32,
        head: Int32,
        head_kv: Int32,
        batch: Int32,
        m_block: Int32,
        seqlen_k: Int32,
        n_block_min: Int32,
        n_block_max: Int32,
    ):
        """Q by TMA (first warp); each K and V tile row by row (:meth:`gather_tile`: thread
        t copies chunks of rows ``t // GATHER_LANES_PER_ROW`` + 32 r from each row's page),
        then arrives on the stage's mbarrier when its copies land
        (cp.async.mbarrier.arrive). Keys past the sequence read its last key (finite,
        masked), so no copy leaves the request's pages."""
        d = self.shape.head_dim
        # decode and packed GQA: the consumers copy the Q rows
        if const_expr(not self.shape.decode and self.pack == 1):
            if warp_idx == 0:
                gQ = cute.local_tile(
                    cute.domain_offset((q_start, 0), mQ[None, None, head]),
                    (self.tile_m, d),
                    (m_block, 0),
                )
                tQsQ, tQgQ = cpasync.tma_partition(
                    tma_atom_Q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                    cute.group_modes(gQ, 0, 2),
                )  # fmt: skip
                q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
                pipe_q.producer_acquire(q_state)
                cute.copy(tma_atom_Q, tQgQ, tQsQ, tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(), self.dtype, num_bits_per_copy=128)
        last_page = mPageTable.shape[1] - 1
        state = pipeline.make_pipeline_state(
            pipeline.PipelineUserType.Producer, self.shape.num_stages
        )
        row0, ps = tidx // GATHER_LANES_PER_ROW, self.shape.page_rows
        for i in cutlass.range(n_block_max - n_block_min, unroll=1):
            n_block = n_block_max - 1 - i
            # this thread's rows of the tile, looked up once for K and V before the wait for
            # a free stage: where each lives as one number, page * page_rows + row in the
            # page (a cache of < 2**31 token rows; held as two, keys and pages, they spilled
            # at 40 registers with pages of 8 tokens)
            slots = cute.make_rmem_tensor(cute.make_layout(self.gather_passes), Int32)
            for r in cutlass.range_constexpr(self.gather_passes):
                key = n_block * self.tile_n + r * self.gather_rows_per_pass + row0
                key = cutlass.min(key, seqlen_k - 1)  # past the end: the last key
                page = cutlass.min(key // ps, last_page)
                slots[r] = mPageTable[batch, page] * ps + key % ps
            pipe_k.producer_acquire(state)
            self.gather_tile(atom, mK, sK, slots, tidx, head_kv, state.index)
            pipe_k.producer_commit(state)
            pipe_v.producer_acquire(state)
            self.gather_tile(atom, mV, sV, slots, tidx, head_kv, state.index)
            pipe_v.producer_commit(state)
            state.advance()

    @cute.jit
    def gather_tile(
        self,
        atom: cute.CopyAtom,
        mX: cute.Tensor,
        sX: cute.Tensor,
        slots: cute.Tensor,
        tidx: Int32,
        head_kv: Int32,
        stage: Int32,
    ):
        """One tile of K or V (``mX``: [page_rows, D, Hkv, pages]) into stage ``stage``:
        GATHER_LANES_PER_ROW threads a row, each copying every GATHER_LANES_PER_ROW-th
        16-byte chunk of it (so a warp's copy covers whole 32-byte sectors), rows ``r *
        gather_rows_per_pass + tidx // GATHER_LANES_PER_ROW`` from ``slots[r]`` (page *
        page_rows + row in the page)."""
        row0, lane = tidx // GATHER_LANES_PER_ROW, tidx % GATHER_LANES_PER_ROW
        chunks = cute.size(sX, mode=[1]) // CHUNK
        ps = self.shape.page_rows
        for r in cutlass.range_constexpr(self.gather_passes):
            row = r * self.gather_rows_per_pass + row0
            key_row = mX[slots[r] % ps, None, head_kv, slots[r] // ps]
            for c in cutlass.range_constexpr(chunks // GATHER_LANES_PER_ROW):
                chunk = c * GATHER_LANES_PER_ROW + lane
                src = cute.local_tile(key_row, (CHUNK,), (chunk,))
                dst = cute.local_tile(sX[row, None, stage], (CHUNK,), (chunk,))
                cute.copy(atom, src, dst)

    @cute.jit
    def wait_kv(self, pipe: pipeline.PipelineAsync, state: pipeline.PipelineState):
        """Wait for a K or V stage; gathered stages were written through the generic proxy,
        so a proxy fence orders them before the wgmma (async proxy) reads them."""
        pipe.consumer_wait(state)
        if const_expr(self.shape.gather):
            cute.arch.fence_view_async_shared()

    # -- consumers: wgmma + online softmax ----

    @cute.jit
    def attend(
        self,
        mO: cute.Tensor,
        mSinks: Optional[cute.Tensor],
        sQ: cute.Tensor,
        sK: cute.Tensor,
        sV: cute.Tensor,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        pipe_q: pipeline.PipelineAsync,
        pipe_k: pipeline.PipelineAsync,
        pipe_v: pipeline.PipelineAsync,
        tidx: Int32,
        softmax_scale: Float32,
        scale_log2: Float32,
        q_start: Int32,
        seqlen_q: Int32,
        seqlen_k: Int32,
        head: Int32,
        m_block: Int32,
        n_block_min: Int32,
        n_block_max: Int32,
        mQ_rows: Optional[cute.Tensor] = None,  # decode: [group heads, D] of the request
        mLSE: Optional[cute.Tensor] = None,  # decode: [group heads] (mO: [group heads, Dv]);
        # prefill / extend: [T, Hq], written when write_lse != 0
        sQScale: Optional[cute.Tensor] = None,  # fp8 cache: 1 / q's part scale per row
        sV16: Optional[cute.Tensor] = None,  # fp8 cache: the converted V tile
        v_scale: Float32 = 1.0,  # fp8 cache: V's dequant scale, applied to the output
        write_lse: Int32 = 0,
        mTree: Optional[cute.Tensor] = None,  # draft trees: the request's mask bytes
    ):
        shape = self.shape
        wg = cute.arch.make_warp_uniform(tidx // WARPGROUP)
        thr_mma_qk = tiled_mma_qk.get_slice(tidx)
        thr_mma_pv = tiled_mma_pv.get_slice(tidx)
        wg_mma_qk = tiled_mma_qk.get_slice(wg * WARPGROUP)
        wg_mma_pv = tiled_mma_pv.get_slice(wg * WARPGROUP)
        tSrQ = wg_mma_qk.make_fragment_A(wg_mma_qk.partition_A(sQ))
        tSrK = wg_mma_qk.make_fragment_B(wg_mma_qk.partition_B(sK))
        if const_expr(shape.kv_fp8):  # PV reads the converted V tile (no stage mode)
            tOrV = wg_mma_pv.make_fragment_B(wg_mma_pv.partition_B(transpose_smem(sV16)))
        else:
            tOrV = wg_mma_pv.make_fragment_B(wg_mma_pv.partition_B(transpose_smem(sV)))
        tOrP = wg_mma_pv.make_fragment_A(wg_mma_pv.partition_shape_A((self.tile_m, self.tile_n)))
        acc_O = cute.make_rmem_tensor(
            tiled_mma_pv.partition_shape_C((self.tile_m, shape.v_head_dim)), Float32
        )
        acc_O.fill(0.0)
        acc_O_rc = rows_cols(acc_O)
        # (row, col) of each accumulator register of S, within the tile
        tScS = rows_cols(
            thr_mma_qk.partition_C(cute.make_identity_tensor((self.tile_m, self.tile_n)))
        )
        num_rows = cute.size(acc_O_rc, mode=[0])
        row_max = cute.make_rmem_tensor(num_rows, Float32)
        row_sum = cute.make_rmem_tensor(num_rows, Float32)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)
        offset = seqlen_k - seqlen_q

        if const_expr(shape.decode and shape.kv_fp8):
            self.load_q_rows_fp8(mQ_rows, sQ, sQScale, tidx)
        elif const_expr(shape.decode):
            self.load_q_rows(mQ_rows, sQ, tidx)
        elif const_expr(self.pack > 1):
            self.load_q_packed(mQ_rows, sQ, tidx, q_start, head, m_block, seqlen_q)
        else:
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
            pipe_q.consumer_wait(q_state)
        if const_expr(shape.overlap):
            loop = OverlapLoop(
                acc_O, tOrP, tSrQ, tSrK, tOrV, tScS, row_max, row_sum, None, tiled_mma_qk,
                tiled_mma_pv, pipe_k, pipe_v, softmax_scale, scale_log2, seqlen_k, offset,
                m_block, mTree, wg,
            )  # fmt: skip
            if const_expr(self.takes_turns):
                if wg == 0:  # the first turn is consumer 0's
                    cute.arch.barrier_arrive(
                        barrier_id=TURN_BARRIER, number_of_threads=2 * WARPGROUP
                    )
            self.mainloop_overlapped(loop, n_block_min, n_block_max)
        else:
            state = pipeline.make_pipeline_state(
                pipeline.PipelineUserType.Consumer, shape.num_stages
            )
            # the serial loop: S, softmax, then PV, per key tile
            for i in cutlass.range(n_block_max - n_block_min, unroll=1):
                n_block = n_block_max - 1 - i
                rows_valid = seqlen_k - n_block * self.tile_n
                # -- S = Q K^T ----
                acc_S = cute.make_rmem_tensor(
                    tiled_mma_qk.partition_shape_C((self.tile_m, self.tile_n)), Float32
                )
                if const_expr(shape.kv_fp8):  # e4m3 QK on the K stage; V converted meanwhile
                    self.wait_kv(pipe_k, state)
                    k_stage = tSrK[None, None, None, state.index]
                    wgmma_group(tiled_mma_qk, acc_S, tSrQ, k_stage, True, wait=-1)
                    self.wait_kv(pipe_v, state)
                    self.convert_tile(sV[None, None, state.index], sV16, tidx, rows_valid)
                    pipe_v.consumer_release(state)
                    warpgroup.wait_group(0)
                    pipe_k.consumer_release(state)
                    self.join_q_parts(acc_S, tScS, sQScale)
                else:
                    self.wait_kv(pipe_k, state)
                    wgmma_group(
                        tiled_mma_qk, acc_S, tSrQ, tSrK[None, None, None, state.index], True
                    )
                    pipe_k.consumer_release(state)
                acc_S_rc = rows_cols(acc_S)
                # -- score_mod: logit softcap ----
                if const_expr(shape.logit_softcap is not None):
                    cap = shape.logit_softcap
                    for j in cutlass.range_constexpr(cute.size(acc_S_rc)):
                        acc_S_rc[j] = cap * cute.math.tanh(
                            acc_S_rc[j] * (softmax_scale / cap), fastmath=True
                        )
                # -- mask_mod: key length, causal, window, draft tree ----
                if self.needs_mask(n_block, m_block, seqlen_k, offset):
                    self.apply_mask(acc_S_rc, tScS, n_block, m_block, seqlen_k, offset, mTree)
                # -- online softmax ----
                for r in cutlass.range_constexpr(num_rows):
                    s_row = acc_S_rc[r, None].load()
                    m_new = cute.arch.warp_reduction_max(
                        s_row.reduce(cute.ReductionOp.MAX, row_max[r], 0), threads_in_group=4
                    )
                    m_safe = m_new if m_new != -Float32.inf else Float32(0.0)
                    rescale = cute.math.exp2((row_max[r] - m_safe) * scale_log2, fastmath=True)
                    p_row = cute.math.exp2(s_row * scale_log2 - m_safe * scale_log2, fastmath=True)
                    row_sum[r] = row_sum[r] * rescale + p_row.reduce(cute.ReductionOp.ADD, 0.0, 0)
                    row_max[r] = m_new
                    acc_S_rc[r, None].store(p_row)
                    acc_O_rc[r, None].store(acc_O_rc[r, None].load() * rescale)
                # -- O += P V ----
                tOrP.store(mma_a(acc_S).load().to(self.mma_dtype))
                if const_expr(shape.kv_fp8):  # sV16 holds this tile's V
                    wgmma_group(tiled_mma_pv, acc_O, tOrP, tOrV, False)
                else:
                    self.wait_kv(pipe_v, state)
                    wgmma_group(
                        tiled_mma_pv, acc_O, tOrP, tOrV[None, None, None, state.index], False
                    )
                    pipe_v.consumer_release(state)
                state.advance()

        if const_expr(shape.decode):
            self.store_partial(acc_O, row_max, row_sum, thr_mma_pv, scale_log2, mO, mLSE, v_scale)
        else:
            self.epilogue(acc_O, row_max, row_sum, tiled_mma_pv, tidx, scale_log2, mO, sQ,
                          mSinks, q_start, seqlen_q, head, m_block, mLSE, write_lse)  # fmt: skip

    @cute.jit
    def epilogue(
        self,
        acc_O: cute.Tensor,
        row_max: cute.Tensor,
        row_sum: cute.Tensor,
        tiled_mma_pv: cute.TiledMma,
        tidx: Int32,
        scale_log2: Float32,
        mO: cute.Tensor,
        sQ: cute.Tensor,
        mSinks: Optional[cute.Tensor],
        q_start: Int32,
        seqlen_q: Int32,
        head: Int32,
        m_block: Int32,
        mLSE: cute.Tensor,
        write_lse: Int32,
    ):
        """Normalise O (sinks join the denominator) and write the rows this request has, and
        their natural-log LSE into mLSE [T, Hq] when write_lse != 0."""
        shape = self.shape
        thr_mma_pv = tiled_mma_pv.get_slice(tidx)
        acc_O_rc = rows_cols(acc_O)
        num_rows = cute.size(acc_O_rc, mode=[0])
        tOcO = rows_cols(
            thr_mma_pv.partition_C(cute.make_identity_tensor((self.tile_m, shape.v_head_dim)))
        )
        for r in cutlass.range_constexpr(num_rows):
            token, head_r = self.row_token_head(m_block, tOcO[r, 0][0], head)
            total = cute.arch.warp_reduction_sum(row_sum[r], threads_in_group=4)
            m_scaled = row_max[r] * scale_log2
            if const_expr(shape.sinks):
                sink = Float32(mSinks[head_r])
                if row_max[r] == -Float32.inf:
                    m_scaled = sink * LOG2_E
                total += cute.math.exp2(sink * LOG2_E - m_scaled, fastmath=True)
            inv = Float32(1.0) / total if total > 0.0 else Float32(0.0)
            acc_O_rc[r, None].store(acc_O_rc[r, None].load() * inv)
            if write_lse != 0:
                if token < seqlen_q and tOcO[r, 0][1] == 0:  # one thread of the row's quad
                    lse = -Float32.inf
                    if total > 0.0:
                        lse = (m_scaled + cute.math.log2(total, fastmath=True)) * LN2
                    mLSE[q_start + token, head_r] = lse
        tOrO = cute.make_rmem_tensor_like(acc_O, self.dtype)
        tOrO.store(acc_O.load().to(self.dtype))
        if const_expr(shape.staged_store):
            self.store_rows_staged(tOrO, tiled_mma_pv, tidx, mO, sQ, q_start, seqlen_q, head,
                                   m_block)  # fmt: skip
        else:
            tOrO_rc = rows_cols(tOrO)
            for r in cutlass.range_constexpr(num_rows):
                token, head_r = self.row_token_head(m_block, tOcO[r, 0][0], head)
                if token < seqlen_q:
                    for c in cutlass.range_constexpr(cute.size(tOrO_rc, mode=[1])):
                        mO[q_start + token, head_r, tOcO[r, c][1]] = tOrO_rc[r, c]

    @cute.jit
    def store_rows_staged(
        self,
        tOrO: cute.Tensor,
        tiled_mma_pv: cute.TiledMma,
        tidx: Int32,
        mO: cute.Tensor,
        sQ: cute.Tensor,
        q_start: Int32,
        seqlen_q: Int32,
        head: Int32,
        m_block: Int32,
    ):
        """O's rows through shared memory: the warpgroup's output fragment goes by stmatrix
        into its own rows of the Q tile (the first Dv columns; every MMA of this warpgroup
        that read them has completed, and the other warpgroups read only their own rows),
        then each thread stores whole 16-byte pieces of rows, so a warp writes 512
        contiguous bytes of a row pair where the fragment's 4-byte pieces half-filled 8 rows'
        sectors per instruction."""
        dv = self.shape.v_head_dim
        wg = cute.arch.make_warp_uniform(tidx // WARPGROUP)
        lane = tidx % WARPGROUP
        sO = cute.local_tile(sQ, (self.tile_m, dv), (0, 0))
        atom = cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype
        )
        thr_copy = cute.make_tiled_copy_C(atom, tiled_mma_pv).get_slice(tidx)
        cute.copy(atom, thr_copy.retile(tOrO), thr_copy.partition_D(sO))
        cute.arch.barrier(barrier_id=1 + wg, number_of_threads=WARPGROUP)
        chunks = dv // CHUNK
        for p in cutlass.range_constexpr((64 * chunks + WARPGROUP - 1) // WARPGROUP):
            piece = p * WARPGROUP + lane
            row, chunk = wg * 64 + piece // chunks, piece % chunks
            token, head_r = self.row_token_head(m_block, row, head)
            if piece < 64 * chunks and token < seqlen_q:
                src = cute.local_tile(sO[row, None], (CHUNK,), (chunk,))
                dst = cute.local_tile(mO[q_start + token, head_r, None], (CHUNK,), (chunk,))
                dst.store(src.load())

    @cute.jit
    def store_partial(
        self,
        acc_O: cute.Tensor,
        row_max: cute.Tensor,
        row_sum: cute.Tensor,
        thr_mma_pv: cute.TiledMma,
        scale_log2: Float32,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        v_scale: Float32,
    ):
        """Decode: this split's normalised output rows (fp32, times V's dequant scale) and
        their log-sum-exps (base 2, of the scaled scores; -inf when the split saw no key) for
        the combine."""
        shape = self.shape
        acc_O_rc = rows_cols(acc_O)
        tOcO = rows_cols(
            thr_mma_pv.partition_C(cute.make_identity_tensor((self.tile_m, shape.v_head_dim)))
        )
        for r in cutlass.range_constexpr(cute.size(acc_O_rc, mode=[0])):
            total = cute.arch.warp_reduction_sum(row_sum[r], threads_in_group=4)
            row = tOcO[r, 0][0]
            if const_expr(shape.kv_fp8):  # rows i < 8 of each 16 hold heads; the rest: dead
                head = Int32((row // 16) * 8 + row % 16)
                if row % 16 >= 8:
                    head = Int32(shape.decode_group)
                row = head
            if row < shape.decode_group:
                inv = Float32(0.0)
                lse = -Float32.inf
                if total > 0.0:
                    inv = v_scale / total
                    lse = row_max[r] * scale_log2 + cute.math.log2(total, fastmath=True)
                for c in cutlass.range_constexpr(cute.size(acc_O_rc, mode=[1])):
                    mO[row, tOcO[r, c][1]] = acc_O_rc[r, c] * inv
                if tOcO[r, 0][1] == 0:  # one thread of the row's quad
                    mLSE[row] = lse

    @cute.jit
    def join_q_parts(self, acc_S: cute.Tensor, tScS: cute.Tensor, sQScale: cute.Tensor):
        """fp8 cache: a thread's two accumulator rows (r and r + 8 of its warp's 16) hold
        one head's scores against q's high and low e4m3 parts (load_q_rows_fp8 put them
        there), each a separate fp32 sum over the head dim; add them, undo the part scale,
        and leave the low row at -inf (a dead row: no probability, never stored)."""
        acc_S_rc = rows_cols(acc_S)
        assert cute.size(acc_S_rc, mode=[0]) == 2, "rows r and r + 8 of one warp"
        inv = sQScale[tScS[0, 0][0]]
        for c in cutlass.range_constexpr(cute.size(acc_S_rc, mode=[1])):
            acc_S_rc[0, c] = (acc_S_rc[0, c] + acc_S_rc[1, c]) * inv
            acc_S_rc[1, c] = -Float32.inf

    @cute.jit
    def convert_tile(self, src: cute.Tensor, dst: cute.Tensor, tidx: Int32, rows_valid: Int32):
        """fp8 cache: the consumer warpgroup converts one (keys, D) fp8 tile in shared memory
        (as TMA wrote it) into the fp16 tile the wgmma reads, 16 elements (16 bytes) per
        thread and pass; rows from ``rows_valid`` on (slots past the sequence in its last
        page: stale, possibly NaN bytes) become zeros, so a masked key's zero probability
        never meets a NaN value. Barriers before (every warp's last wgmma read of ``dst`` is
        done) and after (all of ``dst`` written, and fenced for the async proxy)."""
        cute.arch.barrier(barrier_id=2, number_of_threads=WARPGROUP)
        convert_fp8_rows(src, dst, tidx, rows_valid, WARPGROUP, self.mma_dtype)
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=2, number_of_threads=WARPGROUP)

    @cute.jit
    def load_q_packed(
        self,
        mQ: cute.Tensor,
        sQ: cute.Tensor,
        tidx: Int32,
        q_start: Int32,
        head: Int32,
        m_block: Int32,
        seqlen_q: Int32,
    ):
        """Packed GQA: each consumer warpgroup copies its 64 rows of the Q tile (16-byte
        cp.async; ``mQ`` (T, D, Hq)): row r is token ``m_block * rows_tok + r // pack`` of
        the request and head ``head + r % pack``; rows past the request repeat its last
        token (never written). Then the proxy fence for wgmma and a warpgroup barrier."""
        wg = cute.arch.make_warp_uniform(tidx // WARPGROUP)
        lane = tidx % WARPGROUP
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(), self.dtype, num_bits_per_copy=128)
        chunks = self.shape.head_dim // CHUNK
        rows_per_pass = WARPGROUP // chunks
        row0, chunk = lane // chunks, lane % chunks
        for p in cutlass.range_constexpr(64 // rows_per_pass):
            row = wg * 64 + p * rows_per_pass + row0
            token, head_r = self.row_token_head(m_block, row, head)
            token = cutlass.min(token, seqlen_q - 1)
            src = cute.local_tile(mQ[q_start + token, None, head_r], (CHUNK,), (chunk,))
            cute.copy(atom, src, cute.local_tile(sQ[row, None], (CHUNK,), (chunk,)))
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=1 + wg, number_of_threads=WARPGROUP)

    @cute.jit
    def load_q_rows(self, mQ_rows: cute.Tensor, sQ: cute.Tensor, tidx: Int32):
        """Decode: the consumer warpgroup copies the group's query rows (16-byte cp.async)
        into the Q tile, row r = head r of the group; rows past the group repeat its last
        head (their outputs are never written). When the MMAs take another type (fp16 over
        an fp8 cache) the rows go through registers and are converted. Then the proxy fence
        for wgmma."""
        group = self.shape.decode_group
        convert = self.mma_dtype is not self.dtype
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(), self.dtype, num_bits_per_copy=128)
        chunks = self.shape.head_dim // CHUNK
        rows_per_pass = WARPGROUP // chunks
        row0, chunk = tidx // chunks, tidx % chunks
        for p in cutlass.range_constexpr(self.tile_m // rows_per_pass):
            row = p * rows_per_pass + row0
            src = cute.local_tile(mQ_rows[cutlass.min(row, group - 1), None], (CHUNK,), (chunk,))
            dst = cute.local_tile(sQ[row, None], (CHUNK,), (chunk,))
            if const_expr(convert):
                dst.store(src.load().to(self.mma_dtype))
            else:
                cute.copy(atom, src, dst)
        if const_expr(not convert):
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(0)
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=1, number_of_threads=WARPGROUP)

    @cute.jit
    def load_q_rows_fp8(
        self, mQ_rows: cute.Tensor, sQ: cute.Tensor, sQScale: cute.Tensor, tidx: Int32
    ):
        """Decode over an fp8 cache: the consumer warpgroup writes head j's query row (of
        the group; zeros past it) as two e4m3 parts of q * s, s a power of two per head
        that puts its largest magnitude at most at 448 (so scaling is exact): hi = e4m3(q s)
        at row 16 (j // 8) + j % 8 and lo = e4m3(q s - hi) at that row + 8, and 1 / s to
        sQScale at the first. Two parts hold a bf16 q to within about 2^-18 of its largest
        element (bench/experimental/fp8_qsplit_emulation.py). Then the proxy fence for
        wgmma."""
        group = self.shape.decode_group
        chunks = self.shape.head_dim // CHUNK  # threads a head (consecutive lanes)
        heads_per_pass = WARPGROUP // chunks
        head0, chunk = tidx // chunks, tidx % chunks
        for p in cutlass.range_constexpr(FP8_DECODE_MAX_GROUP // heads_per_pass):
            head = p * heads_per_pass + head0
            src = cute.local_tile(mQ_rows[cutlass.min(head, group - 1), None], (CHUNK,), (chunk,))
            x = src.load().to(Float32)
            live = Float32(1.0)
            if head >= group:
                live = Float32(0.0)
            x = x * live
            amax = Float32(0.0)
            for e in cutlass.range_constexpr(CHUNK):
                amax = cutlass.max(amax, cute.math.absf(x[e]))
            amax = cute.arch.warp_reduction_max(amax, threads_in_group=chunks)
            s = Float32(1.0)
            if amax > 0.0:
                s = cute.math.exp2(cute.math.floor(cute.math.log2(E4M3_MAX / amax)))
            y = x * s
            hi = y.to(cutlass.Float8E4M3FN)
            lo = (y - hi.to(Float32)).to(cutlass.Float8E4M3FN)
            row = (head // 8) * 16 + head % 8
            cute.local_tile(sQ[row, None], (CHUNK,), (chunk,)).store(hi)
            cute.local_tile(sQ[row + 8, None], (CHUNK,), (chunk,)).store(lo)
            if chunk == 0:
                sQScale[row] = Float32(1.0) / s
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=1, number_of_threads=WARPGROUP)

    @cute.jit
    def mainloop_overlapped(self, loop: OverlapLoop, n_block_min: Int32, n_block_max: Int32):
        """The serial loop's attention with S_j = Q K_j^T issued before O += P_{j-1} V_{j-1},
        O's rescale done while S_j's MMA runs (FA3's order) and S_j's score/mask/softmax while
        the PV runs; O and P_{j-1} (registers the PV reads) are touched only after it is
        waited for."""
        shape = self.shape
        num_rows = cute.size(rows_cols(loop.acc_O), mode=[0])
        loop = replace(loop, rescale=cute.make_rmem_tensor(num_rows, Float32))
        s_shape = loop.tiled_mma_qk.partition_shape_C((self.tile_m, self.tile_n))
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, shape.num_stages)
        # -- the first (newest) key tile: S, softmax, P; O is zero (its rescale: by 0) ----
        acc_S = cute.make_rmem_tensor(s_shape, Float32)
        self.wait_kv(loop.pipe_k, state)
        k_stage = loop.tSrK[None, None, None, state.index]
        self.turn(loop.wg, True)
        wgmma_group(loop.tiled_mma_qk, acc_S, loop.tSrQ, k_stage, True, -1)
        self.turn(loop.wg, False)
        warpgroup.wait_group(0)
        loop.pipe_k.consumer_release(state)
        self.scores_to_probs(acc_S, loop, n_block_max - 1, None)
        loop.tOrP.store(mma_a(acc_S).load().to(self.mma_dtype))
        state_v = state.clone()
        state.advance()
        # the other tiles, newest first, in three loops: [a_lo, top) and [n_block_min, b_lo)
        # hold the tiles some row masks (key length and causal diagonal; window edge), masked
        # without a test; [b_lo, a_lo) none. A loop body without a branch lets ptxas place the
        # wait for P V after the row maxima (it puts the wait at the top of a block; FA4's
        # loops are split alike)
        top = n_block_max - 1
        lo, hi = self.unmasked_blocks(loop.m_block, loop.seqlen_k, loop.offset)
        a_lo = cutlass.max(cutlass.min(hi, top), n_block_min)
        b_lo = cutlass.max(cutlass.min(lo, a_lo), n_block_min)
        for i in cutlass.range(top - a_lo, unroll=1):
            self.overlapped_tile(loop, state, state_v, top - 1 - i, True)
            state_v = state.clone()
            state.advance()
        for i in cutlass.range(a_lo - b_lo, unroll=1):
            self.overlapped_tile(loop, state, state_v, a_lo - 1 - i, False)
            state_v = state.clone()
            state.advance()
        for i in cutlass.range(b_lo - n_block_min, unroll=1):
            self.overlapped_tile(loop, state, state_v, b_lo - 1 - i, True)
            state_v = state.clone()
            state.advance()
        self.rescale_o(loop)
        self.wait_kv(loop.pipe_v, state_v)
        v_stage = loop.tOrV[None, None, None, state_v.index]
        self.turn(loop.wg, True)
        wgmma_group(loop.tiled_mma_pv, loop.acc_O, loop.tOrP, v_stage, False, -1)
        self.turn(loop.wg, False)
        warpgroup.wait_group(0)
        loop.pipe_v.consumer_release(state_v)

    @cute.jit
    def turn(self, wg: Int32, begin: cutlass.Constexpr[bool]):
        """Turns (``takes_turns``): consumer ``wg`` waits for its turn to issue wgmmas
        (``begin``), or passes it to the next consumer. Every consumer of a CTA takes the same
        number of turns (one per wgmma group of the overlapped loop, all on the same key
        tiles); the last grant, to consumer 0, is left unclaimed when the CTA exits."""
        if const_expr(self.takes_turns):
            if const_expr(begin):
                cute.arch.barrier(barrier_id=TURN_BARRIER + wg, number_of_threads=2 * WARPGROUP)
            else:
                nxt = wg + 1
                if nxt == self.num_consumers:
                    nxt = Int32(0)
                cute.arch.barrier_arrive(
                    barrier_id=TURN_BARRIER + nxt, number_of_threads=2 * WARPGROUP
                )

    @cute.jit
    def rescale_o(self, loop: OverlapLoop):
        """O's rows times ``loop.rescale`` (to the running maxima of the newest P), before the
        P V that adds to them."""
        acc_O_rc = rows_cols(loop.acc_O)
        for r in cutlass.range_constexpr(cute.size(acc_O_rc, mode=[0])):
            acc_O_rc[r, None].store(acc_O_rc[r, None].load() * loop.rescale[r])

    @cute.jit
    def overlapped_tile(
        self,
        loop: OverlapLoop,
        state: pipeline.PipelineState,
        state_v: pipeline.PipelineState,
        n_block: Int32,
        masked: cutlass.Constexpr[bool],
    ):
        """One step of the overlapped loop: S_j = Q K_j^T (K stage ``state``), O's rescale to
        P_{j-1}'s maxima while it runs, then O += P_{j-1} V_{j-1} (V stage ``state_v``); S_j's
        softmax while that PV runs, then P_j (O's rescale to its maxima waits for the next
        step, or the loop's last PV). ``masked``: apply the mask to S_j (no test)."""
        acc_S = cute.make_rmem_tensor(
            loop.tiled_mma_qk.partition_shape_C((self.tile_m, self.tile_n)), Float32
        )
        self.wait_kv(loop.pipe_k, state)
        k_stage = loop.tSrK[None, None, None, state.index]
        self.turn(loop.wg, True)
        wgmma_group(loop.tiled_mma_qk, acc_S, loop.tSrQ, k_stage, True, -1)
        self.rescale_o(loop)  # while S_j's MMA runs: O to the maxima of P_{j-1}
        self.wait_kv(loop.pipe_v, state_v)
        v_stage = loop.tOrV[None, None, None, state_v.index]
        wgmma_group(loop.tiled_mma_pv, loop.acc_O, loop.tOrP, v_stage, False, -1)
        self.turn(loop.wg, False)
        warpgroup.wait_group(1)
        loop.pipe_k.consumer_release(state)  # S_j is done (PV may still run)
        self.scores_to_probs(acc_S, loop, n_block, masked)
        warpgroup.wait_group(0)  # PV of the previous tile: O and P are free
        loop.pipe_v.consumer_release(state_v)
        loop.tOrP.store(mma_a(acc_S).load().to(self.mma_dtype))

    @cute.jit
    def unmasked_blocks(self, m_block: Int32, seqlen_k: Int32, offset: Int32):
        """[lo, hi): the key tiles no row of the query tile masks (``needs_mask`` is false
        for exactly these): keys below seqlen_k, at or left of the first row's diagonal
        (causal), at or right of the last row's window edge (sliding window), before the
        drafts (draft tree)."""
        shape = self.shape
        hi = seqlen_k // self.tile_n
        if const_expr(shape.causal):
            hi = cutlass.min(hi, (m_block * self.rows_tok + offset + 1) // self.tile_n)
        if const_expr(shape.tree):
            hi = cutlass.min(hi, offset // self.tile_n)
        lo = Int32(0)
        if const_expr(shape.window_left is not None):
            edge = (m_block + 1) * self.rows_tok - 1 + offset - shape.window_left
            lo = (cutlass.max(edge, 0) + self.tile_n - 1) // self.tile_n
        return lo, hi

    @cute.jit
    def scores_to_probs(
        self,
        acc_S: cute.Tensor,
        loop: OverlapLoop,
        n_block: Int32,
        masked: cutlass.Constexpr = None,
    ):
        """score_mod, mask_mod and the online-softmax update of one key tile, in place (S
        becomes unnormalised P); ``loop.rescale[r]`` is what row r of O must be multiplied
        by. ``masked``: None tests whether the tile needs the mask, True / False apply it or
        not."""
        shape = self.shape
        acc_S_rc = rows_cols(acc_S)
        row_max, row_sum, rescale = loop.row_max, loop.row_sum, loop.rescale
        scale_log2 = loop.scale_log2
        if const_expr(shape.logit_softcap is not None):
            cap = shape.logit_softcap
            for j in cutlass.range_constexpr(cute.size(acc_S_rc)):
                acc_S_rc[j] = cap * cute.math.tanh(
                    acc_S_rc[j] * (loop.softmax_scale / cap), fastmath=True
                )
        where = (n_block, loop.m_block, loop.seqlen_k, loop.offset)
        if const_expr(masked is None):
            if self.needs_mask(*where):
                self.apply_mask(acc_S_rc, loop.tScS, *where, loop.mTree)
        elif const_expr(masked):
            self.apply_mask(acc_S_rc, loop.tScS, *where, loop.mTree)
        for r in cutlass.range_constexpr(cute.size(row_max)):
            s_row = acc_S_rc[r, None].load()
            # a Float32 reduces over the quad with fmax (FMNMX), not compare-and-select
            m_new = cute.arch.warp_reduction_max(
                Float32(s_row.reduce(cute.ReductionOp.MAX, row_max[r], 0)), threads_in_group=4
            )
            m_safe = m_new if m_new != -Float32.inf else Float32(0.0)
            rescale[r] = cute.math.exp2((row_max[r] - m_safe) * scale_log2, fastmath=True)
            p_row = cute.math.exp2(s_row * scale_log2 - m_safe * scale_log2, fastmath=True)
            row_sum[r] = row_sum[r] * rescale[r] + p_row.reduce(cute.ReductionOp.ADD, 0.0, 0)
            row_max[r] = m_new
            acc_S_rc[r, None].store(p_row)

    @cute.jit
    def needs_mask(self, n_block: Int32, m_block: Int32, seqlen_k: Int32, offset: Int32):
        """Whether some key of this tile is hidden from some row of the query tile."""
        shape = self.shape
        first_key, end_key = n_block * self.tile_n, (n_block + 1) * self.tile_n
        need = end_key > seqlen_k
        if const_expr(shape.causal):
            need = need or end_key - 1 > m_block * self.rows_tok + offset
        if const_expr(shape.tree):  # the tile reaches the drafts
            need = need or end_key > offset
        if const_expr(shape.window_left is not None):
            need = (
                need or first_key < (m_block + 1) * self.rows_tok - 1 + offset - shape.window_left
            )
        return need

    @cute.jit
    def apply_mask(
        self,
        acc_S_rc: cute.Tensor,
        tScS: cute.Tensor,
        n_block: Int32,
        m_block: Int32,
        seqlen_k: Int32,
        offset: Int32,
        mTree: Optional[cute.Tensor] = None,
    ):
        """-inf where a row may not see a key: past seqlen_k, right of the row's position
        (causal), left of its window, or (draft tree) a draft its tree mask hides."""
        shape = self.shape
        for r in cutlass.range_constexpr(cute.size(acc_S_rc, mode=[0])):
            row = tScS[r, 0][0]
            if const_expr(shape.decode):
                row = 0  # every row is a head of the request's one query token
            pos = self.row_token_head(m_block, row, 0)[0] + offset  # its query position
            key_end = seqlen_k
            if const_expr(shape.causal):
                key_end = cutlass.min(pos + 1, seqlen_k)
            key_start = Int32(0)
            if const_expr(shape.window_left is not None):
                key_start = pos - shape.window_left
            if const_expr(shape.tree):  # the row's draft (rows past the request: its last)
                drafts = seqlen_k - offset
                draft = cutlass.min(pos - offset, drafts - 1)
            for c in cutlass.range_constexpr(cute.size(acc_S_rc, mode=[1])):
                key = n_block * self.tile_n + tScS[r, c][1]
                if key >= key_end or key < key_start:
                    acc_S_rc[r, c] = -Float32.inf
                if const_expr(shape.tree):
                    if key >= offset and key < seqlen_k:
                        bit = draft * drafts + key - offset
                        if (Int32(mTree[bit // 8]) >> (bit % 8)) & 1 == 0:
                            acc_S_rc[r, c] = -Float32.inf


KERNEL = MhaFwdSm90  # what host/compile.py builds for sm90
