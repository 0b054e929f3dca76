"""Chunked gated delta rule over ragged requests (prefill / extend), in three launches.

Within a chunk of C tokens (positions i, j; cumulative log decay G_i = g_1 + .. + g_i,
gamma_i = exp(G_i); k, q normalised, q scaled) the recurrence from the chunk's initial
state S0 (K x V) unrolls to

    u  = U - W S0                  pseudo-values [C, V] (what each token adds to the state)
    O  = (Q * gamma) S0 + P u      P_ij = (q_i . k_j) exp(G_i - G_j) for j <= i, else 0
    S  = gamma_C S0 + (K * exp(G_C - G))^T u

with the WY / UT transform T = (I + M)^-1, M_ij = beta_i exp(G_i - G_j) (k_i . k_j) for
j < i (unit lower triangular, so T is too): W = T (beta gamma K), U = T (beta V).

chunk_prepare_kernel (grid: chunks x value heads): gates, G, the q/k inverse norms (from
the Gram diagonals), P and M into fp32 workspaces; the q.k products run on the stored
bf16/fp16 values (exact products), norms and scale act on rows and columns.
chunk_solve_kernel (same grid): T by :func:`unit_lower_inverse`, then W and U.
chunk_scan_kernel (grid: requests x value heads x value blocks): walks a request's chunks
in order with its state slice S [K, BLOCK_V] in registers (two halves of the key dim),
starting from the pool row when the request has a prefix, writing O per chunk and the final
state back to the pool row. Products are tensor-core tl.dot (fp32 operands: TF32 on the
GPU; the triangular inverse: tf32x3).
"""

import triton
import triton.language as tl

from attngen.families.gdn.triton.kernels.common import gate_values, inverse_norms_from_gram

SUB = tl.constexpr(16)  # diagonal blocks of the triangular inverse


