"""Register-fragment views of Hopper warpgroup MMA accumulators.

A wgmma accumulator of an (M, N) tile is held by each thread as ``((2, 2, V), MMA_M,
MMA_N)``: for every 8-column group, 2 adjacent columns of 2 rows (r and r + 8). Softmax
wants it as (rows, columns); the P @ V wgmma wants the same registers as its A operand
(register-sourced), whose k16 atoms take two 8-column groups: ``((2, 2, 2), MMA_M,
MMA_K)``. Both are views (layouts over the same registers), never copies. And
:func:`wgmma_group`, which issues one MMA over such fragments (the MHA forward's and the GDN
chunk kernels' common step: kept here, so that editing either kernel leaves the other's
identity and evidence standing).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import const_expr
from cutlass.cute.nvgpu import warpgroup


def rows_cols_layout(acc: cute.Layout) -> cute.Layout:
    """((2, 2, V), MMA_M, MMA_N) -> ((2, MMA_M), (2, V, MMA_N)): rows first, then columns."""
    flat = cute.make_layout(acc.shape)  # the accumulator's registers, column-major
    col_pair, row_half, col_groups = (flat.shape[0][i] for i in range(3))
    col_pair_s, row_half_s, col_groups_s = (flat.stride[0][i] for i in range(3))
    shape = ((row_half, flat.shape[1]), (col_pair, col_groups, flat.shape[2]))
    stride = ((row_half_s, flat.stride[1]), (col_pair_s, col_groups_s, flat.stride[2]))
    return cute.composition(acc, cute.make_layout(shape, stride=stride))


def rows_cols(acc: cute.Tensor) -> cute.Tensor:
    return cute.make_tensor(acc.iterator, rows_cols_layout(acc.layout))


def mma_a_layout(acc: cute.Layout) -> cute.Layout:
    """((2, 2, V), MMA_M, MMA_N) -> ((2, 2, 2), MMA_M, (V / 2, MMA_N)): the accumulator of
    S = Q K^T read as the A operand of O += P V (V even: tile_n is a multiple of 16)."""
    split = cute.logical_divide(acc, ((None, None, 2), None, None))
    atom = (split.shape[0][0], split.shape[0][1], split.shape[0][2][0])
    atom_s = (split.stride[0][0], split.stride[0][1], split.stride[0][2][0])
    shape = (atom, split.shape[1], (split.shape[0][2][1], split.shape[2]))
    stride = (atom_s, split.stride[1], (split.stride[0][2][1], split.stride[2]))
    return cute.make_layout(shape, stride=stride)


def mma_a(acc: cute.Tensor) -> cute.Tensor:
    return cute.make_tensor(acc.iterator, mma_a_layout(acc.layout))


def transpose_smem(s: cute.Tensor) -> cute.Tensor:
    """(rows, cols, ...) -> (cols, rows, ...) of a shared-memory tile (V read as V^T)."""
    shape = (s.shape[1], s.shape[0], *s.shape[2:])
    order = (1, 0, *range(2, cute.rank(s)))
    return cute.composition(s, cute.make_ordered_layout(shape, order=order))


@cute.jit
def wgmma_group(
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    t_a: cute.Tensor,
    t_b: cute.Tensor,
    zero_init: cutlass.Constexpr[bool],
    wait: cutlass.Constexpr[int] = 0,
):
    """acc (+)= A B over the k blocks of the fragments as one wgmma group, then wait until
    at most ``wait`` groups are in flight (-1: do not wait)."""
    warpgroup.fence()
    atom = cute.make_mma_atom(tiled_mma.op)
    atom.set(warpgroup.Field.ACCUMULATE, not zero_init)
    for k in cutlass.range_constexpr(cute.size(t_a.shape[2])):
        cute.gemm(atom, acc, t_a[None, None, k], t_b[None, None, k], acc)
        atom.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.commit_group()
    if const_expr(wait >= 0):
        warpgroup.wait_group(wait)
