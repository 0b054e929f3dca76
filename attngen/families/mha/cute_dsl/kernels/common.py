"""What the forward kernels of every arch share: the specialization they are compiled for,
dtype spellings, shared-memory tile layouts and views of the launchers' tensors."""

from __future__ import annotations

import math
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90
from cutlass.cute.nvgpu import warpgroup
from cutlass.tensor_utils import LayoutEnum

LOG2_E = math.log2(math.e)  # exp(x) = exp2(x * LOG2_E)
LN2 = math.log(2.0)  # ln(x) = log2(x) * LN2


@dataclass(frozen=True)
class FwdShape:
    """What one compiled forward kernel is specialized for (everything else is dynamic)."""

    dtype: str  # "bfloat16" | "float16"
    head_dim: int  # qk
    v_head_dim: int
    tile_m: int  # query rows per CTA
    tile_n: int  # keys per pipeline stage (== page_size when paged)
    num_stages: int  # K/V ring depth
    causal: bool
    window_left: int | None
    logit_softcap: float | None
    sinks: bool
    paged: bool
    # sm90: issue S_j = Q K_j^T before O += P_{j-1} V_{j-1} and run S_j's softmax while that
    # PV runs (FA3's intra-warpgroup overlap): the sm90 lowering's default (config
    # fwd_intra_wg_overlap), matched against the oracle on the H200 at a3885ee.
    overlap: bool = False
    # query heads packed into one CTA's rows (GQA packing, prefill / extend): 1, or the GQA
    # group: row r of the tile is token r // pack_gqa of the tile and head r % pack_gqa of
    # the kv head's group, so each K/V tile brought into shared memory serves the group
    pack_gqa: int = 1
    # paged: K/V pages per key tile. 1: the tile is one page (one TMA box each of K and V);
    # n > 1: pages of tile_n / n tokens, each read by its own TMA copy into its rows of the
    # tile (sm90: one copy per page and swizzle column block, all on the stage's barrier)
    pages_per_tile: int = 1
    # > 0: split-KV decode (kernels/decode_sm90.py): one query token per request, and the
    # tile's rows are the decode_group query heads that share one kv head (GQA packing into
    # the MMA's M); the CTA reads one split of the request's key tiles and writes a partial
    # output and log-sum-exp that the combine kernel (kernels/combine.py) merges
    decode_group: int = 0
    # the K/V cache's dtype when it differs from ``dtype``: "float8_e4m3fn" (decode only so
    # far): TMA brings the fp8 tiles into shared memory and the consumers convert each to a
    # ``dtype`` tile for the wgmma; the per-tensor scales fold into the softmax scale (K)
    # and into the output (V)
    kv_dtype: str = ""
    # speculative verify of draft trees (paged, not causal): a request's rows are its drafts,
    # its last seqlen_q keys; every row sees the keys before them (the cached prefix), and
    # draft row i sees draft j when bit i * seqlen_q + j of the request's bit-packed mask
    # (uint8, little-endian bits, from byte tree_indptr[b]) is set
    tree: bool = False
    # sm90 prefill / extend: O's rows written through shared memory (stmatrix into the Q
    # tile, then 16-byte row pieces) instead of each thread's 4-byte accumulator pairs
    staged_store: bool = False

    @property
    def decode(self) -> bool:
        return self.decode_group > 0

    @property
    def kv_fp8(self) -> bool:
        return self.kv_dtype == "float8_e4m3fn"

    @property
    def kv_elem_bytes(self) -> int:
        return 1 if self.kv_fp8 else 2

    @property
    def page_rows(self) -> int:
        """Tokens per page (paged) = rows of the tile one TMA copy of a page fills."""
        return self.tile_n // self.pages_per_tile

    @property
    def gather(self) -> bool:
        """Pages of fewer than GATHER_BELOW tokens: K/V rows are gathered one by one with
        cp.async by the whole producer warpgroup instead of copied per page by TMA."""
        return self.paged and self.page_rows < GATHER_BELOW


@dataclass(frozen=True)
class CombineShape:
    """What the split-KV decode combine kernel is specialized for."""

    dtype: str  # the output's: "bfloat16" | "float16"
    v_head_dim: int
    sinks: bool  # exp(sinks[h]) joins each row's softmax denominator


GATHER_BELOW = 16  # pages of fewer tokens are gathered row by row (see FwdShape.gather)
DTYPES = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16}
KV_DTYPES = {**DTYPES, "float8_e4m3fn": cutlass.Float8E4M3FN}
SMEM_ALIGN = 1024  # each tile starts on 1 KiB (128-byte swizzle atoms); the barriers come first


