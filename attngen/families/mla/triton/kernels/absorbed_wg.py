"""Absorbed MLA attention for sm90 with the warp layout chosen by hand (Gluon, Triton's
layout-explicit language): 64 query heads x 64 latent rows per iteration on two warpgroups
that never repeat each other's products.

Triton's own layout choice for the chained products of ``absorbed.py`` puts all 8 warps on
the 64 head rows, so both warpgroups compute the whole 576-deep score and each then half
the 512 output columns: 832 of the 544 multiply-adds per head and key a warpgroup would
need. Here the score's warps split the keys (each warpgroup scores 32 of the 64 rows over
all 576 columns), the probabilities go through shared memory, and the output's warps split
the columns (each warpgroup accumulates 256 of the 512 over all 64 keys): 288 + 256 per
warpgroup. Row maxima and sums cross the two warpgroups through the reductions.

An fp8 e4m3 cache (one per-tensor scale) travels as 32-bit words of four values: cp.async
gathers them into staging buffers (two stages), and each landed tile is widened to fp16
into one operand tile (cvt.rn.f16x2.e4m3x2, 128 columns at a time) before the products;
q and the probabilities are fp16 then, as in ``absorbed.py``. e4m3 values are exact in
fp16, so the products see the cache's values; the scale is folded into the score scale
and the output (q 72 KiB, staging 72 KiB, operand tile 72 KiB, probabilities 8 KiB).

Same arguments and semantics as ``absorbed_split_kernel`` for a cache without a draft
tree: one program holds BLOCK_H (64) heads of one query row over one split of its
keys; q and the latent rows stay in shared memory (q 72 KiB, two stages of latent rows
144 KiB, the probabilities 8 KiB), the latent rows arrive by cp.async gathers through the
page table (any page size). Runs on sm_90a only (warpgroup MMA); no interpreter.
"""

from triton.experimental import gluon
from triton.runtime.jit import constexpr_function
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

LN2: gl.constexpr = gl.constexpr(0.6931471805599453)  # ln(2)
LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)  # 1/ln(2)


@gluon.jit
def gather_rows(
    lat_smem,
    rope_smem,
    KV_CACHE,
    page_row,
    start_n,
    kv_end,
    stride_kv,
    LORA: gl.constexpr,
    ROPE: gl.constexpr,
    PAGE_SIZE: gl.constexpr,
    BLOCK_N: gl.constexpr,
    LOAD: gl.constexpr,
):
    """cp.async latent rows start_n .. start_n+BLOCK_N-1 (LORA elements into lat_smem, the
    ROPE after them into rope_smem; elements of the cache's type: 16-bit values or words
    of four fp8); rows at or past kv_end are zero-filled."""
    offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LOAD))
    mask_n = offs_n < kv_end
    page = gl.load(page_row + offs_n // PAGE_SIZE, mask=mask_n, other=0).to(gl.int64)
    rows = page * PAGE_SIZE + (offs_n % PAGE_SIZE)
    # rows start on 16 bytes (the launcher checks it): whole cp.async vectors
    vec: gl.constexpr = 128 // KV_CACHE.dtype.element_ty.primitive_bitwidth
    base = KV_CACHE + gl.multiple_of(rows * stride_kv, vec)
    offs_c = gl.arange(0, LORA, layout=gl.SliceLayout(0, LOAD))
    async_copy.async_copy_global_to_shared(
        lat_smem, base[:, None] + offs_c[None, :], mask=mask_n[:, None]
    )
    offs_r = gl.arange(0, ROPE, layout=gl.SliceLayout(0, LOAD))
    async_copy.async_copy_global_to_shared(
        rope_smem, base[:, None] + LORA + offs_r[None, :], mask=mask_n[:, None]
    )
    async_copy.commit_group()


@gluon.jit
def row_and_head_block(NUM_HEADS: gl.constexpr, BLOCK_H: gl.constexpr):
    """This program's query row and head block: the grid's first axis runs over rows x head
    blocks with the head blocks of a row adjacent, so they run side by side and the second
    reads the row's latent tiles from L2 (rows as the slow axis also lifts the 65535-row
    cap of a second grid axis)."""
    HEAD_BLOCKS: gl.constexpr = (NUM_HEADS + BLOCK_H - 1) // BLOCK_H
    pid = gl.program_id(0)
    return pid // HEAD_BLOCKS, pid % HEAD_BLOCKS


@gluon.jit
def split_range(ROW_LENS, ROW_REQ, NUM_SPLITS, off_t, split, MAX_SPLITS: gl.constexpr,
                BLOCK_N: gl.constexpr):  # fmt: skip
    """Query row off_t's request, its split count, and split ``split``'s BLOCK_N-aligned
    slice kv_start .. kv_end of its visible keys (may be empty)."""
    if NUM_SPLITS is not None:
        num_splits = gl.minimum(gl.maximum(gl.load(NUM_SPLITS + off_t), 1), MAX_SPLITS)
    if ROW_REQ is None:
        off_b = off_t
    else:
        off_b = gl.load(ROW_REQ + off_t)
    kv_len = gl.load(ROW_LENS + off_t)
    if NUM_SPLITS is None:  # 1, as a value (a literal 1 trips the backend's lowering)
        num_splits = (kv_len >= 0).to(gl.int32)
    split_len = gl.cdiv(gl.cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N
    kv_start = gl.minimum(split * split_len, kv_len)
    kv_end = gl.minimum(kv_start + split_len, kv_len)
    return off_b, num_splits, kv_start, kv_end


@constexpr_function
def score_layout(block_n):
    """The score tile's warps: 4 along the 64 heads, 2 along the rows (each warpgroup
    scores half the rows over every column)."""
    return gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, block_n // 2, 16]
    )


@constexpr_function
def output_layout(lora):
    """The output accumulator's warps: 4 along the 64 heads, 2 along the latent columns."""
    return gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, lora // 2, 16]
    )


