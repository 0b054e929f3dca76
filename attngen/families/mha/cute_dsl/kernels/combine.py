"""Split-KV decode, stage 2: merge each (request, query head)'s split outputs.

One CTA per (query head, request), one thread per output column: with ``n = num_splits[b]``
partials ``O_s`` (normalised, fp32) and base-2 log-sum-exps ``l_s`` (-inf for a split that
saw no key), the output is ``sum_s 2^(l_s - m) O_s / (sum_s 2^(l_s - m) + sink)`` with
``m = max(l_s, sink logit)`` and ``sink = 2^(sinks[h] * log2(e) - m)`` when the mask has
sinks (the sink joins the softmax denominator, as in the forward kernels). A row with no
visible key and no sink gives zeros. Arch-independent SIMT code (no tensor cores).

Layouts: partial_o ``[B, Hq, max_splits, Dv]``, partial_lse ``[B, Hq, max_splits]`` (fp32),
num_splits ``[B]`` int32 (1 .. max_splits; clamped to that range), out ``[B, Hq, Dv]``.
"""

from __future__ import annotations

from typing import Optional

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr

from attngen.families.mha.cute_dsl.kernels.common import DTYPES, LOG2_E, CombineShape

# plain loads and stores: nothing beyond what any kernel has
REQUIRES: dict[str, tuple[str, ...]] = {"ptx": ("ex2.approx",)}


def requires(shape: CombineShape) -> dict[str, tuple[str, ...]]:
    return REQUIRES


def shared_bytes(shape: CombineShape) -> int:
    return 0


class DecodeCombine:
    """The combine kernel of one :class:`CombineShape`."""

    def __init__(self, shape: CombineShape):
        self.shape = shape
        self.dtype = DTYPES[shape.dtype]

    @cute.jit
    def __call__(
        self,
        mPartialO: cute.Tensor,
        mPartialLSE: cute.Tensor,
        mNumSplits: cute.Tensor,
        mSinks: Optional[cute.Tensor],
        mO: cute.Tensor,
        stream: cuda.CUstream,
    ):
        grid = (cute.size(mO.shape[1]), cute.size(mO.shape[0]), 1)
        self.kernel(mPartialO, mPartialLSE, mNumSplits, mSinks, mO).launch(
            grid=grid, block=[self.shape.v_head_dim, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(
        self,
        mPartialO: cute.Tensor,
        mPartialLSE: cute.Tensor,
        mNumSplits: cute.Tensor,
        mSinks: Optional[cute.Tensor],
        mO: cute.Tensor,
    ):
        col, _, _ = cute.arch.thread_idx()
        head, batch, _ = cute.arch.block_idx()
        n = cutlass.max(cutlass.min(mNumSplits[batch], mPartialLSE.shape[2]), 1)
        m = -Float32.inf
        for s in cutlass.range(n, unroll=1):
            m = cutlass.max(m, mPartialLSE[batch, head, s])
        sink = -Float32.inf
        if const_expr(self.shape.sinks):
            sink = Float32(mSinks[head]) * LOG2_E
            m = cutlass.max(m, sink)
        m_safe = m if m != -Float32.inf else Float32(0.0)
        total = Float32(0.0)
        acc = Float32(0.0)
        for s in cutlass.range(n, unroll=1):
            w = cute.math.exp2(mPartialLSE[batch, head, s] - m_safe, fastmath=True)
            total += w
            acc += w * mPartialO[batch, head, s, col]
        if const_expr(self.shape.sinks):
            total += cute.math.exp2(sink - m_safe, fastmath=True)
        out = acc / total if total > 0.0 else Float32(0.0)
        mO[batch, head, col] = out.to(self.dtype)


KERNEL = DecodeCombine  # what host/compile.py builds for the combine (any arch)
