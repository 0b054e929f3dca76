"""The triangular inverse of the GDN chunk form on one sm90 warpgroup, in CuTe DSL:
T = (I + M)^-1 with M = (K K^T ∘ beta_t kn_t kn_s exp(G_t -
G_s))[s < t < n], as the Triton prepare kernel forms it, from a chunk's keys in shared
memory. Shared by the fused kernel's third warpgroup (``chunk_sm90.GdnFusedSm90(inverse=True)``) and
the prepare kernel (``prepare_sm90``) as a mixin: the class using it sets
``self.skip`` (parts a timing ablation leaves out: "diag", "merge").

M goes to shared memory in fp32 (``form_m``: K K^T on a wgmma, exact bf16 products); T is
formed by blocked forward substitution in fp32 FMAs (``form_t``): each warp inverts one
16 x 16 diagonal block by substitution (a lane a column, its column in registers), then the
16 -> 32 and 32 -> 64 merges T_21 = -T_22 (M_21 T_11) run as shared-memory products of
the warpgroup (``small_gemm``). Rows of the fp32 tiles are padded by ``PAD`` so that four
rows' 16-byte pieces fall in different banks.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90
from cutlass import BFloat16, Float32, Int32, const_expr

from attngen.families.mha.cute_dsl.kernels.common import LOG2_E
from attngen.families.mha.cute_dsl.kernels.fragments import wgmma_group

C = 64  # tokens a chunk
THREADS = 128  # the warpgroup
PAD = 4  # fp32 elements after each row of the inverse's tiles
# named barriers: INVERSE (the warpgroup), PAIR + p (its warps 2p, 2p + 1)
INVERSE, PAIR = 10, 11


COPY = 8  # 16-bit elements a 16-byte piece; fp32 T rows go out 8 at a time too


def tile_layout(rows: int = C) -> cute.Layout:
    """A padded fp32 [rows, rows] tile (M, T; rows // 2 for the products' scratch)."""
    return cute.make_layout((rows, rows), stride=(rows + PAD, 1))


def chunk_mma() -> cute.TiledMma:
    """The warpgroup's [C, C] product of two K-major bf16 shared tiles (K K^T, Q K^T)."""
    k_major = sm90.OperandMajorMode.K
    return sm90.make_trivial_tiled_mma(
        BFloat16, BFloat16, k_major, k_major, Float32, atom_layout_mnk=(1, 1, 1),
        tiler_mn=(C, C),
    )  # fmt: skip


def smem_member(layout, dtype) -> type:
    """A shared-storage member holding ``layout``'s elements, 1024-byte aligned (what a
    swizzled wgmma operand needs)."""
    return cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(layout)], 1024]


def fake_tensor(dtype, dims, align: int = 16):
    """A CPU-compile stand-in with DLPack's dynamic layout: symbolic strides, the last 1."""
    from cutlass.cute.runtime import make_fake_tensor

    strides = [cute.sym_int64() for _ in dims[:-1]]
    return make_fake_tensor(dtype, dims, (*strides, 1), assumed_align=align)


@cute.jit
def load_lower(sT: cute.Tensor, t: Int32, part: Int32, x: cute.Tensor):
    """Elements ``part * COPY ..`` of fp32 T's row ``t`` into ``x``, 0 above the diagonal."""
    x.store(cute.local_tile(sT[t, None], (COPY,), (part,)).load())
    for e in cutlass.range_constexpr(COPY):
        x[e] = cutlass.select_(part * COPY + e <= t, x[e], Float32(0.0))