# 16-byte row segments of 16-bit elements over 8 warps: the layout of every gather and q load
ROWS_16BIT = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0]))


@constexpr_function
def rows_layout(num_warps):
    """16-byte row segments of 16-bit elements, 8 threads a row, over num_warps warps (8:
    ROWS_16BIT)."""
    return gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
# 16-byte row segments of 32-bit words (four fp8 values each) over 8 warps: fp8 gathers
# and the widening's loads, 32 words (128 values) of 64 rows at a time
WORDS = gl.constexpr(gl.BlockedLayout([1, 4], [8, 4], [8, 1], [1, 0]))
# the fp8 staging buffers: rows of words, 16-byte vectors swizzled across banks
WORDS_SH = gl.constexpr(gl.SwizzledSharedLayout(4, 1, 8, order=[1, 0]))


@gluon.jit
def stage_q(
    qn_smem,
    qr_smem,
    Q_NOPE,
    Q_ROPE,
    off_t,
    off_hb,
    stride_qt,
    stride_qh,
    stride_rt,
    stride_rh,
    NUM_HEADS: gl.constexpr,
    LORA: gl.constexpr,
    ROPE: gl.constexpr,
    BLOCK_H: gl.constexpr,
):
    """Heads off_hb*BLOCK_H .. of query row off_t (latent and rope parts) into shared
    memory, in its dtype."""
    ROWS: gl.constexpr = rows_layout(gl.num_warps())
    heads = off_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ROWS))
    mask = heads < NUM_HEADS
    offs_c = gl.arange(0, LORA, layout=gl.SliceLayout(0, ROWS))
    offs_r = gl.arange(0, ROPE, layout=gl.SliceLayout(0, ROWS))
    q_rows = Q_NOPE + off_t.to(gl.int64) * stride_qt + heads * stride_qh
    r_rows = Q_ROPE + off_t.to(gl.int64) * stride_rt + heads * stride_rh
    q_nope = gl.load(q_rows[:, None] + offs_c[None, :], mask=mask[:, None], other=0.0)
    q_rope = gl.load(r_rows[:, None] + offs_r[None, :], mask=mask[:, None], other=0.0)
    qn_smem.store(q_nope.to(qn_smem.dtype))  # fp16 operands of an fp8 cache
    qr_smem.store(q_rope.to(qr_smem.dtype))


@gluon.jit
def widen_words(words):
    """Words of four e4m3 values -> words of two fp16 values, twice as many along the last
    dim, in order (exact: cvt.rn.f16x2.e4m3x2 on each half-word)."""
    lo, hi = widen_pairs(words)
    return gl.reshape(gl.join(lo, hi), [words.shape[0], 2 * words.shape[1]])


@gluon.jit
def widen_pairs(words):
    """Each word's four e4m3 values as two words of two fp16 values (exact): lo = values
    0, 1; hi = values 2, 3."""
    return gl.inline_asm_elementwise(
        """{
        .reg .b16 a, b;
        mov.b32 {a, b}, $2;
        cvt.rn.f16x2.e4m3x2 $0, a;
        cvt.rn.f16x2.e4m3x2 $1, b;
        }""",
        "=r,=r,r",
        [words],
        dtype=(gl.int32, gl.int32),
        is_pure=True,
        pack=1,
    )


