"""Chunked gated delta rule over ragged requests (prefill / extend), in four launches.

Within a chunk of C tokens (positions i, j; cumulative log decay G_i = g_1 + .. + g_i,
gamma_i = exp(G_i); k, q normalised, q scaled) the recurrence from the chunk's initial
state S0 (K x V) unrolls to

    u  = U - W S0                  pseudo-values [C, V] (what each token adds to the state)
    O  = (Q * gamma) S0 + P u      P_ij = (q_i . k_j) exp(G_i - G_j) for j <= i, else 0
    S  = gamma_C S0 + (K * exp(G_C - G))^T u

with the WY / UT transform T = (I + M)^-1, M_ij = beta_i exp(G_i - G_j) (k_i . k_j) for
j < i (unit lower triangular, so T is too): W = T (beta gamma K), U = T (beta V).

Only the state recurrence is sequential, so the work splits by what it depends on:

- chunk_prepare_kernel (grid: chunks x value heads, all parallel): gates, G, the q/k
  inverse norms (from their Gram diagonals), M (from the Gram matrix of the stored keys:
  exact products), T by
  :func:`unit_lower_inverse`;
- chunk_wu_kernel (grid: chunks x value heads x 3, all parallel): W, U and the keys
  transposed to fp32 KT = K^T for the state update, one each;
- chunk_state_kernel (grid: value blocks x requests x value heads): walks a request's
  chunks in order with its state slice S [K, BLOCK_V] in fp32 registers (from the pool
  row when the request has a prefix), storing each chunk's initial state to H and u over
  U (in place), two products per chunk on pipelined shared-memory operands (W, KT); the
  final state goes back to the pool row;
  (chunk_state_t_kernel, sm90: the same on the transposed state, kept in registers as both
  products' left operand, with W / U / KT arriving by TMA);
- chunk_output_kernel (grid: chunks x value heads x value blocks, all parallel):
  O = (Q gamma) S0 + P u from H and u, with P from the stored q, k.

W, U and u are fp32 and their products TF32 (fp32 operands; bf16 W, U, u or P broke the
output and state bounds of families/gdn/testing.py in the correlated-keys case, emulated
in float64 with the GPU's roundings); H, the per-chunk initial states, holds the
activation dtype (bf16: Q S0 on bf16 operands, within the bounds) or fp32, as the
launcher allocates it.
"""

import triton
import triton.language as tl

from attngen.families.gdn.triton.kernels.common import gate_values, inverse_norms_from_gram

SUB = tl.constexpr(16)  # diagonal blocks of the triangular inverse


