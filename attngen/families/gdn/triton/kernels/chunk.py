"""Chunked gated delta rule over ragged requests (prefill / extend), in two launches.

Within a chunk of C tokens (positions i, j; cumulative log decay G_i = g_1 + .. + g_i,
gamma_i = exp(G_i)) the recurrence from the chunk's initial state S0 (K x V) unrolls to

    u  = U - W S0                  pseudo-values [C, V] (what each token adds to the state)
    O  = (Q * gamma) S0 + P u      P_ij = (q_i . k_j) exp(G_i - G_j) for j <= i, else 0
    S  = gamma_C S0 + (K * exp(G_C - G))^T u

with the WY / UT transform T = (I + M)^-1, M_ij = beta_i exp(G_i - G_j) (k_i . k_j) for
j < i (unit lower triangular, so T is too): W = T (beta gamma K), U = T (beta V).

chunk_prepare_kernel (grid: chunks x value heads, all chunks in parallel): gates, the
cumulative decay, M, T by forward substitution (stable for any keys, unlike a power
series), then W and U into fp32 workspaces.

chunk_scan_kernel (grid: requests x value heads x value blocks): walks a request's chunks
in order with its state slice S [K, BLOCK_V] in registers, starting from the pool row when
the request has a prefix, writing O per chunk and the final state back to the pool row.
Every product is a tensor-core tl.dot (fp32 operands: TF32 on the GPU).
"""

import triton
import triton.language as tl

from attngen.families.gdn.triton.kernels.common import gate_values, inverse_norms