@gluon.jit
def widen_tile(op_smem, words_smem):
    """The fp8 tile in words_smem ([rows, C/4] words) into the fp16 operand op_smem ([rows,
    C]), 128 values of every row at a time, through a 32-bit view of op_smem (its swizzle
    is by bytes, so both views address the same bytes)."""
    ROWS: gl.constexpr = op_smem.shape[0]
    HALF: gl.constexpr = op_smem.shape[1] // 2  # fp16 pairs a row
    WORDS_ROW: gl.constexpr = op_smem.shape[1] // 4  # fp8 words a row
    CHUNK: gl.constexpr = 32 if WORDS_ROW > 32 else WORDS_ROW  # words read at a time
    view = op_smem._reinterpret(
        gl.int32, [ROWS, HALF], gl.NVMMASharedLayout.get_default_for([ROWS, HALF], gl.int32)
    )
    for c in gl.static_range(WORDS_ROW // CHUNK):
        words = words_smem.slice(c * CHUNK, CHUNK, dim=1).load(WORDS)
        view.slice(2 * c * CHUNK, 2 * CHUNK, dim=1).store(widen_words(words))


@gluon.jit
def attend_tile(
    qn_smem,
    qr_smem,
    lat,
    rope,
    p_smem,
    acc,
    m_i,
    l_i,
    visible,
    qk_scale,
    BLOCK_H: gl.constexpr,
    BLOCK_N: gl.constexpr,
    LORA: gl.constexpr,
    GUARD: gl.constexpr,
):
    """One tile of rows (landed in lat / rope, fenced) into the online softmax: the scores
    over all 576 columns (this warpgroup's half of the rows), the probabilities of all rows
    through p_smem, the values (this warpgroup's half of the columns). visible: the tile's
    rows that count ([BLOCK_N], the score layout's columns). GUARD: a whole tile may be
    invisible (keep exp2 finite while the running maximum is -inf)."""
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=score_layout(BLOCK_N))
    s = warpgroup_mma(qn_smem, lat.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma(qr_smem, rope.permute((1, 0)), s, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    s = gl.where(visible[None, :], s * qk_scale, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1))
    m_use = m_new
    if GUARD:
        m_use = gl.where(m_new > float("-inf"), m_new, 0.0)
    p = gl.exp2(s - m_use[:, None])
    alpha = gl.exp2(m_i - m_use)
    l_i = l_i * alpha + gl.sum(p, 1)
    p_smem.store(p.to(p_smem.dtype))
    fence_async_shared()
    gl.thread_barrier()
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, output_layout(LORA)))[:, None]
    acc = warpgroup_mma(p_smem, lat.slice(0, LORA, dim=1), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    return acc, m_new, l_i


@gluon.jit
def finish(acc, m_i, l_i, LORA: gl.constexpr):
    """Normalised output and natural-log LSE (a row without keys: zeros and -inf)."""
    has_keys = l_i > 0.0
    l_safe = gl.where(has_keys, l_i, 1.0)
    lse = gl.where(has_keys, (m_i + gl.log2(l_safe)) * LN2, float("-inf"))
    o = acc / gl.convert_layout(l_safe, gl.SliceLayout(1, output_layout(LORA)))[:, None]
    return o, lse


@gluon.jit
def store_rows(
    DST,
    DST_LSE,
    o,
    lse,
    off_t,
    off_hb,
    split,
    stride_t,
    stride_h,
    stride_s,
    stride_lt,
    stride_lh,
    NUM_HEADS: gl.constexpr,
    LORA: gl.constexpr,
    BLOCK_H: gl.constexpr,
    BLOCK_N: gl.constexpr,
    WRITE_LSE: gl.constexpr,
):
    """o into DST rows (t, h, split) (converted to DST's dtype), and the LSE into DST_LSE
    (t, h) + split when WRITE_LSE: the final output (split and its stride 0) or a split's
    partial."""
    o_layout: gl.constexpr = output_layout(LORA)
    s_layout: gl.constexpr = score_layout(BLOCK_N)
    heads_o = off_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, o_layout))
    cols = gl.arange(0, LORA, layout=gl.SliceLayout(0, o_layout))
    rows = off_t.to(gl.int64) * stride_t + heads_o * stride_h + split * stride_s
    gl.store(
        DST + rows[:, None] + cols[None, :],
        o.to(DST.dtype.element_ty),
        mask=(heads_o < NUM_HEADS)[:, None],
    )
    if WRITE_LSE:
        heads_s = off_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, s_layout))
        l_rows = off_t.to(gl.int64) * stride_lt + heads_s * stride_lh + split
        gl.store(DST_LSE + l_rows, lse, mask=heads_s < NUM_HEADS)


