"""The GDN chunk kernel's prepare launch in CuTe DSL for sm90: per chunk of 64 tokens and
value head, G (the cumulative log decay in the chunk), beta and the q / k inverse norms
(q's with the scale), ``[HV, N]`` fp32, and T = (I + M)^-1 as **fp16** ``[N, HV, C]``
(exact zeros above the diagonal; rows past the request not written), the operand the chunk
kernel's ``half`` form loads as it is (``chunk_sm90.GdnFusedSm90(half=True, t16=True)``).

Why a launch of its own: the chunk kernel's third warpgroup can form the same T
(``inverse=True``) but then sits in the chunk's chain (its loads wait for a stage to free,
then M and the inverse run); here every (chunk, head) is a CTA of one warpgroup, several an
SM, so the inverse's latency hides behind other CTAs' (H100: 0.21 ms at 1x32k H16 against
the Triton prepare kernel's 0.41; bench/README.md). The inverse is ``inverse_sm90``: K K^T
on a wgmma, M, the diagonal blocks by substitution in registers, two merges as
shared-memory products, all fp32 but the bf16 keys' exact products.

Gates: g = -exp(A_log) softplus(a + dt_bias) (softplus(x) = x above 20, as torch's),
beta = sigmoid(b); the inverse norms 1 / sqrt(sum x^2 + 1e-6) in fp32 (q and k L2-normalised
in the kernel, as the chunk kernel assumes).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.memory
from cutlass import BFloat16, Float16, Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync

from attngen.families.mha.cute_dsl.kernels.common import rows_aligned, smem_layout
from attngen.families.gdn.cute_dsl.kernels.inverse_sm90 import (
    COPY,
    INVERSE,
    PAD,
    InverseSm90,
    chunk_mma,
    fake_tensor,
    load_lower,
    smem_member,
)
from attngen.families.gdn.cute_dsl.kernels.inverse_sm90 import tile_layout as inv_tile

C = 64  # tokens a chunk
KD = 128  # key head dim
THREADS = 128
L2_EPS = 1e-6  # as attngen.families.gdn.reference
SOFTPLUS_THRESHOLD = 20.0
ALL = 0  # named barrier: the whole CTA (one warpgroup)


class GdnPrepSm90(InverseSm90):
    """q, k ``[N, H, KD]`` bf16; a, b ``[N, HV]`` bf16; A_log, dt_bias ``[HV]`` fp32;
    chunk_seq, chunk_start ``[chunks]`` and query_start_loc ``[B + 1]`` int32 (the Triton
    extend's chunk plan); out: G, beta, qs, kn ``[HV, N]`` fp32, T ``[N, HV, C]`` fp16."""

    PARTS = ("mform", "diag", "merge")  # the inverse's parts an ablation may leave out

    def __init__(self, group: int = 1, skip: tuple[str, ...] = ()):
        self.group = group  # value heads per key head
        assert set(skip) <= set(self.PARTS), skip
        self.skip = frozenset(skip)

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mA: cute.Tensor,
        mB: cute.Tensor,
        mALog: cute.Tensor,
        mDtBias: cute.Tensor,
        mChunkSeq: cute.Tensor,
        mChunkStart: cute.Tensor,
        mQsl: cute.Tensor,
        mG: cute.Tensor,
        mBeta: cute.Tensor,
        mQs: cute.Tensor,
        mKn: cute.Tensor,
        mT: cute.Tensor,
        scale: Float32,
        stream: cuda.CUstream,
    ):
        mQ, mK, mT = (rows_aligned(t) for t in (mQ, mK, mT))  # 16-byte rows
        mma_kk = chunk_mma()
        l_k = smem_layout(BFloat16, C, KD, None)  # the chunk's keys [t, key], swizzled
        l_m, l_y = inv_tile(), inv_tile(C // 2)
        members = {
            "sK": smem_member(l_k, BFloat16), "sM": smem_member(l_m, Float32),
            "sTf": smem_member(l_m, Float32), "sY": smem_member(l_y, Float32),
            "g": cute.struct.MemRange[Float32, C],
            "beta": cute.struct.MemRange[Float32, C], "kn": cute.struct.MemRange[Float32, C],
            "graw": cute.struct.MemRange[Float32, C],
        }  # fmt: skip
        Storage = cute.struct(type("Storage", (), {"__annotations__": members}))
        grid = (cute.size(mChunkSeq.shape[0]), cute.size(mA.shape[1]), 1)
        self.kernel(
            mQ, mK, mA, mB, mALog, mDtBias, mChunkSeq, mChunkStart, mQsl, mG, mBeta, mQs,
            mKn, mT, scale, l_k, l_m, l_y, mma_kk, Storage,
        ).launch(
            grid=grid, block=[THREADS, 1, 1], smem=Storage.size_in_bytes(), stream=stream
        )  # fmt: skip

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mA: cute.Tensor,
        mB: cute.Tensor,
        mALog: cute.Tensor,
        mDtBias: cute.Tensor,
        mChunkSeq: cute.Tensor,
        mChunkStart: cute.Tensor,
        mQsl: cute.Tensor,
        mG: cute.Tensor,
        mBeta: cute.Tensor,
        mQs: cute.Tensor,
        mKn: cute.Tensor,
        mT: cute.Tensor,
        scale: Float32,
        l_k: cute.ComposedLayout,
        l_m: cute.Layout,
        l_y: cute.Layout,
        mma_kk: cute.TiledMma,
        Storage: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        chunk, h, _ = cute.arch.block_idx()
        hk = h // self.group
        start = mChunkStart[chunk]
        n = cutlass.min(mQsl[mChunkSeq[chunk] + 1] - start, C)
        st = cutlass.memory.SmemAllocator().allocate(Storage)
        sK = st.sK.get_tensor(l_k.outer, swizzle=l_k.inner)
        sM, sTf, sY = st.sM.get_tensor(l_m), st.sTf.get_tensor(l_m), st.sY.get_tensor(l_y)
        vec = cute.make_layout(C)
        sG, sBeta, sKn, sGraw = (m.get_tensor(vec) for m in (st.g, st.beta, st.kn, st.graw))
        # -- the keys by cp.async (rows past the request repeat its last: finite, unused) ----
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(), BFloat16, num_bits_per_copy=128)
        per_row = KD // COPY
        for p in cutlass.range_constexpr(C * per_row // THREADS):
            piece = p * THREADS + tidx
            row, part = piece // per_row, piece % per_row
            tok = start + cutlass.min(row, n - 1)
            cute.copy(
                atom,
                cute.local_tile(mK[tok, hk, None], (COPY,), (part,)),
                cute.local_tile(sK[row, None], (COPY,), (part,)),
            )
        cute.arch.cp_async_commit_group()
        # -- gates of row t = tidx (< C): g raw, beta ----
        if tidx < C:
            t = tidx
            valid = t < n
            tok = start + cutlass.min(t, n - 1)
            x = Float32(mA[tok, h]) + mDtBias[h]
            soft = cutlass.select_(x > SOFTPLUS_THRESHOLD, x, cute.math.log(1.0 + cute.math.exp(x)))
            g = -cute.math.exp(mALog[h]) * soft
            beta = 1.0 / (1.0 + cute.math.exp(-Float32(mB[tok, h])))
            sGraw[t] = cutlass.select_(valid, g, Float32(0.0))
            sBeta[t] = cutlass.select_(valid, beta, Float32(0.0))
        # -- q's inverse norms from global: two threads a row, 64 elements each ----
        row, half = tidx // 2, tidx % 2
        tok = start + cutlass.min(row, n - 1)
        qs = self.inverse_norm(mQ[tok, hk, None], half) * scale
        cute.arch.cp_async_wait_group(0)
        cute.arch.fence_view_async_shared()  # the keys' copies, then K K^T's wgmma reads them
        cute.arch.barrier(barrier_id=ALL, number_of_threads=THREADS)
        kn = self.inverse_norm(sK[row, None], half)
        # G: the cumulative sum of g in the chunk (row t sums rows 0 .. t; 0 past n)
        if tidx < C:
            total = Float32(0.0)
            for s in cutlass.range_constexpr(C):
                total = total + cutlass.select_(s <= tidx, sGraw[s], Float32(0.0))
            sG[tidx] = total
        if half == 0:
            sKn[row] = cutlass.select_(row < n, kn, Float32(0.0))
            if row < n:
                mQs[h, start + row] = qs
                mKn[h, start + row] = kn
        cute.arch.barrier(barrier_id=ALL, number_of_threads=THREADS)
        if tidx < n:
            mG[h, start + tidx] = sG[tidx]
            mBeta[h, start + tidx] = sBeta[tidx]
        # -- M, then T = (I + M)^-1, then T to fp16 rows ----
        wg_kk = mma_kk.get_slice(0)
        tKa = wg_kk.make_fragment_A(wg_kk.partition_A(sK))
        tKb = wg_kk.make_fragment_B(wg_kk.partition_B(sK))
        cM = mma_kk.get_slice(tidx).partition_C(cute.make_identity_tensor((C, C)))
        if const_expr("mform" not in self.skip):
            self.form_m(mma_kk, tKa, tKb, cM, sM, sG, sBeta, sKn, n, tidx)
        cute.arch.barrier(barrier_id=INVERSE, number_of_threads=THREADS)
        self.form_t(sM, sTf, sY, tidx)
        self.store_t(sTf, mT, start, n, h, tidx)

    @cute.jit
    def inverse_norm(self, x_row: cute.Tensor, half: Int32) -> Float32:
        """1 / sqrt(sum x^2 + eps) of a [KD] bf16 row (global or shared), the two threads
        of a row (``half``: which 64 elements) joined by a shuffle."""
        width = KD // 2
        v = cute.make_rmem_tensor(COPY, Float32)
        total = Float32(0.0)
        for p in cutlass.range_constexpr(width // COPY):
            v.store(
                cute.local_tile(x_row, (COPY,), (half * (width // COPY) + p,)).load().to(Float32)
            )
            for e in cutlass.range_constexpr(COPY):
                total = total + v[e] * v[e]
        total = total + cute.arch.shuffle_sync_bfly(total, offset=1)
        return cute.math.rsqrt(total + L2_EPS)

    @cute.jit
    def store_t(
        self, sT: cute.Tensor, mT: cute.Tensor, start: Int32, n: Int32, h: Int32, tidx: Int32
    ):
        """T's first ``n`` rows as fp16 to ``mT[start + t, h, :]``, 0 above the diagonal, 8
        elements (16 bytes) a thread and pass."""
        per_row = C // COPY
        x = cute.make_rmem_tensor(COPY, Float32)
        for p in cutlass.range_constexpr(C * per_row // THREADS):
            piece = p * THREADS + tidx
            t, part = piece // per_row, piece % per_row
            load_lower(sT, t, part, x)
            if t < n:
                dst = cute.local_tile(mT[start + t, h, None], (COPY,), (part,))
                dst.store(x.load().to(Float16))


def fake_args(group: int = 1):
    """Arguments with the launch's types and dynamic sizes, no memory: what the launcher
    compiles from (for TVM FFI calls: the stream is the caller's current one) and the CPU
    compile."""
    from cutlass.cute.runtime import make_fake_stream

    tensor = fake_tensor
    n, h, hv, chunks, b1 = (cute.sym_int32() for _ in range(5))
    return (
        tensor(BFloat16, (n, h, KD)), tensor(BFloat16, (n, h, KD)),
        tensor(BFloat16, (n, hv), 2), tensor(BFloat16, (n, hv), 2),
        tensor(Float32, (hv,), 4), tensor(Float32, (hv,), 4),
        tensor(Int32, (chunks,), 4), tensor(Int32, (chunks,), 4), tensor(Int32, (b1,), 4),
        *(tensor(Float32, (hv, n), 4) for _ in range(4)), tensor(Float16, (n, hv, C)),
        Float32(KD**-0.5), make_fake_stream(use_tvm_ffi_env_stream=True),
    )  # fmt: skip


REQUIRES = {"ptx": ("wgmma.mma_async",), "sass": ("HGMMA",)}


def shared_bytes() -> int:
    """Dynamic shared memory of one CTA: the chunk's keys, M, T and the products' scratch
    (fp32, padded rows, each 1024-byte aligned), four vectors."""
    align = 1024

    def aligned(n: int) -> int:
        return -(-n // align) * align

    keys = aligned(C * KD * 2)
    square = aligned(C * (C + PAD) * 4)
    scratch = aligned(C // 2 * (C // 2 + PAD) * 4)
    return keys + 2 * square + scratch + 4 * C * 4
