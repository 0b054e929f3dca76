"""Extend / verify / prefill: ragged new tokens over a paged prefix (or contiguous K/V)."""

import triton
import triton.language as tl

from attngen.families.mha.triton.kernels.attend import (
    attend_kv_blocks,
    load_kv_scale,
    score_scale,
    sink_denominator,
)


@triton.jit
def extend_kernel(
    Q,
    K_CACHE,
    V_CACHE,
    PAGE_TABLE,
    QO_INDPTR,
    PREFIX_LENS,
    SINKS,
    K_SCALE,
    V_SCALE,
    K_BSCALE,
    V_BSCALE,
    TREE_MASK,
    TREE_MASK_INDPTR,
    OUT,
    sm_scale,
    stride_qt,
    stride_qh,
    stride_kp,
    stride_ks,
    stride_kh,
    stride_vp,
    stride_vs,
    stride_vh,
    stride_ksp,
    stride_kss,
    stride_ksh,
    stride_vsp,
    stride_vss,
    stride_vsh,
    stride_ptb,
    stride_ot,
    stride_oh,
    GQA_GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    V_HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW_LEFT: tl.constexpr,
    LOGIT_SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    KV_SCALED: tl.constexpr,
    SCALE_PER_HEAD: tl.constexpr,
    KV_FP4: tl.constexpr,
    MASK_TREE: tl.constexpr,
    PAGED: tl.constexpr,
    PACK_GQA: tl.constexpr,
):
    """BLOCK_M new tokens of one request and one query head over the request's KV.

    Key blocks: left of every row's window (not read), window-masked, unmasked, then the
    diagonal (causal), the draft tokens (MASK_TREE: prefix keys are all visible, draft keys
    per the request's tree mask, which starts at byte TREE_MASK_INDPTR[b] of TREE_MASK) or
    the ragged end (kv_len), with every mask that applies. PAGED: K/V come through the page
    table, after a cached prefix of PREFIX_LENS[b] tokens; without it (prefill) the rows
    QO_INDPTR[b] .. QO_INDPTR[b+1]-1 of contiguous K/V [T, Hkv, D] are the whole sequence.
    KV_FP4: an NVFP4 cache (packed codes in K/V_CACHE, e4m3 block scales in K/V_BSCALE).
    PACK_GQA (grid dim 1 = kv heads): a tile's rows are (token, query head of the kv head's
    group) pairs, token-major, so the group's heads share each K/V load (verify: few tokens
    per request, the whole group in one tile).
    """
    tl.static_assert(not (MASK_TREE and CAUSAL))
    start_m = tl.program_id(0)
    off_b = tl.program_id(2)
    if PACK_GQA:
        # -- row r of the tile: token r // GQA_GROUP, head r % GQA_GROUP of the group ----
        off_kvh = tl.program_id(1)
        pair = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_m = pair // GQA_GROUP
        heads = off_kvh * GQA_GROUP + pair % GQA_GROUP  # [BLOCK_M]
        tok_lo = start_m * BLOCK_M // GQA_GROUP  # tokens tok_lo .. tok_hi - 1 in the tile
        tok_hi = ((start_m + 1) * BLOCK_M - 1) // GQA_GROUP + 1
    else:
        heads = tl.program_id(1)  # one query head
        off_kvh = heads // GQA_GROUP
        tok_lo = start_m * BLOCK_M
        tok_hi = tok_lo + BLOCK_M
        offs_m = tok_lo + tl.arange(0, BLOCK_M)

    # -- this request's rows; tiles past its extend length have nothing to do ----
    q_start = tl.load(QO_INDPTR + off_b)
    extend_len = tl.load(QO_INDPTR + off_b + 1) - q_start
    if tok_lo >= extend_len:
        return
    k_base = K_CACHE + off_kvh * stride_kh
    v_base = V_CACHE + off_kvh * stride_vh
    ks_base = K_BSCALE  # NVFP4 block scales (None otherwise)
    vs_base = V_BSCALE
    if KV_FP4:
        ks_base += off_kvh * stride_ksh
        vs_base += off_kvh * stride_vsh
    if PAGED:
        prefix_len = tl.load(PREFIX_LENS + off_b)
        page_row = PAGE_TABLE + off_b.to(tl.int64) * stride_ptb
    else:
        prefix_len = 0
        page_row = PAGE_TABLE
        k_base += q_start.to(tl.int64) * stride_ks
        v_base += q_start.to(tl.int64) * stride_vs
    kv_len = prefix_len + extend_len
    mask_row = TREE_MASK
    if MASK_TREE:
        mask_row += tl.load(TREE_MASK_INDPTR + off_b).to(tl.int64)
    # what every key-block pass shares (attend_kv_blocks' grouped arguments)
    strides = (
        stride_kp,
        stride_ks,
        stride_vp,
        stride_vs,
        stride_ksp,
        stride_kss,
        stride_vsp,
        stride_vss,
    )
    tree = (prefix_len, extend_len)
    TILE: tl.constexpr = (
        HEAD_DIM,
        V_HEAD_DIM,
        BLOCK_D,
        BLOCK_DV,
        PAGE_SIZE,
        BLOCK_N,
        PAGED,
        KV_FP4,
    )

    # -- load q ----
    mask_m = offs_m < extend_len
    rows = (q_start + offs_m).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q_rows = rows * stride_qt + heads * stride_qh  # heads: a scalar, or per row (PACK_GQA)
    o_rows = rows * stride_ot + heads * stride_oh
    q_ptrs = Q + q_rows[:, None] + offs_d[None, :]
    q_ptrs = tl.multiple_of(q_ptrs, [16, 16])  # 16-byte aligned rows (the launcher checks)
    q_mask = mask_m[:, None]
    if HEAD_DIM < BLOCK_D:
        q_mask = q_mask & (offs_d < HEAD_DIM)[None, :]  # padded lanes: 0, nothing in q.k
    q = tl.load(q_ptrs, mask=q_mask, other=0.0)
    q_pos = prefix_len + offs_m

    # -- key blocks every row of the tile sees in full, then the masked rest ----
    if CAUSAL:
        full_end = (prefix_len + tok_lo) // BLOCK_N * BLOCK_N
        masked_end = tl.minimum(kv_len, prefix_len + tok_hi)
    elif MASK_TREE:
        full_end = prefix_len // BLOCK_N * BLOCK_N
        masked_end = kv_len
    else:
        full_end = kv_len // BLOCK_N * BLOCK_N
        masked_end = kv_len
    kv_lo = 0
    full_start = 0
    if WINDOW_LEFT >= 0:
        # the first row's window starts at kv_lo; the last row's covers keys >= full_start
        kv_lo = tl.maximum(prefix_len + tok_lo - WINDOW_LEFT, 0)
        full_start = tl.maximum(prefix_len + tok_hi - 1 - WINDOW_LEFT, 0)
        full_start = tl.minimum(tl.cdiv(full_start, BLOCK_N) * BLOCK_N, full_end)
        full_start = tl.maximum(full_start, kv_lo // BLOCK_N * BLOCK_N)

    k_scale = load_kv_scale(K_SCALE, off_kvh, KV_SCALED, SCALE_PER_HEAD)
    qk_scale = score_scale(sm_scale * k_scale, LOGIT_SOFTCAP)
    if WINDOW_LEFT >= 0 or MASK_TREE:
        # a row may see no key of a masked block: a finite start keeps exp2 off NaN
        m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    if WINDOW_LEFT >= 0:
        acc, l_i, m_i = attend_kv_blocks(  # left edge of the window
            acc,
            l_i,
            m_i,
            q,
            q_pos,
            qk_scale,
            k_base,
            v_base,
            ks_base,
            vs_base,
            page_row,
            strides,
            mask_row,
            tree,
            (kv_lo // BLOCK_N * BLOCK_N, full_start, kv_lo, kv_len),
            TILE,
            MASK_KV_LEN=False,
            MASK_CAUSAL=False,
            WINDOW_LEFT=WINDOW_LEFT,
            LOGIT_SOFTCAP=LOGIT_SOFTCAP,
            MASK_TREE=False,
        )
    acc, l_i, m_i = attend_kv_blocks(  # no mask
        acc,
        l_i,
        m_i,
        q,
        q_pos,
        qk_scale,
        k_base,
        v_base,
        ks_base,
        vs_base,
        page_row,
        strides,
        mask_row,
        tree,
        (full_start, full_end, kv_lo, kv_len),
        TILE,
        MASK_KV_LEN=False,
        MASK_CAUSAL=False,
        WINDOW_LEFT=-1,
        LOGIT_SOFTCAP=LOGIT_SOFTCAP,
        MASK_TREE=False,
    )
    acc, l_i, m_i = attend_kv_blocks(
        acc,
        l_i,
        m_i,
        q,
        q_pos,
        qk_scale,
        k_base,
        v_base,
        ks_base,
        vs_base,
        page_row,
        strides,
        mask_row,
        tree,
        (full_end, masked_end, kv_lo, kv_len),
        TILE,
        MASK_KV_LEN=True,
        MASK_CAUSAL=CAUSAL,
        WINDOW_LEFT=WINDOW_LEFT,
        LOGIT_SOFTCAP=LOGIT_SOFTCAP,
        MASK_TREE=MASK_TREE,
    )

    # -- epilogue: V's dequant scale, the sink; a row that saw no key gives zeros ----
    v_scale = load_kv_scale(V_SCALE, off_kvh, KV_SCALED, SCALE_PER_HEAD)
    if HAS_SINKS or WINDOW_LEFT >= 0 or MASK_TREE:
        sink = 0.0
        if HAS_SINKS:
            sink = tl.load(SINKS + heads)  # one per row when PACK_GQA
        out = acc * (v_scale / sink_denominator(l_i, m_i, sink, HAS_SINKS))[:, None]
    else:
        out = acc * (v_scale / l_i)[:, None]  # causal/none: every row saw a key
    out_ptrs = OUT + o_rows[:, None] + offs_dv[None, :]
    out_ptrs = tl.multiple_of(out_ptrs, [16, 16])
    out_mask = mask_m[:, None]
    if V_HEAD_DIM < BLOCK_DV:
        out_mask = out_mask & (offs_dv < V_HEAD_DIM)[None, :]
    tl.store(out_ptrs, out.to(OUT.dtype.element_ty), mask=out_mask)
