"""Absorbed MLA attention for few heads (16 or 32) on sm90, keys-major (Gluon): both
products are computed transposed, so the latent rows fill the warpgroup MMA's 64-row M
and the heads are its N.

With 16 heads a head-major tile would waste three quarters of every 64-row MMA. Here the
score is S^T [64 rows, H] = latent [64, 576] x q^T (each warpgroup scores half the heads
over all 64 rows), the probabilities go to shared memory as P^T [64, H], and the output
is O^T [512, H] = latent^T [512, 64] x P^T (each warpgroup accumulates 256 of the 512
latent columns): no product is repeated and none is padded. The per-head maxima and sums
reduce over the M axis.

The latent rows (a 16-bit cache) are gathered by cp.async straight into the operand tiles
through the page table (any page size), STAGES deep. (An fp8 path, widening one tile ahead
into an fp16 operand tile, measured no faster than ``absorbed.py``'s at 16 heads: see
bench/README.md.)

Same arguments and semantics as ``absorbed_split_kernel`` for a 16-bit cache without a
draft tree: one program holds BLOCK_H heads of one query row over one split of its keys.
Runs on sm_90a only (warpgroup MMA); no interpreter.
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

from attngen.families.mla.triton.kernels.absorbed_wg import (
    LN2,
    LOG2E,
    ROWS_16BIT,
    gather_rows,
    row_and_head_block,
    split_range,
    stage_q,
)

@constexpr_function
def cols_out(num_warps):
    """The output's store: 4 consecutive latent columns a thread, the warps along the heads."""
    return gl.BlockedLayout([4, 1], [32, 1], [1, num_warps], [0, 1])


@constexpr_function
def keys_score_layout(block_h, num_warps):
    """S^T [64 rows, BLOCK_H]: a warpgroup's 4 warps along the rows; with two warpgroups
    each scores half of the heads."""
    groups = num_warps // 4
    return gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, groups], instr_shape=[16, block_h // groups, 16]
    )


@constexpr_function
def keys_output_layout(block_h, num_warps):
    """O^T [512 columns, BLOCK_H]: the warps along the columns (each warpgroup 64-row slabs
    of them, every head)."""
    return gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, block_h, 16]
    )


@gluon.jit
def attend_keys(lat, rope, qn_smem, qr_smem, p_smem, acc, m_i, l_i, visible, qk_scale,
            S_LAYOUT: gl.constexpr, O_LAYOUT: gl.constexpr):  # fmt: skip
    """One tile of latent rows (in lat / rope, fenced) into the online softmax: S^T =
    latent . q^T over all 576 columns, P^T through p_smem, O^T += latent^T . P^T.
    visible: the tile's rows that count (at least one does)."""
    BLOCK_N: gl.constexpr = lat.shape[0]
    BLOCK_H: gl.constexpr = p_smem.shape[1]
    s = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=S_LAYOUT)
    s = warpgroup_mma(lat, qn_smem.permute((1, 0)), s, use_acc=False, is_async=True)
    s = warpgroup_mma(rope, qr_smem.permute((1, 0)), s, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    s = gl.where(visible[:, None], s * qk_scale, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 0))
    p = gl.exp2(s - m_new[None, :])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, 0)
    p_smem.store(p.to(p_smem.dtype))
    fence_async_shared()
    gl.thread_barrier()
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(0, O_LAYOUT))[None, :]
    acc = warpgroup_mma(lat.permute((1, 0)), p_smem, acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    return acc, m_new, l_i


@gluon.jit
def absorbed_keys_wg_kernel(
    Q_NOPE,
    Q_ROPE,
    KV_CACHE,
    PAGE_TABLE,
    ROW_LENS,
    ROW_REQ,
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
    STAGES: gl.constexpr,
    WRITE_LSE: gl.constexpr,
):
    """Stage 1 of the absorbed attention (see ``absorbed_split_kernel``), 8 warps, keys
    major."""
    gl.static_assert(BLOCK_N == 64, "the latent rows fill one warpgroup MMA's 64-row M")
    gl.static_assert(BLOCK_H == 16 or BLOCK_H == 32, "16 or 32 heads (the MMA's N)")
    gl.static_assert(gl.num_warps() == 8, "two warpgroups")
    dtype: gl.constexpr = Q_NOPE.dtype.element_ty
    S_LAYOUT: gl.constexpr = keys_score_layout(BLOCK_H, 8)
    O_LAYOUT: gl.constexpr = keys_output_layout(BLOCK_H, 8)
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
    # q (this head block of row off_t) in shared memory: the products' B operand
    qn_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, LORA], QN_SH)
    qr_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, ROPE], QR_SH)
    stage_q(
        qn_smem, qr_smem, Q_NOPE, Q_ROPE, off_t, off_hb, stride_qt, stride_qh, stride_rt,
        stride_rh, NUM_HEADS, LORA, ROPE, BLOCK_H,
    )  # fmt: skip

    p_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_H], P_SH)
    page_row = PAGE_TABLE + off_b.to(gl.int64) * stride_ptb
    qk_scale = sm_scale * LOG2E
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(0, S_LAYOUT))
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(0, S_LAYOUT))
    acc = gl.zeros([LORA, BLOCK_H], gl.float32, layout=O_LAYOUT)
    offs_ns = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, S_LAYOUT))
    num_tiles = gl.cdiv(kv_end - kv_start, BLOCK_N)

    # -- STAGES of cp.async gathers straight into the operand tiles ----
    gl.static_assert(STAGES >= 2, "at least double-buffered gathers")
    lat_in = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, LORA], LAT_SH)
    rope_in = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, ROPE], ROPE_SH)
    for i in gl.static_range(STAGES - 1):  # prologue: the first STAGES-1 tiles in flight
        if i < num_tiles:
            gather_rows(
                lat_in.index(i), rope_in.index(i), KV_CACHE, page_row,
                kv_start + i * BLOCK_N, kv_end, stride_kv, LORA, ROPE, PAGE_SIZE, BLOCK_N,
                ROWS_16BIT,
            )  # fmt: skip
        else:  # an empty group keeps the count of groups per tile
            async_copy.commit_group()
    for it in range(num_tiles):
        stage = it % STAGES
        start_n = kv_start + it * BLOCK_N
        # every warp is done with the stage the next gather refills (last iteration's)
        gl.thread_barrier()
        ahead = it + STAGES - 1
        if ahead < num_tiles:
            gather_rows(
                lat_in.index(ahead % STAGES), rope_in.index(ahead % STAGES), KV_CACHE,
                page_row, kv_start + ahead * BLOCK_N, kv_end, stride_kv, LORA, ROPE,
                PAGE_SIZE, BLOCK_N, ROWS_16BIT,
            )  # fmt: skip
        else:
            async_copy.commit_group()
        async_copy.wait_group(STAGES - 1)  # tile `it` has landed
        gl.thread_barrier()
        fence_async_shared()
        acc, m_i, l_i = attend_keys(
            lat_in.index(stage), rope_in.index(stage), qn_smem, qr_smem, p_smem, acc, m_i,
            l_i, (start_n + offs_ns) < kv_end, qk_scale, S_LAYOUT, O_LAYOUT,
        )  # fmt: skip

    finish_keys(
        acc, m_i, l_i, off_t, off_hb, split, num_splits, OUT, LSE, PARTIAL_O, PARTIAL_LSE,
        stride_ot, stride_oh, stride_lt, stride_pot, stride_poh, stride_pos, stride_plt,
        stride_plh, NUM_HEADS, LORA, BLOCK_H, WRITE_LSE, S_LAYOUT, O_LAYOUT,
    )  # fmt: skip


