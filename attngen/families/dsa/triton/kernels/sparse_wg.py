"""Sparse MLA (absorbed) on sm90 with the warp layout chosen by hand (Gluon): 64 query
heads x 64 selected slots per iteration on two warpgroups that never repeat each other's
products (the split of MLA's ``absorbed_wg.py``: the score's warps split the slots, the
output's warps split the 512 latent columns, the probabilities go through shared memory).

Same arguments and semantics as ``sparse_mla_kernel`` (``sparse.py``). The selected rows
arrive by cp.async gathers through the slot indices (-1: no key, zero-filled and masked):

- ``FP8 = False``: rows ``[slots, 576]`` in the activations' dtype, copied straight into
  the two shared-memory stages the tensor cores read;
- ``FP8 = True``: DeepSeek-V3.2's 656-byte rows. The 512 e4m3 values are copied into two
  byte stages; before its products a tile is decoded once in registers, 128 columns at a
  time, as e4m3 x the chunk's fp32 scale rounded to fp16, into one fp16 tile, beside the
  rope's bf16 values (read into registers a tile ahead) as fp16. Both products then run
  in fp16: q's bf16 values convert exactly in fp16's normal range, and the decoded latent
  values must stay below 65504 in magnitude (they are the amax-scaled e4m3 values of a
  normalised latent).

Shared memory: q 72 KiB, the probabilities 8 KiB, and two 72 KiB stages (16-bit rows) or
two 32 KiB byte stages plus a 72 KiB fp16 tile (fp8 rows). Runs on sm_90a only.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

LN2: gl.constexpr = gl.constexpr(0.6931471805599453)  # ln(2)
LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)  # 1/ln(2)
CHUNK: gl.constexpr = gl.constexpr(128)  # latent columns per fp8 scale
ROPE_WORD: gl.constexpr = gl.constexpr(264)  # 16-bit word of a 656-byte row where rope starts
SCALE_WORD: gl.constexpr = gl.constexpr(128)  # 32-bit word of a 656-byte row: the scales


@gluon.jit
def _slots(i_row, start_n, BLOCK_N: gl.constexpr, layout: gl.constexpr):
    """Cache rows of selected slots start_n .. start_n+BLOCK_N-1 (0 where -1) and the mask."""
    slots = gl.load(i_row + start_n + gl.arange(0, BLOCK_N, layout=layout))
    mask = slots >= 0
    return gl.where(mask, slots, 0).to(gl.int64), mask


@gluon.jit
def _gather(
    lat_smem,
    rope_smem,
    KV,
    i_row,
    start_n,
    stride_kv,
    LORA: gl.constexpr,
    ROPE: gl.constexpr,
    BLOCK_N: gl.constexpr,
    FP8: gl.constexpr,
    LOAD: gl.constexpr,
):
    """cp.async the selected rows' latent (FP8: its e4m3 bytes) into lat_smem and (16-bit
    rows) their rope into rope_smem; one commit group."""
    rows, mask = _slots(i_row, start_n, BLOCK_N, gl.SliceLayout(1, LOAD))
    base = KV + gl.multiple_of(rows * stride_kv, 16)
    offs_c = gl.arange(0, LORA, layout=gl.SliceLayout(0, LOAD))
    async_copy.async_copy_global_to_shared(
        lat_smem, base[:, None] + offs_c[None, :], mask=mask[:, None]
    )
    if not FP8:
        offs_r = gl.arange(0, ROPE, layout=gl.SliceLayout(0, LOAD))
        async_copy.async_copy_global_to_shared(
            rope_smem, base[:, None] + LORA + offs_r[None, :], mask=mask[:, None]
        )
    async_copy.commit_group()


@gluon.jit
def _fp8_side(
    KVF,
    KV16,
    i_row,
    start_n,
    stride_kvf,
    stride_kv16,
    ROPE: gl.constexpr,
    BLOCK_N: gl.constexpr,
    ROPE_L: gl.constexpr,
    CV: gl.constexpr,
):
    """Of a 656-byte row tile: the rope (bf16 bits -> fp16) and the four chunk scales."""
    rows, mask = _slots(i_row, start_n, BLOCK_N, gl.SliceLayout(1, ROPE_L))
    offs_r = gl.arange(0, ROPE, layout=gl.SliceLayout(0, ROPE_L))
    r_ptrs = KV16 + (rows * stride_kv16 + ROPE_WORD)[:, None] + offs_r[None, :]
    bits = gl.load(r_ptrs, mask=mask[:, None], other=0).to(gl.uint16, bitcast=True)
    rope = (bits.to(gl.uint32) << 16).to(gl.float32, bitcast=True).to(gl.float16)
    rows_s, mask_s = _slots(i_row, start_n, BLOCK_N, gl.SliceLayout(1, CV))
    s_row = KVF + rows_s * stride_kvf + SCALE_WORD
    s0 = gl.load(s_row, mask=mask_s, other=0.0)
    s1 = gl.load(s_row + 1, mask=mask_s, other=0.0)
    s2 = gl.load(s_row + 2, mask=mask_s, other=0.0)
    s3 = gl.load(s_row + 3, mask=mask_s, other=0.0)
    return rope, s0, s1, s2, s3


@gluon.jit
def _decode_chunk(src, dst, scale, c: gl.constexpr, CV: gl.constexpr):
    """Columns c*128 .. c*128+127: e4m3 bytes x the rows' scale -> fp16."""
    x = src.slice(c * CHUNK, CHUNK, dim=1).load(CV)
    dst.slice(c * CHUNK, CHUNK, dim=1).store((x.to(gl.float32) * scale[:, None]).to(gl.float16))


