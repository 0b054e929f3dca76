"""Sparse MLA (absorbed) on sm90 with the warp layout chosen by hand (Gluon): 64 query
heads x 64 selected slots per iteration on two warpgroups that never repeat each other's
products (the split of MLA's ``absorbed_wg.py``: the score's warps split the slots, the
output's warps split the 512 latent columns, the probabilities go through shared memory).

Same semantics as ``sparse_mla_kernel`` (``sparse.py``) for rows ``[slots, 576]`` in the
activations' dtype (the 656-byte fp8 rows stay on that kernel: see the lowering). The
selected rows arrive by cp.async gathers through the slot indices (-1: no key, zero-filled
and masked) into two shared-memory stages the tensor cores read. Shared memory: q 72 KiB,
two 72 KiB stages, the probabilities 8 KiB. Runs on sm_90a only.
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
    LOAD: gl.constexpr,
):
    """cp.async the selected rows' latent into lat_smem and their rope into rope_smem
    (rows of -1 zero-filled); one commit group."""
    rows, mask = _slots(i_row, start_n, BLOCK_N, gl.SliceLayout(1, LOAD))
    base = KV + gl.multiple_of(rows * stride_kv, 16)
    offs_c = gl.arange(0, LORA, layout=gl.SliceLayout(0, LOAD))
    async_copy.async_copy_global_to_shared(
        lat_smem, base[:, None] + offs_c[None, :], mask=mask[:, None]
    )
    offs_r = gl.arange(0, ROPE, layout=gl.SliceLayout(0, LOAD))
    async_copy.async_copy_global_to_shared(
        rope_smem, base[:, None] + LORA + offs_r[None, :], mask=mask[:, None]
    )
    async_copy.commit_group()


@gluon.jit
def sparse_wg_kernel(
    Q_NOPE,
    Q_ROPE,
    KV,
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
    ``sparse_mla_kernel``; NUM_SPLITS is the combine's and unread here), 8 warps."""
    gl.static_assert(BLOCK_H == 64, "one 64-row warpgroup tile of heads")
    gl.static_assert(gl.num_warps() == 8, "two warpgroups")
    dtype: gl.constexpr = Q_NOPE.dtype.element_ty
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BLOCK_N // 2, 16]
    )
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, LORA // 2, 16]
    )
    LOAD: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_LAYOUT)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_LAYOUT)
    LAT_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, LORA], dtype)
    ROPE_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, ROPE], dtype)
    QN_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, LORA], dtype)
    QR_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, ROPE], dtype)
    P_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], dtype)

    off_t = gl.program_id(0)
    off_hb = gl.program_id(1)
    split = gl.program_id(2)
    SPLIT_LEN: gl.constexpr = TOPK // SPLITS
    NUM_TILES: gl.constexpr = SPLIT_LEN // BLOCK_N
    i_row = INDICES + off_t.to(gl.int64) * stride_it + split * SPLIT_LEN

    # -- q into shared memory, once ----
    heads_l = off_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, LOAD))
    mask_hl = heads_l < NUM_HEADS
    offs_c = gl.arange(0, LORA, layout=gl.SliceLayout(0, LOAD))
    offs_r = gl.arange(0, ROPE, layout=gl.SliceLayout(0, LOAD))
    q_rows = Q_NOPE + off_t.to(gl.int64) * stride_qt + heads_l * stride_qh
    r_rows = Q_ROPE + off_t.to(gl.int64) * stride_rt + heads_l * stride_rh
    qn_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, LORA], QN_SH)
    qr_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, ROPE], QR_SH)
    qn_smem.store(gl.load(q_rows[:, None] + offs_c[None, :], mask=mask_hl[:, None], other=0.0))
    qr_smem.store(gl.load(r_rows[:, None] + offs_r[None, :], mask=mask_hl[:, None], other=0.0))
    p_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, BLOCK_N], P_SH)
    lat_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, LORA], LAT_SH)
    rope_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, ROPE], ROPE_SH)
    _gather(
        lat_smem.index(0), rope_smem.index(0), KV, i_row, 0, stride_kv, LORA, ROPE, BLOCK_N,
        LOAD,
    )  # fmt: skip

    qk_scale = sm_scale * LOG2E
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=ROW_S)
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=ROW_S)
    acc = gl.zeros([BLOCK_H, LORA], gl.float32, layout=O_LAYOUT)
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=S_LAYOUT)
    for it in range(NUM_TILES):
        stage = it % 2
        start_n = it * BLOCK_N
        gl.thread_barrier()  # every warp is done with the other stage and with p
        if it + 1 < NUM_TILES:
            _gather(
                lat_smem.index(1 - stage), rope_smem.index(1 - stage), KV, i_row,
                start_n + BLOCK_N, stride_kv, LORA, ROPE, BLOCK_N, LOAD,
            )  # fmt: skip
            async_copy.wait_group(1)
        else:
            async_copy.wait_group(0)
        gl.thread_barrier()
        fence_async_shared()
        lat = lat_smem.index(stage)
        # -- scores over all 576 columns, this warpgroup's 32 slots ----
        s = warpgroup_mma(qn_smem, lat.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma(qr_smem, rope_smem.index(stage).permute((1, 0)), s, is_async=True)
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
        p_smem.store(p.to(dtype))
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
