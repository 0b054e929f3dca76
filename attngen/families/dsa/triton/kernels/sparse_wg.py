"""Sparse MLA (absorbed) on sm90 with the warp layout chosen by hand (Gluon): 64 query
heads x 64 selected slots per iteration on two warpgroups that never repeat each other's
products (the split of MLA's ``absorbed_wg.py``: the score's warps split the slots, the
output's warps split the 512 latent columns, the probabilities go through shared memory).

Same semantics as ``sparse_mla_kernel`` (``sparse.py``) for rows ``[slots, 576]`` in the
activations' dtype (the 656-byte fp8 rows: ``sparse_fp8_wg.py``). The
selected rows arrive by cp.async gathers through the slot indices (-1: no key, zero-filled
and masked) into two shared-memory stages the tensor cores read. Shared memory: q 72 KiB,
two 72 KiB stages, the probabilities 8 KiB. Runs on sm_90a only.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared

from attngen.families.mla.triton.kernels.absorbed_wg import (
    LOG2E,
    ROWS_16BIT,
    attend_tile,
    finish,
    output_layout,
    score_layout,
    stage_q,
    store_rows,
)


@gluon.jit
def selected_rows(i_row, start_n, BLOCK_N: gl.constexpr, layout: gl.constexpr):
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
):
    """cp.async the selected rows' latent into lat_smem and their rope into rope_smem
    (rows of -1 zero-filled); one commit group."""
    rows, mask = selected_rows(i_row, start_n, BLOCK_N, gl.SliceLayout(1, ROWS_16BIT))
    base = KV + gl.multiple_of(rows * stride_kv, 16)
    offs_c = gl.arange(0, LORA, layout=gl.SliceLayout(0, ROWS_16BIT))
    async_copy.async_copy_global_to_shared(
        lat_smem, base[:, None] + offs_c[None, :], mask=mask[:, None]
    )
    offs_r = gl.arange(0, ROPE, layout=gl.SliceLayout(0, ROWS_16BIT))
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
    ROW_S: gl.constexpr = gl.SliceLayout(1, score_layout(BLOCK_N))
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

    qn_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, LORA], QN_SH)
    qr_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, ROPE], QR_SH)
    stage_q(
        qn_smem, qr_smem, Q_NOPE, Q_ROPE, off_t, off_hb, stride_qt, stride_qh, stride_rt,
        stride_rh, NUM_HEADS, LORA, ROPE, BLOCK_H,
    )  # fmt: skip
    p_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, BLOCK_N], P_SH)
    lat_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, LORA], LAT_SH)
    rope_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, ROPE], ROPE_SH)
    _gather(lat_smem.index(0), rope_smem.index(0), KV, i_row, 0, stride_kv, LORA, ROPE, BLOCK_N)

    qk_scale = sm_scale * LOG2E
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=ROW_S)
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=ROW_S)
    acc = gl.zeros([BLOCK_H, LORA], gl.float32, layout=output_layout(LORA))
    for it in range(NUM_TILES):
        stage = it % 2
        start_n = it * BLOCK_N
        gl.thread_barrier()  # every warp is done with the other stage and with p
        if it + 1 < NUM_TILES:
            _gather(
                lat_smem.index(1 - stage), rope_smem.index(1 - stage), KV, i_row,
                start_n + BLOCK_N, stride_kv, LORA, ROPE, BLOCK_N,
            )  # fmt: skip
            async_copy.wait_group(1)
        else:
            async_copy.wait_group(0)
        gl.thread_barrier()
        fence_async_shared()
        _, valid = selected_rows(
            i_row, start_n, BLOCK_N, gl.SliceLayout(0, score_layout(BLOCK_N))
        )
        acc, m_i, l_i = attend_tile(
            qn_smem, qr_smem, lat_smem.index(stage), rope_smem.index(stage), p_smem, acc, m_i,
            l_i, valid, qk_scale, BLOCK_H, BLOCK_N, LORA, True,
        )  # fmt: skip

    o, lse = finish(acc, m_i, l_i, LORA)
    if SPLITS == 1:
        store_rows(
            OUT, LSE, o, lse, off_t, off_hb, 0, stride_ot, stride_oh, 0, stride_lt, 1,
            NUM_HEADS, LORA, BLOCK_H, BLOCK_N, WRITE_LSE,
        )  # fmt: skip
    else:
        store_rows(
            PARTIAL_O, PARTIAL_LSE, o, lse, off_t, off_hb, split, stride_pot, stride_poh,
            stride_pos, stride_plt, stride_plh, NUM_HEADS, LORA, BLOCK_H, BLOCK_N, True,
        )  # fmt: skip
