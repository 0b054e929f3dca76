"""Split-KV paged decode on Hopper, stage 1: the forward kernel's pipeline on decode tiles.

One CTA computes one (split, kv head, request): the request's one query token for the
``decode_group`` query heads that share the kv head, packed into the rows of a 64-row tile
(GQA packing: the group's heads are the MMA's M, so every K/V tile read from HBM serves the
whole group in one wgmma), against its share of the request's key tiles. The warp roles,
K/V loads (TMA per page, or cp.async row gathers for pages of fewer than 16 tokens), the
wgmma mainloop and the masks are :class:`~.fwd_sm90.MhaFwdSm90`'s with one consumer
warpgroup (``FwdShape.decode_group`` selects the decode paths there); what differs:

- Q rows are copied by the consumer warpgroup with 16-byte cp.async (row r: head r of the
  group; the tile's rows past the group repeat its last head and are never written);
- request ``b`` has ``seq_lens[b]`` keys (its new token is already in the cache) and its
  visible key tiles are split ``num_splits[b]`` ways (at most ``max_splits``, the grid's x);
- each split writes its normalised output rows (fp32) and their base-2 log-sum-exps to
  ``partial_o [B, Hq, max_splits, Dv]`` / ``partial_lse [B, Hq, max_splits]``; a split
  with no key writes zeros and -inf. The combine (:mod:`.combine`) merges them, adding
  the sinks to the denominator.

Layouts: q ``[B, Hq, D]``, paged K/V ``[num_pages, page_size, Hkv, D]`` read through
``page_table[b, j]``. An fp8 e4m3 cache (``FwdShape.kv_dtype``, pages of 16 or more tokens)
is read by TMA as fp8. Q K^T runs on e4m3 MMAs straight on the K stages (K-major as TMA
writes them): the consumer warpgroup writes each query head as two e4m3 parts of q * s (s a
power of two per head) to rows r and r + 8 of the Q tile, one thread's two accumulator
rows, which it adds and unscales (``join_q_parts``; at most 32 heads). Each V tile is
converted to fp16 in shared memory while the QK MMAs run, and P V runs on fp16 MMAs. The
per-tensor scales ``k_scale`` / ``v_scale`` ([1] fp32) fold into the softmax scale and the
partial outputs.
"""

from __future__ import annotations

from typing import Optional

import cuda.bindings.driver as cuda
import cutlass.cute as cute
from cutlass import Float32, Int32

from attngen.families.mha.cute_dsl.kernels import fwd_sm90
from attngen.families.mha.cute_dsl.kernels.common import FwdShape, mode_select, rows_aligned
from attngen.families.mha.cute_dsl.kernels.fwd_sm90 import GATHER_REQUIRES, MhaFwdSm90

# wgmma always; the Q rows' cp.async copies; TMA of K/V unless they are gathered
_Q_COPY = ("cp.async.ca.shared.global", "fence.proxy.async")


# an fp8 cache: the consumers' e4m3 -> f16 conversions of V, fp16 PV and e4m3 QK wgmmas (Q
# rows are split into e4m3 parts in registers, so no cp.async is required)
FP8_CONVERT = ("cvt.rn.f16x2.e4m3x2", "f32.f16.f16", "f32.e4m3.e4m3", "fence.proxy.async")


def requires(shape: FwdShape) -> dict[str, tuple[str, ...]]:
    """Instructions the compiled decode kernel of ``shape`` must contain (PTX, SASS)."""
    if shape.kv_fp8:
        return {"ptx": ("wgmma.mma_async", "cp.async.bulk.tensor", *FP8_CONVERT),
                "sass": ("HGMMA", "UTMALDG")}  # fmt: skip
    if shape.gather:
        return {"ptx": ("wgmma.mma_async", *GATHER_REQUIRES), "sass": ("HGMMA",)}
    return {"ptx": ("wgmma.mma_async", "cp.async.bulk.tensor", *_Q_COPY),
            "sass": ("HGMMA", "UTMALDG")}  # fmt: skip


shared_bytes = fwd_sm90.shared_bytes
SM90_SHARED_PER_SM = 228 * 1024  # one SM's shared memory; each resident CTA reserves 1 KB
CTA_RESERVED_SHARED = 1024


def resident_ctas(shape: FwdShape) -> int:
    """CTAs of ``shape`` an SM can hold by shared memory, at most 2: the launch asks ptxas
    for that many (``min_blocks_per_mp``), which at 2 caps the 256 threads at 128 registers
    each. Without the ask the fp8 cache's conversion loop took the kernel to 171 registers
    and one CTA an SM. Gathered shapes keep 1: their producers hold 48 registers, and
    48 + 224 > 2 x 128 would leave the consumers' setmaxnreg.inc waiting for ever."""
    if shape.gather:
        return 1
    return max(1, min(2, SM90_SHARED_PER_SM // (shared_bytes(shape) + CTA_RESERVED_SHARED)))


class MhaDecodeSm90(MhaFwdSm90):
    """The split-KV decode kernel of one :class:`FwdShape` (``decode_group`` > 0)."""

    def __init__(self, shape: FwdShape):
        assert shape.decode and shape.paged and not shape.sinks and not shape.overlap
        assert shape.decode_group <= shape.tile_m == 64, "the group's heads fill one wgmma M"
        super().__init__(shape)
        self.min_ctas = resident_ctas(shape)
        if self.min_ctas == 2:  # 128 registers a thread at launch: the consumers take
            # what the producer leaves of 2 x 128 (232, or 216 beside a page-looking one)
            self.consumer_regs = 2 * 128 - self.producer_regs

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mPartialO: cute.Tensor,
        mSeqLens: cute.Tensor,
        mNumSplits: cute.Tensor,
        mPageTable: cute.Tensor,
        mPartialLSE: cute.Tensor,
        mKScale: Optional[cute.Tensor],  # fp8 cache: [1] fp32 dequant scales, else None
        mVScale: Optional[cute.Tensor],
        softmax_scale: Float32,
        stream: cuda.CUstream,
    ):
        mQ, mK, mV = (rows_aligned(t) for t in (mQ, mK, mV))
        mK, mV = mode_select(mK, [1, 3, 2, 0]), mode_select(mV, [1, 3, 2, 0])
        # the Q atom (over (B, D, Hq)) goes unused: the consumers copy the group's rows
        tma, smem, mmas, SharedStorage = self.setup(mode_select(mQ, [0, 2, 1]), mK, mV)
        grid = (
            cute.size(mPartialLSE.shape[2]),  # max_splits
            cute.size(mK.shape[2]),  # kv heads
            cute.size(mQ.shape[0]),  # requests
        )
        self.kernel(
            mQ, tma[1], tma[2], mK, mV, mPartialO, mSeqLens, None, mPageTable, None,
            mNumSplits, mPartialLSE, mKScale, mVScale, None, None, *tma[3:], softmax_scale,
            self.scale_log2(softmax_scale), Int32(0), *smem, *mmas, SharedStorage,
        ).launch(
            grid=grid,
            block=[self.num_threads, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=self.min_ctas,
            preferred_smem_carveout=100,  # percent: all of the SM's shared memory
        )  # fmt: skip


KERNEL = MhaDecodeSm90  # what host/compile.py builds for sm90 decode