@gluon.jit
def finish_keys(
    acc,
    m_i,
    l_i,
    off_t,
    off_hb,
    split,
    num_splits,
    OUT,
    LSE,
    PARTIAL_O,
    PARTIAL_LSE,
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
    BLOCK_H: gl.constexpr,
    WRITE_LSE: gl.constexpr,
    S_LAYOUT: gl.constexpr,
    O_LAYOUT: gl.constexpr,
):
    """Normalise the keys-major accumulator O^T and store it (the final output when the row
    has one split, else this split's partial) with its LSE; a row without keys gives zeros
    and an LSE of -inf."""
    OUT_COLS: gl.constexpr = cols_out(gl.num_warps())
    has_keys = l_i > 0.0
    l_safe = gl.where(has_keys, l_i, 1.0)
    lse = gl.where(has_keys, (m_i + gl.log2(l_safe)) * LN2, float("-inf"))
    o = acc / gl.convert_layout(l_safe, gl.SliceLayout(0, O_LAYOUT))[None, :]
    o = gl.convert_layout(o, OUT_COLS)
    heads_o = off_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, OUT_COLS))
    cols = gl.arange(0, LORA, layout=gl.SliceLayout(1, OUT_COLS))
    heads_l = off_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, S_LAYOUT))
    if num_splits == 1:
        if split == 0:
            rows = off_t.to(gl.int64) * stride_ot + heads_o * stride_oh
            gl.store(
                OUT + rows[None, :] + cols[:, None],
                o.to(OUT.dtype.element_ty),
                mask=(heads_o < NUM_HEADS)[None, :],
            )
            if WRITE_LSE:
                gl.store(LSE + off_t.to(gl.int64) * stride_lt + heads_l, lse,
                         mask=heads_l < NUM_HEADS)  # fmt: skip
    elif split < num_splits:
        rows = off_t.to(gl.int64) * stride_pot + heads_o * stride_poh + split * stride_pos
        gl.store(PARTIAL_O + rows[None, :] + cols[:, None], o, mask=(heads_o < NUM_HEADS)[None, :])
        l_rows = off_t.to(gl.int64) * stride_plt + heads_l * stride_plh + split
        gl.store(PARTIAL_LSE + l_rows, lse, mask=heads_l < NUM_HEADS)
