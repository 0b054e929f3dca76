"""Split-KV decode: stage 1 attends one split of a request's keys for one kv head's
query group; stage 2 merges the splits (and the sinks)."""

import triton
import triton.language as tl

from attngen.families.mha.triton.kernels.attend import (
    attend_kv_blocks,
    load_kv_scale,
    score_scale,
    sink_denominator,
)


@triton.jit
def decode_split_kernel(
    Q,
    K_CACHE,
    V_CACHE,
    PAGE_TABLE,
    SEQ_LENS,
    NUM_SPLITS,
    K_SCALE,
    V_SCALE,
    K_BSCALE,
    V_BSCALE,
    PARTIAL_O,
    PARTIAL_LSE,
    sm_scale,
    stride_qb,
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
    stride_pob,
    stride_poh,
    stride_pos,
    stride_plb,
    stride_plh,
    GQA_GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    V_HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    WINDOW_LEFT: tl.constexpr,
    LOGIT_SOFTCAP: tl.constexpr,
    KV_SCALED: tl.constexpr,
    SCALE_PER_HEAD: tl.constexpr,
    KV_FP4: tl.constexpr,
):
    """Stage 1: the GQA_GROUP query heads of one kv head over one split of one request.

    KV_SCALED: K_SCALE / V_SCALE (fp32, one value, or one per kv head with SCALE_PER_HEAD)
    dequantize an fp8 cache (or scale an NVFP4 one, KV_FP4, whose e4m3 block scales are
    K_BSCALE / V_BSCALE); K's folds into the score scale, V's into the split output.
    """
    off_b = tl.program_id(0)
    off_kvh = tl.program_id(1)
    split = tl.program_id(2)

    # -- this split's slice of the KV range (BLOCK_N-aligned; may be empty) ----
    seq_len = tl.load(SEQ_LENS + off_b)
    num_splits = tl.minimum(tl.maximum(tl.load(NUM_SPLITS + off_b), 1), MAX_SPLITS)
    if WINDOW_LEFT >= 0:
        # the query sits at seq_len - 1; blocks wholly left of its window are not read
        kv_lo = tl.maximum(seq_len - 1 - WINDOW_LEFT, 0)
        range_start = kv_lo // BLOCK_N * BLOCK_N
        split_len = tl.cdiv(tl.cdiv(seq_len - range_start, num_splits), BLOCK_N) * BLOCK_N
        kv_start = tl.minimum(range_start + split * split_len, seq_len)
    else:
        kv_lo = 0
        split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
        kv_start = tl.minimum(split * split_len, seq_len)
    # split_len * num_splits covers the range, so splits >= num_splits start at seq_len: empty
    kv_end = tl.minimum(kv_start + split_len, seq_len)

    # -- load the group's query rows (padded to BLOCK_H for tl.dot) ----
    offs_h = tl.arange(0, BLOCK_H)
    mask_h = offs_h < GQA_GROUP
    heads = off_kvh * GQA_GROUP + offs_h
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q_ptrs = Q + off_b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
    q_ptrs = tl.multiple_of(q_ptrs, [16, 16])  # 16-byte aligned rows (the launcher checks)
    q_mask = mask_h[:, None]
    if HEAD_DIM < BLOCK_D:
        q_mask = q_mask & (offs_d < HEAD_DIM)[None, :]  # padded lanes: 0, nothing in q.k
    q = tl.load(q_ptrs, mask=q_mask, other=0.0)

    # -- attend the split's keys ----
    k_scale = load_kv_scale(K_SCALE, off_kvh, KV_SCALED, SCALE_PER_HEAD)
    qk_scale = score_scale(sm_scale * k_scale, LOGIT_SOFTCAP)
    ks_base = K_BSCALE  # NVFP4 block scales (None otherwise)
    vs_base = V_BSCALE
    if KV_FP4:
        ks_base += off_kvh * stride_ksh
        vs_base += off_kvh * stride_vsh
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
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
    TILE: tl.constexpr = (HEAD_DIM, V_HEAD_DIM, BLOCK_D, BLOCK_DV, PAGE_SIZE, BLOCK_N, True, KV_FP4)
    acc, l_i, m_i = attend_kv_blocks(
        acc,
        l_i,
        m_i,
        q,
        tl.full([BLOCK_H], seq_len - 1, dtype=tl.int32),  # every head's query position
        qk_scale,
        K_CACHE + off_kvh * stride_kh,
        V_CACHE + off_kvh * stride_vh,
        ks_base,
        vs_base,
        PAGE_TABLE + off_b.to(tl.int64) * stride_ptb,
        strides,
        None,  # no tree mask
        (0, 0),
        (kv_start, kv_end, kv_lo, kv_end),
        TILE,
        MASK_KV_LEN=True,
        MASK_CAUSAL=False,
        WINDOW_LEFT=WINDOW_LEFT,
        LOGIT_SOFTCAP=LOGIT_SOFTCAP,
        MASK_TREE=False,
    )

    # -- write the split's normalised output and natural-log LSE (-inf when empty) ----
    has_keys = l_i > 0.0
    l_safe = tl.where(has_keys, l_i, 1.0)
    lse = tl.where(has_keys, (m_i + tl.math.log2(l_safe)) * 0.69314718, float("-inf"))  # ln(2)
    po_ptrs = (
        PARTIAL_O
        + off_b.to(tl.int64) * stride_pob
        + heads[:, None] * stride_poh
        + split * stride_pos
        + offs_dv[None, :]
    )
    po_ptrs = tl.multiple_of(po_ptrs, [16, 16])
    po_mask = mask_h[:, None]
    if V_HEAD_DIM < BLOCK_DV:
        po_mask = po_mask & (offs_dv < V_HEAD_DIM)[None, :]
    v_scale = load_kv_scale(V_SCALE, off_kvh, KV_SCALED, SCALE_PER_HEAD)
    tl.store(po_ptrs, acc * (v_scale / l_safe)[:, None], mask=po_mask)
    plse_ptrs = PARTIAL_LSE + off_b.to(tl.int64) * stride_plb + heads * stride_plh + split
    tl.store(plse_ptrs, lse, mask=mask_h)


