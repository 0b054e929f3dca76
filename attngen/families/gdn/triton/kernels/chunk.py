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

from attngen.families.gdn.triton.kernels.common import gate_values, l2norm_rows


@triton.jit
def chunk_prepare_kernel(
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
    # -- keys (normalised), values, gates of the chunk ----
    k_ptr = K + tok[:, None] * stride_k_tok + hk * stride_k_head + ks[None, :]
    k = l2norm_rows(tl.load(k_ptr, mask=rmask[:, None], other=0.0).to(tl.float32), L2NORM)
    v_ptr = V + tok[:, None] * stride_v_tok + hv * stride_v_head + vs[None, :]
    v = tl.load(v_ptr, mask=rmask[:, None], other=0.0).to(tl.float32)
    a = tl.load(A + tok * stride_a_tok + hv, mask=rmask, other=0.0)
    b = tl.load(B + tok * stride_b_tok + hv, mask=rmask, other=0.0)
    g, beta = gate_values(a, b, tl.load(A_LOG + hv), tl.load(DT_BIAS + hv).to(tl.float32))
    g = tl.where(rmask, g, 0.0)
    beta = tl.where(rmask, beta, 0.0)
    cum = tl.cumsum(g, axis=0)  # G_i
    tl.store(G_BUF + tok * num_v_heads + hv, cum, mask=rmask)
    # -- M^T[j, i] = M[i, j] = beta_i exp(G_i - G_j) (k_i . k_j), j < i ----
    ri = rows[:, None]
    ci = rows[None, :]
    kk = tl.dot(k, tl.trans(k))
    decay = tl.exp(tl.where(ci > ri, cum[None, :] - cum[:, None], 0.0))
    mt = tl.where(ci > ri, beta[None, :] * decay * kk, 0.0)
    # -- T = (I + M)^-1 by forward substitution: row i = e_i - M[i, :i] T[:i, :] ----
    tm = tl.where(ri == ci, 1.0, 0.0)
    for i in range(1, length):
        m_row = tl.sum(tl.where(ci == i, mt, 0.0), axis=1)  # M[i, :] indexed by rows
        new_row = tl.where(ci == i, 1.0, 0.0) - tl.sum(m_row[:, None] * tm, axis=0)[None, :]
        tm = tl.where(ri == i, new_row, tm)
    # -- W = T (beta gamma K), U = T (beta V) ----
    w = tl.dot(tm, k * (beta * tl.exp(cum))[:, None])
    u = tl.dot(tm, v * beta[:, None])
    w_ptr = W_BUF + (tok[:, None] * num_v_heads + hv) * KEY_DIM + ks[None, :]
    tl.store(w_ptr, w, mask=rmask[:, None])
    u_ptr = U_BUF + (tok[:, None] * num_v_heads + hv) * VALUE_DIM + vs[None, :]
    tl.store(u_ptr, u, mask=rmask[:, None])


@triton.jit
def chunk_scan_kernel(
    Q,
    K,
    W_BUF,
    U_BUF,
    G_BUF,
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
    pid_b = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // GROUP
    vs = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    ks = tl.arange(0, KEY_DIM)
    rows = tl.arange(0, CHUNK)
    start = tl.load(QUERY_START_LOC + pid_b).to(tl.int64)
    end = tl.load(QUERY_START_LOC + pid_b + 1).to(tl.int64)
    slot = tl.load(CACHE_INDICES + pid_b).to(tl.int64)
    init = (tl.load(HAS_INITIAL + pid_b) != 0) & (slot > 0)
    # -- S [KEY_DIM, BLOCK_V] from the pool row (stored transposed, [V, K]) ----
    pool = STATE + slot * stride_s_slot + hv * stride_s_head + vs[None, :] * KEY_DIM + ks[:, None]
    s = tl.load(pool, mask=init, other=0.0).to(tl.float32)
    causal = rows[None, :] <= rows[:, None]
    for c0 in range(start, end, CHUNK):
        length = tl.minimum(end - c0, CHUNK)
        rmask = rows < length
        tok = c0 + rows
        # -- the chunk's q, k (normalised), W, U, cumulative decay ----
        q_ptr = Q + tok[:, None] * stride_q_tok + hk * stride_q_head + ks[None, :]
        q = tl.load(q_ptr, mask=rmask[:, None], other=0.0).to(tl.float32)
        q = l2norm_rows(q, L2NORM) * scale
        k_ptr = K + tok[:, None] * stride_k_tok + hk * stride_k_head + ks[None, :]
        k = l2norm_rows(tl.load(k_ptr, mask=rmask[:, None], other=0.0).to(tl.float32), L2NORM)
        head_rows = tok[:, None] * num_v_heads + hv
        w = tl.load(W_BUF + head_rows * KEY_DIM + ks[None, :], mask=rmask[:, None], other=0.0)
        u = tl.load(U_BUF + head_rows * VALUE_DIM + vs[None, :], mask=rmask[:, None], other=0.0)
        cum = tl.load(G_BUF + tok * num_v_heads + hv, mask=rmask, other=0.0)
        cum_last = tl.sum(tl.where(rows == length - 1, cum, 0.0), axis=0)
        # -- u = U - W S; O = (Q gamma) S + P u; S = gamma_C S + (K exp(G_C - G))^T u ----
        u = u - tl.dot(w, s)
        p = tl.dot(q, tl.trans(k))
        p = tl.where(causal, p * tl.exp(tl.where(causal, cum[:, None] - cum[None, :], 0.0)), 0.0)
        o = tl.dot(q * tl.exp(cum)[:, None], s) + tl.dot(p, u)
        o_ptr = OUT + tok[:, None] * stride_o_tok + hv * stride_o_head + vs[None, :]
        tl.store(o_ptr, o.to(OUT.dtype.element_ty), mask=rmask[:, None])
        k_decayed = k * tl.exp(cum_last - cum)[:, None]
        s = s * tl.exp(cum_last) + tl.dot(tl.trans(k_decayed), u)
    tl.store(pool, s.to(STATE.dtype.element_ty), mask=slot > 0)