@triton.jit
def unit_lower_inverse(m, ri, ci, CHUNK: tl.constexpr):
    """(I + M)^-1 of a strictly lower triangular [CHUNK, CHUNK] M (CHUNK a multiple of SUB,
    at most 4 * SUB).

    D = I + (M's diagonal SUB x SUB blocks) is inverted by forward substitution on all
    blocks at once ([NB, SUB, SUB] tensors, one row per step, fp32 FMAs, no products);
    with N = D^-1 (M - its diagonal blocks), strictly block-lower so N^4 = 0,
    (I + M)^-1 = (I - N)(I + N^2) D^-1: the terms of blocked forward substitution, as
    stable as it, in four TF32 products (tf32x3 spilled 3.4 KB on sm_90a; TF32 here kept
    the correlated-keys case at 0.26 of the output bound, emulated in float64)."""
    NB: tl.constexpr = CHUNK // SUB
    same_block = (ri // SUB) == (ci // SUB)
    eye = tl.where(ri == ci, 1.0, 0.0)
    # -- the diagonal blocks as [NB, SUB, SUB] ----
    bi = tl.arange(0, NB)[:, None, None, None]
    bj = tl.arange(0, NB)[None, None, :, None]
    m4 = tl.reshape(m, (NB, SUB, NB, SUB))
    low = tl.sum(tl.where(bi == bj, m4, 0.0), axis=2)
    r3 = tl.arange(0, SUB)[None, :, None]
    c3 = tl.arange(0, SUB)[None, None, :]
    eye3 = tl.where(r3 == c3, 1.0, 0.0) + tl.zeros((NB, SUB, SUB), tl.float32)
    d_inv = eye3
    for j in tl.static_range(1, SUB):
        # row j of every block: e_j - sum_c L[j, c] D^-1[c, :] (rows c < j are final)
        l_row = tl.sum(tl.where(r3 == j, low, 0.0), axis=1)
        update = tl.sum(l_row[:, :, None] * d_inv, axis=1)
        d_inv = tl.where(r3 == j, eye3 - update[:, None, :], d_inv)
    d_full = tl.reshape(tl.where(bi == bj, d_inv[:, :, None, :], 0.0), (CHUNK, CHUNK))
    n = tl.dot(d_full, tl.where(same_block, 0.0, m), input_precision="tf32")
    n2 = tl.dot(n, n, input_precision="tf32")
    series = tl.dot(eye - n, eye + n2, input_precision="tf32")
    return tl.dot(series, d_full, input_precision="tf32")


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
def _head_major(hv, tok, num_rows):
    """Index of token(s) ``tok`` of value head ``hv`` in the per-row vectors (G, beta and
    the inverse norms: [HV, rows], so a chunk's 64 values of one head are contiguous)."""
    return hv.to(tl.int64) * num_rows + tok


@triton.jit
def _load_rows(PTR, tok, stride_tok, col0, cols, rmask):
    """Rows ``tok`` [CHUNK], columns ``col0 + cols`` of a row-major tensor, as stored."""
    ptr = PTR + tok[:, None] * stride_tok + col0 + cols[None, :]
    return tl.load(ptr, mask=rmask[:, None], other=0.0)


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
    QS_BUF,
    KN_BUF,
    T_BUF,
    scale,
    stride_q_tok,
    stride_q_head,
    stride_k_tok,
    stride_k_head,
    stride_a_tok,
    stride_b_tok,
    num_v_heads,
    num_rows,
    GROUP: tl.constexpr,
    KEY_DIM: tl.constexpr,
    CHUNK: tl.constexpr,
    L2NORM: tl.constexpr,
):
    """Per chunk and value head: gates, G, q/k inverse norms, T = (I + M)^-1."""
    hv = tl.program_id(1)
    hk = hv // GROUP
    rows, rmask, tok = _chunk_rows(CHUNK_SEQ, CHUNK_START, QUERY_START_LOC, CHUNK)
    ks = tl.arange(0, KEY_DIM)
    head_rows = tok * num_v_heads + hv
    ri = rows[:, None]
    ci = rows[None, :]
    # -- inverse norms from the Gram diagonals (exact products, fp32 sums; the keys' Gram is
    # needed whole for M). q's as a product too: its rows summed elementwise in fp32 waited
    # on each of its loads in turn (a fifth of the kernel's stall samples on the H200) ----
    k = _load_rows(K + hk * stride_k_head, tok, stride_k_tok, 0, ks, rmask)
    kk = tl.dot(k, tl.trans(k))
    k_norm = inverse_norms_from_gram(kk, ri, ci, L2NORM)
    q = _load_rows(Q + hk * stride_q_head, tok, stride_q_tok, 0, ks, rmask)
    q_norm = inverse_norms_from_gram(tl.dot(q, tl.trans(q)), ri, ci, L2NORM)
    vec_rows = _head_major(hv, tok, num_rows)
    tl.store(QS_BUF + vec_rows, q_norm * scale, mask=rmask)
    tl.store(KN_BUF + vec_rows, k_norm, mask=rmask)
    # -- gates and the cumulative log decay G_i ----
    a = tl.load(A + tok * stride_a_tok + hv, mask=rmask, other=0.0)
    b = tl.load(B + tok * stride_b_tok + hv, mask=rmask, other=0.0)
    g, beta = gate_values(a, b, tl.load(A_LOG + hv), tl.load(DT_BIAS + hv).to(tl.float32))
    beta = tl.where(rmask, beta, 0.0)
    cum = tl.cumsum(tl.where(rmask, g, 0.0), axis=0)
    tl.store(G_BUF + vec_rows, cum, mask=rmask)
    tl.store(BETA_BUF + vec_rows, beta, mask=rmask)
    # -- M[i, j] = beta_i exp(G_i - G_j) (k_i . k_j) / (||k_i|| ||k_j||), j < i; T ----
    lower = ci < ri
    decay = tl.exp(tl.where(lower, cum[:, None] - cum[None, :], 0.0))
    m = tl.where(lower, (beta * k_norm)[:, None] * decay * kk * k_norm[None, :], 0.0)
    tm = unit_lower_inverse(m, ri, ci, CHUNK)
    tl.store(T_BUF + head_rows[:, None] * CHUNK + ci, tm, mask=rmask[:, None])


