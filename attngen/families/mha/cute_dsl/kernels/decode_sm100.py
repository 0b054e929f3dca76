"""Split-KV paged decode on Blackwell, stage 1: the sm100 forward kernel on decode tiles.
COMPILE-ONLY, as :mod:`.fwd_sm100`: it builds for sm_100a on CPU (the AOT check proves
tcgen05 and bulk tensor copies are in it) but has not run on a B200.

One CTA computes one (split, kv head, request): the request's one query token for the
``decode_group`` query heads that share the kv head, as the rows of the forward's 128-row
tile (GQA packing: the group's heads are the MMA's M, so every K/V tile read from HBM serves
the whole group in one tcgen05 MMA), against its share of the request's key tiles. The host
plans decode tiles of ``FwdShape.tile_m`` = 64 rows (the group's limit) for both archs; this
kernel pads them to the 128 rows of its MMA, one softmax thread a row. The warp
roles, K/V loads (TMA per page or per tile of a page, cp.async row gathers for pages of
fewer than 16 tokens), the MMAs and the masks are :class:`~.fwd_sm100.MhaFwdSm100`'s
(``FwdShape.decode_group`` selects the decode paths there); what differs:

- the Q tile is one TMA box of the rows ``head .. head + 128`` of q viewed as ``(Hq, D, B)``
  at the request (the group's heads first; rows past the group read the next heads, rows
  past Hq are zero-filled by TMA; neither is written);
- every row is at the request's newest position ``seq_lens[b] - 1``, and the visible key
  tiles are split ``num_splits[b]`` ways (at most ``max_splits``, the grid's x);
- each split writes its normalised output rows (fp32) and their base-2 log-sum-exps to
  ``partial_o [B, Hq, max_splits, Dv]`` / ``partial_lse [B, Hq, max_splits]``, as the sm90
  decode does, for the same combine (:mod:`.combine`), which adds the sinks.
- over an fp8 e4m3 cache (``FwdShape.kv_dtype``, per-tensor k_scale / v_scale, pages of 16+
  tokens read by TMA): the softmax warps write each head's q as two e4m3 parts under a
  power-of-two scale (one row each: the group may fill the 64 planned rows), the MMA warp
  runs Q K^T as two accumulating e4m3 MMAs on the K stages as TMA wrote them, the softmax
  warps convert each V stage to fp16 for the P V MMA (fp16 P), K's scale folds into the
  softmax scale and V's into the output.

Layouts: q ``[B, Hq, D]``, paged K/V ``[num_pages, page_size, Hkv, D]`` read through
``page_table[b, j]``, K/V in the activation dtype or fp8 e4m3.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import cuda.bindings.driver as cuda
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from attngen.families.mha.cute_dsl.kernels import fwd_sm100
from attngen.families.mha.cute_dsl.kernels.common import FwdShape, mode_select, rows_aligned
from attngen.families.mha.cute_dsl.kernels.fwd_sm100 import NUM_THREADS, MhaFwdSm100

requires = fwd_sm100.requires


def padded(shape: FwdShape) -> FwdShape:
    """The forward kernel's shape this decode runs: the planned rows padded to the 128 of the
    tcgen05 tile (one softmax thread a row)."""
    return dataclasses.replace(shape, tile_m=fwd_sm100.SOFTMAX_WARPS * 32)


def shared_bytes(shape: FwdShape) -> int:
    return fwd_sm100.shared_bytes(padded(shape))


class MhaDecodeSm100(MhaFwdSm100):
    """The split-KV decode kernel of one :class:`FwdShape` (``decode_group`` > 0) for sm_100a."""

    def __init__(self, shape: FwdShape):
        assert shape.decode and shape.paged and not shape.sinks
        assert shape.decode_group <= shape.tile_m, "the group's heads fill the planned rows"
        super().__init__(padded(shape))

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
        mQ = mode_select(mQ, [1, 2, 0])  # (Hq, D, B): a TMA box of heads at one request
        mK, mV = mode_select(mK, [1, 3, 2, 0]), mode_select(mV, [1, 3, 2, 0])
        tma, layouts, mmas, SharedStorage = self.setup(mQ, mK, mV)
        grid = (
            cute.size(mPartialLSE.shape[2]),  # max_splits
            cute.size(mK.shape[2]),  # kv heads
            cute.size(mQ.shape[2]),  # requests
        )
        # over an fp8 cache the softmax warps read q's rows themselves (no Q TMA)
        q_arg = mQ if const_expr(self.shape.kv_fp8) else tma[0]
        self.kernel(
            q_arg, tma[1], tma[2], mK, mV, mPartialO, mSeqLens, None, mPageTable, None,
            mNumSplits, mPartialLSE, mKScale, mVScale, None, None, *tma[3:], softmax_scale,
            self.scale_log2(softmax_scale), Int32(0), *layouts, *mmas, SharedStorage,
        ).launch(
            grid=grid, block=[NUM_THREADS, 1, 1], smem=SharedStorage.size_in_bytes(),
            stream=stream,
        )  # fmt: skip


KERNEL = MhaDecodeSm100  # what host/compile.py builds for sm100 decode