def smem_layout(dtype: type, rows: int, cols: int, stages: int | None) -> cute.ComposedLayout:
    """A swizzled row-major (cols contiguous) tile, optionally staged: what TMA writes and
    wgmma reads without bank conflicts."""
    atom = warpgroup.make_smem_layout_atom(
        sm90.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dtype, cols), dtype
    )
    if stages is None:
        return cute.tile_to_shape(atom, (rows, cols), order=(0, 1))
    return cute.tile_to_shape(atom, (rows, cols, stages), order=(0, 1, 2))


def page_slice(tile: cute.ComposedLayout, rows: int) -> cute.ComposedLayout:
    """The first ``rows`` rows of a swizzled (tile rows, cols) layout: the smem that one TMA
    copy of a page of ``rows`` tokens fills (every page's rows have this layout, offset by a
    multiple of the swizzle's period, so one TMA atom serves them all)."""
    cols = cute.size(tile, mode=[1])
    return cute.slice_(cute.flat_divide(tile, (rows, cols)), (None, None, 0, 0))


def rows_aligned(t: cute.Tensor) -> cute.Tensor:
    """The same tensor, with its outer strides promised to be multiples of 16 bytes (the
    launchers check it): TMA descriptors need it."""
    elems = 128 // t.element_type.width
    outer = tuple(s if isinstance(s, int) else cute.assume(s, divby=elems) for s in t.stride[:-1])
    return cute.make_tensor(t.iterator, cute.make_layout(t.shape, stride=(*outer, t.stride[-1])))


def mode_select(t: cute.Tensor, modes: list[int]) -> cute.Tensor:
    return cute.make_tensor(t.iterator, cute.select(t.layout, mode=modes))


@cute.jit
def split_blocks(
    split: cutlass.Int32,
    num_splits: cutlass.Int32,
    n_block_min: cutlass.Int32,
    n_block_max: cutlass.Int32,
    seqlen_k: cutlass.Int32,
    tile_n: cutlass.Constexpr[int],
):
    """Split-KV decode: [lo, hi) of the visible key tiles [n_block_min, n_block_max) that
    split ``split`` of ``num_splits`` takes (none when they run out, or when the request has
    no key: it writes an empty partial, zeros and lse -inf; splits past num_splits do
    nothing, the combine reads num_splits partials)."""
    n_block_max = cutlass.min(n_block_max, (seqlen_k + tile_n - 1) // tile_n)
    per_split = (n_block_max - n_block_min + num_splits - 1) // num_splits
    first = n_block_min + split * per_split
    return cutlass.min(first, n_block_max), cutlass.min(first + per_split, n_block_max)


FP8_VECTOR = 16  # e4m3 values per 16-byte vector


@cute.jit
def convert_fp8_rows(
    src: cute.Tensor,
    dst: cute.Tensor,
    tidx: cutlass.Int32,
    rows_valid: cutlass.Int32,
    threads: cutlass.Constexpr[int],
    out_dtype: cutlass.Constexpr[type],
):
    """An fp8 cache's (keys, D) e4m3 tile in shared memory (as TMA wrote it) into the 16-bit
    tile ``dst`` an MMA reads, by ``threads`` threads (``tidx`` < threads), 16 values a thread
    and pass; rows from ``rows_valid`` on (slots past the sequence in its last page: stale,
    possibly NaN bytes) become zeros, so a masked key's zero probability never meets a NaN.
    No barrier or fence: the caller orders the reads before and the MMA after."""
    chunks = cute.size(src, mode=[1]) // FP8_VECTOR
    # eight consecutive threads take one chunk of eight consecutive rows: each quarter warp's
    # 16-byte stores then land in eight distinct bank groups of the 128-byte swizzle (one
    # row's chunks would put chunk c and c + 4 of a row, in the two 64-column halves, on the
    # same banks: two wavefronts a store)
    passes = cute.size(src, mode=[0]) * chunks // threads
    rows, cols, vals = [], [], []
    for p in cutlass.range_constexpr(passes):  # every load first: their latencies overlap
        idx = p * threads + tidx
        rows.append((idx // (8 * chunks)) * 8 + idx % 8)
        cols.append((idx // 8) % chunks)
        vals.append(cute.local_tile(src[rows[p], None], (FP8_VECTOR,), (cols[p],)).load())
    for p in cutlass.range_constexpr(passes):
        out = cute.local_tile(dst[rows[p], None], (FP8_VECTOR,), (cols[p],))
        out.store(vals[p].to(out_dtype))
        if rows[p] >= rows_valid:
            out.fill(0.0)