@triton.jit
def chunk_wu_kernel(
    K,
    V,
    CHUNK_SEQ,
    CHUNK_START,
    QUERY_START_LOC,
    G_BUF,
    BETA_BUF,
    KN_BUF,
    T_BUF,
    W_BUF,
    U_BUF,
    KT_BUF,
    stride_k_tok,
    stride_k_head,
    stride_v_tok,
    stride_v_head,
    num_v_heads,
    num_rows,
    GROUP: tl.constexpr,
    KEY_DIM: tl.constexpr,
    VALUE_DIM: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Per chunk, value head and product (program_id 2: 0 W, 1 U, 2 KT): W = T (beta
    gamma K / ||k||), U = T (beta V), and the stored keys as fp32 KT [KEY_DIM, CHUNK] = K^T
    (exact: no scale folded in, zero columns past the chunk's end), transposed so the
    sequential kernel reads them as a K-major product operand."""
    hv = tl.program_id(1)
    product = tl.program_id(2)
    rows, rmask, tok = _chunk_rows(CHUNK_SEQ, CHUNK_START, QUERY_START_LOC, CHUNK)
    head_rows = tok * num_v_heads + hv
    if product == 1:
        tm = _load_rows(T_BUF, head_rows, CHUNK, 0, rows, rmask)
        beta = tl.load(BETA_BUF + _head_major(hv, tok, num_rows), mask=rmask, other=0.0)
        vs = tl.arange(0, VALUE_DIM)
        v_base = V + hv * stride_v_head
        v = _load_rows(v_base, tok, stride_v_tok, 0, vs, rmask).to(tl.float32)
        u = tl.dot(tm, v * beta[:, None])
        tl.store(U_BUF + head_rows[:, None] * VALUE_DIM + vs[None, :], u, mask=rmask[:, None])
    else:
        ks = tl.arange(0, KEY_DIM)
        k_base = K + (hv // GROUP) * stride_k_head
        k = _load_rows(k_base, tok, stride_k_tok, 0, ks, rmask).to(tl.float32)
        if product == 0:
            tm = _load_rows(T_BUF, head_rows, CHUNK, 0, rows, rmask)
            vec_rows = _head_major(hv, tok, num_rows)
            beta = tl.load(BETA_BUF + vec_rows, mask=rmask, other=0.0)
            cum = tl.load(G_BUF + vec_rows, mask=rmask, other=0.0)
            k_norm = tl.load(KN_BUF + vec_rows, mask=rmask, other=0.0)
            w = tl.dot(tm, k * (k_norm * beta * tl.exp(cum))[:, None])
            tl.store(W_BUF + head_rows[:, None] * KEY_DIM + ks[None, :], w, mask=rmask[:, None])
        else:
            kt = tl.trans(k)
            chunk_head = tl.program_id(0) * num_v_heads + hv
            kt_base = KT_BUF + chunk_head.to(tl.int64) * (KEY_DIM * CHUNK)
            tl.store(kt_base + ks[:, None] * CHUNK + rows[None, :], kt)


@triton.jit
def chunk_state_kernel(
    W_BUF,
    U_BUF,
    KT_BUF,
    G_BUF,
    KN_BUF,
    H_BUF,
    STATE,
    CACHE_INDICES,
    HAS_INITIAL,
    QUERY_START_LOC,
    SEQ_FIRST_CHUNK,
    stride_s_slot,
    stride_s_head,
    num_v_heads,
    num_rows,
    KEY_DIM: tl.constexpr,
    VALUE_DIM: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Per value block, request and value head: the state through the request's chunks.
    Per chunk: H[chunk] = S; u = U - W S (over U); S = gamma_C S + K^T (u exp(G_C - G) /
    ||k||), K^T read as KT (the scale on u, so the product's keys stay exact). Every load of a
    step but S is independent of the state, so the loop's pipelining keeps them in flight
    (W and KT straight into the products' shared-memory operands)."""
    vs = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    pid_b = tl.program_id(1)
    hv = tl.program_id(2)
    ks = tl.arange(0, KEY_DIM)
    rows = tl.arange(0, CHUNK)
    start = tl.load(QUERY_START_LOC + pid_b).to(tl.int64)
    end = tl.load(QUERY_START_LOC + pid_b + 1).to(tl.int64)
    chunk = tl.load(SEQ_FIRST_CHUNK + pid_b).to(tl.int64)
    slot = tl.load(CACHE_INDICES + pid_b).to(tl.int64)
    init = (tl.load(HAS_INITIAL + pid_b) != 0) & (slot > 0)
    # -- S [KEY_DIM, BLOCK_V] from the pool row (stored transposed, [V, K]) ----
    pool = STATE + slot * stride_s_slot + hv * stride_s_head + vs[None, :] * KEY_DIM + ks[:, None]
    s = tl.load(pool, mask=init, other=0.0).to(tl.float32)
    h_tile = ks[:, None] * VALUE_DIM + vs[None, :]
    kt_tile = ks[:, None] * CHUNK + rows[None, :]
    for c0 in range(start, end, CHUNK):
        length = tl.minimum(end - c0, CHUNK)
        rmask = rows < length
        head_rows = (c0 + rows) * num_v_heads + hv
        head_chunk = chunk * num_v_heads + hv
        # G at the chunk's last row: issued first, so its latency hides behind W S
        cum_last = tl.load(G_BUF + _head_major(hv, c0 + length - 1, num_rows))
        tl.store(H_BUF + head_chunk * (KEY_DIM * VALUE_DIM) + h_tile, s.to(H_BUF.dtype.element_ty))
        # -- u = U - W S, stored over U ----
        u_ptr = U_BUF + head_rows[:, None] * VALUE_DIM + vs[None, :]
        u = tl.load(u_ptr, mask=rmask[:, None], other=0.0)
        w = _load_rows(W_BUF, head_rows, KEY_DIM, 0, ks, rmask)
        u -= tl.dot(w, s)
        tl.store(u_ptr, u, mask=rmask[:, None])
        # -- S = gamma_C S + K^T (u exp(G_C - G) / ||k||): K exact, as the stored keys ----
        vec_rows = _head_major(hv, c0 + rows, num_rows)
        cum = tl.load(G_BUF + vec_rows, mask=rmask, other=0.0)
        k_row = tl.load(KN_BUF + vec_rows, mask=rmask, other=0.0)
        u_in = u * (k_row * tl.exp(cum_last - cum))[:, None]
        kt = tl.load(KT_BUF + head_chunk * (KEY_DIM * CHUNK) + kt_tile)
        s = s * tl.exp(cum_last) + tl.dot(kt, u_in)
        chunk += 1
    tl.store(pool, s.to(STATE.dtype.element_ty), mask=slot > 0)


@triton.jit
def _tf32(x):
    """x rounded to the nearest TF32 value, ties away from zero (the rounding of PTX's
    cvt.rna.tf32.f32, in integer operations the interpreter runs too): a register operand
    would be truncated by the tensor cores."""
    bits = x.to(tl.int32, bitcast=True)
    return ((bits + 0x1000) & -8192).to(tl.float32, bitcast=True)


@triton.jit
def _split16(x, dtype: tl.constexpr):
    """x (fp32) as hi + lo in ``dtype`` (16-bit): hi = x rounded, lo = the rest rounded;
    about 16 significant bits together (22 in fp16), finer than TF32's 11."""
    hi = x.to(dtype)
    return hi, (x - hi.to(tl.float32)).to(dtype)


@triton.jit
def chunk_state_t_kernel(
    W_DESC,
    U_DESC,
    K_DESC,
    U_BUF,
    G_BUF,
    KN_BUF,
    H_BUF,
    STATE,
    CACHE_INDICES,
    HAS_INITIAL,
    QUERY_START_LOC,
    SEQ_FIRST_CHUNK,
    stride_s_slot,
    stride_s_head,
    num_v_heads,
    num_rows,
    GROUP: tl.constexpr,
    KEY_DIM: tl.constexpr,
    VALUE_DIM: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """:func:`chunk_state_kernel` on the transposed state (sm90): S^T [BLOCK_V, KEY_DIM] in
    two key halves stays in registers as both products' left operand, u^T = U^T - S^T W^T
    (TF32, S^T rounded to it) and S^T = gamma_C S^T + (u^T exp(G_C - G) / ||k||) K, so
    neither product sends its state-dependent operand through shared memory. The second
    product reads the stored keys as they are (16-bit, exact; no fp32 K^T): u's scaled
    rows, each divided by a power of two that brings its largest entry to [1, 2) (exact),
    enter as hi + lo 16-bit parts, two 16-bit products. W, U and K arrive by TMA
    (descriptors over W [T, HV, K], U [T, HV, V] and k [T, H, K]). Tokens past the
    request's end are dropped by a select, not a product, so another request's rows never
    reach this one's state."""
    HALF: tl.constexpr = KEY_DIM // 2
    v0 = tl.program_id(0) * BLOCK_V
    vs = v0 + tl.arange(0, BLOCK_V)
    pid_b = tl.program_id(1)
    hv = tl.program_id(2)
    ks = tl.arange(0, HALF)
    rows = tl.arange(0, CHUNK)
    start = tl.load(QUERY_START_LOC + pid_b)
    end = tl.load(QUERY_START_LOC + pid_b + 1)
    chunk = tl.load(SEQ_FIRST_CHUNK + pid_b).to(tl.int64)
    slot = tl.load(CACHE_INDICES + pid_b).to(tl.int64)
    init = (tl.load(HAS_INITIAL + pid_b) != 0) & (slot > 0)
    # -- S^T [BLOCK_V, KEY_DIM] from the pool row ([V, K]: S^T as stored), by key halves ----
    pool = STATE + slot * stride_s_slot + hv * stride_s_head + vs[:, None] * KEY_DIM + ks[None, :]
    s_lo = tl.load(pool, mask=init, other=0.0).to(tl.float32)
    s_hi = tl.load(pool + HALF, mask=init, other=0.0).to(tl.float32)
    h_tile = ks[None, :] * VALUE_DIM + vs[:, None]  # H [K, V] per chunk, written transposed
    kh = hv // GROUP
    for c0 in range(start, end, CHUNK):
        length = tl.minimum(end - c0, CHUNK)
        rmask = rows < length
        head_rows = (c0 + rows).to(tl.int64) * num_v_heads + hv
        head_chunk = chunk * num_v_heads + hv
        cum_last = tl.load(G_BUF + _head_major(hv, c0 + length - 1, num_rows))
        h_ptr = H_BUF + head_chunk * (KEY_DIM * VALUE_DIM) + h_tile
        tl.store(h_ptr, s_lo.to(H_BUF.dtype.element_ty))
        tl.store(h_ptr + HALF * VALUE_DIM, s_hi.to(H_BUF.dtype.element_ty))
        # -- u^T = U^T - S^T W^T, stored over U ----
        u = tl.trans(U_DESC.load([c0, hv, v0]).reshape(CHUNK, BLOCK_V))
        w_lo = W_DESC.load([c0, hv, 0]).reshape(CHUNK, HALF)
        w_hi = W_DESC.load([c0, hv, HALF]).reshape(CHUNK, HALF)
        u -= tl.dot(_tf32(s_lo), tl.trans(w_lo))
        u -= tl.dot(_tf32(s_hi), tl.trans(w_hi))
        tl.store(U_BUF + head_rows[None, :] * VALUE_DIM + vs[:, None], u, mask=rmask[None, :])
        # -- S^T = gamma_C S^T + (u^T exp(G_C - G) / ||k||) K, K exact (the stored keys) ----
        vec_rows = _head_major(hv, c0 + rows, num_rows)
        cum = tl.load(G_BUF + vec_rows, mask=rmask, other=0.0)
        k_row = tl.load(KN_BUF + vec_rows, mask=rmask, other=0.0)
        u_in = tl.where(rmask[None, :], u * (k_row * tl.exp(cum_last - cum))[None, :], 0.0)
        k_lo = K_DESC.load([c0, kh, 0]).reshape(CHUNK, HALF)
        k_hi = K_DESC.load([c0, kh, HALF]).reshape(CHUNK, HALF)
        decay = tl.exp(cum_last)
        if K_DESC.dtype == tl.bfloat16:  # bf16 spans fp32's exponents: hi + lo unscaled
            u_hi, u_lo = _split16(u_in, K_DESC.dtype)
        else:
            # a power of two a row: its largest |entry| to [1, 2), so fp16 parts cannot overflow
            exponent = tl.max(tl.abs(u_in), axis=1).to(tl.int32, bitcast=True) & 0x7F800000
            exponent = tl.minimum(tl.maximum(exponent, 0x00800000), 0x7E800000)  # 2^-126..2^126
            row_scale = exponent.to(tl.float32, bitcast=True)
            inv_scale = (0x7F000000 - exponent).to(tl.float32, bitcast=True)  # 1 / row_scale
            u_hi, u_lo = _split16(u_in * inv_scale[:, None], K_DESC.dtype)
        d_lo = tl.dot(u_hi, k_lo) + tl.dot(u_lo, k_lo)
        d_hi = tl.dot(u_hi, k_hi) + tl.dot(u_lo, k_hi)
        if K_DESC.dtype != tl.bfloat16:
            d_lo = d_lo * row_scale[:, None]
            d_hi = d_hi * row_scale[:, None]
        s_lo = s_lo * decay + d_lo
        s_hi = s_hi * decay + d_hi
        chunk += 1
    tl.store(pool, s_lo.to(STATE.dtype.element_ty), mask=slot > 0)
    tl.store(pool + HALF, s_hi.to(STATE.dtype.element_ty), mask=slot > 0)


@triton.jit
def chunk_output_kernel(
    Q,
    K,
    U_BUF,
    G_BUF,
    QS_BUF,
    KN_BUF,
    H_BUF,
    CHUNK_SEQ,
    CHUNK_START,
    QUERY_START_LOC,
    OUT,
    stride_q_tok,
    stride_q_head,
    stride_k_tok,
    stride_k_head,
    stride_o_tok,
    stride_o_head,
    num_v_heads,
    num_rows,
    GROUP: tl.constexpr,
    KEY_DIM: tl.constexpr,
    VALUE_DIM: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Per chunk, value head and value block: O = (Q gamma / ||q||) S0 + P u."""
    DT: tl.constexpr = H_BUF.dtype.element_ty  # Q S0 on operands of H's dtype
    hv = tl.program_id(1)
    hk = hv // GROUP
    vs = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    rows, rmask, tok = _chunk_rows(CHUNK_SEQ, CHUNK_START, QUERY_START_LOC, CHUNK)
    head_rows = tok * num_v_heads + hv
    ks = tl.arange(0, KEY_DIM)
    vec_rows = _head_major(hv, tok, num_rows)
    cum = tl.load(G_BUF + vec_rows, mask=rmask, other=0.0)
    q_row = tl.load(QS_BUF + vec_rows, mask=rmask, other=0.0)
    k_row = tl.load(KN_BUF + vec_rows, mask=rmask, other=0.0)
    q = _load_rows(Q + hk * stride_q_head, tok, stride_q_tok, 0, ks, rmask)
    k = _load_rows(K + hk * stride_k_head, tok, stride_k_tok, 0, ks, rmask)
    # -- P[i, j] = (q_i . k_j) exp(G_i - G_j) / (||q_i|| ||k_j||) * scale, j <= i ----
    ri = rows[:, None]
    ci = rows[None, :]
    causal = (ci <= ri) & rmask[:, None]
    p = tl.dot(q, tl.trans(k)) * q_row[:, None] * k_row[None, :]
    p = tl.where(causal, p * tl.exp(tl.where(causal, cum[:, None] - cum[None, :], 0.0)), 0.0)
    c = tl.program_id(0)
    h_ptr = H_BUF + (c * num_v_heads + hv).to(tl.int64) * (KEY_DIM * VALUE_DIM)
    s0 = tl.load(h_ptr + ks[:, None] * VALUE_DIM + vs[None, :])
    u_ptr = U_BUF + head_rows[:, None] * VALUE_DIM + vs[None, :]
    u = tl.load(u_ptr, mask=rmask[:, None], other=0.0)
    o = tl.dot(q.to(DT), s0) * (q_row * tl.exp(cum))[:, None] + tl.dot(p, u)
    o_ptr = OUT + tok[:, None] * stride_o_tok + hv * stride_o_head + vs[None, :]
    tl.store(o_ptr, o.to(OUT.dtype.element_ty), mask=rmask[:, None])
