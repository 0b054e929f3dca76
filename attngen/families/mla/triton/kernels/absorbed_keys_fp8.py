"""Absorbed MLA attention for 16 heads over an fp8 e4m3 latent cache (per-tensor scale) on
sm90, keys-major (Gluon): S^T = latent x q^T and O^T = latent^T x P^T as in
``absorbed_keys_wg.py``, with the tile kept in fp8 in shared memory and each product's
latent operand built in registers from it; the value product runs on fp8 tensor cores.

The fp8 rows are gathered by cp.async through the page table (any page size) STAGES deep
(36 KB a 64-row tile; at 2 stages a program needs 92 KB, so two share an SM). A tile
crosses shared memory once in fp8 and is read twice (about 125 KB of shared-memory traffic
a tile, against 278 KB when the tile was widened into a 16-bit operand tile there):

- Score, fp16 MMA (exact products): each 64-column chunk of a row is one 16-byte vector a
  lane, widened in registers (cvt.rn.f16x2.e4m3x2, exact) straight into the wgmma A
  fragment. The MMA's K order is free as long as A and B agree: lane q of a quad holds
  bytes 16q .. 16q+15 of the chunk, and q is staged in shared memory with its columns in
  that order (:func:`score_column`). Each chunk's product runs while the next is widened.
- Value product, e4m3 x e4m3 MMA: O^T [512, 16] = latent^T [512, 64] x P^T [64, 16]. The
  A fragment holds 4 consecutive keys of one latent column per 32-bit register; the MMA's
  M order is free too (the accumulator's rows are put back in column order at the end),
  so row m = 64 i + 16 w + 8 h + g (w warp, g = lane // 4, h the fragment's row half, i
  the M repetition) reads column 128 w + 16 g + 2 i + h: a thread's 16 columns are
  contiguous, one 16-byte load for each of its keys, and the fragment is an in-register
  byte transpose of those loads.
- P in fp8 as hi + lo: P' = 256 P (P <= 1 after the running max), hi = e4m3(P'), lo =
  e4m3(P' - hi); both multiply the same operand into the same accumulator, so P carries
  about 8 significant bits (|P' - hi - lo| <= 2^-8 |P'|, twice bf16's rounding). Each
  tile's value product starts from zero and is added to the fp32 output in registers:
  the fp8 MMA adds with reduced precision, so it never carries the running sum.

On the H200 at 16 heads, page 64 (bench/mla.py): 0.075 / 0.256 ms at B64 ctx4096 / B128
ctx8192 against 0.088 / 0.319 for the bf16 cache, and 0.087 / 0.300 for the kernel this
replaced (the tile widened into a 16-bit operand in shared memory).

Same arguments and semantics as ``absorbed_split_kernel`` for an fp8 cache (per-tensor
scale) without a draft tree; the cache and its row stride come as 32-bit words (the
launcher's int32 view). 4 warps, 16 heads a program. Runs on sm_90a only (warpgroup MMA);
no interpreter.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.runtime.jit import constexpr_function

from attngen.families.mla.triton.kernels.absorbed_keys_wg import (
    finish_keys,
    keys_output_layout,
    keys_score_layout,
)
from attngen.families.mla.triton.kernels.absorbed_wg import (
    LOG2E,
    gather_rows,
    row_and_head_block,
    rows_layout,
    split_range,
    widen_pairs,
)

CHUNK = gl.constexpr(64)  # latent values a score chunk: 16 words a row
P_SCALE = gl.constexpr(256.0)  # P' = 256 P: hi and lo stay in e4m3's normal range
# fp8 cache bytes for the gathers: 16 a thread, 64 columns by 4 threads, 8 rows a warp
GATHER8 = gl.constexpr(gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0]))
# the fp8 tiles are only read into registers (never an MMA operand): plain rows, whose
# 16-byte loads below are conflict-free (a 576-byte row is 16 banks off the previous one)
PLAIN = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))


@gluon.jit
def score_column(k):
    """The cache column that column k of the score's K order reads: within a 64-column
    chunk, the wgmma A fragment (fp16) gives lane q of a quad, in k-block g (16 columns),
    the pairs 2q, 2q+1 and 2q+8, 2q+9; the lane's 16-byte load holds chunk bytes 16q ..
    16q+15, value e1 * 2 + e0 of word g."""
    x = k % 64
    g = (x >> 4) & 3
    e1 = (x >> 3) & 1
    q = (x >> 1) & 3
    e0 = x & 1
    return (k - x) + 16 * q + 4 * g + 2 * e1 + e0


@gluon.jit
def stage_q_permuted(qn_smem, qr_smem, Q_NOPE, Q_ROPE, off_t, off_hb, stride_qt, stride_qh,
                     stride_rt, stride_rh, NUM_HEADS: gl.constexpr, LORA: gl.constexpr,
                     ROPE: gl.constexpr, BLOCK_H: gl.constexpr):  # fmt: skip
    """q's heads of row off_t in fp16 (bf16 values are exact in fp16 within its range),
    columns in the score's K order."""
    ROWS: gl.constexpr = rows_layout(gl.num_warps())
    heads = off_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ROWS))
    mask = heads < NUM_HEADS
    offs_c = score_column(gl.arange(0, LORA, layout=gl.SliceLayout(0, ROWS)))
    offs_r = score_column(gl.arange(0, ROPE, layout=gl.SliceLayout(0, ROWS)))
    q_rows = Q_NOPE + off_t.to(gl.int64) * stride_qt + heads * stride_qh
    r_rows = Q_ROPE + off_t.to(gl.int64) * stride_rt + heads * stride_rh
    q_nope = gl.load(q_rows[:, None] + offs_c[None, :], mask=mask[:, None], other=0.0)
    q_rope = gl.load(r_rows[:, None] + offs_r[None, :], mask=mask[:, None], other=0.0)
    qn_smem.store(q_nope.to(gl.float16))
    qr_smem.store(q_rope.to(gl.float16))