@triton.jit
def decode_combine_kernel(
    PARTIAL_O,
    PARTIAL_LSE,
    NUM_SPLITS,
    SINKS,
    OUT,
    stride_pob,
    stride_poh,
    stride_pos,
    stride_plb,
    stride_plh,
    stride_ob,
    stride_oh,
    V_HEAD_DIM: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    """Stage 2: merge one query head's splits by their LSE, then its sink (HAS_SINKS: SINKS
    [Hq] fp32, once per head, not per split); no keys at all gives zeros."""
    off_b = tl.program_id(0)
    off_h = tl.program_id(1)
    num_splits = tl.minimum(tl.maximum(tl.load(NUM_SPLITS + off_b), 1), MAX_SPLITS)
    offs_dv = tl.arange(0, BLOCK_DV)
    po_row = PARTIAL_O + off_b.to(tl.int64) * stride_pob + off_h * stride_poh
    plse_row = PARTIAL_LSE + off_b.to(tl.int64) * stride_plb + off_h * stride_plh

    m = float("-inf")
    l = 0.0
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for split in range(0, num_splits):
        # -- rescale by base-2 exponents; empty splits (LSE -inf) add nothing ----
        lse = tl.load(plse_row + split) * 1.44269504  # 1/ln(2)
        if lse > float("-inf"):
            o_ptrs = tl.multiple_of(po_row + split * stride_pos + offs_dv, [16])
            if V_HEAD_DIM < BLOCK_DV:
                o = tl.load(o_ptrs, mask=offs_dv < V_HEAD_DIM, other=0.0)
            else:
                o = tl.load(o_ptrs)
            m_new = tl.maximum(m, lse)
            alpha = tl.math.exp2(m - m_new)
            weight = tl.math.exp2(lse - m_new)
            acc = acc * alpha + o * weight
            l = l * alpha + weight
            m = m_new

    sink = 0.0
    if HAS_SINKS:
        sink = tl.load(SINKS + off_h)
    out = acc / sink_denominator(l, m, sink, HAS_SINKS)
    out_ptrs = OUT + off_b.to(tl.int64) * stride_ob + off_h * stride_oh + offs_dv
    out_ptrs = tl.multiple_of(out_ptrs, [16])
    if V_HEAD_DIM < BLOCK_DV:
        tl.store(out_ptrs, out.to(OUT.dtype.element_ty), mask=offs_dv < V_HEAD_DIM)
    else:
        tl.store(out_ptrs, out.to(OUT.dtype.element_ty))
