"""MHA / GQA forward (prefill and extend) on Blackwell: TMA loads, tcgen05 MMA into tensor
memory, warp-specialized. COMPILE-ONLY so far: it builds for sm_100a on CPU (the AOT check
proves tcgen05 and bulk tensor copies are in it) but has not run on a B200; its numerics
are unverified and the support matrix says "compiles", never "verified".

One CTA computes one (query tile of 128 rows, query head, request), newest key tile first,
with the same layouts, mask and hooks as the Hopper kernel (kernels/fwd_sm90.py).

Warp roles (6 warps, 192 threads):

- warps 0-3, **softmax**: thread ``t`` owns query row ``t`` (TMEM lane ``t``). Per key tile it
  loads its row of S from tensor memory, applies score_mod and mask_mod, updates its
  running max and sum (no cross-thread reduction: a row is one thread's), rescales its row
  of O in tensor memory, and writes its row of P (bf16/fp16) to shared memory. At the end it
  normalises O and writes it to global memory.
- warp 4, **MMA**: allocates tensor memory (S: ``tile_n`` fp32 columns, O: ``Dv`` columns) and
  issues S = Q K^T and O += P V (tcgen05, one CTA, all operands in shared memory).
- warp 5, **load**: TMA of Q once and of each K and V tile into a ``num_stages`` ring (paged:
  a tile out of a page of 64 / 128 tokens, or one copy per page of 16 / 32 tokens; pages of
  fewer tokens: rows gathered with 16-byte cp.async copies, waited for and fenced into the
  async proxy before the stage's barrier arrive).

Order per key tile j (mbarrier pipelines): load K_j, V_j -> MMA S_j (after softmax released
S_{j-1}) -> softmax reads S_j, waits for PV_{j-1}, rescales O, writes P_j -> MMA PV_j. The
tiles are serialized (no S/P double buffering yet): the simplest correct order.
"""

from __future__ import annotations

from typing import Optional

import cuda.bindings.driver as cuda
import cutlass
import cutlass.memory
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.blackwell_helpers as sm100
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, tcgen05
from cutlass.experimental.primitives.nvvm_wrapper import tcgen05_fence

from attngen.families.mha.cute_dsl.kernels.common import (
    DTYPES,
    KV_DTYPES,
    LN2,
    LOG2_E,
    SMEM_ALIGN,
    FP8_VECTOR,
    FwdShape,
    convert_fp8_rows,
    mode_select,
    page_slice,
    rows_aligned,
    smem_layout,
    split_blocks,
)
from attngen.families.mha.cute_dsl.kernels.fragments import transpose_smem

SOFTMAX_WARPS = 4  # warps 0..3: one thread per query row
MMA_WARP = 4
LOAD_WARP = 5
NUM_THREADS = 32 * 6
SM_TMEM_COLS = 512  # an SM's tensor memory: 128 lanes x 512 fp32 columns
O_CHUNK = 32  # O columns per tensor-memory load / store of a softmax thread
TMEM_BARRIER_ID = 1  # named barrier of the softmax warps and the MMA warp (TMEM alloc/free)
# What the design relies on: tcgen05 MMA and tensor-memory loads, bulk tensor copies (TMA).
REQUIRES = {
    "ptx": ("tcgen05.mma", "tcgen05.ld", "cp.async.bulk.tensor"),
    "sass": ("UTCHMMA", "UTMALDG"),
}
# gathered K/V: 16-byte cp.async copies, and the proxy fence before the MMA reads them
GATHER_REQUIRES = ("cp.async.ca.shared.global", "fence.proxy.async")
CHUNK = 8  # elements per cp.async of a gathered row (16 bytes)
# an fp8 e4m3 cache (decode): Q K^T on e4m3 MMAs (kind::f8f6f4) straight on the TMA-written K
# stages, q as two e4m3 parts; the softmax warps convert each V stage to fp16 for P V
FP8_REQUIRES = ("kind::f8f6f4", "cvt.rn.f16x2.e4m3x2")
E4M3_MAX = 448.0


def requires(shape: FwdShape) -> dict[str, tuple[str, ...]]:
    """Instructions the compiled kernel of ``shape`` must contain (PTX, SASS)."""
    if shape.gather:
        return {**REQUIRES, "ptx": REQUIRES["ptx"] + GATHER_REQUIRES}
    if shape.kv_fp8:
        return {**REQUIRES, "ptx": REQUIRES["ptx"] + FP8_REQUIRES}
    return REQUIRES


def tmem_cols(shape: FwdShape) -> int:
    """Tensor-memory columns one CTA allocates: S (tile_n) + O (Dv) fp32 columns, rounded up
    to a power of two >= 32 (tcgen05.alloc's unit); d 256 takes all 512 of the SM's."""
    cols = 32
    while cols < shape.tile_n + shape.v_head_dim:
        cols *= 2
    return cols


def shared_bytes(shape: FwdShape) -> int:
    """Dynamic shared memory of one CTA: barriers (padded to SMEM_ALIGN), the Q and P tiles
    and ``num_stages`` K and V tiles; checked at compile time. Over an fp8 cache: Q as two
    e4m3 parts, the K and V stages in e4m3, and one V tile converted to fp16."""
    elem = 2  # bf16 / fp16
    q_p = shape.tile_m * (shape.head_dim + shape.tile_n) * elem  # two e4m3 parts: Q's bytes
    kv = shape.num_stages * shape.tile_n * (shape.head_dim + shape.v_head_dim)
    converted = shape.tile_n * shape.v_head_dim * elem if shape.kv_fp8 else 0
    return SMEM_ALIGN + q_p + kv * shape.kv_elem_bytes + converted


@cute.jit
def _umma(
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    t_a: cute.Tensor,
    t_b: cute.Tensor,
    accumulate: cutlass.Boolean,
):
    """acc (+)= A B over the k blocks of the fragments (tcgen05; completion via commit)."""
    atom = cute.make_mma_atom(tiled_mma.op)  # a fresh atom: its ACCUMULATE field is set here
    for k in cutlass.range_constexpr(cute.size(t_a.shape[2])):
        atom.set(tcgen05.Field.ACCUMULATE, accumulate if k == 0 else True)
        cute.gemm(atom, acc, t_a[None, None, k], t_b[None, None, k], acc)