class InverseSm90:
    """form_m, form_t and small_gemm for a class with ``self.skip``."""

    @cute.jit
    def form_m(
        self,
        mma_qk: cute.TiledMma,
        tKa: cute.Tensor,
        tKb: cute.Tensor,
        cM: cute.Tensor,
        sM: cute.Tensor,
        sG: cute.Tensor,
        sBeta: cute.Tensor,
        sKn: cute.Tensor,
        n: Int32,
        tidx: Int32,
    ):
        """M = (K K^T ∘ beta_t kn_t kn_s exp(G_t - G_s))[s < t < n] in fp32 into ``sM``
        [t, s] from the stored keys (exact bf16 products), as the prepare kernel forms it."""
        acc = cute.make_rmem_tensor(mma_qk.partition_shape_C((C, C)), Float32)
        tMs = mma_qk.get_slice(tidx).partition_C(sM)  # sM as the accumulator: static offsets
        wgmma_group(mma_qk, acc, tKa, tKb, True)
        # everyone is done reading the last chunk's M
        cute.arch.barrier(barrier_id=INVERSE, number_of_threads=THREADS)
        for j in cutlass.range_constexpr(cute.size(acc)):
            t, s = cM[j]
            decay = cute.math.exp2(cutlass.min(sG[t] - sG[s], 0.0) * LOG2_E, fastmath=True)
            factor = cutlass.select_(t < n, sBeta[t] * sKn[t] * sKn[s] * decay, Float32(0.0))
            tMs[j] = acc[j] * cutlass.select_(s < t, factor, Float32(0.0))

    @cute.jit
    def form_t(self, sM: cute.Tensor, sT: cute.Tensor, sY: cute.Tensor, tidx: Int32):
        """T = (I + M)^-1 into ``sT`` (fp32 [t, s], lower triangular; the blocks above the
        diagonal that the products below read are zeroed, the rest are left: split_t masks
        them) by blocked forward substitution, in fp32 FMAs: each warp inverts one 16 x 16
        diagonal block by substitution (a lane a column, its T column in registers), then
        the 16 -> 32 and 32 -> 64 merges, T_21 = -T_22 (M_21 T_11), as shared-memory products
        of all 128 threads (four dependent steps of 64 .. 256 FMAs a thread)."""
        warp = tidx // 32
        lane = tidx % 32
        col = lane % 16
        blk = 16
        if const_expr("diag" not in self.skip):
            m_blk = cute.local_tile(sM, (blk, blk), (warp, warp))
            mine = cute.make_rmem_tensor(blk, Float32)  # T[base + r, base + col]
            for r in cutlass.range_constexpr(blk):
                mine[r] = cutlass.select_(r == col, Float32(1.0), Float32(0.0))
            x = cute.make_rmem_tensor(4, Float32)
            for t in cutlass.range_constexpr(1, blk):
                parts = [Float32(0.0) for _ in range(4)]
                for q in cutlass.range_constexpr((t + 3) // 4):  # M[t, s], s < t (0 at s >= t)
                    x.store(cute.local_tile(m_blk[t, None], (4,), (q,)).load())
                    for e in cutlass.range_constexpr(4):
                        parts[e] = parts[e] + x[e] * mine[4 * q + e]
                mine[t] = mine[t] - ((parts[0] + parts[1]) + (parts[2] + parts[3]))
            t_blk = cute.local_tile(sT, (blk, blk), (warp, warp))
            if lane < blk:
                for r in cutlass.range_constexpr(blk):
                    t_blk[r, col] = mine[r]
            if warp % 2 == 0:  # the block right of this one is read by the 32 -> 64 merge: 0
                right = cute.local_tile(sT, (blk, blk), (warp, warp + 1))
                for r in cutlass.range_constexpr(blk * blk // 32):
                    right[r * 2 + lane // 16, col] = Float32(0.0)
        cute.arch.barrier(barrier_id=INVERSE, number_of_threads=THREADS)
        # -- 16 -> 32: warps 2p, 2p + 1 merge diagonal blocks 2p and 2p + 1 ----
        if const_expr("merge" not in self.skip):
            pair = warp // 2
            ptid = tidx % 64
            y = cute.local_tile(sY, (blk, blk), (pair, 0))

            def block(tile, i, j, size=blk):
                return cute.local_tile(tile, (size, size), (i, j))

            lo, hi = 2 * pair, 2 * pair + 1
            self.small_gemm(y, block(sM, hi, lo), block(sT, lo, lo), 1.0, ptid, 64)
            cute.arch.barrier(barrier_id=PAIR + pair, number_of_threads=64)
            self.small_gemm(block(sT, hi, lo), block(sT, hi, hi), y, -1.0, ptid, 64)
            cute.arch.barrier(barrier_id=INVERSE, number_of_threads=THREADS)
            # -- 32 -> 64 ----
            half = 2 * blk
            self.small_gemm(sY, block(sM, 1, 0, half), block(sT, 0, 0, half), 1.0, tidx, THREADS)
            cute.arch.barrier(barrier_id=INVERSE, number_of_threads=THREADS)
            self.small_gemm(block(sT, 1, 0, half), block(sT, 1, 1, half), sY, -1.0, tidx, THREADS)
        cute.arch.barrier(barrier_id=INVERSE, number_of_threads=THREADS)

    @cute.jit
    def small_gemm(
        self,
        out: cute.Tensor,
        a: cute.Tensor,
        b: cute.Tensor,
        scale: cutlass.Constexpr,
        tidx: Int32,
        threads: cutlass.Constexpr,
    ):
        """out = scale (a b) for fp32 shared tiles (rows x k) (k x cols) in fp32 FMAs: thread
        ``tidx`` of ``threads`` forms 4 adjacent columns of rows tidx // (cols / 4) + p
        threads / (cols / 4) for each pass p, reading a and b by 16-byte pieces (each piece
        of b serves every pass's row)."""
        rows, cols = cute.size(out, mode=[0]), cute.size(out, mode=[1])
        depth = cute.size(a, mode=[1])
        groups = cols // 4
        per_pass = threads // groups
        passes = rows // per_pass
        g = tidx % groups
        row0 = tidx // groups
        av = cute.make_rmem_tensor((4, passes), Float32)
        bv = cute.make_rmem_tensor(4, Float32)
        acc = cute.make_rmem_tensor((4, passes), Float32)
        acc.fill(0.0)
        for k4 in cutlass.range_constexpr(depth // 4):
            for p in cutlass.range_constexpr(passes):
                piece = cute.local_tile(a[row0 + p * per_pass, None], (4,), (k4,))
                av[None, p].store(piece.load())
            for kk in cutlass.range_constexpr(4):
                bv.store(cute.local_tile(b[4 * k4 + kk, None], (4,), (g,)).load())
                for p in cutlass.range_constexpr(passes):
                    for e in cutlass.range_constexpr(4):
                        acc[e, p] = acc[e, p] + av[kk, p] * bv[e]
        for p in cutlass.range_constexpr(passes):
            for e in cutlass.range_constexpr(4):
                acc[e, p] = acc[e, p] * scale
            cute.local_tile(out[row0 + p * per_pass, None], (4,), (g,)).store(acc[None, p].load())