@constexpr_function
def chunk_words_layout():
    """Words [64 rows, 16] of one score chunk: lane q of a quad holds words 4q .. 4q+3 (one
    16-byte load), lanes g = lane // 4 rows 0-7, a second register row 8, warps 16 rows
    each: the fp16 wgmma A fragment's rows."""
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [8, 0]],
        lane_bases=[[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]],
        block_bases=[],
        shape=[64, 16],
    )


@constexpr_function
def value_bytes_layout():
    """fp8 bytes [32 keys, 512 columns] for the value product's A: a thread holds 16
    contiguous columns (one 16-byte load) of keys 4q .. 4q+3 and 16+4q .. 16+4q+3; lanes q
    = lane % 4 along the keys, g = lane // 4 along the columns (16 each), warps along the
    columns (128 each)."""
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [1, 0], [2, 0], [16, 0]],
        lane_bases=[[4, 0], [8, 0], [0, 16], [0, 32], [0, 64]],
        warp_bases=[[0, 128], [0, 256]],
        block_bases=[],
        shape=[32, 512],
    )


@constexpr_function
def value_acc_layout():
    """O^T [512 (permuted columns), 16 heads] of the fp8 value product, one warpgroup."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 32])


@gluon.jit
def chunk_operand(words_smem, S_LAYOUT: gl.constexpr):
    """A score chunk's fp16 A operand [64 rows, 64 columns in the score's K order] in
    registers, from its 16 fp8 words a row."""
    words = gl.reshape(words_smem.load(chunk_words_layout()), [64, 4, 4])  # [row, q, g]
    lo, hi = widen_pairs(words)
    v0, v1 = _unpack_pair(lo)
    v2, v3 = _unpack_pair(hi)
    z = gl.join(gl.join(v0, v1), gl.join(v2, v3))  # [row, q, g, e0, e1]
    z = gl.permute(z, (0, 2, 4, 1, 3))  # [row, g, e1, q, e0]: the K order
    a = gl.reshape(z, [64, CHUNK])
    return gl.convert_layout(a, gl.DotOperandLayout(operand_index=0, parent=S_LAYOUT, k_width=2))


@gluon.jit
def _unpack_pair(pair):
    """A 32-bit fp16 pair as its two fp16 values (low half first)."""
    return gl.inline_asm_elementwise(
        "mov.b32 {$0, $1}, $2;",
        "=h,=h,r",
        [pair],
        dtype=(gl.float16, gl.float16),
        is_pure=True,
        pack=1,
    )


@gluon.jit
def issue_score(lat_w, rope_w, qn_smem, qr_smem, BLOCK_H: gl.constexpr,
                S_LAYOUT: gl.constexpr):  # fmt: skip
    """Issue S^T [64 rows, BLOCK_H] of one tile over its chunks (512 latent columns, then
    the 64 rope columns), each product running while the next chunk is widened. Returns
    the accumulator token and the last two chunks' operands (they must live until the
    caller's wait)."""
    CHUNKS: gl.constexpr = qn_smem.shape[1] // CHUNK
    s = gl.zeros([64, BLOCK_H], gl.float32, layout=S_LAYOUT)
    a_prev = chunk_operand(lat_w.slice(0, 16, dim=1), S_LAYOUT)
    q0 = qn_smem.slice(0, CHUNK, dim=1).permute((1, 0))
    s = warpgroup_mma(a_prev, q0, s, use_acc=False, is_async=True)
    for j in gl.static_range(1, CHUNKS):
        a = chunk_operand(lat_w.slice(16 * j, 16, dim=1), S_LAYOUT)
        qj = qn_smem.slice(CHUNK * j, CHUNK, dim=1).permute((1, 0))
        s = warpgroup_mma(a, qj, s, is_async=True)
        s, a_prev = warpgroup_mma_wait(num_outstanding=1, deps=(s, a_prev))
        a_prev = a
    a = chunk_operand(rope_w, S_LAYOUT)
    s = warpgroup_mma(a, qr_smem.permute((1, 0)), s, is_async=True)
    return s, a_prev, a