@gluon.jit
def sparse_wg_kernel(
    Q_NOPE,
    Q_ROPE,
    KV,
    KVF,
    KV16,
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
    stride_kv,
    stride_kvf,
    stride_kv16,
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
    FP8: gl.constexpr,
    WRITE_LSE: gl.constexpr,
):
    """Heads h0 .. h0+63 of row t over slots INDICES[t, split * TOPK / SPLITS ..] (see
    ``sparse_mla_kernel``), 8 warps."""
    gl.static_assert(BLOCK_H == 64, "one 64-row warpgroup tile of heads")
    gl.static_assert(LORA == 4 * CHUNK)
    gl.static_assert(gl.num_warps() == 8, "two warpgroups")
    io: gl.constexpr = Q_NOPE.dtype.element_ty
    if FP8:
        mdt: gl.constexpr = gl.float16
    else:
        mdt: gl.constexpr = io
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BLOCK_N // 2, 16]
    )
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, LORA // 2, 16]
    )
    LOAD16: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    LOAD8: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [8, 1], [1, 0])
    CV: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [8, 1], [1, 0])
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_LAYOUT)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_LAYOUT)
    LAT_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, LORA], mdt)
    ROPE_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, ROPE], mdt)
    QN_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, LORA], mdt)
    QR_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, ROPE], mdt)
    P_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], mdt)

    off_t = gl.program_id(0)
    off_hb = gl.program_id(1)
    split = gl.program_id(2)
    SPLIT_LEN: gl.constexpr = TOPK // SPLITS
    NUM_TILES: gl.constexpr = SPLIT_LEN // BLOCK_N
    i_row = INDICES + off_t.to(gl.int64) * stride_it + split * SPLIT_LEN

    # -- q into shared memory, once (fp8 rows: as fp16) ----
    heads_l = off_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, LOAD16))
    mask_hl = heads_l < NUM_HEADS
    offs_c = gl.arange(0, LORA, layout=gl.SliceLayout(0, LOAD16))
    offs_r = gl.arange(0, ROPE, layout=gl.SliceLayout(0, LOAD16))
    q_rows = Q_NOPE + off_t.to(gl.int64) * stride_qt + heads_l * stride_qh
    r_rows = Q_ROPE + off_t.to(gl.int64) * stride_rt + heads_l * stride_rh
    q_n = gl.load(q_rows[:, None] + offs_c[None, :], mask=mask_hl[:, None], other=0.0)
    q_r = gl.load(r_rows[:, None] + offs_r[None, :], mask=mask_hl[:, None], other=0.0)
    qn_smem = gl.allocate_shared_memory(mdt, [BLOCK_H, LORA], QN_SH)
    qr_smem = gl.allocate_shared_memory(mdt, [BLOCK_H, ROPE], QR_SH)
    qn_smem.store(q_n.to(mdt))
    qr_smem.store(q_r.to(mdt))
    p_smem = gl.allocate_shared_memory(mdt, [BLOCK_H, BLOCK_N], P_SH)
    if FP8:
        raw_smem = gl.allocate_shared_memory(
            gl.float8e4nv,
            [2, BLOCK_N, LORA],
            gl.NVMMASharedLayout.get_default_for([BLOCK_N, LORA], gl.float8e4nv),
        )
        lat_smem = gl.allocate_shared_memory(mdt, [1, BLOCK_N, LORA], LAT_SH)
        rope_smem = gl.allocate_shared_memory(mdt, [1, BLOCK_N, ROPE], ROPE_SH)
        rope_cur, s0, s1, s2, s3 = _fp8_side(
            KVF, KV16, i_row, 0, stride_kvf, stride_kv16, ROPE, BLOCK_N, LOAD16, CV
        )
        _gather(
            raw_smem.index(0), rope_smem, KV, i_row, 0, stride_kv, LORA, ROPE, BLOCK_N, True,
            LOAD8,
        )  # fmt: skip
    else:
        lat_smem = gl.allocate_shared_memory(mdt, [2, BLOCK_N, LORA], LAT_SH)
        rope_smem = gl.allocate_shared_memory(mdt, [2, BLOCK_N, ROPE], ROPE_SH)
        _gather(
            lat_smem.index(0), rope_smem.index(0), KV, i_row, 0, stride_kv, LORA, ROPE,
            BLOCK_N, False, LOAD16,
        )  # fmt: skip

    qk_scale = sm_scale * LOG2E
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=ROW_S)
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=ROW_S)
    acc = gl.zeros([BLOCK_H, LORA], gl.float32, layout=O_LAYOUT)
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=S_LAYOUT)
    for it in range(NUM_TILES):
        stage = it % 2
        start_n = it * BLOCK_N
        gl.thread_barrier()  # every warp is done with the other stage, the tile and p
        if FP8:
            if it + 1 < NUM_TILES:
                _gather(
                    raw_smem.index(1 - stage), rope_smem, KV, i_row, start_n + BLOCK_N,
                    stride_kv, LORA, ROPE, BLOCK_N, True, LOAD8,
                )  # fmt: skip
                rope_nxt, n0, n1, n2, n3 = _fp8_side(
                    KVF, KV16, i_row, start_n + BLOCK_N, stride_kvf, stride_kv16, ROPE,
                    BLOCK_N, LOAD16, CV,
                )  # fmt: skip
                async_copy.wait_group(1)
            else:
                rope_nxt, n0, n1, n2, n3 = rope_cur, s0, s1, s2, s3
                async_copy.wait_group(0)
            gl.thread_barrier()
            raw = raw_smem.index(stage)
            lat = lat_smem.index(0)
            _decode_chunk(raw, lat, s0, 0, CV)
            _decode_chunk(raw, lat, s1, 1, CV)
            _decode_chunk(raw, lat, s2, 2, CV)
            _decode_chunk(raw, lat, s3, 3, CV)
            rope = rope_smem.index(0)
            rope.store(rope_cur)
            rope_cur, s0, s1, s2, s3 = rope_nxt, n0, n1, n2, n3
            fence_async_shared()
            gl.thread_barrier()
        else:
            if it + 1 < NUM_TILES:
                _gather(
                    lat_smem.index(1 - stage), rope_smem.index(1 - stage), KV, i_row,
                    start_n + BLOCK_N, stride_kv, LORA, ROPE, BLOCK_N, False, LOAD16,
                )  # fmt: skip
                async_copy.wait_group(1)
            else:
                async_copy.wait_group(0)
            gl.thread_barrier()
            fence_async_shared()
            lat = lat_smem.index(stage)
            rope = rope_smem.index(stage)
        # -- scores over all 576 columns, this warpgroup's 32 slots ----
        s = warpgroup_mma(qn_smem, lat.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma(qr_smem, rope.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        _, valid = _slots(i_row, start_n, BLOCK_N, gl.SliceLayout(0, S_LAYOUT))
        s = gl.where(valid[None, :], s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_use = gl.where(m_new > float("-inf"), m_new, 0.0)  # a tile of -1s: exp2 finite
        p = gl.exp2(s - m_use[:, None])
        alpha = gl.exp2(m_i - m_use)
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        # -- values: all 64 slots' probabilities, this warpgroup's 256 columns ----
        p_smem.store(p.to(mdt))
        fence_async_shared()
        gl.thread_barrier()
        acc = acc * gl.convert_layout(alpha, ROW_O)[:, None]
        acc = warpgroup_mma(p_smem, lat, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))

    # -- normalised output and natural-log LSE (no key: zeros and -inf) ----
    has_keys = l_i > 0.0
    l_safe = gl.where(has_keys, l_i, 1.0)
    lse = gl.where(has_keys, (m_i + gl.log2(l_safe)) * LN2, float("-inf"))
    o = acc / gl.convert_layout(l_safe, ROW_O)[:, None]
    heads_o = off_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=ROW_O)
    cols_o = gl.arange(0, LORA, layout=gl.SliceLayout(0, O_LAYOUT))
    mask_o = heads_o < NUM_HEADS
    heads_s = off_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=ROW_S)
    mask_s = heads_s < NUM_HEADS
    if SPLITS == 1:
        o_rows = off_t.to(gl.int64) * stride_ot + heads_o * stride_oh
        gl.store(
            OUT + o_rows[:, None] + cols_o[None, :],
            o.to(OUT.dtype.element_ty),
            mask=mask_o[:, None],
        )
        if WRITE_LSE:
            gl.store(LSE + off_t.to(gl.int64) * stride_lt + heads_s, lse, mask=mask_s)
    else:
        po_rows = off_t.to(gl.int64) * stride_pot + heads_o * stride_poh + split * stride_pos
        gl.store(PARTIAL_O + po_rows[:, None] + cols_o[None, :], o, mask=mask_o[:, None])
        pl_rows = off_t.to(gl.int64) * stride_plt + heads_s * stride_plh + split
        gl.store(PARTIAL_LSE + pl_rows, lse, mask=mask_s)