class MhaFwdSm100:
    """The kernel of one :class:`FwdShape` for sm_100a; ``cute.compile(obj, ...)`` builds it."""

    def __init__(self, shape: FwdShape):
        assert shape.tile_m == 32 * SOFTMAX_WARPS, "one softmax thread per query row"
        assert tmem_cols(shape) <= SM_TMEM_COLS, "S and O share the SM's tensor memory"
        self.shape = shape
        self.dtype = DTYPES[shape.dtype]
        self.kv_dtype = KV_DTYPES[shape.kv_dtype or shape.dtype]
        # over an fp8 cache: Q K^T on e4m3 (q's two parts against the K stages as TMA wrote
        # them) and P V on fp16 (V converted in shared memory, P in [0, 1] loses nothing)
        self.qk_dtype = cutlass.Float8E4M3FN if shape.kv_fp8 else self.dtype
        self.mma_dtype = cutlass.Float16 if shape.kv_fp8 else self.dtype
        if shape.kv_fp8:  # the softmax warps write Q and convert V: whole-page TMA tiles
            assert shape.decode and not shape.gather and not shape.sinks
        self.tile_m, self.tile_n = shape.tile_m, shape.tile_n

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
        mQ = mode_select(mQ, [0, 2, 1])  # (T, D, H): TMA tiles the first two modes
        kv_modes = [1, 3, 2, 0] if const_expr(shape.paged) else [0, 2, 1]
        mK, mV = mode_select(mK, kv_modes), mode_select(mV, kv_modes)
        tma, layouts, mmas, SharedStorage = self.setup(mQ, mK, mV)
        num_m_blocks = (max_seqlen_q + self.tile_m - 1) // self.tile_m
        grid = (num_m_blocks, cute.size(mQ.shape[2]), cute.size(mCuSeqlensQ.shape[0]) - 1)
        self.kernel(
            tma[0], tma[1], tma[2], mK, mV, mO, mCuSeqlensQ, mPrefixLens, mPageTable, mSinks,
            None, mLSE, None, None, mTreeMask, mTreeIndptr, *tma[3:], softmax_scale,
            self.scale_log2(softmax_scale), write_lse, *layouts, *mmas, SharedStorage,
        ).launch(
            grid=grid, block=[NUM_THREADS, 1, 1], smem=SharedStorage.size_in_bytes(),
            stream=stream,
        )  # fmt: skip

    def scale_log2(self, softmax_scale: Float32) -> Float32:
        """The factor of scores in exp2: exp(s * scale) = exp2(s * scale * log2(e))."""
        if const_expr(self.shape.logit_softcap is None):
            return softmax_scale * LOG2_E
        return Float32(LOG2_E)  # the capped scores are already scaled

    def setup(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor):
        """Shared-memory layouts, MMAs, TMA atoms and the shared storage of the (mode-selected)
        q, k and v tensors: (TMA tensors and atoms of Q, K, V), (sQ, sK, sV, sP layouts),
        (QK and PV tiled MMAs), SharedStorage."""
        shape = self.shape
        d, dv = shape.head_dim, shape.v_head_dim
        # over an fp8 cache, Q's two e4m3 parts as the layout's two "stages"
        sQ_layout = smem_layout(self.qk_dtype, self.tile_m, d, 2 if shape.kv_fp8 else None)
        sK_layout = smem_layout(self.kv_dtype, self.tile_n, d, shape.num_stages)
        sV_layout = smem_layout(self.kv_dtype, self.tile_n, dv, shape.num_stages)
        sP_layout = smem_layout(self.mma_dtype, self.tile_m, self.tile_n, None)
        tiled_mma_qk = sm100.make_trivial_tiled_mma(
            self.qk_dtype,
            self.qk_dtype,
            tcgen05.OperandMajorMode.K,
            tcgen05.OperandMajorMode.K,
            Float32,
            tcgen05.CtaGroup.ONE,
            (self.tile_m, self.tile_n),
        )
        tiled_mma_pv = sm100.make_trivial_tiled_mma(
            self.mma_dtype,
            self.mma_dtype,
            tcgen05.OperandMajorMode.K,
            tcgen05.OperandMajorMode.MN,
            Float32,
            tcgen05.CtaGroup.ONE,
            (self.tile_m, dv),
        )
        load = cpasync.CopyBulkTensorTileG2SOp()
        # Q's atom in q's own type (over an fp8 cache the softmax warps write sQ: unused)
        sQ_tma = smem_layout(self.dtype, self.tile_m, d, None)
        tma_atom_Q, tma_Q = cpasync.make_tiled_tma_atom(load, mQ, sQ_tma, (self.tile_m, d))
        sK_one, sV_one = (cute.select(s, mode=[0, 1]) for s in (sK_layout, sV_layout))
        rows = shape.page_rows  # rows of the tile one TMA copy fills (a page, or the tile)
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

        def tile(layout: cute.ComposedLayout, dtype: type) -> type:
            return cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(layout)], 1024]

        # built from a dict: this module's annotations are strings (PEP 563), and cute.struct
        # reads the class's __annotations__ as given
        members = {
            "mbar_q": cute.struct.MemRange[cutlass.Int64, 2],
            "mbar_k": cute.struct.MemRange[cutlass.Int64, 2 * stages],
            "mbar_v": cute.struct.MemRange[cutlass.Int64, 2 * stages],
            "mbar_s": cute.struct.MemRange[cutlass.Int64, 2],
            "mbar_p": cute.struct.MemRange[cutlass.Int64, 2],
            "tmem_holding_buf": Int32,
            "sQ": tile(sQ_layout, self.qk_dtype),
            "sK": tile(sK_layout, self.kv_dtype),
            "sV": tile(sV_layout, self.kv_dtype),
            "sP": tile(sP_layout, self.mma_dtype),
        }
        if const_expr(shape.kv_fp8):  # the converted V tile the P V MMA reads
            members["sV16"] = tile(smem_layout(self.mma_dtype, self.tile_n, dv, None),
                                   self.mma_dtype)  # fmt: skip
        SharedStorage = cute.struct(type("SharedStorage", (), {"__annotations__": members}))

        assert SharedStorage.size_in_bytes() == shared_bytes(shape), "shared_bytes() is stale"
        return (
            (tma_Q, tma_K, tma_V, tma_atom_Q, tma_atom_K, tma_atom_V),
            (sQ_layout, sK_layout, sV_layout, sP_layout),
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
        mLSE: cute.Tensor,  # [T, Hq] fp32, written when write_lse != 0; decode: [B, Hq,
        # max_splits] fp32 base-2 log-sum-exps of the splits (mO: [B, Hq, max_splits, Dv])
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
        sP_layout: cute.ComposedLayout,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        shape = self.shape
        if const_expr(shape.decode):  # (split, kv head, request); mCuSeqlensQ: seq_lens
            split, head_kv, batch = cute.arch.block_idx()
            m_block, seqlen_q = Int32(0), Int32(1)
            seqlen_k = mCuSeqlensQ[batch]
            head = head_kv * shape.decode_group  # the group's first query head
            # the Q tile: rows head .. head + tile_m of mQ (Hq, D, B) at this request
            q_row, q_slice = head, batch
        else:
            m_block_rev, head, batch = cute.arch.block_idx()
            num_m_blocks, num_heads, _ = cute.arch.grid_dim()
            m_block = num_m_blocks - 1 - m_block_rev  # longest (causal: last) query tiles first
            q_start = mCuSeqlensQ[batch]
            seqlen_q = mCuSeqlensQ[batch + 1] - q_start
            seqlen_k = seqlen_q
            if const_expr(mPrefixLens is not None):
                seqlen_k = seqlen_q + mPrefixLens[batch]
            head_kv = head // (num_heads // mK.shape[2])
            q_row, q_slice = q_start, head  # the Q tile: rows of mQ (T, D, Hq) at this head

        if warp_idx == LOAD_WARP:
            for atom in (tma_atom_Q, tma_atom_K, tma_atom_V):
                cpasync.prefetch_descriptor(atom)
        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        one = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        rows = pipeline.CooperativeGroup(pipeline.Agent.Thread, 32 * SOFTMAX_WARPS)
        stages = self.shape.num_stages
        if const_expr(shape.kv_fp8):  # the softmax warps write Q's e4m3 parts
            pipe_q = pipeline.PipelineAsyncUmma.create(
                num_stages=1, producer_group=rows, consumer_group=one,
                barrier_storage=storage.mbar_q.data_ptr(), defer_sync=True,
            )  # fmt: skip
        else:
            pipe_q = pipeline.PipelineTmaUmma.create(
                num_stages=1, producer_group=one, consumer_group=one, tx_count=self.tx_bytes_q,
                barrier_storage=storage.mbar_q.data_ptr(), defer_sync=True,
            )  # fmt: skip
        if const_expr(self.shape.gather):  # the load warp's 32 threads arrive after copying
            lanes = pipeline.CooperativeGroup(pipeline.Agent.Thread, 32)
            pipe_k = pipeline.PipelineAsyncUmma.create(
                num_stages=stages, producer_group=lanes, consumer_group=one,
                barrier_storage=storage.mbar_k.data_ptr(), defer_sync=True,
            )  # fmt: skip
            pipe_v = pipeline.PipelineAsyncUmma.create(
                num_stages=stages, producer_group=lanes, consumer_group=one,
                barrier_storage=storage.mbar_v.data_ptr(), defer_sync=True,
            )  # fmt: skip
        else:
            # TMA stages the MMA warp reads; over an fp8 cache the softmax warps read the V
            # stages (they convert them; one arrive a warp releases a stage)
            v_kind, v_readers = pipeline.PipelineTmaUmma, one
            if const_expr(shape.kv_fp8):
                v_kind = pipeline.PipelineTmaAsync
                v_readers = pipeline.CooperativeGroup(pipeline.Agent.Thread, SOFTMAX_WARPS)
            pipe_k, pipe_v = (
                kind.create(
                    num_stages=stages, producer_group=one, consumer_group=readers,
                    tx_count=tx, barrier_storage=bar.data_ptr(), defer_sync=True,
                )
                for kind, readers, tx, bar in (
                    (pipeline.PipelineTmaUmma, one, self.tx_bytes_k, storage.mbar_k),
                    (v_kind, v_readers, self.tx_bytes_v, storage.mbar_v),
                )
            )  # fmt: skip
        # S ready (MMA -> softmax) and P ready / PV done (softmax <-> MMA)
        pipe_s = pipeline.PipelineUmmaAsync.create(
            num_stages=1, producer_group=one, consumer_group=rows,
            barrier_storage=storage.mbar_s.data_ptr(), defer_sync=True,
        )  # fmt: skip
        pipe_p = pipeline.PipelineAsyncUmma.create(
            num_stages=1, producer_group=rows, consumer_group=one,
            barrier_storage=storage.mbar_p.data_ptr(), defer_sync=True,
        )  # fmt: skip
        cute.arch.mbarrier_init_fence()
        cute.arch.barrier()

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sP = storage.sP.get_tensor(sP_layout.outer, swizzle=sP_layout.inner)
        sV16, v_scale = None, Float32(1.0)
        if const_expr(shape.kv_fp8):
            sV16_layout = smem_layout(self.mma_dtype, self.tile_n, shape.v_head_dim, None)
            sV16 = storage.sV16.get_tensor(sV16_layout.outer, swizzle=sV16_layout.inner)
            # exp(s * k_scale * scale): K's scale folds into the softmax scale (and into the
            # softcap's argument); V's into the output
            k_scale, v_scale = Float32(mKScale[0]), Float32(mVScale[0])
            softmax_scale = softmax_scale * k_scale
            if const_expr(shape.logit_softcap is None):
                scale_log2 = scale_log2 * k_scale
        tmem = cutlass.memory.TmemAllocator(
            storage.tmem_holding_buf.ptr,
            barrier_for_retrieve=pipeline.NamedBarrier(
                barrier_id=TMEM_BARRIER_ID, num_threads=32 * (SOFTMAX_WARPS + 1)
            ),
            allocator_warp_id=MMA_WARP,
        )
        # TMEM views: S in columns [0, tile_n), O in [tile_n, tile_n + Dv)
        tStS_shape = tiled_mma_qk.partition_shape_C((self.tile_m, self.tile_n))
        tOtO_shape = tiled_mma_pv.partition_shape_C((self.tile_m, self.shape.v_head_dim))
        tStS_fake = tiled_mma_qk.make_fragment_C(tStS_shape)
        tOtO_fake = tiled_mma_pv.make_fragment_C(tOtO_shape)

        n_block_min, n_block_max = self.key_blocks(m_block, seqlen_q, seqlen_k)
        active = m_block * self.tile_m < seqlen_q
        mO_rows, mLSE_rows, mTree = mO, mLSE, None
        if const_expr(shape.tree):  # the request's seqlen_q x seqlen_q bits
            mTree = cute.domain_offset((mTreeIndptr[batch],), mTreeMask)
        if const_expr(shape.decode):
            num_splits = cutlass.max(cutlass.min(mNumSplits[batch], mLSE.shape[2]), 1)
            active = split < num_splits
            n_block_min, n_block_max = split_blocks(
                split, num_splits, n_block_min, n_block_max, seqlen_k, self.tile_n
            )
            mO_rows = cute.domain_offset((head, 0), mO[batch, None, split, None])
            mLSE_rows = cute.domain_offset((head,), mLSE[batch, None, split])
        if active:
            if warp_idx == LOAD_WARP:
                if const_expr(self.shape.gather):
                    self.load_gathered(
                        mQ, mK_rows, mV_rows, sQ, sK, sV, mPageTable, tma_atom_Q, pipe_q,
                        pipe_k, pipe_v, q_row, q_slice, head_kv, batch, m_block, seqlen_k,
                        n_block_min, n_block_max,
                    )  # fmt: skip
                elif const_expr(self.shape.pages_per_tile > 1):
                    self.load_pages(
                        mQ, mK, mV, sQ, sK, sV, mPageTable, tma_atom_Q, tma_atom_K, tma_atom_V,
                        pipe_q, pipe_k, pipe_v, q_row, q_slice, head_kv, batch, m_block,
                        n_block_min, n_block_max,
                    )  # fmt: skip
                else:
                    self.load(
                        mQ, mK, mV, sQ, sK, sV, mPageTable, tma_atom_Q, tma_atom_K, tma_atom_V,
                        pipe_q, pipe_k, pipe_v, q_row, q_slice, head_kv, batch, m_block,
                        n_block_min, n_block_max,
                    )  # fmt: skip
            if warp_idx == MMA_WARP:
                tmem.allocate(tmem_cols(self.shape))
                tmem.wait_for_alloc()
                tmem_ptr = tmem.retrieve_ptr(Float32)
                tStS = cute.make_tensor(tmem_ptr, tStS_fake.layout)
                tOtO = cute.make_tensor(tmem_ptr + self.tile_n, tOtO_fake.layout)
                self.mma(
                    tiled_mma_qk, tiled_mma_pv, sQ, sK, sV, sP, tStS, tOtO,
                    pipe_q, pipe_k, pipe_v, pipe_s, pipe_p, n_block_max - n_block_min, sV16,
                )  # fmt: skip
                tmem.relinquish_alloc_permit()
                tmem.wait_for_alloc()  # the softmax warps are done with tensor memory
                tcgen05_fence("after_thread_sync")
                tmem.free(tmem_ptr)
            if warp_idx < SOFTMAX_WARPS:
                tmem.wait_for_alloc()
                tmem_ptr = tmem.retrieve_ptr(Float32)
                tStS = cute.make_tensor(tmem_ptr, tStS_fake.layout)
                tOtO = cute.make_tensor(tmem_ptr + self.tile_n, tOtO_fake.layout)
                q_inv = Float32(1.0)  # over an fp8 cache: 1 / the row's q part scale
                if const_expr(shape.kv_fp8):  # Q's e4m3 parts, for the MMA warp
                    q_inv = self.write_q_parts(mQ, sQ, pipe_q, tidx, head, batch)
                self.softmax(
                    mO_rows, mSinks, sP, tStS, tOtO, tiled_mma_qk, tiled_mma_pv, pipe_s, pipe_p,
                    tidx, softmax_scale, scale_log2, q_row, seqlen_q, seqlen_k, head, m_block,
                    n_block_min, n_block_max, mLSE_rows, write_lse, sV, sV16, pipe_v, q_inv,
                    v_scale, mTree,
                )  # fmt: skip
                tcgen05_fence("before_thread_sync")  # the last O loads are complete
                tmem.wait_for_alloc()  # tell the MMA warp tensor memory may be freed

    @cute.jit
    def key_blocks(self, m_block: Int32, seqlen_q: Int32, seqlen_k: Int32):
        """[n_block_min, n_block_max): the key tiles some row of this query tile sees."""
        shape = self.shape
        offset = seqlen_k - seqlen_q
        n_block_max = (seqlen_k + self.tile_n - 1) // self.tile_n
        if const_expr(shape.causal):
            last_key = cutlass.min((m_block + 1) * self.tile_m + offset, seqlen_k)
            n_block_max = cutlass.max((last_key + self.tile_n - 1) // self.tile_n, 1)
        n_block_min = Int32(0)
        if const_expr(shape.window_left is not None):
            first_key = cutlass.max(m_block * self.tile_m + offset - shape.window_left, 0)
            n_block_min = cutlass.min(first_key // self.tile_n, n_block_max - 1)
        return n_block_min, n_block_max

    # -- load warp: TMA ----

    @cute.jit
    def load_q(
        self,
        mQ: cute.Tensor,
        sQ: cute.Tensor,
        tma_atom_Q: cute.CopyAtom,
        pipe_q: pipeline.PipelineAsync,
        q_start: Int32,
        head: Int32,
        m_block: Int32,
    ):
        """The Q tile by TMA (over an fp8 cache the softmax warps write it instead)."""
        if const_expr(not self.shape.kv_fp8):
            gQ = cute.local_tile(
                cute.domain_offset((q_start, 0), mQ[None, None, head]),
                (self.tile_m, self.shape.head_dim),
                (m_block, 0),
            )
            tQsQ, tQgQ = cpasync.tma_partition(
                tma_atom_Q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                cute.group_modes(gQ, 0, 2),
            )  # fmt: skip
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
            pipe_q.producer_acquire(q_state)
            cute.copy(tma_atom_Q, tQgQ, tQsQ, tma_bar_ptr=pipe_q.producer_get_barrier(q_state))

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
        if const_expr(self.shape.paged):  # (tile_n, D, tile in page, page)
            gK = cute.local_tile(mK[None, None, head_kv, None], (self.tile_n, d), (None, 0, None))
            gV = cute.local_tile(mV[None, None, head_kv, None], (self.tile_n, dv), (None, 0, None))
        else:  # (tile_n, D, n_block) of this request's rows
            mK_b = cute.domain_offset((q_start, 0), mK[None, None, head_kv])
            mV_b = cute.domain_offset((q_start, 0), mV[None, None, head_kv])
            gK = cute.local_tile(mK_b, (self.tile_n, d), (None, 0))
            gV = cute.local_tile(mV_b, (self.tile_n, dv), (None, 0))
        tKsK, tKgK = cpasync.tma_partition(
            tma_atom_K, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2)
        )  # fmt: skip
        tVsV, tVgV = cpasync.tma_partition(
            tma_atom_V, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2)
        )  # fmt: skip
        self.load_q(mQ, sQ, tma_atom_Q, pipe_q, q_start, head, m_block)
        state = pipeline.make_pipeline_state(
            pipeline.PipelineUserType.Producer, self.shape.num_stages
        )
        tiles_per_page = 1
        if const_expr(self.shape.paged):
            tiles_per_page = mK.shape[0] // self.tile_n  # page_size is a multiple of tile_n
        for i in cutlass.range(n_block_max - n_block_min, unroll=1):
            n_block = n_block_max - 1 - i
            pipe_k.producer_acquire(state)
            pipe_v.producer_acquire(state)
            bar_k, bar_v = pipe_k.producer_get_barrier(state), pipe_v.producer_get_barrier(state)
            sK_i, sV_i = tKsK[None, state.index], tVsV[None, state.index]
            if const_expr(self.shape.paged):
                sub = n_block % tiles_per_page
                page = mPageTable[batch, n_block // tiles_per_page]
                cute.copy(tma_atom_K, tKgK[None, sub, page], sK_i, tma_bar_ptr=bar_k)
                cute.copy(tma_atom_V, tVgV[None, sub, page], sV_i, tma_bar_ptr=bar_v)
            else:
                cute.copy(tma_atom_K, tKgK[None, n_block], sK_i, tma_bar_ptr=bar_k)
                cute.copy(tma_atom_V, tVgV[None, n_block], sV_i, tma_bar_ptr=bar_v)
            state.advance()

    @cute.jit
    def load_pages(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        sQ: cute.Tensor,
        sK: cute.Tensor,
        sV: cute.Tensor,
        mPageTable: cute.Tensor,
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
        """The load warp when pages are smaller than a key tile: one TMA copy per page into
        its rows of the stage, all on the stage's barrier (which expects the whole tile).
        Pages past the table's width read its last entry: any page id keeps a TMA copy in
        bounds (coordinates outside the cache are zero-filled) and those keys are masked."""
        d, dv = self.shape.head_dim, self.shape.v_head_dim
        rows, ppt = self.shape.page_rows, self.shape.pages_per_tile
        gK = cute.local_tile(mK[None, None, head_kv, None], (rows, d), (0, 0, None))
        gV = cute.local_tile(mV[None, None, head_kv, None], (rows, dv), (0, 0, None))
        # smem: (rows, D, (page of the tile, 1, stage))
        sK_pages = cute.group_modes(cute.flat_divide(sK, (rows, d)), 2, 5)
        sV_pages = cute.group_modes(cute.flat_divide(sV, (rows, dv)), 2, 5)
        tKsK, tKgK = cpasync.tma_partition(
            tma_atom_K, 0, cute.make_layout(1), cute.group_modes(sK_pages, 0, 2),
            cute.group_modes(gK, 0, 2),
        )  # fmt: skip
        tVsV, tVgV = cpasync.tma_partition(
            tma_atom_V, 0, cute.make_layout(1), cute.group_modes(sV_pages, 0, 2),
            cute.group_modes(gV, 0, 2),
        )  # fmt: skip
        last_page = mPageTable.shape[1] - 1
        self.load_q(mQ, sQ, tma_atom_Q, pipe_q, q_start, head, m_block)
        state = pipeline.make_pipeline_state(
            pipeline.PipelineUserType.Producer, self.shape.num_stages
        )
        for i in cutlass.range(n_block_max - n_block_min, unroll=1):
            n_block = n_block_max - 1 - i
            pipe_k.producer_acquire(state)
            pipe_v.producer_acquire(state)
            bar_k, bar_v = pipe_k.producer_get_barrier(state), pipe_v.producer_get_barrier(state)
            for p in cutlass.range_constexpr(ppt):
                page = mPageTable[batch, cutlass.min(n_block * ppt + p, last_page)]
                cute.copy(tma_atom_K, tKgK[None, page], tKsK[None, (p, 0, state.index)],
                          tma_bar_ptr=bar_k)  # fmt: skip
                cute.copy(tma_atom_V, tVgV[None, page], tVsV[None, (p, 0, state.index)],
                          tma_bar_ptr=bar_v)  # fmt: skip
            state.advance()

    @cute.jit
    def load_gathered(
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
        q_start: Int32,
        head: Int32,
        head_kv: Int32,
        batch: Int32,
        m_block: Int32,
        seqlen_k: Int32,
        n_block_min: Int32,
        n_block_max: Int32,
    ):
        """The load warp when pages hold fewer than 16 tokens: Q by TMA, each K and V tile
        row by row with 16-byte cp.async copies (lane t: chunk t % chunks of rows
        t // chunks, + the rows of later passes); each lane waits for its copies, fences
        them into the async proxy (the MMA reads shared memory through it) and arrives.
        Keys past the sequence read its last key (finite, masked)."""
        self.load_q(mQ, sQ, tma_atom_Q, pipe_q, q_start, head, m_block)
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(), self.dtype, num_bits_per_copy=128)
        lane = cute.arch.lane_idx()
        last_page = mPageTable.shape[1] - 1
        state = pipeline.make_pipeline_state(
            pipeline.PipelineUserType.Producer, self.shape.num_stages
        )
        for i in cutlass.range(n_block_max - n_block_min, unroll=1):
            n_block = n_block_max - 1 - i
            for pipe, mX, sX in ((pipe_k, mK, sK), (pipe_v, mV, sV)):
                pipe.producer_acquire(state)
                self.gather_tile(atom, mX, sX, mPageTable, lane, head_kv, batch, seqlen_k,
                                 n_block, state.index, last_page)  # fmt: skip
                cute.arch.cp_async_commit_group()
                cute.arch.cp_async_wait_group(0)
                cute.arch.fence_view_async_shared()
                pipe.producer_commit(state)
            state.advance()

    @cute.jit
    def gather_tile(
        self,
        atom: cute.CopyAtom,
        mX: cute.Tensor,
        sX: cute.Tensor,
        mPageTable: cute.Tensor,
        lane: Int32,
        head_kv: Int32,
        batch: Int32,
        seqlen_k: Int32,
        n_block: Int32,
        stage: Int32,
        last_page: Int32,
    ):
        """One tile of K or V (``mX``: [page_rows, D, Hkv, pages]) into stage ``stage``."""
        ps = self.shape.page_rows
        chunks = cute.size(sX, mode=[1]) // CHUNK
        rows_per_pass = 32 // chunks
        row0, chunk = lane // chunks, lane % chunks
        for r in cutlass.range_constexpr(self.tile_n // rows_per_pass):
            row = r * rows_per_pass + row0
            key = cutlass.min(n_block * self.tile_n + row, seqlen_k - 1)
            page = mPageTable[batch, cutlass.min(key // ps, last_page)]
            src = cute.local_tile(mX[key % ps, None, head_kv, page], (CHUNK,), (chunk,))
            dst = cute.local_tile(sX[row, None, stage], (CHUNK,), (chunk,))
            cute.copy(atom, src, dst)

    # -- MMA warp: tcgen05 ----

    @cute.jit
    def mma(
        self,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        sQ: cute.Tensor,
        sK: cute.Tensor,
        sV: cute.Tensor,
        sP: cute.Tensor,
        tStS: cute.Tensor,
        tOtO: cute.Tensor,
        pipe_q: pipeline.PipelineAsync,
        pipe_k: pipeline.PipelineAsync,
        pipe_v: pipeline.PipelineAsync,
        pipe_s: pipeline.PipelineAsync,
        pipe_p: pipeline.PipelineAsync,
        num_blocks: Int32,
        sV16: Optional[cute.Tensor] = None,  # fp8 cache: the V tile the softmax warps convert
    ):
        """S = Q K^T per key tile into tensor memory, then O += P V once the softmax warps
        wrote P. Over an fp8 cache S is the sum of two e4m3 MMAs (q's high and low parts
        against the K stage), and P V reads the fp16 V tile the softmax warps converted (the
        P pipeline orders it: they convert after the last P V and before committing P)."""
        fp8 = self.shape.kv_fp8
        thr_qk, thr_pv = tiled_mma_qk.get_slice(0), tiled_mma_pv.get_slice(0)
        tSrQ = tiled_mma_qk.make_fragment_A(thr_qk.partition_A(sQ))
        tSrK = tiled_mma_qk.make_fragment_B(thr_qk.partition_B(sK))
        tOrP = tiled_mma_pv.make_fragment_A(thr_pv.partition_A(sP))
        tOrV = tiled_mma_pv.make_fragment_B(
            thr_pv.partition_B(transpose_smem(sV16 if const_expr(fp8) else sV))
        )
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        kv_state = pipeline.make_pipeline_state(
            pipeline.PipelineUserType.Consumer, self.shape.num_stages
        )
        s_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        p_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        pipe_q.consumer_wait(q_state)
        for i in cutlass.range(num_blocks, unroll=1):
            # -- S = Q K^T into tensor memory (the softmax warps released the last S) ----
            pipe_k.consumer_wait(kv_state)
            pipe_s.producer_acquire(s_state)
            tcgen05_fence("after_thread_sync")  # the softmax warps' S loads come first
            k_stage = tSrK[None, None, None, kv_state.index]
            if const_expr(fp8):  # q = hi + lo: two e4m3 MMAs into one S
                _umma(tiled_mma_qk, tStS, tSrQ[None, None, None, 0], k_stage, False)
                _umma(tiled_mma_qk, tStS, tSrQ[None, None, None, 1], k_stage, True)
            else:
                _umma(tiled_mma_qk, tStS, tSrQ, k_stage, False)
            pipe_s.producer_commit(s_state)
            s_state.advance()
            pipe_k.consumer_release(kv_state)
            # -- O += P V once the softmax warps wrote P and rescaled O ----
            pipe_p.consumer_wait(p_state)
            tcgen05_fence("after_thread_sync")  # the softmax warps' O stores come first
            if const_expr(fp8):  # the converted tile (the softmax warps release the stage)
                _umma(tiled_mma_pv, tOtO, tOrP, tOrV, i > 0)
                pipe_p.consumer_release(p_state)  # PV done: P, V16 and O are free again
            else:
                pipe_v.consumer_wait(kv_state)
                _umma(tiled_mma_pv, tOtO, tOrP, tOrV[None, None, None, kv_state.index], i > 0)
                pipe_p.consumer_release(p_state)  # PV done: P's buffer and O are free again
                pipe_v.consumer_release(kv_state)
            p_state.advance()
            kv_state.advance()

    # -- softmax warps: one row each ----

    @cute.jit
    def softmax(
        self,
        mO: cute.Tensor,
        mSinks: Optional[cute.Tensor],
        sP: cute.Tensor,
        tStS: cute.Tensor,
        tOtO: cute.Tensor,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        pipe_s: pipeline.PipelineAsync,
        pipe_p: pipeline.PipelineAsync,
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
        mLSE: cute.Tensor,
        write_lse: Int32,
        sV: Optional[cute.Tensor] = None,  # fp8 cache: the V stages (e4m3) ...
        sV16: Optional[cute.Tensor] = None,  # ... converted here into the P V MMA's tile
        pipe_v: Optional[pipeline.PipelineAsync] = None,
        q_inv: Float32 = 1.0,  # fp8 cache: 1 / this row's q part scale
        v_scale: Float32 = 1.0,  # fp8 cache: V's dequant scale, applied to the output
        mTree: Optional[cute.Tensor] = None,  # draft trees: the request's mask bytes
    ):
        shape = self.shape
        thr_qk, thr_pv = tiled_mma_qk.get_slice(0), tiled_mma_pv.get_slice(0)
        # this thread's row of S and of O, in tensor memory and in registers, with coordinates
        tSAcc = tStS[(None, None), 0, 0]
        tScS = thr_qk.partition_C(cute.make_identity_tensor((self.tile_m, self.tile_n)))
        tScS = tScS[(None, None), 0, 0]
        load_s = tcgen05.make_tmem_copy(
            cute.make_copy_atom(tcgen05.Ld32x32bOp(tcgen05.Repetition(32)), Float32), tSAcc
        ).get_slice(tidx)
        tStS_t2r, tScS_t2r = load_s.partition_S(tSAcc), load_s.partition_D(tScS)
        tSrS = cute.make_rmem_tensor(tScS_t2r.shape, Float32)
        # O is read and written in column chunks of O_CHUNK (a whole row would not fit)
        tOAcc = tOtO[(None, None), 0, 0]
        tOcO = thr_pv.partition_C(cute.make_identity_tensor((self.tile_m, shape.v_head_dim)))
        tOcO = tOcO[(None, None), 0, 0]
        chunk = (self.tile_m, O_CHUNK)
        load_o = tcgen05.make_tmem_copy(
            cute.make_copy_atom(tcgen05.Ld32x32bOp(tcgen05.Repetition(O_CHUNK)), Float32),
            cute.local_tile(tOAcc, chunk, (0, 0)),
        ).get_slice(tidx)
        store_o = tcgen05.make_tmem_copy(
            cute.make_copy_atom(tcgen05.St32x32bOp(tcgen05.Repetition(O_CHUNK)), Float32),
            cute.local_tile(tOAcc, chunk, (0, 0)),
        ).get_slice(tidx)
        tOrO = cute.make_rmem_tensor(
            load_o.partition_D(cute.local_tile(tOcO, chunk, (0, 0))).shape, Float32
        )
        num_chunks = shape.v_head_dim // O_CHUNK

        row = tScS_t2r[0][0]  # this thread's query row within the tile
        pos = m_block * self.tile_m + row + (seqlen_k - seqlen_q)  # its query position
        if const_expr(shape.decode):
            pos = seqlen_k - 1  # every row is a head of the request's one (newest) token
        key_end = seqlen_k
        if const_expr(shape.causal):
            key_end = cutlass.min(pos + 1, seqlen_k)
        key_start = Int32(0)
        if const_expr(shape.window_left is not None):
            key_start = pos - shape.window_left
        if const_expr(shape.tree):  # the row's draft (rows past the request: its last)
            first_draft = seqlen_k - seqlen_q
            draft = cutlass.min(pos - first_draft, seqlen_q - 1)
        row_max = -Float32.inf
        row_sum = Float32(0.0)
        s_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        p_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, shape.num_stages)
        for i in cutlass.range(n_block_max - n_block_min, unroll=1):
            n_block = n_block_max - 1 - i
            pipe_s.consumer_wait(s_state)
            tcgen05_fence("after_thread_sync")
            cute.copy(load_s, tStS_t2r, tSrS)
            cute.arch.fence_view_async_tmem_load()
            tcgen05_fence("before_thread_sync")  # S read before the MMA warp overwrites it
            pipe_s.consumer_release(s_state)
            s_state.advance()
            # -- score_mod, mask_mod ----
            for j in cutlass.range_constexpr(cute.size(tSrS)):
                s = tSrS[j]
                if const_expr(shape.kv_fp8):  # undo q's part scale (K's is in the scale)
                    s = s * q_inv
                if const_expr(shape.logit_softcap is not None):
                    cap = shape.logit_softcap
                    s = cap * cute.math.tanh(s * (softmax_scale / cap), fastmath=True)
                key = n_block * self.tile_n + tScS_t2r[j][1]
                tSrS[j] = s if key < key_end and key >= key_start else -Float32.inf
                if const_expr(shape.tree):
                    if key >= first_draft and key < seqlen_k:
                        bit = draft * seqlen_q + key - first_draft
                        if (Int32(mTree[bit // 8]) >> (bit % 8)) & 1 == 0:
                            tSrS[j] = -Float32.inf
            # -- online softmax over this thread's row ----
            s_row = tSrS.load()
            m_new = s_row.reduce(cute.ReductionOp.MAX, row_max, 0)
            m_safe = m_new if m_new != -Float32.inf else Float32(0.0)
            rescale = cute.math.exp2((row_max - m_safe) * scale_log2, fastmath=True)
            p_row = cute.math.exp2(s_row * scale_log2 - m_safe * scale_log2, fastmath=True)
            row_sum = row_sum * rescale + p_row.reduce(cute.ReductionOp.ADD, 0.0, 0)
            row_max = m_new
            # -- once PV of the last tile is done: rescale O, write P ----
            pipe_p.producer_acquire(p_state)
            tcgen05_fence("after_thread_sync")  # PV of the last tile is complete
            if const_expr(shape.kv_fp8):  # V16 is free too: convert this tile's V into it
                pipe_v.consumer_wait(v_state)
                rows_valid = seqlen_k - n_block * self.tile_n
                # (ordered: after the last P V by P's pipeline, fenced with P before commit)
                convert_fp8_rows(sV[None, None, v_state.index], sV16, tidx, rows_valid,
                                 32 * SOFTMAX_WARPS, self.mma_dtype)  # fmt: skip
                pipe_v.consumer_release(v_state)
                v_state.advance()
            if i > 0:
                for c in cutlass.range_constexpr(num_chunks):
                    tOtO_c = cute.local_tile(tOAcc, chunk, (0, c))
                    cute.copy(load_o, load_o.partition_S(tOtO_c), tOrO)
                    cute.arch.fence_view_async_tmem_load()
                    tOrO.store(tOrO.load() * rescale)
                    cute.copy(store_o, tOrO, store_o.partition_D(tOtO_c))
                cute.arch.fence_view_async_tmem_store()
            tSrS.store(p_row)  # P over S's registers, converted as it is stored
            for j in cutlass.range_constexpr(cute.size(tSrS)):
                sP[row, tScS_t2r[j][1]] = self.mma_dtype(tSrS[j])
            cute.arch.fence_view_async_shared()  # P visible to the tensor cores
            tcgen05_fence("before_thread_sync")  # O stores ordered before the PV MMA
            pipe_p.producer_commit(p_state)
            p_state.advance()

        # -- epilogue: wait for the last PV, normalise, write this row ----
        pipe_p.producer_acquire(p_state)
        tcgen05_fence("after_thread_sync")
        if const_expr(shape.decode):
            self.store_partial(tOAcc, tOcO, load_o, tOrO, row, row_sum, row_max, scale_log2,
                               mO, mLSE, v_scale)  # fmt: skip
        else:
            self.epilogue(tOAcc, tOcO, load_o, tOrO, row, row_sum, row_max, scale_log2, mO,
                          mSinks, q_start, seqlen_q, head, m_block, mLSE, write_lse)  # fmt: skip

    @cute.jit
    def write_q_parts(
        self,
        mQ: cute.Tensor,
        sQ: cute.Tensor,
        pipe_q: pipeline.PipelineAsync,
        tidx: Int32,
        head: Int32,
        batch: Int32,
    ) -> Float32:
        """Decode over an fp8 cache: softmax thread t writes row t of Q (query head ``head +
        t`` of ``mQ`` (Hq, D, B) at the request; zeros past the group) as two e4m3 parts of
        q * s, s a power of two that puts the row's largest magnitude at most at 448 (the
        scaling is exact): hi = e4m3(q s) into part 0, lo = e4m3(q s - hi) into part 1, so
        hi + lo holds a bf16 q to about 2^-18 of its largest element; then fences them for
        the MMA and commits Q. Returns 1 / s (the thread's row of S is scaled by it)."""
        group = self.shape.decode_group
        src = mQ[cutlass.min(head + tidx, head + group - 1), None, batch]
        live = Float32(1.0)
        if tidx >= group:
            live = Float32(0.0)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        pipe_q.producer_acquire(q_state)
        chunks = self.shape.head_dim // FP8_VECTOR
        amax = Float32(0.0)
        for c in cutlass.range_constexpr(chunks):
            x = cute.local_tile(src, (FP8_VECTOR,), (c,)).load().to(Float32)
            for e in cutlass.range_constexpr(FP8_VECTOR):
                amax = cutlass.max(amax, cute.math.absf(x[e]))
        s = Float32(1.0)
        if amax > 0.0:
            s = cute.math.exp2(cute.math.floor(cute.math.log2(E4M3_MAX / amax)))
        for c in cutlass.range_constexpr(chunks):
            y = cute.local_tile(src, (FP8_VECTOR,), (c,)).load().to(Float32) * (s * live)
            hi = y.to(cutlass.Float8E4M3FN)
            lo = (y - hi.to(Float32)).to(cutlass.Float8E4M3FN)
            cute.local_tile(sQ[tidx, None, 0], (FP8_VECTOR,), (c,)).store(hi)
            cute.local_tile(sQ[tidx, None, 1], (FP8_VECTOR,), (c,)).store(lo)
        cute.arch.fence_view_async_shared()  # visible to the MMA (async proxy)
        pipe_q.producer_commit(q_state)
        return Float32(1.0) / s

    @cute.jit
    def epilogue(
        self,
        tOAcc: cute.Tensor,
        tOcO: cute.Tensor,
        load_o: cute.TiledCopy,
        tOrO: cute.Tensor,
        row: Int32,
        row_sum: Float32,
        row_max: Float32,
        scale_log2: Float32,
        mO: cute.Tensor,
        mSinks: Optional[cute.Tensor],
        q_start: Int32,
        seqlen_q: Int32,
        head: Int32,
        m_block: Int32,
        mLSE: cute.Tensor,
        write_lse: Int32,
    ):
        """Normalise this thread's row of O (sinks join the denominator) and write it, and
        its natural-log LSE into mLSE [T, Hq] when write_lse != 0."""
        shape = self.shape
        total = row_sum
        m_scaled = row_max * scale_log2
        if const_expr(shape.sinks):
            sink = Float32(mSinks[head])
            if row_max == -Float32.inf:
                m_scaled = sink * LOG2_E
            total += cute.math.exp2(sink * LOG2_E - m_scaled, fastmath=True)
        inv = Float32(1.0) / total if total > 0.0 else Float32(0.0)
        mO_h = cute.domain_offset((q_start, 0), mO[None, head, None])
        q_row = m_block * self.tile_m + row
        if write_lse != 0:  # this thread holds the whole row: its LSE (natural log)
            if q_row < seqlen_q:
                lse = -Float32.inf
                if total > 0.0:
                    lse = (m_scaled + cute.math.log2(total, fastmath=True)) * LN2
                mLSE[q_start + q_row, head] = lse
        self.store_row(tOAcc, tOcO, load_o, tOrO, inv, mO_h[q_row, None], q_row < seqlen_q,
                       self.dtype)  # fmt: skip

    @cute.jit
    def store_partial(
        self,
        tOAcc: cute.Tensor,
        tOcO: cute.Tensor,
        load_o: cute.TiledCopy,
        tOrO: cute.Tensor,
        row: Int32,
        row_sum: Float32,
        row_max: Float32,
        scale_log2: Float32,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        v_scale: Float32,
    ):
        """Decode: this split's normalised output row (fp32, times V's dequant scale) and
        its log-sum-exp (base 2, of the scaled scores; -inf when the split saw no key) for
        the combine, when the row is a head of the group (``mO``: [group heads.., Dv],
        ``mLSE``: [group heads..])."""
        live = row < self.shape.decode_group
        inv = Float32(0.0)
        lse = -Float32.inf
        if row_sum > 0.0:
            inv = v_scale / row_sum
            lse = row_max * scale_log2 + cute.math.log2(row_sum, fastmath=True)
        if live:
            mLSE[row] = lse
        self.store_row(tOAcc, tOcO, load_o, tOrO, inv, mO[row, None], live, Float32)

    @cute.jit
    def store_row(
        self,
        tOAcc: cute.Tensor,
        tOcO: cute.Tensor,
        load_o: cute.TiledCopy,
        tOrO: cute.Tensor,
        inv: Float32,
        mO_row: cute.Tensor,
        live: cutlass.Boolean,
        out_dtype: cutlass.Constexpr[type],
    ):
        """This thread's row of O from tensor memory, times ``inv``, into ``mO_row`` (its
        output row's Dv columns, as ``out_dtype``) when ``live``. Every thread loads:
        tcgen05.ld is warp-collective, so only the stores are guarded."""
        chunk = (self.tile_m, O_CHUNK)
        out = cute.make_rmem_tensor_like(tOrO, out_dtype)
        for c in cutlass.range_constexpr(self.shape.v_head_dim // O_CHUNK):
            cute.copy(load_o, load_o.partition_S(cute.local_tile(tOAcc, chunk, (0, c))), tOrO)
            cute.arch.fence_view_async_tmem_load()
            out.store((tOrO.load() * inv).to(out_dtype))
            tOcO_c = load_o.partition_D(cute.local_tile(tOcO, chunk, (0, c)))
            if live:
                for j in cutlass.range_constexpr(cute.size(out)):
                    mO_row[tOcO_c[j][1]] = out[j]


KERNEL = MhaFwdSm100  # what host/compile.py builds for sm100
