"""The GDN chunked prefill / extend kernel for sm90 in CuTe DSL: the sequential half of the
prefill in one launch, after the prepare kernel (``prepare_sm90``: gates, norms, T).

It keeps each (request, value head)'s state on chip for the whole request and forms the
chunk form's W / U work, the output and the state update per chunk from what is stored
once: q, k, v (bf16) and prepare's T = (I + A)^-1 with the per-row gates and inverse norms
(about 1.3 KB a token and head through memory, against 8 KB for the Triton library's four
launches; bench/README.md, "the memory floor of the four-launch design").

A consumer warpgroup holds 64 value rows of one (request, value head)'s state transposed,
S^T [64, K] fp32, in its wgmma accumulator registers for the whole request, and walks the
request's chunks of C = 64 tokens in order; a producer warpgroup loads each chunk and forms
its S-independent tiles while the consumer runs the previous chunk's state products. Per
chunk (t, s: token rows; v: value rows; G the cumulative log decay, γ = exp G, qs / kn the
q / k inverse norms, qs with the scale):

    P     = (Q K^T ∘ qs_t kn_s exp(G_t - G_s))[s <= t]           wgmma, smem operands
    T     = (I + A)^-1 from prepare
    d^T   = (V^T - (S^T K^T) diag(γ kn)) diag(β)               S^T as a register operand
    u^T   = d^T T^T
    O^T   = (S^T Q^T) diag(γ qs) + u^T P^T
    S^T   = γ_C S^T + (u^T diag(kn exp(G_C - G))) K            K exact (the stored keys)

The row factors (β, γ kn, γ qs, kn exp(G_C - G), zero past the request) are computed once a
chunk into shared vectors; β rides on d and the update's factors on u, so the only tiles
formed per chunk are P and T's operand.

Forms (constructor arguments; ``FORMS`` names them; the generated backends take ``c1pd``
and ``c2p``, bench/README.md measures every one):
- ``half`` with ``t16``: T, d, u, P and the update's keys as fp16 operands, one wgmma a
  product, T loaded as prepare_sm90 writes it (fp16); without ``half``, split bf16 pairs
  (two wgmmas a product) and fp32 T from the Triton prepare kernel;
- ``consumers`` 1 or 2: two consumer warpgroups hold a head's 128 value rows and share one
  producer (half the bytes a head moves; 384 threads with setmaxnreg);
- ``early_d``: the consumer waits for S^T K^T alone, so S^T Q^T's k-steps run under d's
  epilogue and u's product;
- ``inverse``: T formed in the kernel by a third warpgroup (measured slower: its inverse
  sits in the chunk's chain);
- ``modes``: each run's mode bits read at run time (``OUT``: store the output rows;
  ``VALUES``: read v, else v = 0; ``IDENTITY``: start from S^T = I), for context
  parallelism's mixed launches;
- ``skip``: parts a timing ablation leaves out (the results are then wrong).

The producer (the last warpgroup) loads q, k, T, the CTA's V columns and the gate vectors
by cp.async into two stages, forms the row factors, P (a wgmma and stmatrix) and T's
operand, and signals FULL (named barriers: bar.arrive, the consumers' bar.sync); once the
consumers signal EMPTY for the chunk before, it loads the next chunk into that stage. The
consumers run d, u, O and the update and write O by stmatrix (transposed into [t, v] rows)
and 16-byte stores while the update is in flight.

The launch takes runs (start, end, mode), the grid's slowest dimension (at most 65535; CTAs
start in run order): a request's rows, its state read from the slot ``slots[b]`` when
``has_init[b]`` and written back there at the end. A padding request
(slot <= 0) runs from a zero state and writes its output rows, never a pool row.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.utils.hopper_helpers as sm90
from cutlass import BFloat16, Float16, Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup

from attngen.families.mha.cute_dsl.kernels.common import (
    LOG2_E,
    rows_aligned,
    smem_layout,
)
from attngen.families.mha.cute_dsl.kernels.fragments import (
    mma_a,
    transpose_smem,
    wgmma_group,
)
from attngen.families.gdn.cute_dsl.kernels.inverse_sm90 import (
    INVERSE,
    InverseSm90,
    chunk_mma,
    fake_tensor,
    load_lower,
    smem_member,
)
from attngen.families.gdn.cute_dsl.kernels.inverse_sm90 import tile_layout as inv_tile

C = 64  # tokens a chunk (the prepare kernel's chunk_size)
KD = VD = 128  # key and value head dims
VB = 64  # value rows of the state a consumer warpgroup holds (wgmma's M)
STAGES = 2  # chunks in shared memory: the producer's next one under the consumer's current
THREADS = 128  # a warpgroup: the consumers (state) are warpgroups 0 .., the producer the last
# registers after setmaxnreg: a CTA's pool is what it launched with (168 a thread at 384
# threads, 504 per three warpgroups); asking for more hangs setmaxnreg.inc for ever.
# Two consumers and the producer:
PRODUCER_REGS, CONSUMER_REGS = 88, 208
# one consumer, the producer and the inverse's warpgroup:
INV_CONSUMER_REGS, INV_PRODUCER_REGS, INV_REGS = 232, 96, 176
POOL_REGS = 504
assert 2 * CONSUMER_REGS + PRODUCER_REGS <= POOL_REGS
assert INV_CONSUMER_REGS + INV_PRODUCER_REGS + INV_REGS <= POOL_REGS
# named barriers: FULL + s (the producer has filled stage s), EMPTY + s (the consumers are
# done with it), and one inside each warpgroup (CONSUMER + the consumer's index)
FULL, EMPTY, PRODUCER, CONSUMER = 1, 3, 5, 6
# with ``inverse``: LOADED + s (the producer's loads of stage s landed: the inverse's
# warpgroup may read k and the gates), and one inside the inverse's warpgroup
LOADED = 8
# a run's mode bits: OUT writes its output rows, VALUES reads v (without it v is taken as
# 0), IDENTITY starts from S^T = I (with VALUES unset, the run gives a segment's transition
# A); a request's run is OUT | VALUES
OUT, VALUES, IDENTITY = 1, 2, 4
COPY = 8  # bf16 elements a 16-byte cp.async


# the kernel's forms by name (the harness's --variants): one or two consumer warpgroups with
# prepare's T, or T formed in the kernel (``inverse``: prepare shrinks to gdn_fused_gates);
# "h": fp16 operands where the others split bf16 (``half``)
FORMS = {
    "c1": {}, "c2": {"consumers": 2}, "inv": {"inverse": True},
    "c1h": {"half": True}, "c2h": {"consumers": 2, "half": True},
    "invh": {"inverse": True, "half": True},
    "c1p": {"half": True, "t16": True},  # after gdn_prep_sm90 (fp16 T)
    "c1pd": {"half": True, "t16": True, "early_d": True},  # c1p, S^T Q^T off the chain
    "c2p": {"consumers": 2, "half": True, "t16": True},  # a head's 128 rows a CTA, fp16 T
}  # fmt: skip


class GdnFusedSm90(InverseSm90):
    """q, k ``[N, H, KD]`` and v, out ``[N, HV, VD]`` bf16; T ``[N, HV, C]`` fp32 (the
    prepare kernel's, row t of token t's chunk); G, beta, qs, kn ``[HV, N]`` fp32; the pool
    ``[slots + 1, HV, VD, KD]`` fp32; cache_indices, has_initial_state ``[B]``,
    query_start_loc ``[B + 1]`` int32. Request b's final state goes to its pool row."""

    # parts a timing ablation may leave out (``skip``; the results are then wrong)
    # (the inverse's warpgroup: "solve" all of it, or its parts "mform" (K K^T and M),
    # "diag" (the diagonal blocks), "merge" (the two merges), "tsplit" (T to the operand))
    PARTS = (
        "gates", "loads", "p", "split", "state", "epi", "ostore", "solve", "mform", "diag",
        "merge", "tsplit",
    )  # fmt: skip

    def __init__(
        self, group: int = 1, skip: tuple[str, ...] = (), consumers: int = 1,
        inverse: bool = False, modes: bool = False, half: bool = False, t16: bool = False,
        early_d: bool = False,
    ):  # fmt: skip
        self.group = group  # value heads per key head
        # consumer warpgroups of a CTA, each VB value rows of the head's state; the
        # producer's loads, P and T's split serve them all
        assert consumers in (1, 2), consumers
        self.consumers = consumers
        # inverse: a warpgroup of its own forms T = (I + M)^-1 a chunk ahead (form_t), so
        # mT is not read (prepare's gates and norms still are)
        assert not (inverse and consumers > 1), "the inverse's warpgroup: one consumer only"
        self.inverse = inverse
        # modes: read each run's mode bits (OUT, VALUES) at run time (gdn_fused_cp's mixed
        # launches); without, every run is OUT | VALUES, known when compiled
        self.modes = modes
        # half: T, d, u, P and the update's keys as fp16 operands, one MMA a product (the
        # split-bf16 pairs otherwise); q, k and the state stay bf16 (gdn_fused_precision:
        # 0.30 / 0.19 of the bounds at 8k against the split design's 0.46 / 0.31)
        self.half = half
        self.lo = Float16 if half else BFloat16  # the type of those operands
        # t16: mT is fp16 T from gdn_prep_sm90, loaded as the operand (no conversion)
        assert not t16 or (half and not inverse), "t16 takes the half form's prepare T"
        self.t16 = t16
        # early_d: wait for S^T K^T alone, so S^T Q^T's 8 k-steps run under d's epilogue and
        # u's product (O scaled once u is issued) instead of in the chain
        self.early_d = early_d
        self.threads = (consumers + 1 + int(inverse)) * THREADS
        self.empty_threads = (consumers + 1) * THREADS  # EMPTY: the consumers and producer
        self.cols = consumers * VB  # the CTA's value columns
        assert set(skip) <= set(self.PARTS), skip
        self.skip = frozenset(skip)

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mT: cute.Tensor,
        mG: cute.Tensor,
        mBeta: cute.Tensor,
        mQs: cute.Tensor,
        mKn: cute.Tensor,
        mPool: cute.Tensor,
        mSlots: cute.Tensor,
        mHasInit: cute.Tensor,
        mStart: cute.Tensor,
        mEnd: cute.Tensor,
        mMode: cute.Tensor,
        mO: cute.Tensor,
        stream: cuda.CUstream,
    ):
        # 16-byte rows: the cp.async copies'
        mQ, mK, mV, mT, mO = (rows_aligned(t) for t in (mQ, mK, mV, mT, mO))
        bf = BFloat16
        k_major, mn_major = sm90.OperandMajorMode.K, sm90.OperandMajorMode.MN
        rmem = sm90.OperandSource.RMEM
        mma_qk = chunk_mma()
        mma_rk = sm90.make_trivial_tiled_mma(
            bf, bf, k_major, k_major, Float32, atom_layout_mnk=(1, 1, 1), tiler_mn=(VB, C),
            a_source=rmem,
        )  # fmt: skip
        mma_upd = sm90.make_trivial_tiled_mma(
            self.lo, self.lo, k_major, mn_major, Float32, atom_layout_mnk=(1, 1, 1),
            tiler_mn=(VB, KD), a_source=rmem,
        )  # fmt: skip
        # u = d T^T and O += u P^T on the low operands (with ``half``: fp16)
        mma_lo = sm90.make_trivial_tiled_mma(
            self.lo, self.lo, k_major, k_major, Float32, atom_layout_mnk=(1, 1, 1),
            tiler_mn=(VB, C), a_source=rmem,
        )  # fmt: skip
        l_qk = smem_layout(bf, C, KD, STAGES)  # q, k: [t, key, load stage]
        l_sq = smem_layout(bf, C, C, STAGES)  # P, T's parts: [t, s, stage]
        l_o = smem_layout(bf, C, VB, self.consumers)  # O: [t, v, consumer]
        l_t = cute.make_layout((C, C, STAGES), stride=(C, 1, C * C))  # T rows, fp32
        cols = self.cols
        l_v = cute.make_layout((C, cols, STAGES), stride=(cols, 1, C * cols))  # the CTA's V

        def tile(layout, dtype=bf) -> type:
            return smem_member(layout, dtype)

        def vec(stages: int = STAGES) -> type:
            return cute.struct.MemRange[Float32, C * stages]

        members = {
            "g": vec(), "beta": vec(), "qs": vec(), "kn": vec(), "ca": vec(), "cv": vec(),
            "cb": vec(), "cu": vec(), "sQ": tile(l_qk), "sK": tile(l_qk),
            "sP": tile(l_sq, self.lo), "sTh": tile(l_sq, self.lo), "sO": tile(l_o),
            "sV": tile(l_v),
        }  # fmt: skip
        if const_expr(not (self.inverse or self.t16)):  # fp32 T rows from the Triton prepare
            members["sT"] = tile(l_t, Float32)
        if const_expr(self.half):  # the update's keys as fp16 (the producer converts them)
            members["sK16"] = tile(l_qk, Float16)
        else:  # T's low part
            members["sTl"] = tile(l_sq)
        # the inverse's fp32 M, T [t, s] and a product's scratch [32, 32]: rows padded by 4
        # so that four rows' 16-byte pieces fall in different banks
        l_m = inv_tile()
        if const_expr(self.inverse):
            members["sM"] = tile(l_m, Float32)
            members["sTf"] = tile(l_m, Float32)
            members["sY"] = tile(inv_tile(C // 2), Float32)
        Storage = cute.struct(type("Storage", (), {"__annotations__": members}))
        # runs the slowest dimension: CTAs start in run order (segments: the longest first)
        grid = (VD // self.cols, cute.size(mV.shape[1]), cute.size(mSlots.shape[0]))
        self.kernel(
            mQ, mK, mV, mT, mG, mBeta, mQs, mKn, mPool, mSlots, mHasInit, mStart, mEnd, mMode,
            mO,
            l_qk, l_sq, l_o, l_t, l_v, l_m, mma_qk, mma_rk, mma_lo, mma_upd, Storage,
        ).launch(
            grid=grid, block=[self.threads, 1, 1], smem=Storage.size_in_bytes(), stream=stream
        )  # fmt: skip

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mT: cute.Tensor,
        mG: cute.Tensor,
        mBeta: cute.Tensor,
        mQs: cute.Tensor,
        mKn: cute.Tensor,
        mPool: cute.Tensor,
        mSlots: cute.Tensor,
        mHasInit: cute.Tensor,
        mStart: cute.Tensor,
        mEnd: cute.Tensor,
        mMode: cute.Tensor,
        mO: cute.Tensor,
        l_qk: cute.ComposedLayout,
        l_sq: cute.ComposedLayout,
        l_o: cute.ComposedLayout,
        l_t: cute.Layout,
        l_v: cute.Layout,
        l_m: cute.Layout,
        mma_qk: cute.TiledMma,
        mma_rk: cute.TiledMma,
        mma_lo: cute.TiledMma,
        mma_upd: cute.TiledMma,
        Storage: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        vb, h, b = cute.arch.block_idx()
        slot = mSlots[b]  # <= 0: a padding request (a zero state; no pool row touched)
        st = cutlass.memory.SmemAllocator().allocate(Storage)
        sQ, sK = (m.get_tensor(l_qk.outer, swizzle=l_qk.inner) for m in (st.sQ, st.sK))
        sV = st.sV.get_tensor(l_v)
        sT = sV  # (not allocated when T is formed here or arrives as the fp16 operand)
        if const_expr(not (self.inverse or self.t16)):
            sT = st.sT.get_tensor(l_t)
        sP, sTh = (m.get_tensor(l_sq.outer, swizzle=l_sq.inner) for m in (st.sP, st.sTh))
        sTl = sTh  # (with ``half`` T is one tile; split_t leaves sTl alone then)
        s_t = sT  # where T's loads land: fp32 rows to split, or (t16) the operand tile
        if const_expr(self.t16):
            s_t = sTh
        sK16 = sK  # (the update's keys: bf16 as stored, or an fp16 copy with ``half``)
        flat_k, flat_k16 = sK, sK  # (their raw elements, for the producer's conversion)
        if const_expr(self.half):
            sK16 = st.sK16.get_tensor(l_qk.outer, swizzle=l_qk.inner)
            raw = cute.make_layout(cute.cosize(l_qk))
            flat_k, flat_k16 = st.sK.get_tensor(raw), st.sK16.get_tensor(raw)
        else:
            sTl = st.sTl.get_tensor(l_sq.outer, swizzle=l_sq.inner)
        sO = st.sO.get_tensor(l_o.outer, swizzle=l_o.inner)
        sG, sBeta, sQs, sKn = (
            m.get_tensor(cute.make_layout((C, STAGES))) for m in (st.g, st.beta, st.qs, st.kn)
        )
        sCa, sCv, sCb, sCu = (
            m.get_tensor(cute.make_layout((C, STAGES))) for m in (st.ca, st.cv, st.cb, st.cu)
        )
        start = mStart[b]  # the run's token rows [start, end)
        end = mEnd[b]
        write_out = True  # a request's run (OUT | VALUES), known when compiled
        v_scale = Float32(1.0)
        if const_expr(self.modes):  # the run's mode bits, read (context parallelism)
            write_out = (mMode[b] & OUT) != 0
            v_scale = cutlass.select_((mMode[b] & VALUES) != 0, Float32(1.0), Float32(0.0))
        num_chunks = (end - start + C - 1) // C
        v0 = vb * self.cols  # the CTA's first value column
        wg = cute.arch.make_warp_uniform(tidx // THREADS)
        if wg == self.consumers:
            # -- the producer: loads, the row factors, P and T's split, a chunk ahead ----
            if const_expr(self.inverse):
                cute.arch.setmaxregister_decrease(INV_PRODUCER_REGS)
            elif const_expr(self.consumers > 1):
                cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            ptid = tidx - self.consumers * THREADS
            hk = h // self.group
            thr_qk = mma_qk.get_slice(ptid)
            wg_qk = mma_qk.get_slice(0)
            tPa = wg_qk.make_fragment_A(wg_qk.partition_A(sQ))
            tPb = wg_qk.make_fragment_B(wg_qk.partition_B(sK))
            cP = thr_qk.partition_C(cute.make_identity_tensor((C, C)))  # (t, s)
            gates = ((mG, sG), (mBeta, sBeta), (mQs, sQs), (mKn, sKn))
            if num_chunks > 0:
                self.load_chunk(mQ, mK, mT, mV, sQ, sK, s_t, sV, gates, start, end, Int32(0),
                                hk, h, v0, ptid)  # fmt: skip
            cute.arch.cp_async_commit_group()
            for c in cutlass.range(num_chunks, unroll=1):
                stage = c % STAGES
                n = cutlass.min(end - start - c * C, C)
                cute.arch.cp_async_wait_group(0)  # this chunk's loads
                cute.arch.fence_view_async_shared()
                cute.arch.barrier(barrier_id=PRODUCER, number_of_threads=THREADS)
                if const_expr(self.inverse):  # k and the gates are here: the inverse
                    cute.arch.barrier_arrive(
                        barrier_id=LOADED + stage, number_of_threads=2 * THREADS
                    )
                sg, sbeta, sqs, skn = (x[None, stage] for x in (sG, sBeta, sQs, sKn))
                if ptid < C:  # the row factors of d, O and the update's u (0 past n)
                    valid = ptid < n
                    g_last = sg[n - 1]
                    gamma = cute.math.exp2(sg[ptid] * LOG2_E, fastmath=True)
                    to_end = cute.math.exp2((g_last - sg[ptid]) * LOG2_E, fastmath=True)
                    beta = cutlass.select_(valid, sbeta[ptid], Float32(0.0))
                    sCv[ptid, stage] = beta
                    sCa[ptid, stage] = beta * gamma * skn[ptid]
                    sCb[ptid, stage] = cutlass.select_(valid, gamma * sqs[ptid], Float32(0.0))
                    sCu[ptid, stage] = cutlass.select_(valid, to_end * skn[ptid], Float32(0.0))
                # -- P = Q K^T, scaled and masked (s <= t), bf16 ----
                if const_expr("p" not in self.skip):
                    self.form_p(mma_qk, tPa, tPb, cP, sP[None, None, stage], sg, sqs, skn,
                                stage, ptid)  # fmt: skip
                # -- T as bf16 hi + lo (beta goes on d, the update's row factors on u) ----
                if const_expr("split" not in self.skip and not self.inverse and not self.t16):
                    self.split_t(
                        sT[None, None, stage], sTh[None, None, stage], sTl[None, None, stage],
                        ptid,
                    )  # fmt: skip
                if const_expr(self.half):  # the update's keys as fp16 (exact in range)
                    self.keys_fp16(flat_k, flat_k16, stage, ptid)
                cute.arch.fence_view_async_shared()
                cute.arch.barrier_arrive(barrier_id=FULL + stage, number_of_threads=self.threads)
                # the next chunk's loads, into the stage of chunk c - 1 once the consumer
                # is done with it (its sync also orders every producer thread's reads of
                # that stage before them): they, and then chunk c + 1's P, T and row
                # factors, come under the consumer's chunk c
                if c + 1 < num_chunks:
                    if c >= 1:
                        cute.arch.barrier(
                            barrier_id=EMPTY + 1 - stage, number_of_threads=self.empty_threads
                        )
                    if const_expr("loads" not in self.skip):
                        self.load_chunk(mQ, mK, mT, mV, sQ, sK, s_t, sV, gates, start, end,
                                        c + 1, hk, h, v0, ptid)  # fmt: skip
                    cute.arch.cp_async_commit_group()
        elif wg > self.consumers:
            # -- the inverse: T = (I + M)^-1 of each chunk, split, a chunk ahead ----
            if const_expr(self.inverse):
                # (above the 168 a thread it launched with: an increase; a decrease
                # to more is an illegal instruction)
                cute.arch.setmaxregister_increase(INV_REGS)
                itid = tidx - (self.consumers + 1) * THREADS
                sM, sTf = st.sM.get_tensor(l_m), st.sTf.get_tensor(l_m)
                sY = st.sY.get_tensor(inv_tile(C // 2))
                wg_kk = mma_qk.get_slice(0)
                tKa = wg_kk.make_fragment_A(wg_kk.partition_A(sK))
                tKk = wg_kk.make_fragment_B(wg_kk.partition_B(sK))
                cM = mma_qk.get_slice(itid).partition_C(cute.make_identity_tensor((C, C)))
                for c in cutlass.range(num_chunks, unroll=1):
                    stage = c % STAGES
                    n = cutlass.min(end - start - c * C, C)
                    cute.arch.barrier(barrier_id=LOADED + stage, number_of_threads=2 * THREADS)
                    if const_expr("solve" not in self.skip):
                        if const_expr("mform" not in self.skip):
                            self.form_m(mma_qk, tKa[None, None, None, stage],
                                        tKk[None, None, None, stage], cM, sM,
                                        sG[None, stage], sBeta[None, stage],
                                        sKn[None, stage], n, itid)  # fmt: skip
                        cute.arch.barrier(barrier_id=INVERSE, number_of_threads=THREADS)
                        self.form_t(sM, sTf, sY, itid)
                        if const_expr("tsplit" not in self.skip):
                            self.split_t(sTf, sTh[None, None, stage], sTl[None, None, stage], itid)
                    cute.arch.fence_view_async_shared()
                    cute.arch.barrier_arrive(
                        barrier_id=FULL + stage, number_of_threads=self.threads
                    )
        else:
            # -- a consumer: the state, S^T [VB, KD] of value rows v0 + wg VB .., in
            # registers ----
            if const_expr(self.inverse):
                cute.arch.setmaxregister_increase(INV_CONSUMER_REGS)
            elif const_expr(self.consumers > 1):
                cute.arch.setmaxregister_increase(CONSUMER_REGS)
            ctid = tidx - wg * THREADS
            vc = wg * VB  # this consumer's first column of the CTA's
            thr_rk, thr_upd = (m.get_slice(ctid) for m in (mma_rk, mma_upd))
            wg_rk, wg_lo, wg_upd = (m.get_slice(0) for m in (mma_rk, mma_lo, mma_upd))
            acc_S = cute.make_rmem_tensor(mma_upd.partition_shape_C((VB, KD)), Float32)
            cS = thr_upd.partition_C(cute.make_identity_tensor((VB, KD)))
            acc_S.fill(0.0)
            if const_expr(self.modes):
                if (mMode[b] & IDENTITY) != 0:
                    for j in cutlass.range_constexpr(cute.size(acc_S)):
                        diag = v0 + vc + cS[j][0] == cS[j][1]
                        acc_S[j] = cutlass.select_(diag, Float32(1.0), Float32(0.0))
            if slot > 0:
                if mHasInit[b] != 0:
                    for j in cutlass.range_constexpr(cute.size(acc_S)):
                        acc_S[j] = mPool[slot, h, v0 + vc + cS[j][0], cS[j][1]]
            tKb = wg_rk.make_fragment_B(wg_rk.partition_B(sK))
            tQb = wg_rk.make_fragment_B(wg_rk.partition_B(sQ))
            tTh = wg_lo.make_fragment_B(wg_lo.partition_B(sTh))
            tTl = wg_lo.make_fragment_B(wg_lo.partition_B(sTl))
            tPt = wg_lo.make_fragment_B(wg_lo.partition_B(sP))
            tKu = wg_upd.make_fragment_B(wg_upd.partition_B(transpose_smem(sK16)))
            tSa = wg_rk.make_fragment_A(wg_rk.partition_shape_A((VB, KD)))

            def a_operand():  # (VB, C) in the low type, registers
                return wg_lo.make_fragment_A(wg_lo.partition_shape_A((VB, C)))

            tDa, tUh, tUl, tUsh, tUsl = (a_operand() for _ in range(5))
            atom_o = cute.make_copy_atom(
                cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=True, num_matrices=4), BFloat16
            )
            thr_o = cute.make_tiled_copy_C(atom_o, mma_rk).get_slice(ctid)
            cR = thr_rk.partition_C(cute.make_identity_tensor((VB, C)))  # (v, t)
            state = const_expr("state" not in self.skip)
            for c in cutlass.range(num_chunks, unroll=1):
                t0 = start + c * C
                n = cutlass.min(end - t0, C)
                stage = c % STAGES
                # chunk c's q, k, V, P, T's parts and row factors are in shared memory
                cute.arch.barrier(barrier_id=FULL + stage, number_of_threads=self.threads)
                # -- d^T diag(beta) = (V^T - (S^T K^T) diag(gamma kn)) diag(beta); S^T Q^T
                tSa.store(mma_a(acc_S).load().to(BFloat16))
                acc_D = cute.make_rmem_tensor(mma_rk.partition_shape_C((VB, C)), Float32)
                acc_O = cute.make_rmem_tensor(mma_rk.partition_shape_C((VB, C)), Float32)
                if const_expr(state):
                    wgmma_group(mma_rk, acc_D, tSa, tKb[None, None, None, stage], True, -1)
                    wgmma_group(mma_rk, acc_O, tSa, tQb[None, None, None, stage], True, -1)
                    warpgroup.wait_group(1 if const_expr(self.early_d) else 0)
                if const_expr("epi" not in self.skip):
                    # (columns t >= n: 0; u's columns there are finite, and multiply P's
                    # zeros, O's columns that are not stored and the update's zero factors)
                    for j in cutlass.range_constexpr(cute.size(acc_D)):
                        v, t = cR[j]
                        d = v_scale * sCv[t, stage] * Float32(sV[t, vc + v, stage])
                        acc_D[j] = d - sCa[t, stage] * acc_D[j]
                        if const_expr(not self.early_d):
                            acc_O[j] = acc_O[j] * sCb[t, stage]
                tDa.store(mma_a(acc_D).load().to(self.lo))
                # -- u^T = d^T diag(beta) T^T, then split (with ``half``: fp16) ----
                acc_U = cute.make_rmem_tensor(mma_rk.partition_shape_C((VB, C)), Float32)
                if const_expr(state):
                    t_hi = tTh[None, None, None, stage]
                    u_wait = -1 if const_expr(self.early_d) else 0
                    if const_expr(self.half):
                        wgmma_group(mma_lo, acc_U, tDa, t_hi, True, u_wait)
                    else:
                        wgmma_group(mma_lo, acc_U, tDa, t_hi, True, -1)
                        wgmma_group(mma_lo, acc_U, tDa, tTl[None, None, None, stage], False, u_wait)
                if const_expr(self.early_d):
                    # S^T Q^T done (u's groups in flight): its scaling, then u
                    warpgroup.wait_group(1 if const_expr(self.half) else 2)
                    if const_expr("epi" not in self.skip):
                        for j in cutlass.range_constexpr(cute.size(acc_O)):
                            acc_O[j] = acc_O[j] * sCb[cR[j][1], stage]
                    warpgroup.wait_group(0)
                self.operand(acc_U, tUh, tUl)
                # the update's u: u^T diag(kn exp(G_C - G))
                for j in cutlass.range_constexpr(cute.size(acc_U)):
                    acc_U[j] = acc_U[j] * sCu[cR[j][1], stage]
                self.operand(acc_U, tUsh, tUsl)
                gamma_c = cute.math.exp2(sG[n - 1, stage] * LOG2_E, fastmath=True)
                acc_S.store(acc_S.load() * gamma_c)
                # -- O^T += u^T P^T, then S^T = gamma_C S^T + (scaled u^T) K (K exact, the
                # stored keys) in flight while O goes out ----
                if const_expr(state):
                    p_t = tPt[None, None, None, stage]
                    k_upd = tKu[None, None, None, stage]
                    wgmma_group(mma_lo, acc_O, tUh, p_t, False, -1)
                    if const_expr(not self.half):
                        wgmma_group(mma_lo, acc_O, tUl, p_t, False, -1)
                    wgmma_group(mma_upd, acc_S, tUsh, k_upd, False, -1)
                    if const_expr(not self.half):
                        wgmma_group(mma_upd, acc_S, tUsl, k_upd, False, -1)
                # -- O^T by stmatrix (transposed) into [t, v] rows, then 16-byte rows
                # (the last chunk's loads of sO finished before this chunk's FULL) ----
                # O's groups done, the update's in flight (O is formed in every run: a
                # branch on the run's mode around a wgmma has ptxas fence them all; only
                # the stores are skipped for the runs without outputs)
                warpgroup.wait_group(1 if const_expr(self.half) else 2)
                if write_out:
                    r_O = cute.make_rmem_tensor_like(acc_O, BFloat16)
                    r_O.store(acc_O.load().to(BFloat16))
                    if const_expr("ostore" not in self.skip):
                        s_o = sO[None, None, wg]
                        cute.copy(atom_o, thr_o.retile(r_O), thr_o.partition_D(transpose_smem(s_o)))
                        cute.arch.barrier(barrier_id=CONSUMER + wg, number_of_threads=THREADS)
                        self.store_rows(s_o, mO, t0, n, h, v0 + vc, ctid)
                warpgroup.wait_group(0)
                if c + 2 < num_chunks:  # the producer loads chunk c + 2 into this stage
                    cute.arch.barrier_arrive(
                        barrier_id=EMPTY + stage, number_of_threads=self.empty_threads
                    )
            if slot > 0:
                for j in cutlass.range_constexpr(cute.size(acc_S)):
                    mPool[slot, h, v0 + vc + cS[j][0], cS[j][1]] = acc_S[j]

    @cute.jit
    def form_p(
        self,
        mma_qk: cute.TiledMma,
        tPa: cute.Tensor,
        tPb: cute.Tensor,
        cP: cute.Tensor,
        sP: cute.Tensor,
        sG: cute.Tensor,
        sQs: cute.Tensor,
        sKn: cute.Tensor,
        stage: Int32,
        tidx: Int32,
    ):
        """P = (Q K^T ∘ qs_t kn_s exp(G_t - G_s))[s <= t] into ``sP`` as bf16 (the vectors:
        this chunk's stage)."""
        acc_P = cute.make_rmem_tensor(mma_qk.partition_shape_C((C, C)), Float32)
        wgmma_group(mma_qk, acc_P, tPa[None, None, None, stage], tPb[None, None, None, stage], True)
        for j in cutlass.range_constexpr(cute.size(acc_P)):
            t, s = cP[j]
            # (s > t: G_t - G_s >= 0 clamped, the product then dropped: no branch)
            decay = cute.math.exp2(cutlass.min(sG[t] - sG[s], 0.0) * LOG2_E, fastmath=True)
            acc_P[j] = cutlass.select_(s <= t, acc_P[j] * sQs[t] * sKn[s] * decay, Float32(0.0))
        r_P = cute.make_rmem_tensor_like(acc_P, self.lo)
        r_P.store(acc_P.load().to(self.lo))
        atom = cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.lo
        )
        thr = cute.make_tiled_copy_C(atom, mma_qk).get_slice(tidx)
        cute.copy(atom, thr.retile(r_P), thr.partition_D(sP))

    @cute.jit
    def load_chunk(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mT: cute.Tensor,
        mV: cute.Tensor,
        sQ: cute.Tensor,
        sK: cute.Tensor,
        sT: cute.Tensor,
        sV: cute.Tensor,
        gates: cutlass.Constexpr,
        start: Int32,
        end: Int32,
        c: Int32,
        hk: Int32,
        h: Int32,
        v0: Int32,
        tidx: Int32,
    ):
        """16-byte cp.async copies of chunk ``c``'s rows into stage ``c % STAGES``: q and k
        (key head ``hk``), T (fp32) and the CTA's value columns ``v0 ..``, and 4-byte ones of
        the gate vectors ``gates`` ((global [HV, N], shared [C, STAGES]) pairs); rows past
        the request repeat its last (never used: masked)."""
        t0 = start + c * C
        last = cutlass.min(end - t0, C) - 1
        stage = c % STAGES
        bf = cute.make_copy_atom(cpasync.CopyG2SOp(), BFloat16, num_bits_per_copy=128)
        f32 = cute.make_copy_atom(cpasync.CopyG2SOp(), Float32, num_bits_per_copy=128)
        f16 = cute.make_copy_atom(cpasync.CopyG2SOp(), Float16, num_bits_per_copy=128)
        # (source, destination, elements a copy, copies a row, atom)
        rows = (
            (mQ[None, hk, None], sQ[None, None, stage], COPY, KD // COPY, bf, 0),
            (mK[None, hk, None], sK[None, None, stage], COPY, KD // COPY, bf, 0),
            (mV[None, h, None], sV[None, None, stage], COPY, self.cols // COPY, bf, v0 // COPY),
        )
        if const_expr(self.t16):  # fp16 T from gdn_prep_sm90, into the operand tile
            rows += ((mT[None, h, None], sT[None, None, stage], COPY, C // COPY, f16, 0),)
        elif const_expr(not self.inverse):  # fp32 T from the Triton prepare kernel
            rows += ((mT[None, h, None], sT[None, None, stage], 4, C // 4, f32, 0),)
        for src, dst, width, per_row, atom, first in rows:
            rows_a_pass = THREADS // per_row
            part = tidx % per_row
            for p in cutlass.range_constexpr(C // rows_a_pass):
                row = p * rows_a_pass + tidx // per_row
                tok = t0 + cutlass.min(row, last)
                cute.copy(
                    atom,
                    cute.local_tile(src[tok, None], (width,), (first + part,)),
                    cute.local_tile(dst[row, None], (width,), (part,)),
                )
        if const_expr("gates" not in self.skip):
            one = cute.make_copy_atom(cpasync.CopyG2SOp(), Float32, num_bits_per_copy=32)
            for i in cutlass.range_constexpr(len(gates) * C // THREADS):
                which = i * THREADS + tidx
                row = which % C
                tok = t0 + cutlass.min(row, last)
                for g in cutlass.range_constexpr(len(gates)):
                    if which // C == g:
                        src, dst = gates[g]
                        cute.copy(
                            one,
                            cute.local_tile(src[h, None], (1,), (tok,)),
                            cute.local_tile(dst[None, stage], (1,), (row,)),
                        )

    @cute.jit
    def store_rows(
        self,
        sO: cute.Tensor,
        mO: cute.Tensor,
        t0: Int32,
        n: Int32,
        h: Int32,
        v0: Int32,
        tidx: Int32,
    ):
        """The chunk's first ``n`` rows of O (``sO`` [t, v], this CTA's value columns) to
        ``mO[t0 + t, h, v0 ..]``, 16 bytes a thread and pass."""
        per_row = VB // COPY
        for p in cutlass.range_constexpr(C * per_row // THREADS):
            piece = p * THREADS + tidx
            row = piece // per_row
            part = piece % per_row
            if row < n:
                src = cute.local_tile(sO[row, None], (COPY,), (part,))
                dst = cute.local_tile(mO[t0 + row, h, None], (COPY,), (v0 // COPY + part,))
                dst.store(src.load())

    @cute.jit
    def operand(self, acc: cute.Tensor, hi: cute.Tensor, lo: cute.Tensor):
        """An accumulator as a register A operand: fp16 with ``half``, else two bf16 parts
        (hi + lo = acc to about 16 bits; ``lo`` untouched with ``half``)."""
        x = mma_a(acc).load()
        x_hi = x.to(self.lo)
        hi.store(x_hi)
        if const_expr(not self.half):
            lo.store((x - x_hi.to(Float32)).to(BFloat16))

    @cute.jit
    def keys_fp16(self, src: cute.Tensor, dst: cute.Tensor, stage: Int32, tidx: Int32):
        """Stage ``stage`` of the keys into their fp16 copy, 8 elements (16 bytes) a thread
        and pass, over the tiles' raw memory (``src``, ``dst``: both tiles share one
        swizzled layout, stages outermost, so raw element i of one is element i of the
        other); exact for |k| in fp16's normal range."""
        size = C * KD
        x = cute.make_rmem_tensor(COPY, Float32)
        for p in cutlass.range_constexpr(size // (THREADS * COPY)):
            piece = stage * (size // COPY) + p * THREADS + tidx
            x.store(cute.local_tile(src, (COPY,), (piece,)).load().to(Float32))
            cute.local_tile(dst, (COPY,), (piece,)).store(x.load().to(Float16))

    @cute.jit
    def split_t(self, sT: cute.Tensor, s_hi: cute.Tensor, s_lo: cute.Tensor, tidx: Int32):
        """T (fp32 [t, s]) as a bf16 high + low pair of tiles, 8 consecutive elements (16-byte
        pieces) a thread and pass; above the diagonal 0 (prepare's T is unit lower
        triangular; the mask only makes sure)."""
        per_pass = THREADS * COPY
        x = cute.make_rmem_tensor(COPY, Float32)
        for p in cutlass.range_constexpr(C * C // per_pass):
            e = p * per_pass + tidx * COPY
            t = e // C
            part = (e % C) // COPY
            load_lower(sT, t, part, x)
            vals = x.load()
            hi = vals.to(self.lo)
            cute.local_tile(s_hi[t, None], (COPY,), (part,)).store(hi)
            if const_expr(not self.half):
                cute.local_tile(s_lo[t, None], (COPY,), (part,)).store(
                    (vals - hi.to(Float32)).to(BFloat16)
                )


def fake_args(group: int = 1, t_dtype=Float32):
    """Arguments with the launch's types and dynamic sizes, no memory: what the launcher
    compiles from (for TVM FFI calls: the stream is the caller's current one) and the CPU
    compile."""
    from cutlass.cute.runtime import make_fake_stream

    tensor = fake_tensor

    n, h, hv, b, slots = (cute.sym_int32() for _ in range(5))
    ints = [tensor(Int32, (b,), 4) for _ in range(5)]  # slots, has_init, start, end, mode
    vecs = [tensor(Float32, (hv, n), 4) for _ in range(4)]
    return (
        tensor(BFloat16, (n, h, KD)), tensor(BFloat16, (n, h, KD)), tensor(BFloat16, (n, hv, VD)),
        tensor(t_dtype, (n, hv, C)), *vecs, tensor(Float32, (slots, hv, VD, KD), 4), *ints,
        tensor(BFloat16, (n, hv, VD)), make_fake_stream(use_tvm_ffi_env_stream=True),
    )  # fmt: skip


# what the compiled kernel must contain: wgmma (HGMMA), the cp.async loads, stmatrix stores
REQUIRES = {"ptx": ("wgmma.mma_async", "cp.async.ca.shared.global"), "sass": ("HGMMA", "STSM")}


def shared_bytes(consumers: int, half: bool = True, t16: bool = True) -> int:
    """Dynamic shared memory of one CTA of the form (the Storage of ``__call__``): the
    gate and row-factor vectors, q and k, P and T's operand per stage, O per consumer, the
    CTA's value columns per stage, and the fp16 keys (``half``), T's low part (without) or
    fp32 T rows (neither ``t16`` nor ``inverse``)."""
    vectors = 8 * C * STAGES * 4
    qk = 2 * C * KD * STAGES * 2
    square = 2 * C * C * STAGES * 2  # P, T's operand
    out = C * VB * consumers * 2
    values = C * VB * consumers * STAGES * 2
    extra = C * KD * STAGES * 2 if half else C * C * STAGES * 2
    if not t16:
        extra += C * C * STAGES * 4
    return vectors + qk + square + out + values + extra