@triton.jit
def chunk_prepare_kernel(
    Q,
    K,
    V,
    A,
    B,
    A_LOG,
    DT_BIAS,
    CHUNK_SEQ,
    CHUNK_START,
    QUERY_START_LOC,
    W_BUF,
    U_BUF,
    G_BUF,
    QN_BUF,
    KN_BUF,
    P_BUF,
    scale,
    stride_q_tok,
    stride_q_head,
    stride_k_tok,
    stride_k_head,
    stride_v_tok,
    stride_v_head,
    stride_a_tok,
    stride_b_tok,
    num_v_heads,
    GROUP: tl.constexpr,
    KEY_DIM: tl.constexpr,
    VALUE_DIM: tl.constexpr,
    CHUNK: tl.constexpr,
    L2NORM: tl.constexpr,
):
    c = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // GROUP
    seq = tl.load(CHUNK_SEQ + c)
    start = tl.load(CHUNK_START + c).to(tl.int64)
    length = tl.minimum(tl.load(QUERY_START_LOC + seq + 1).to(tl.int64) - start, CHUNK)
    rows = tl.arange(0, CHUNK)
    rmask = rows < length
    tok = start + rows
    ks = tl.arange(0, KEY_DIM)
    vs = tl.arange(0, VALUE_DIM)
    # -- keys and queries as stored, their inverse norms ----
    k_ptr = K + tok[:, None] * stride_k_tok + hk * stride_k_head + ks[None, :]
    k = tl.load(k_ptr, mask=rmask[:, None], other=0.0)
    k_norm = inverse_norms(k.to(tl.float32), L2NORM)
    q_ptr = Q + tok[:, None] * stride_q_tok + hk * stride_q_head + ks[None, :]
    q = tl.load(q_ptr, mask=rmask[:, None], other=0.0)
    q_norm = inverse_norms(q.to(tl.float32), L2NORM)
    tl.store(QN_BUF + tok * num_v_heads + hv, q_norm, mask=rmask)
    tl.store(KN_BUF + tok * num_v_heads + hv, k_norm, mask=rmask)
    a = tl.load(A + tok * stride_a_tok + hv, mask=rmask, other=0.0)
    b = tl.load(B + tok * stride_b_tok + hv, mask=rmask, other=0.0)
    g, beta = gate_values(a, b, tl.load(A_LOG + hv), tl.load(DT_BIAS + hv).to(tl.float32))
    g = tl.where(rmask, g, 0.0)
    beta = tl.where(rmask, beta, 0.0)
    cum = tl.cumsum(g, axis=0)  # G_i
    tl.store(G_BUF + tok * num_v_heads + hv, cum, mask=rmask)
    # -- P[i, j] = (q_i . k_j) exp(G_i - G_j) for j <= i, normalised and scaled ----
    ri = rows[:, None]
    ci = rows[None, :]
    causal = ci <= ri
    p = tl.dot(q, tl.trans(k)) * (q_norm * scale)[:, None] * k_norm[None, :]
    p = tl.where(causal, p * tl.exp(tl.where(causal, cum[:, None] - cum[None, :], 0.0)), 0.0)
    p_ptr = P_BUF + (tok[:, None] * num_v_heads + hv) * CHUNK + rows[None, :]
    tl.store(p_ptr, p, mask=rmask[:, None])
    # -- M^T[j, i] = M[i, j] = beta_i exp(G_i - G_j) (k_i . k_j), j < i ----
    kk = tl.dot(k, tl.trans(k)) * k_norm[:, None] * k_norm[None, :]
    decay = tl.exp(tl.where(ci > ri, cum[None, :] - cum[:, None], 0.0))
    mt = tl.where(ci > ri, beta[None, :] * decay * kk, 0.0)
    # -- T = (I + M)^-1 by forward substitution: row i = e_i - M[i, :i] T[:i, :] ----
    tm = tl.where(ri == ci, 1.0, 0.0)
    for i in range(1, length):
        m_row = tl.sum(tl.where(ci == i, mt, 0.0), axis=1)  # M[i, :] indexed by rows
        new_row = tl.where(ci == i, 1.0, 0.0) - tl.sum(m_row[:, None] * tm, axis=0)[None, :]
        tm = tl.where(ri == i, new_row, tm)
    # -- W = T (beta gamma K) ----
    # (per half of the key dim: one [CHUNK, KEY_DIM / 2] fp32 operand at a time)
    w_scale = (k_norm * beta * tl.exp(cum))[:, None]
    half = tl.arange(0, KEY_DIM // 2)
    w_ptr = W_BUF + (tok[:, None] * num_v_heads + hv) * KEY_DIM + half[None, :]
    k_half = K + tok[:, None] * stride_k_tok + hk * stride_k_head + half[None, :]
    k_lo = tl.load(k_half, mask=rmask[:, None], other=0.0).to(tl.float32)
    tl.store(w_ptr, tl.dot(tm, k_lo * w_scale), mask=rmask[:, None])
    k_hi = tl.load(k_half + KEY_DIM // 2, mask=rmask[:, None], other=0.0).to(tl.float32)
    tl.store(w_ptr + KEY_DIM // 2, tl.dot(tm, k_hi * w_scale), mask=rmask[:, None])
    # -- U = T (beta V) ----
    v_ptr = V + tok[:, None] * stride_v_tok + hv * stride_v_head + vs[None, :]
    v = tl.load(v_ptr, mask=rmask[:, None], other=0.0).to(tl.float32)
    u = tl.dot(tm, v * beta[:, None])
    u_ptr = U_BUF + (tok[:, None] * num_v_heads + hv) * VALUE_DIM + vs[None, :]
    tl.store(u_ptr, u, mask=rmask[:, None])


@triton.jit
def _load_rows(PTR, tok, stride_tok, col0, cols, rmask):
    """Rows ``tok`` [CHUNK], columns ``col0 + cols`` of a row-major tensor, as stored."""
    ptr = PTR + tok[:, None] * stride_tok + col0 + cols[None, :]
    return tl.load(ptr, mask=rmask[:, None], other=0.0)


@triton.jit
def chunk_scan_kernel(
    Q,
    K,
    W_BUF,
    U_BUF,
    G_BUF,
    QN_BUF,
    KN_BUF,
    P_BUF,
    STATE,
    CACHE_INDICES,
    HAS_INITIAL,
    QUERY_START_LOC,
    OUT,
    scale,
    stride_q_tok,
    stride_q_head,
    stride_k_tok,
    stride_k_head,
    stride_s_slot,
    stride_s_head,
    stride_o_tok,
    stride_o_head,
    num_v_heads,
    GROUP: tl.constexpr,
    KEY_DIM: tl.constexpr,
    VALUE_DIM: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_V: tl.constexpr,
    L2NORM: tl.constexpr,
):
    # The key dim is processed in two halves (lo, hi), so at most one [CHUNK, KEY_DIM / 2]
    # tile of q, k or W is live at a time next to the state halves.
    HALF: tl.constexpr = KEY_DIM // 2
    pid_b = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // GROUP
    vs = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    cols = tl.arange(0, HALF)
    rows = tl.arange(0, CHUNK)
    start = tl.load(QUERY_START_LOC + pid_b).to(tl.int64)
    end = tl.load(QUERY_START_LOC + pid_b + 1).to(tl.int64)
    slot = tl.load(CACHE_INDICES + pid_b).to(tl.int64)
    init = (tl.load(HAS_INITIAL + pid_b) != 0) & (slot > 0)
    # -- S [KEY_DIM, BLOCK_V] in two halves, from the pool row (stored transposed) ----
    pool = STATE + slot * stride_s_slot + hv * stride_s_head + vs[None, :] * KEY_DIM
    s_lo = tl.load(pool + cols[:, None], mask=init, other=0.0).to(tl.float32)
    s_hi = tl.load(pool + HALF + cols[:, None], mask=init, other=0.0).to(tl.float32)
    q0 = hk * stride_q_head
    k0 = hk * stride_k_head
    for c0 in range(start, end, CHUNK):
        length = tl.minimum(end - c0, CHUNK)
        rmask = rows < length
        tok = c0 + rows
        head_rows = tok * num_v_heads + hv
        cum = tl.load(G_BUF + head_rows, mask=rmask, other=0.0)
        cum_last = tl.sum(tl.where(rows == length - 1, cum, 0.0), axis=0)
        # -- u = U - W S ----
        u = tl.load(
            U_BUF + head_rows[:, None] * VALUE_DIM + vs[None, :], mask=rmask[:, None], other=0.0
        )
        w = _load_rows(W_BUF, head_rows, KEY_DIM, 0, cols, rmask)
        u -= tl.dot(w, s_lo)
        w = _load_rows(W_BUF, head_rows, KEY_DIM, HALF, cols, rmask)
        u -= tl.dot(w, s_hi)
        # -- per half of the key dim, on the raw q, k (their norms and the scale act on
        # rows): O = q S, then S = gamma_C S + k^T (u exp(G_C - G) / ||k||) ----
        q_row = tl.load(QN_BUF + head_rows, mask=rmask, other=0.0) * scale
        k_row = tl.load(KN_BUF + head_rows, mask=rmask, other=0.0)
        u_in = u * (k_row * tl.exp(cum_last - cum))[:, None]
        decay_last = tl.exp(cum_last)
        q = _load_rows(Q, tok, stride_q_tok, q0, cols, rmask)
        o = tl.dot(q.to(tl.float32), s_lo)
        k = _load_rows(K, tok, stride_k_tok, k0, cols, rmask)
        s_lo = s_lo * decay_last + tl.dot(tl.trans(k.to(tl.float32)), u_in)
        q = _load_rows(Q, tok, stride_q_tok, q0 + HALF, cols, rmask)
        o += tl.dot(q.to(tl.float32), s_hi)
        k = _load_rows(K, tok, stride_k_tok, k0 + HALF, cols, rmask)
        s_hi = s_hi * decay_last + tl.dot(tl.trans(k.to(tl.float32)), u_in)
        # -- O = (q S) gamma / ||q|| + P u (P from the prepare kernel) ----
        p = _load_rows(P_BUF, head_rows, CHUNK, 0, rows, rmask)
        o = o * (q_row * tl.exp(cum))[:, None] + tl.dot(p, u)
        o_ptr = OUT + tok[:, None] * stride_o_tok + hv * stride_o_head + vs[None, :]
        tl.store(o_ptr, o.to(OUT.dtype.element_ty), mask=rmask[:, None])
    tl.store(pool + cols[:, None], s_lo.to(STATE.dtype.element_ty), mask=slot > 0)
    tl.store(pool + HALF + cols[:, None], s_hi.to(STATE.dtype.element_ty), mask=slot > 0)
