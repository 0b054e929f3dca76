"""Absorbed MLA attention for few heads (16 or 32) over an fp8 e4m3 latent cache on sm90,
keys-major (Gluon): the products of ``absorbed_keys_wg.py`` (S^T = latent x q^T, O^T =
latent^T x P^T, the 64 latent rows as the warpgroup MMA's M) on one fp16 operand tile.

The tile's fp8 words (four e4m3 values each, 36 KiB for 64 rows) are loaded into registers
one tile ahead through the page table, then widened (cvt.rn.f16x2.e4m3x2: exact) straight
into the operand tile: no staging buffer, so a program needs q (18 or 36 KiB), one operand
tile (72 KiB) and the probabilities, and two programs share an SM. While one widens, the
other's tensor-core products run; the words of the next tile are in flight during both.
q and the probabilities are fp16 (q's bf16 values are exact in fp16 within its range); the
per-tensor scale is folded into the score scale and the output.

Same arguments and semantics as ``absorbed_split_kernel`` for an fp8 cache (per-tensor
scale) without a draft tree; the cache and its row stride come as 32-bit words. 4 or 8
warps. Runs on sm_90a only (warpgroup MMA); no interpreter.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared
from triton.runtime.jit import constexpr_function

from attngen.families.mla.triton.kernels.absorbed_keys_wg import (
    attend_keys,
    finish_keys,
    keys_output_layout,
    keys_score_layout,
)
from attngen.families.mla.triton.kernels.absorbed_wg import (
    LOG2E,
    row_and_head_block,
    split_range,
    stage_q,
    widen_words,
)


@constexpr_function
def words_layout(num_warps, words):
    """Rows of ``words`` 32-bit words (32 or 16): a thread loads 16 bytes, words / 4 threads
    cover a row (no thread repeats another's)."""
    return gl.BlockedLayout([1, 4], [128 // words, words // 4], [num_warps, 1], [1, 0])


@gluon.jit
def load_words(KV_CACHE, page_row, start_n, kv_end, stride_kv, LORA_W: gl.constexpr,
               ROPE_W: gl.constexpr, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr):  # fmt: skip
    """The words of latent rows start_n .. start_n+BLOCK_N-1 through the page table: the
    latent part in four column quarters (widened one at a time, so few registers hold
    widened values) and the rope part; rows at or past kv_end read as zeros."""
    QUARTER: gl.constexpr = LORA_W // 4
    ptrs, mask = _row_ptrs(KV_CACHE, page_row, start_n, kv_end, stride_kv, 0, QUARTER,
                           PAGE_SIZE, BLOCK_N)  # fmt: skip
    w0 = gl.load(ptrs, mask=mask, other=0)
    w1 = gl.load(ptrs + QUARTER, mask=mask, other=0)
    w2 = gl.load(ptrs + 2 * QUARTER, mask=mask, other=0)
    w3 = gl.load(ptrs + 3 * QUARTER, mask=mask, other=0)
    ptrs, mask = _row_ptrs(KV_CACHE, page_row, start_n, kv_end, stride_kv, LORA_W, ROPE_W,
                           PAGE_SIZE, BLOCK_N)  # fmt: skip
    rope = gl.load(ptrs, mask=mask, other=0)
    return w0, w1, w2, w3, rope


@gluon.jit
def _row_ptrs(KV_CACHE, page_row, start_n, kv_end, stride_kv, col, WORDS: gl.constexpr,
              PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr):  # fmt: skip
    """Pointers to words col .. col+WORDS-1 of latent rows start_n .. (through the page
    table) and the rows' mask (rows before kv_end)."""
    LAYOUT: gl.constexpr = words_layout(gl.num_warps(), WORDS)
    offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LAYOUT))
    mask_n = offs_n < kv_end
    page = gl.load(page_row + offs_n // PAGE_SIZE, mask=mask_n, other=0).to(gl.int64)
    rows = page * PAGE_SIZE + (offs_n % PAGE_SIZE)
    base = KV_CACHE + gl.multiple_of(rows * stride_kv, 4)  # rows start on 16 bytes
    offs_c = col + gl.arange(0, WORDS, layout=gl.SliceLayout(0, LAYOUT))
    return base[:, None] + offs_c[None, :], mask_n[:, None]


@gluon.jit
def store_widened(op_smem, words, col: gl.constexpr):
    """Words [rows, W] of fp8 values widened into fp16 columns col .. col+4W-1 of the operand
    op_smem through its 32-bit view (the swizzle is by bytes: both views address the same
    bytes)."""
    ROWS: gl.constexpr = op_smem.shape[0]
    HALF: gl.constexpr = op_smem.shape[1] // 2
    view = op_smem._reinterpret(
        gl.int32, [ROWS, HALF], gl.NVMMASharedLayout.get_default_for([ROWS, HALF], gl.int32)
    )
    view.slice(col // 2, 2 * words.shape[1], dim=1).store(widen_words(words))


@gluon.jit
def absorbed_keys_fp8_kernel(
    Q_NOPE,
    Q_ROPE,
    KV_CACHE,
    PAGE_TABLE,
    ROW_LENS,
    ROW_REQ,
    NUM_SPLITS,
    KV_SCALE,
    OUT,
    LSE,
    PARTIAL_O,
    PARTIAL_LSE,
    sm_scale,
    stride_qt,
    stride_qh,
    stride_rt,
    stride_rh,
    stride_kv,
    stride_ptb,
    stride_ot,
    stride_oh,
    stride_lt,
    stride_pot,
    stride_poh,
    stride_pos,
    stride_plt,
    stride_plh,
    NUM_HEADS: gl.constexpr,
    LORA: gl.constexpr,
    ROPE: gl.constexpr,
    PAGE_SIZE: gl.constexpr,
    BLOCK_H: gl.constexpr,
    BLOCK_N: gl.constexpr,
    MAX_SPLITS: gl.constexpr,
    WRITE_LSE: gl.constexpr,
):
    """Stage 1 of the absorbed attention (see ``absorbed_split_kernel``) for an fp8 cache
    with the fp32 per-tensor scale KV_SCALE, keys major; KV_CACHE and stride_kv in words of
    four values."""
    gl.static_assert(BLOCK_N == 64, "the latent rows fill one warpgroup MMA's 64-row M")
    gl.static_assert(BLOCK_H == 16 or BLOCK_H == 32, "16 or 32 heads (the MMA's N)")
    NUM_WARPS: gl.constexpr = gl.num_warps()
    gl.static_assert(NUM_WARPS == 4 or NUM_WARPS == 8, "one or two warpgroups")
    dtype: gl.constexpr = gl.float16
    S_LAYOUT: gl.constexpr = keys_score_layout(BLOCK_H, NUM_WARPS)
    O_LAYOUT: gl.constexpr = keys_output_layout(BLOCK_H, NUM_WARPS)
    LAT_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, LORA], dtype)
    ROPE_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, ROPE], dtype)
    QN_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, LORA], dtype)
    QR_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, ROPE], dtype)
    P_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_H], dtype)

    off_t, off_hb = row_and_head_block(NUM_HEADS, BLOCK_H)
    split = gl.program_id(2)
    off_b, num_splits, kv_start, kv_end = split_range(
        ROW_LENS, ROW_REQ, NUM_SPLITS, off_t, split, MAX_SPLITS, BLOCK_N
    )
    qn_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, LORA], QN_SH)
    qr_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, ROPE], QR_SH)
    stage_q(
        qn_smem, qr_smem, Q_NOPE, Q_ROPE, off_t, off_hb, stride_qt, stride_qh, stride_rt,
        stride_rh, NUM_HEADS, LORA, ROPE, BLOCK_H,
    )  # fmt: skip
    lat_op = gl.allocate_shared_memory(dtype, [BLOCK_N, LORA], LAT_SH)
    rope_op = gl.allocate_shared_memory(dtype, [BLOCK_N, ROPE], ROPE_SH)
    p_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_H], P_SH)
    page_row = PAGE_TABLE + off_b.to(gl.int64) * stride_ptb

    kv_scale = gl.load(KV_SCALE)
    qk_scale = sm_scale * kv_scale * LOG2E
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(0, S_LAYOUT))
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(0, S_LAYOUT))
    acc = gl.zeros([LORA, BLOCK_H], gl.float32, layout=O_LAYOUT)
    offs_ns = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, S_LAYOUT))
    num_tiles = gl.cdiv(kv_end - kv_start, BLOCK_N)

    # the first tile's words (rows past kv_end, and an empty split, read as zeros)
    w0, w1, w2, w3, rope_w = load_words(
        KV_CACHE, page_row, kv_start, kv_end, stride_kv, LORA // 4, ROPE // 4, PAGE_SIZE,
        BLOCK_N,
    )  # fmt: skip
    for it in range(num_tiles):
        start_n = kv_start + it * BLOCK_N
        gl.thread_barrier()  # every warp's products of the last tile are done
        Q: gl.constexpr = LORA // 4  # a quarter's columns
        store_widened(lat_op, w0, 0)
        store_widened(lat_op, w1, Q)
        store_widened(lat_op, w2, 2 * Q)
        store_widened(lat_op, w3, 3 * Q)
        store_widened(rope_op, rope_w, 0)
        # the next tile's words fly while this one is multiplied
        w0, w1, w2, w3, rope_w = load_words(
            KV_CACHE, page_row, start_n + BLOCK_N, kv_end, stride_kv, LORA // 4, ROPE // 4,
            PAGE_SIZE, BLOCK_N,
        )  # fmt: skip
        fence_async_shared()
        gl.thread_barrier()
        acc, m_i, l_i = attend_keys(
            lat_op, rope_op, qn_smem, qr_smem, p_smem, acc, m_i, l_i,
            (start_n + offs_ns) < kv_end, qk_scale, S_LAYOUT, O_LAYOUT,
        )  # fmt: skip

    finish_keys(
        acc * kv_scale, m_i, l_i, off_t, off_hb, split, num_splits, OUT, LSE, PARTIAL_O,
        PARTIAL_LSE, stride_ot, stride_oh, stride_lt, stride_pot, stride_poh, stride_pos,
        stride_plt, stride_plh, NUM_HEADS, LORA, BLOCK_H, WRITE_LSE, S_LAYOUT, O_LAYOUT,
    )  # fmt: skip