@gluon.jit
def value_operand(lat8, half: gl.constexpr, O8: gl.constexpr):
    """Keys 32 half .. 32 half + 31 of the fp8 tile lat8 [64, 512] as the fp8 wgmma A
    operand [512 permuted columns, 32 keys] in registers."""
    y = lat8.slice(32 * half, 32, dim=0).load(value_bytes_layout())
    y = gl.reshape(y, [32, 4, 8, 8, 2])  # [key, w, g, i, h]: column 128 w + 16 g + 2 i + h
    y = gl.permute(y, (0, 3, 1, 4, 2))  # [key, i, w, h, g]: row 64 i + 16 w + 8 h + g
    a = gl.permute(gl.reshape(y, [32, 512]), (1, 0))
    return gl.convert_layout(a, gl.DotOperandLayout(operand_index=0, parent=O8, k_width=4))


@gluon.jit
def tile_values(lat8, ph_smem, pl_smem, LORA: gl.constexpr, BLOCK_H: gl.constexpr,
                O8: gl.constexpr):  # fmt: skip
    """This tile's O^T [512 permuted columns, BLOCK_H] x P_SCALE from zero: both halves of
    its keys times P's hi and lo parts. The second product of each operand is synchronous
    (it waits for both): a wait cannot hold 8-bit operands as dependencies."""
    o = gl.zeros([LORA, BLOCK_H], gl.float32, layout=O8)
    a0 = value_operand(lat8, 0, O8)
    o = warpgroup_mma(a0, ph_smem.slice(0, 32, dim=1).permute((1, 0)), o, use_acc=False,
                      is_async=True)  # fmt: skip
    o = warpgroup_mma(a0, pl_smem.slice(0, 32, dim=1).permute((1, 0)), o)
    a1 = value_operand(lat8, 1, O8)
    o = warpgroup_mma(a1, ph_smem.slice(32, 32, dim=1).permute((1, 0)), o, is_async=True)
    return warpgroup_mma(a1, pl_smem.slice(32, 32, dim=1).permute((1, 0)), o)