@triton.jit
def unit_lower_inverse(m, ri, ci, CHUNK: tl.constexpr):
    """(I + M)^-1 of a strictly lower triangular [CHUNK, CHUNK] M (CHUNK <= 4 * SUB).

    D = I + (M's diagonal SUB x SUB blocks) is inverted by forward substitution, one row of
    every block per step (SUB - 1 steps, each a tensor-core product of the step's rows of M
    with the rows already done); with N = D^-1 (M - its diagonal blocks), strictly block-lower
    so N^4 = 0, (I + M)^-1 = (I - N)(I + N^2) D^-1. Products run as three TF32 products
    (tf32x3: fp32-level accuracy); the terms are those of blocked forward substitution, so
    it is as stable as it (no long power series)."""
    same_block = (ri // SUB) == (ci // SUB)
    eye = tl.where(ri == ci, 1.0, 0.0)
    m_diag = tl.where(same_block, m, 0.0)
    d_inv = eye
    for j in range(1, SUB):
        rows = (ri % SUB) == j
        update = tl.dot(tl.where(rows, m_diag, 0.0), d_inv, input_precision="tf32x3")
        d_inv = tl.where(rows, eye - update, d_inv)
    n = tl.dot(d_inv, m - m_diag, input_precision="tf32x3")
    n2 = tl.dot(n, n, input_precision="tf32x3")
    series = tl.dot(eye - n, eye + n2, input_precision="tf32x3")
    return tl.dot(series, d_inv, input_precision="tf32x3")


@triton.jit
def _chunk_rows(CHUNK_SEQ, CHUNK_START, QUERY_START_LOC, CHUNK: tl.constexpr):
    """This program's chunk: its token rows and which of them exist."""
    c = tl.program_id(0)
    seq = tl.load(CHUNK_SEQ + c)
    start = tl.load(CHUNK_START + c).to(tl.int64)
    length = tl.minimum(tl.load(QUERY_START_LOC + seq + 1).to(tl.int64) - start, CHUNK)
    rows = tl.arange(0, CHUNK)
    return rows, rows < length, start + rows


@triton.jit
def chunk_prepare_kernel(
    Q,
    K,
    A,
    B,
    A_LOG,
    DT_BIAS,
    CHUNK_SEQ,
    CHUNK_START,
    QUERY_START_LOC,
    G_BUF,
    BETA_BUF,
    QN_BUF,
    KN_BUF,
    P_BUF,
    M_BUF,
    scale,
    stride_q_tok,
    stride_q_head,
    stride_k_tok,
    stride_k_head,
    stride_a_tok,
    stride_b_tok,
    num_v_heads,
    GROUP: tl.constexpr,
    KEY_DIM: tl.constexpr,
    CHUNK: tl.constexpr,
    L2NORM: tl.constexpr,
):
    """Per chunk and value head: gates, cumulative decay, q/k inverse norms, P and M."""
    hv = tl.program_id(1)
    hk = hv // GROUP
    rows, rmask, tok = _chunk_rows(CHUNK_SEQ, CHUNK_START, QUERY_START_LOC, CHUNK)
    ks = tl.arange(0, KEY_DIM)
    head_rows = tok * num_v_heads + hv
    # -- keys and queries as stored, their inverse norms ----
    k_ptr = K + tok[:, None] * stride_k_tok + hk * stride_k_head + ks[None, :]
    k = tl.load(k_ptr, mask=rmask[:, None], other=0.0)
    q_ptr = Q + tok[:, None] * stride_q_tok + hk * stride_q_head + ks[None, :]
    q = tl.load(q_ptr, mask=rmask[:, None], other=0.0)
    ri = rows[:, None]
    ci = rows[None, :]
    # (||x_i||^2 = the diagonal of x x^T: products of stored values are exact in fp32)
    kk = tl.dot(k, tl.trans(k))
    k_norm = inverse_norms_from_gram(kk, ri, ci, L2NORM)
    q_norm = inverse_norms_from_gram(tl.dot(q, tl.trans(q)), ri, ci, L2NORM)
    tl.store(QN_BUF + head_rows, q_norm, mask=rmask)
    tl.store(KN_BUF + head_rows, k_norm, mask=rmask)
    # -- gates and the cumulative log decay G_i ----
    a = tl.load(A + tok * stride_a_tok + hv, mask=rmask, other=0.0)
    b = tl.load(B + tok * stride_b_tok + hv, mask=rmask, other=0.0)
    g, beta = gate_values(a, b, tl.load(A_LOG + hv), tl.load(DT_BIAS + hv).to(tl.float32))
    beta = tl.where(rmask, beta, 0.0)
    cum = tl.cumsum(tl.where(rmask, g, 0.0), axis=0)
    tl.store(G_BUF + head_rows, cum, mask=rmask)
    tl.store(BETA_BUF + head_rows, beta, mask=rmask)
    # -- P[i, j] = (q_i . k_j) exp(G_i - G_j) for j <= i, normalised and scaled ----
    causal = ci <= ri
    p = tl.dot(q, tl.trans(k)) * (q_norm * scale)[:, None] * k_norm[None, :]
    p = tl.where(causal, p * tl.exp(tl.where(causal, cum[:, None] - cum[None, :], 0.0)), 0.0)
    tile = head_rows[:, None] * CHUNK + rows[None, :]
    tl.store(P_BUF + tile, p, mask=rmask[:, None])
    # -- M[i, j] = beta_i exp(G_i - G_j) (k_i . k_j), j < i ----
    kk = kk * k_norm[:, None] * k_norm[None, :]
    lower = ci < ri
    decay = tl.exp(tl.where(lower, cum[:, None] - cum[None, :], 0.0))
    tl.store(M_BUF + tile, tl.where(lower, beta[:, None] * decay * kk, 0.0), mask=rmask[:, None])


@triton.jit
def chunk_solve_kernel(
    K,
    V,
    CHUNK_SEQ,
    CHUNK_START,
    QUERY_START_LOC,
    G_BUF,
    BETA_BUF,
    KN_BUF,
    M_BUF,
    W_BUF,
    U_BUF,
    stride_k_tok,
    stride_k_head,
    stride_v_tok,
    stride_v_head,
    num_v_heads,
    GROUP: tl.constexpr,
    KEY_DIM: tl.constexpr,
    VALUE_DIM: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Per chunk and value head: T = (I + M)^-1, then W = T (beta gamma K), U = T (beta V)."""
    hv = tl.program_id(1)
    hk = hv // GROUP
    rows, rmask, tok = _chunk_rows(CHUNK_SEQ, CHUNK_START, QUERY_START_LOC, CHUNK)
    head_rows = tok * num_v_heads + hv
    ri = rows[:, None]
    ci = rows[None, :]
    m = tl.load(M_BUF + head_rows[:, None] * CHUNK + ci, mask=rmask[:, None], other=0.0)
    tm = unit_lower_inverse(m, ri, ci, CHUNK)
    beta = tl.load(BETA_BUF + head_rows, mask=rmask, other=0.0)
    cum = tl.load(G_BUF + head_rows, mask=rmask, other=0.0)
    k_norm = tl.load(KN_BUF + head_rows, mask=rmask, other=0.0)
    # -- W = T (beta gamma K), per half of the key dim ----
    w_scale = (k_norm * beta * tl.exp(cum))[:, None]
    half = tl.arange(0, KEY_DIM // 2)
    w_ptr = W_BUF + head_rows[:, None] * KEY_DIM + half[None, :]
    k_half = K + tok[:, None] * stride_k_tok + hk * stride_k_head + half[None, :]
    k_lo = tl.load(k_half, mask=rmask[:, None], other=0.0).to(tl.float32)
    tl.store(w_ptr, tl.dot(tm, k_lo * w_scale), mask=rmask[:, None])
    k_hi = tl.load(k_half + KEY_DIM // 2, mask=rmask[:, None], other=0.0).to(tl.float32)
    tl.store(w_ptr + KEY_DIM // 2, tl.dot(tm, k_hi * w_scale), mask=rmask[:, None])
    # -- U = T (beta V) ----
    vs = tl.arange(0, VALUE_DIM)
    v_ptr = V + tok[:, None] * stride_v_tok + hv * stride_v_head + vs[None, :]
    v = tl.load(v_ptr, mask=rmask[:, None], other=0.0).to(tl.float32)
    u_ptr = U_BUF + head_rows[:, None] * VALUE_DIM + vs[None, :]
    tl.store(u_ptr, tl.dot(tm, v * beta[:, None]), mask=rmask[:, None])


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
