"""MLA's non-absorbed path (prefill and the chunked prefix cache): ragged multi-head
attention with qk dim NOPE + ROPE (128 + 64) and v dim V (128), returning the LSE, and the
merge of two (output, LSE) pairs.

The caller supplies K and V (no latent is decompressed here): per-head k_nope and v, and a
k_rope shared by the heads (head stride 0) or per head. One program holds BLOCK_M query
rows of one request and one head; a request's keys are rows kv_indptr[b] .. kv_indptr[b+1]-1.
"""

import triton
import triton.language as tl

LN2 = tl.constexpr(0.6931471805599453)  # ln(2)
LOG2E = tl.constexpr(1.4426950408889634)  # 1/ln(2)


@triton.jit
def _attend_tile(
    acc,
    m_i,
    l_i,
    q_nope,
    q_rope,
    K_NOPE,
    K_ROPE,
    V,
    kv_lo,
    start_n,
    kv_len,
    q_pos,
    qk_scale,
    off_h,
    stride_kt,
    stride_kh,
    stride_rt,
    stride_rh,
    stride_vt,
    stride_vh,
    NOPE: tl.constexpr,
    ROPE: tl.constexpr,
    V_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASKED: tl.constexpr,
):
    """Keys start_n .. start_n+BLOCK_N-1 into the online softmax of one row block. MASKED:
    the tile may hold keys past kv_len or (CAUSAL) past a row's limit q_pos, masked to -inf
    (and a row may have seen no key yet); otherwise every row sees every key of the tile."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    tok = (kv_lo + offs_n).to(tl.int64)
    k_rows = tl.multiple_of(tok * stride_kt + off_h * stride_kh, 16)
    r_rows = tl.multiple_of(tok * stride_rt + off_h * stride_rh, 16)
    v_rows = tl.multiple_of(tok * stride_vt + off_h * stride_vh, 16)
    k_ptrs = K_NOPE + k_rows[:, None] + tl.arange(0, NOPE)[None, :]
    r_ptrs = K_ROPE + r_rows[:, None] + tl.arange(0, ROPE)[None, :]
    v_ptrs = V + v_rows[:, None] + tl.arange(0, V_DIM)[None, :]
    if MASKED:
        mask_n = offs_n < kv_len
        k_nope = tl.load(k_ptrs, mask=mask_n[:, None], other=0.0)
        k_rope = tl.load(r_ptrs, mask=mask_n[:, None], other=0.0)
        v = tl.load(v_ptrs, mask=mask_n[:, None], other=0.0)
    else:
        k_nope = tl.load(k_ptrs)
        k_rope = tl.load(r_ptrs)
        v = tl.load(v_ptrs)
    s = tl.dot(q_nope, tl.trans(k_nope))
    s = tl.dot(q_rope, tl.trans(k_rope), s)
    if MASKED:
        visible = offs_n[None, :] < kv_len
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= q_pos[:, None])
        s = tl.where(visible, s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # rows with nothing visible yet keep m = -inf; exp2 stays finite
        m_use = tl.where(m_new > float("-inf"), m_new, 0.0)
        p = tl.math.exp2(s - m_use[:, None])
    else:
        s = s * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = m_new
        p = tl.math.exp2(s - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, m_new, l_i


@triton.jit
def ragged_attend_kernel(
    Q,
    K_NOPE,
    K_ROPE,
    V,
    QO_INDPTR,
    KV_INDPTR,
    OUT,
    LSE,
    sm_scale,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_rt,
    stride_rh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_lt,
    NOPE: tl.constexpr,
    ROPE: tl.constexpr,
    V_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    """Rows m0 .. m0+BLOCK_M-1 of request b, head h, over the request's keys.

    Grid (heads, requests, row blocks), row blocks last and in reverse: the blocks with the
    most causal work start first. Q [T, H, NOPE + ROPE] (nope first). CAUSAL aligns the
    queries to the end of the keys: query i of a request with q_len queries and kv_len keys
    sees keys 0 .. kv_len - q_len + i (the new tokens over themselves); otherwise every key
    (a prefix chunk). The tiles every row sees whole run unmasked; the rest (the causal
    diagonal, the ragged end) masked. A row that sees no key gives zeros and LSE -inf.
    """
    off_h = tl.program_id(0)
    off_b = tl.program_id(1)
    off_m = tl.num_programs(2) - 1 - tl.program_id(2)
    q_lo = tl.load(QO_INDPTR + off_b)
    q_len = tl.load(QO_INDPTR + off_b + 1) - q_lo
    if off_m * BLOCK_M < q_len:
        kv_lo = tl.load(KV_INDPTR + off_b)
        kv_len = tl.load(KV_INDPTR + off_b + 1) - kv_lo
        offs_m = off_m * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = offs_m < q_len
        offs_d = tl.arange(0, NOPE)
        offs_r = tl.arange(0, ROPE)
        offs_v = tl.arange(0, V_DIM)

        # -- load q: nope and rope parts ----
        # every row starts on 16 elements (the launcher checks the strides): vector loads
        q_off = (q_lo + offs_m).to(tl.int64) * stride_qt + off_h * stride_qh
        q_rows = Q + tl.multiple_of(q_off, 16)[:, None]
        q_nope = tl.load(q_rows + offs_d[None, :], mask=mask_m[:, None], other=0.0)
        q_rope = tl.load(q_rows + NOPE + offs_r[None, :], mask=mask_m[:, None], other=0.0)

        # -- the keys these rows may see: [0, n_full) by every row, then masked tiles ----
        q_pos = (kv_len - q_len) + offs_m
        kv_hi = kv_len
        n_full = kv_len // BLOCK_N * BLOCK_N
        if CAUSAL:
            first = kv_len - q_len + off_m * BLOCK_M  # the block's first row sees keys <= first
            kv_hi = tl.maximum(tl.minimum(kv_len, first + BLOCK_M), 0)
            n_full = tl.minimum(n_full, tl.maximum(first + 1, 0) // BLOCK_N * BLOCK_N)

        qk_scale = sm_scale * LOG2E
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, V_DIM], dtype=tl.float32)
        for start_n in range(0, n_full, BLOCK_N):
            acc, m_i, l_i = _attend_tile(
                acc, m_i, l_i, q_nope, q_rope, K_NOPE, K_ROPE, V, kv_lo, start_n, kv_len,
                q_pos, qk_scale, off_h, stride_kt, stride_kh, stride_rt, stride_rh,
                stride_vt, stride_vh, NOPE, ROPE, V_DIM, BLOCK_N, CAUSAL, False,
            )  # fmt: skip
        for start_n in range(n_full, kv_hi, BLOCK_N):
            acc, m_i, l_i = _attend_tile(
                acc, m_i, l_i, q_nope, q_rope, K_NOPE, K_ROPE, V, kv_lo, start_n, kv_len,
                q_pos, qk_scale, off_h, stride_kt, stride_kh, stride_rt, stride_rh,
                stride_vt, stride_vh, NOPE, ROPE, V_DIM, BLOCK_N, CAUSAL, True,
            )  # fmt: skip

        # -- normalise, write out and the natural-log LSE ----
        has_keys = l_i > 0.0
        l_safe = tl.where(has_keys, l_i, 1.0)
        lse = tl.where(has_keys, (m_i + tl.math.log2(l_safe)) * LN2, float("-inf"))
        rows = (q_lo + offs_m).to(tl.int64)
        o_rows = tl.multiple_of(rows * stride_ot + off_h * stride_oh, 16)
        o_ptrs = OUT + o_rows[:, None] + offs_v[None, :]
        tl.store(o_ptrs, (acc / l_safe[:, None]).to(OUT.dtype.element_ty), mask=mask_m[:, None])
        tl.store(LSE + rows * stride_lt + off_h, lse, mask=mask_m)


@triton.jit
def merge_state_kernel(
    O_A,
    LSE_A,
    O_B,
    LSE_B,
    OUT,
    LSE_OUT,
    stride_at,
    stride_ah,
    stride_bt,
    stride_bh,
    stride_ot,
    stride_oh,
    stride_lt,
    NUM_HEADS: tl.constexpr,
    DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """out = (exp(lse_a) o_a + exp(lse_b) o_b) / (exp(lse_a) + exp(lse_b)) per (token, head),
    lse_out = ln(exp(lse_a) + exp(lse_b)); a side with LSE -inf contributes nothing (both
    -inf: zeros, -inf). LSEs [T, H] fp32 (head stride 1)."""
    off_t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = heads < NUM_HEADS
    offs_d = tl.arange(0, DIM)
    lse_a = tl.load(LSE_A + off_t * stride_lt + heads, mask=mask_h, other=float("-inf"))
    lse_b = tl.load(LSE_B + off_t * stride_lt + heads, mask=mask_h, other=float("-inf"))
    o_a = tl.load(
        O_A + off_t * stride_at + heads[:, None] * stride_ah + offs_d[None, :],
        mask=mask_h[:, None],
        other=0.0,
    ).to(tl.float32)
    o_b = tl.load(
        O_B + off_t * stride_bt + heads[:, None] * stride_bh + offs_d[None, :],
        mask=mask_h[:, None],
        other=0.0,
    ).to(tl.float32)
    m = tl.maximum(lse_a, lse_b)
    m_use = tl.where(m > float("-inf"), m, 0.0)
    w_a = tl.math.exp2((lse_a - m_use) * LOG2E)
    w_b = tl.math.exp2((lse_b - m_use) * LOG2E)
    total = w_a + w_b
    t_safe = tl.where(total > 0.0, total, 1.0)
    out = o_a * (w_a / t_safe)[:, None] + o_b * (w_b / t_safe)[:, None]
    o_ptrs = OUT + off_t * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=mask_h[:, None])
    lse = tl.where(total > 0.0, m_use + tl.math.log2(t_safe) * LN2, float("-inf"))
    tl.store(LSE_OUT + off_t * stride_lt + heads, lse, mask=mask_h)