@gluon.jit
def absorbed_wg_kernel(
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
    KV_SCALED: gl.constexpr,
    WRITE_LSE: gl.constexpr,
):
    """Stage 1 of the absorbed attention (see ``absorbed_split_kernel``), 8 warps.
    KV_SCALED: the cache is fp8 e4m3 with the fp32 per-tensor scale KV_SCALE, passed as its
    int32 view (KV_CACHE and stride_kv in words of four values)."""
    gl.static_assert(BLOCK_H == 64, "one 64-row warpgroup tile of heads")
    gl.static_assert(gl.num_warps() == 8, "two warpgroups")
    if KV_SCALED:  # the products' operand type
        dtype: gl.constexpr = gl.float16
    else:
        dtype: gl.constexpr = Q_NOPE.dtype.element_ty
    ROW_S: gl.constexpr = gl.SliceLayout(1, score_layout(BLOCK_N))
    LAT_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, LORA], dtype)
    ROPE_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, ROPE], dtype)
    QN_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, LORA], dtype)
    QR_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, ROPE], dtype)
    P_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], dtype)

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
    if KV_SCALED:  # staging words, widened into one operand tile
        lat_smem = gl.allocate_shared_memory(gl.int32, [2, BLOCK_N, LORA // 4], WORDS_SH)
        rope_smem = gl.allocate_shared_memory(gl.int32, [2, BLOCK_N, ROPE // 4], WORDS_SH)
        lat_op = gl.allocate_shared_memory(dtype, [BLOCK_N, LORA], LAT_SH)
        rope_op = gl.allocate_shared_memory(dtype, [BLOCK_N, ROPE], ROPE_SH)
        GATHER: gl.constexpr = WORDS
        kv_scale = gl.load(KV_SCALE)
        LORA_IN: gl.constexpr = LORA // 4
        ROPE_IN: gl.constexpr = ROPE // 4
    else:
        lat_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, LORA], LAT_SH)
        rope_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, ROPE], ROPE_SH)
        GATHER: gl.constexpr = ROWS_16BIT
        kv_scale = 1.0
        LORA_IN: gl.constexpr = LORA
        ROPE_IN: gl.constexpr = ROPE
    p_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, BLOCK_N], P_SH)
    page_row = PAGE_TABLE + off_b.to(gl.int64) * stride_ptb

    qk_scale = sm_scale * kv_scale * LOG2E
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=ROW_S)
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=ROW_S)
    acc = gl.zeros([BLOCK_H, LORA], gl.float32, layout=output_layout(LORA))
    offs_ns = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, score_layout(BLOCK_N)))

    num_tiles = gl.cdiv(kv_end - kv_start, BLOCK_N)
    if num_tiles > 0:
        gather_rows(
            lat_smem.index(0), rope_smem.index(0), KV_CACHE, page_row, kv_start, kv_end,
            stride_kv, LORA_IN, ROPE_IN, PAGE_SIZE, BLOCK_N, GATHER,
        )  # fmt: skip
    for it in range(num_tiles):
        stage = it % 2
        start_n = kv_start + it * BLOCK_N
        # every warp is done with the other stage (last iteration's products) and with p
        gl.thread_barrier()
        if it + 1 < num_tiles:
            gather_rows(
                lat_smem.index(1 - stage), rope_smem.index(1 - stage), KV_CACHE, page_row,
                start_n + BLOCK_N, kv_end, stride_kv, LORA_IN, ROPE_IN, PAGE_SIZE, BLOCK_N,
                GATHER,
            )  # fmt: skip
            async_copy.wait_group(1)
        else:
            async_copy.wait_group(0)
        gl.thread_barrier()
        if KV_SCALED:
            widen_tile(lat_op, lat_smem.index(stage))
            widen_tile(rope_op, rope_smem.index(stage))
            fence_async_shared()
            gl.thread_barrier()
            lat = lat_op
            rope = rope_op
        else:
            fence_async_shared()
            lat = lat_smem.index(stage)
            rope = rope_smem.index(stage)
        acc, m_i, l_i = attend_tile(
            qn_smem, qr_smem, lat, rope, p_smem, acc, m_i, l_i, (start_n + offs_ns) < kv_end,
            qk_scale, BLOCK_H, BLOCK_N, LORA, False,
        )  # fmt: skip

    o, lse = finish(acc * kv_scale, m_i, l_i, LORA)
    if num_splits == 1:
        if split == 0:
            store_rows(
                OUT, LSE, o, lse, off_t, off_hb, 0, stride_ot, stride_oh, 0, stride_lt, 1,
                NUM_HEADS, LORA, BLOCK_H, BLOCK_N, WRITE_LSE,
            )  # fmt: skip
    elif split < num_splits:
        store_rows(
            PARTIAL_O, PARTIAL_LSE, o, lse, off_t, off_hb, split, stride_pot, stride_poh,
            stride_pos, stride_plt, stride_plh, NUM_HEADS, LORA, BLOCK_H, BLOCK_N, True,
        )  # fmt: skip
