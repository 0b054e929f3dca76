"""Sparse MLA (absorbed) on sm90 over DeepSeek-V3.2's 656-byte fp8 rows (Gluon): 512 e4m3
latent values, 4 fp32 scales (one per 128 values), 64 bf16 rope values per slot.

The warp split is ``sparse_wg.py``'s (64 heads x 64 selected slots a tile on two
warpgroups: the score's warps split the slots, the output's warps split the columns), and
the products stay exact as in ``sparse.py``: the e4m3 values are widened to fp16 exactly
(cvt.rn.f16x2.e4m3x2) into one operand tile, each 128-column chunk of the score is its own
product scaled per slot by that chunk's scale afterwards, and the value product of chunk j
reads P * scale_j (rounded to fp16 like P itself) against the unscaled chunk. So the
output keeps four accumulators of 64 x 128 (each warpgroup holds half the columns of every
chunk) and four scaled copies of P. The rope product runs in bf16, the cache's own values
against q's. q's latent part is fp16 (its bf16 values are exact in fp16's normal range).

Per tile: the rows' e4m3 words land by cp.async in one staging buffer, their scales and
rope in two stages; the words are widened, the next tile's gathers are issued, and the
products run while they fly. Shared memory: q 64 + 8 KiB, words 32 KiB, operand tile 64
KiB, rope 2 x 8 KiB, scales 2 x 1 KiB, P 4 x 8 KiB. Runs on sm_90a only; bf16 activations.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from attngen.families.dsa.triton.kernels.sparse_wg import selected_rows
from attngen.families.mla.triton.kernels.absorbed_wg import (
    LN2,
    LOG2E,
    ROWS_16BIT,
    WORDS,
    WORDS_SH,
    output_layout,
    score_layout,
    stage_q,
    widen_tile,
)

CHUNK = gl.constexpr(128)  # latent values per fp32 scale
# [4, 64] scale words of 64 rows: one 4-byte cp.async a thread over 8 warps
SCALES = gl.constexpr(gl.BlockedLayout([1, 1], [1, 32], [4, 2], [1, 0]))
SCALES_SH = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))


@gluon.jit
def _gather(words_smem, scale_smem, rope_smem, KVW, KVB, i_row, start_n, stride_kvw,
            stride_kvb, LORA: gl.constexpr, ROPE: gl.constexpr, BLOCK_N: gl.constexpr):  # fmt: skip
    """cp.async the selected rows' e4m3 words into words_smem [BLOCK_N, LORA/4], their
    scale words transposed into scale_smem [LORA/128, BLOCK_N] and their bf16 rope into
    rope_smem (rows of -1 zero-filled); one commit group."""
    NUM_CHUNKS: gl.constexpr = LORA // CHUNK
    rows, mask = selected_rows(i_row, start_n, BLOCK_N, gl.SliceLayout(1, WORDS))
    base = KVW + gl.multiple_of(rows * stride_kvw, 4)  # 656-byte rows: 16-byte aligned
    offs_w = gl.arange(0, LORA // 4, layout=gl.SliceLayout(0, WORDS))
    async_copy.async_copy_global_to_shared(
        words_smem, base[:, None] + offs_w[None, :], mask=mask[:, None]
    )
    rows_s, mask_s = selected_rows(i_row, start_n, BLOCK_N, gl.SliceLayout(0, SCALES))
    offs_s = LORA // 4 + gl.arange(0, NUM_CHUNKS, layout=gl.SliceLayout(1, SCALES))
    async_copy.async_copy_global_to_shared(
        scale_smem,
        KVW + (rows_s * stride_kvw)[None, :] + offs_s[:, None],
        mask=mask_s[None, :],
    )
    rows_r, mask_r = selected_rows(i_row, start_n, BLOCK_N, gl.SliceLayout(1, ROWS_16BIT))
    base_r = KVB + gl.multiple_of(rows_r * stride_kvb, 8) + (LORA + 4 * NUM_CHUNKS) // 2
    offs_r = gl.arange(0, ROPE, layout=gl.SliceLayout(0, ROWS_16BIT))
    async_copy.async_copy_global_to_shared(
        rope_smem, base_r[:, None] + offs_r[None, :], mask=mask_r[:, None]
    )
    async_copy.commit_group()


@gluon.jit
def _scale(scales, j: gl.constexpr, layout: gl.constexpr):
    """Chunk j's fp32 scale of every slot of the tile (row j of scales [chunks, slots]), in
    the slice of the 2-D ``layout`` along the slots."""
    row = scales.slice(j, 1, dim=0).load(layout).to(gl.float32, bitcast=True)
    return gl.max(row, 0)  # [1, slots] -> [slots]


@gluon.jit
def _chunk_score(qn_smem, lat_op, j: gl.constexpr, zero):
    """q's chunk j . the tile's chunk j (unscaled e4m3 values), issued asynchronously."""
    return warpgroup_mma(
        qn_smem.slice(j * CHUNK, CHUNK, dim=1),
        lat_op.slice(j * CHUNK, CHUNK, dim=1).permute((1, 0)),
        zero,
        use_acc=False,
        is_async=True,
    )


@gluon.jit
def _scores(qn_smem, qr_smem, lat_op, rope, scales, BLOCK_H: gl.constexpr,
            BLOCK_N: gl.constexpr):  # fmt: skip
    """S = q_rope . rope + sum over chunks j of (q_j . e4m3_j) * scale_j (per slot), two
    chunk products in flight while the previous one is folded in."""
    S_LAYOUT: gl.constexpr = score_layout(BLOCK_N)
    zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=S_LAYOUT)
    s = warpgroup_mma(qr_smem, rope.permute((1, 0)), zero, use_acc=False, is_async=True)
    t0 = _chunk_score(qn_smem, lat_op, 0, zero)
    t1 = _chunk_score(qn_smem, lat_op, 1, zero)
    s, t0 = warpgroup_mma_wait(num_outstanding=1, deps=(s, t0))
    s = s + t0 * _scale(scales, 0, S_LAYOUT)[None, :]
    t2 = _chunk_score(qn_smem, lat_op, 2, zero)
    t1 = warpgroup_mma_wait(num_outstanding=1, deps=(t1,))
    s = s + t1 * _scale(scales, 1, S_LAYOUT)[None, :]
    t3 = _chunk_score(qn_smem, lat_op, 3, zero)
    t2 = warpgroup_mma_wait(num_outstanding=1, deps=(t2,))
    s = s + t2 * _scale(scales, 2, S_LAYOUT)[None, :]
    t3 = warpgroup_mma_wait(num_outstanding=0, deps=(t3,))
    return s + t3 * _scale(scales, 3, S_LAYOUT)[None, :]


@gluon.jit
def _store_chunk(DST, o, off_t, off_hb, split, stride_t, stride_h, stride_s,
                 col: gl.constexpr, NUM_HEADS: gl.constexpr, BLOCK_H: gl.constexpr):  # fmt: skip
    """Output chunk o [BLOCK_H, 128] into columns col .. col+127 of DST rows (t, h, split)."""
    O_LAYOUT: gl.constexpr = output_layout(CHUNK)
    heads = off_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, O_LAYOUT))
    cols = col + gl.arange(0, CHUNK, layout=gl.SliceLayout(0, O_LAYOUT))
    rows = off_t.to(gl.int64) * stride_t + heads * stride_h + split * stride_s
    gl.store(
        DST + rows[:, None] + cols[None, :],
        o.to(DST.dtype.element_ty),
        mask=(heads < NUM_HEADS)[:, None],
    )


@gluon.jit
def _store(DST, DST_LSE, acc0, acc1, acc2, acc3, m_i, l_i, off_t, off_hb, split, stride_t,
           stride_h, stride_s, stride_lt, stride_lh, NUM_HEADS: gl.constexpr,
           BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, WRITE_LSE: gl.constexpr):  # fmt: skip
    """The normalised output (a row without keys: zeros) and, when WRITE_LSE, the natural-log
    LSE (-inf without keys) into DST / DST_LSE rows (t, h, split)."""
    has_keys = l_i > 0.0
    l_safe = gl.where(has_keys, l_i, 1.0)
    inv = gl.convert_layout(1.0 / l_safe, gl.SliceLayout(1, output_layout(CHUNK)))[:, None]
    args = (off_t, off_hb, split, stride_t, stride_h, stride_s)
    _store_chunk(DST, acc0 * inv, *args, 0, NUM_HEADS, BLOCK_H)
    _store_chunk(DST, acc1 * inv, *args, CHUNK, NUM_HEADS, BLOCK_H)
    _store_chunk(DST, acc2 * inv, *args, 2 * CHUNK, NUM_HEADS, BLOCK_H)
    _store_chunk(DST, acc3 * inv, *args, 3 * CHUNK, NUM_HEADS, BLOCK_H)
    if WRITE_LSE:
        lse = gl.where(has_keys, (m_i + gl.log2(l_safe)) * LN2, float("-inf"))
        ROW_S: gl.constexpr = gl.SliceLayout(1, score_layout(BLOCK_N))
        heads = off_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=ROW_S)
        l_rows = off_t.to(gl.int64) * stride_lt + heads * stride_lh + split
        gl.store(DST_LSE + l_rows, lse, mask=heads < NUM_HEADS)


@gluon.jit
def sparse_fp8_wg_kernel(
    Q_NOPE,
    Q_ROPE,
    KVW,
    KVB,
    INDICES,
    NUM_SPLITS,
    OUT,
    LSE,
    PARTIAL_O,
    PARTIAL_LSE,
    sm_scale,
    stride_qt,
    stride_qh,
    stride_rt,
    stride_rh,
    stride_kvw,
    stride_kvb,
    stride_it,
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
    TOPK: gl.constexpr,
    BLOCK_H: gl.constexpr,
    BLOCK_N: gl.constexpr,
    SPLITS: gl.constexpr,
    WRITE_LSE: gl.constexpr,
):
    """Heads h0 .. h0+63 of row t over slots INDICES[t, split * TOPK / SPLITS ..] (see
    ``sparse_mla_kernel``; NUM_SPLITS is the combine's and unread here), 8 warps. KVW: the
    656-byte rows as 32-bit words (stride_kvw 164), KVB as bf16 (stride_kvb 328)."""
    gl.static_assert(BLOCK_H == 64, "one 64-row warpgroup tile of heads")
    gl.static_assert(BLOCK_N == 64, "64 slots a tile")
    gl.static_assert(LORA == 4 * CHUNK, "four scaled chunks")
    gl.static_assert(gl.num_warps() == 8, "two warpgroups")
    gl.static_assert(Q_ROPE.dtype.element_ty == gl.bfloat16, "the rope product is bf16")
    f16: gl.constexpr = gl.float16
    bf16: gl.constexpr = gl.bfloat16
    S_LAYOUT: gl.constexpr = score_layout(BLOCK_N)
    O_LAYOUT: gl.constexpr = output_layout(CHUNK)
    LAT_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, LORA], f16)
    ROPE_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, ROPE], bf16)
    QN_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, LORA], f16)
    QR_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, ROPE], bf16)
    P_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], f16)
    NUM_CHUNKS: gl.constexpr = LORA // CHUNK

    off_t = gl.program_id(0)
    off_hb = gl.program_id(1)
    split = gl.program_id(2)
    SPLIT_LEN: gl.constexpr = TOPK // SPLITS
    NUM_TILES: gl.constexpr = SPLIT_LEN // BLOCK_N
    i_row = INDICES + off_t.to(gl.int64) * stride_it + split * SPLIT_LEN

    qn_smem = gl.allocate_shared_memory(f16, [BLOCK_H, LORA], QN_SH)
    qr_smem = gl.allocate_shared_memory(bf16, [BLOCK_H, ROPE], QR_SH)
    stage_q(
        qn_smem, qr_smem, Q_NOPE, Q_ROPE, off_t, off_hb, stride_qt, stride_qh, stride_rt,
        stride_rh, NUM_HEADS, LORA, ROPE, BLOCK_H,
    )  # fmt: skip
    words_smem = gl.allocate_shared_memory(gl.int32, [BLOCK_N, LORA // 4], WORDS_SH)
    scale_smem = gl.allocate_shared_memory(gl.int32, [2, NUM_CHUNKS, BLOCK_N], SCALES_SH)
    rope_smem = gl.allocate_shared_memory(bf16, [2, BLOCK_N, ROPE], ROPE_SH)
    lat_op = gl.allocate_shared_memory(f16, [BLOCK_N, LORA], LAT_SH)
    p_smem = gl.allocate_shared_memory(f16, [NUM_CHUNKS, BLOCK_H, BLOCK_N], P_SH)
    _gather(
        words_smem, scale_smem.index(0), rope_smem.index(0), KVW, KVB, i_row, 0, stride_kvw,
        stride_kvb, LORA, ROPE, BLOCK_N,
    )  # fmt: skip

    qk_scale = sm_scale * LOG2E
    COLS: gl.constexpr = gl.SliceLayout(0, S_LAYOUT)
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))
    acc0 = gl.zeros([BLOCK_H, CHUNK], gl.float32, layout=O_LAYOUT)
    acc1 = gl.zeros([BLOCK_H, CHUNK], gl.float32, layout=O_LAYOUT)
    acc2 = gl.zeros([BLOCK_H, CHUNK], gl.float32, layout=O_LAYOUT)
    acc3 = gl.zeros([BLOCK_H, CHUNK], gl.float32, layout=O_LAYOUT)
    for it in range(NUM_TILES):
        stage = it % 2
        start_n = it * BLOCK_N
        async_copy.wait_group(0)
        # every warp's gathers of this tile landed, and its products of the last tile (the
        # operand tile, P, the other stage) are done
        gl.thread_barrier()
        widen_tile(lat_op, words_smem)
        fence_async_shared()
        gl.thread_barrier()  # the operand tile is whole; the staging buffer is free
        if it + 1 < NUM_TILES:
            _gather(
                words_smem, scale_smem.index(1 - stage), rope_smem.index(1 - stage), KVW,
                KVB, i_row, start_n + BLOCK_N, stride_kvw, stride_kvb, LORA, ROPE, BLOCK_N,
            )  # fmt: skip
        scales = scale_smem.index(stage)
        s = _scores(qn_smem, qr_smem, lat_op, rope_smem.index(stage), scales, BLOCK_H, BLOCK_N)
        _, valid = selected_rows(i_row, start_n, BLOCK_N, COLS)
        s = gl.where(valid[None, :], s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_use = gl.where(m_new > float("-inf"), m_new, 0.0)  # a tile of -1s: exp2 finite
        p = gl.exp2(s - m_use[:, None])
        alpha = gl.exp2(m_i - m_use)
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        # chunk j's values are weighted by P * scale_j: the e4m3 values enter unscaled
        p_smem.index(0).store((p * _scale(scales, 0, S_LAYOUT)[None, :]).to(f16))
        p_smem.index(1).store((p * _scale(scales, 1, S_LAYOUT)[None, :]).to(f16))
        p_smem.index(2).store((p * _scale(scales, 2, S_LAYOUT)[None, :]).to(f16))
        p_smem.index(3).store((p * _scale(scales, 3, S_LAYOUT)[None, :]).to(f16))
        fence_async_shared()
        gl.thread_barrier()
        alpha_o = gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]
        acc0 = warpgroup_mma(p_smem.index(0), lat_op.slice(0, CHUNK, dim=1), acc0 * alpha_o,
                             is_async=True)  # fmt: skip
        acc1 = warpgroup_mma(p_smem.index(1), lat_op.slice(CHUNK, CHUNK, dim=1),
                             acc1 * alpha_o, is_async=True)  # fmt: skip
        acc2 = warpgroup_mma(p_smem.index(2), lat_op.slice(2 * CHUNK, CHUNK, dim=1),
                             acc2 * alpha_o, is_async=True)  # fmt: skip
        acc3 = warpgroup_mma(p_smem.index(3), lat_op.slice(3 * CHUNK, CHUNK, dim=1),
                             acc3 * alpha_o, is_async=True)  # fmt: skip
        acc0, acc1, acc2, acc3 = warpgroup_mma_wait(
            num_outstanding=0, deps=(acc0, acc1, acc2, acc3)
        )

    if SPLITS == 1:
        _store(
            OUT, LSE, acc0, acc1, acc2, acc3, m_i, l_i, off_t, off_hb, 0, stride_ot, stride_oh,
            0, stride_lt, 1, NUM_HEADS, BLOCK_H, BLOCK_N, WRITE_LSE,
        )  # fmt: skip
    else:
        _store(
            PARTIAL_O, PARTIAL_LSE, acc0, acc1, acc2, acc3, m_i, l_i, off_t, off_hb, split,
            stride_pot, stride_poh, stride_pos, stride_plt, stride_plh, NUM_HEADS, BLOCK_H,
            BLOCK_N, True,
        )  # fmt: skip