@gluon.jit
def columns_in_order(acc):
    """The value accumulator's rows (64 i + 16 w + 8 h + g) back in column order."""
    x = gl.reshape(acc, [8, 4, 2, 8, acc.shape[1]])  # [i, w, h, g, head]
    x = gl.permute(x, (1, 3, 0, 2, 4))  # [w, g, i, h, head]
    return gl.reshape(x, [acc.shape[0], acc.shape[1]])


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
    STAGES: gl.constexpr,
):
    """Stage 1 of the absorbed attention (see ``absorbed_split_kernel``) for an fp8 cache
    with the fp32 per-tensor scale KV_SCALE, keys major; KV_CACHE and stride_kv in words of
    four values."""
    gl.static_assert(BLOCK_N == 64, "64 latent rows: the MMA's M")
    gl.static_assert(BLOCK_H == 16, "16 heads: the MMAs' N")
    gl.static_assert(gl.num_warps() == 4, "one warpgroup")
    gl.static_assert(LORA == 512 and ROPE == CHUNK, "the 512 + 64 latent row")
    gl.static_assert(STAGES >= 2, "at least double-buffered gathers")
    f16: gl.constexpr = gl.float16
    f8: gl.constexpr = gl.float8e4nv
    S_LAYOUT: gl.constexpr = keys_score_layout(BLOCK_H, 4)
    O8: gl.constexpr = value_acc_layout()
    O_LAYOUT: gl.constexpr = keys_output_layout(BLOCK_H, 4)
    QN_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, LORA], f16)
    QR_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, ROPE], f16)
    P_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], f8)

    off_t, off_hb = row_and_head_block(NUM_HEADS, BLOCK_H)
    split = gl.program_id(2)
    off_b, num_splits, kv_start, kv_end = split_range(
        ROW_LENS, ROW_REQ, NUM_SPLITS, off_t, split, MAX_SPLITS, BLOCK_N
    )
    qn_smem = gl.allocate_shared_memory(f16, [BLOCK_H, LORA], QN_SH)
    qr_smem = gl.allocate_shared_memory(f16, [BLOCK_H, ROPE], QR_SH)
    stage_q_permuted(
        qn_smem, qr_smem, Q_NOPE, Q_ROPE, off_t, off_hb, stride_qt, stride_qh, stride_rt,
        stride_rh, NUM_HEADS, LORA, ROPE, BLOCK_H,
    )  # fmt: skip
    # P^T's hi and lo parts as the value product's B operand ([heads, keys]: K-major)
    ph_smem = gl.allocate_shared_memory(f8, [BLOCK_H, BLOCK_N], P_SH)
    pl_smem = gl.allocate_shared_memory(f8, [BLOCK_H, BLOCK_N], P_SH)
    lat_in = gl.allocate_shared_memory(f8, [STAGES, BLOCK_N, LORA], PLAIN)
    rope_in = gl.allocate_shared_memory(f8, [STAGES, BLOCK_N, ROPE], PLAIN)
    page_row = PAGE_TABLE + off_b.to(gl.int64) * stride_ptb
    KV8 = KV_CACHE.to(gl.pointer_type(f8), bitcast=True)
    stride_kv8 = stride_kv * 4  # bytes

    kv_scale = gl.load(KV_SCALE)
    qk_scale = sm_scale * kv_scale * LOG2E
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(0, S_LAYOUT))
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(0, S_LAYOUT))
    acc = gl.zeros([LORA, BLOCK_H], gl.float32, layout=O8)
    offs_ns = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, S_LAYOUT))
    num_tiles = gl.cdiv(kv_end - kv_start, BLOCK_N)

    for i in gl.static_range(STAGES - 1):  # prologue: the first STAGES-1 tiles in flight
        if i < num_tiles:
            gather_rows(
                lat_in.index(i), rope_in.index(i), KV8, page_row, kv_start + i * BLOCK_N,
                kv_end, stride_kv8, LORA, ROPE, PAGE_SIZE, BLOCK_N, GATHER8,
            )  # fmt: skip
        else:  # an empty group keeps the count of groups per tile
            async_copy.commit_group()
    for it in range(num_tiles):
        stage = it % STAGES
        start_n = kv_start + it * BLOCK_N
        gl.thread_barrier()  # every warp is done with the stage the next gather refills
        ahead = it + STAGES - 1
        if ahead < num_tiles:
            gather_rows(
                lat_in.index(ahead % STAGES), rope_in.index(ahead % STAGES), KV8, page_row,
                kv_start + ahead * BLOCK_N, kv_end, stride_kv8, LORA, ROPE, PAGE_SIZE,
                BLOCK_N, GATHER8,
            )  # fmt: skip
        else:
            async_copy.commit_group()
        async_copy.wait_group(STAGES - 1)  # tile `it` has landed
        gl.thread_barrier()
        lat8 = lat_in.index(stage)
        lat_w = lat8._reinterpret(gl.int32, [BLOCK_N, LORA // 4], PLAIN)
        rope_w = rope_in.index(stage)._reinterpret(gl.int32, [BLOCK_N, ROPE // 4], PLAIN)
        s, a_prev, a = issue_score(lat_w, rope_w, qn_smem, qr_smem, BLOCK_H, S_LAYOUT)
        s, a_prev, a = warpgroup_mma_wait(num_outstanding=0, deps=(s, a_prev, a))

        s = gl.where(((start_n + offs_ns) < kv_end)[:, None], s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 0))
        p = gl.exp2(s - m_new[None, :])
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, 0)
        m_i = m_new
        ps = p * P_SCALE
        p_hi = ps.to(f8)
        p_lo = (ps - p_hi.to(gl.float32)).to(f8)
        ph_smem.store(gl.permute(p_hi, (1, 0)))
        pl_smem.store(gl.permute(p_lo, (1, 0)))
        fence_async_shared()
        gl.thread_barrier()
        o = tile_values(lat8, ph_smem, pl_smem, LORA, BLOCK_H, O8)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(0, O8))[None, :] + o

    acc = gl.convert_layout(columns_in_order(acc), O_LAYOUT)
    finish_keys(
        acc * (kv_scale / P_SCALE), m_i, l_i, off_t, off_hb, split, num_splits, OUT, LSE,
        PARTIAL_O, PARTIAL_LSE, stride_ot, stride_oh, stride_lt, stride_pot, stride_poh,
        stride_pos, stride_plt, stride_plh, NUM_HEADS, LORA, BLOCK_H, WRITE_LSE, S_LAYOUT,
        O_LAYOUT,
    )  # fmt: skip
