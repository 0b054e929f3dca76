"""Recurrent gated delta rule: decode (one token per request, the pool row updated in
place) and target verify (T drafts per request, every step's state written to ``STEPS``,
the pool left alone; trees continue each draft from its parent's state).

One program per (V_TILES blocks of BLOCK_V value rows, value head, request): it walks its
tiles of the state, ``S^T[v0:v0+BLOCK_V, :]`` (pool layout ``[slots + 1, HV, V, K]``,
fp32), each held in registers, so the state is read once and written once per launch; the
tile loop is software-pipelined (the next tiles' loads are in flight while one is
updated), which hides the pool slot's dependent load behind more than one tile. The gates
(g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)) and the q/k L2 norm are fused.
A request whose slot is <= 0 (padding) starts from zeros and writes no state.
"""

import triton
import triton.language as tl

from attngen.families.gdn.triton.kernels.common import gate_values, l2norm_rows


@triton.jit
def recurrent_kernel(
    Q,
    K,
    V,
    A,
    B,
    A_LOG,
    DT_BIAS,
    STATE,
    CACHE_INDICES,
    QUERY_START_LOC,
    OUT,
    STEPS,
    PARENTS,
    scale,
    stride_q_tok,
    stride_q_head,
    stride_k_tok,
    stride_k_head,
    stride_v_tok,
    stride_v_head,
    stride_a_tok,
    stride_b_tok,
    stride_s_slot,
    stride_s_head,
    stride_o_tok,
    stride_o_head,
    stride_st_b,
    stride_st_t,
    stride_st_head,
    stride_par_b,
    T: tl.constexpr,
    GROUP: tl.constexpr,
    KEY_DIM: tl.constexpr,
    VALUE_DIM: tl.constexpr,
    BLOCK_V: tl.constexpr,
    V_TILES: tl.constexpr,
    L2NORM: tl.constexpr,
    WRITE_POOL: tl.constexpr,
    WRITE_STEPS: tl.constexpr,
    TREE: tl.constexpr,
):
    # grid (value tiles, value heads, requests): neighbouring programs read neighbouring
    # slices of one request's state
    hv = tl.program_id(1)
    pid_b = tl.program_id(2)
    hk = hv // GROUP
    ks = tl.arange(0, KEY_DIM)
    slot = tl.load(CACHE_INDICES + pid_b).to(tl.int64)
    row0 = tl.load(QUERY_START_LOC + pid_b).to(tl.int64)
    a_log = tl.load(A_LOG + hv).to(tl.float32)
    dt_bias = tl.load(DT_BIAS + hv).to(tl.float32)
    for v_tile in range(0, V_TILES):
        vs = (tl.program_id(0) * V_TILES + v_tile) * BLOCK_V + tl.arange(0, BLOCK_V)
        # -- the request's state slice S^T [BLOCK_V, KEY_DIM] ----
        tile = vs[:, None] * KEY_DIM + ks[None, :]
        pool = STATE + slot * stride_s_slot + hv * stride_s_head + tile
        h0 = tl.load(pool, mask=slot > 0, other=0.0).to(tl.float32)
        h = h0
        for t in tl.static_range(T):
            row = row0 + t
            if TREE:
                # -- a draft continues from its parent's state (-1: the request's) ----
                parent = tl.load(PARENTS + pid_b * stride_par_b + t)
                tl.debug_barrier()  # the parent's state was stored by this program
                prev = STEPS + pid_b * stride_st_b + parent * stride_st_t + hv * stride_st_head
                h = tl.where(parent >= 0, tl.load(prev + tile, mask=parent >= 0, other=0.0), h0)
            # -- this token's q, k (key head hk), v, gates ----
            q = tl.load(Q + row * stride_q_tok + hk * stride_q_head + ks).to(tl.float32)
            k = tl.load(K + row * stride_k_tok + hk * stride_k_head + ks).to(tl.float32)
            v = tl.load(V + row * stride_v_tok + hv * stride_v_head + vs).to(tl.float32)
            q = l2norm_rows(q, L2NORM) * scale
            k = l2norm_rows(k, L2NORM)
            a = tl.load(A + row * stride_a_tok + hv)
            b = tl.load(B + row * stride_b_tok + hv)
            g, beta = gate_values(a, b, a_log, dt_bias)
            # -- S = exp(g) S; u = beta (v - S^T k); S += k u^T; o = S^T q, with o taken
            # from the old state (exp(g) S^T q + u (k . q)): both reductions read it
            # before the update, so no second pass over the new state ----
            decay = tl.exp(g)
            hk_dot = tl.sum(h * k[None, :], axis=1)
            hq = tl.sum(h * q[None, :], axis=1)
            u = beta * (v - decay * hk_dot)
            o = decay * hq + u * tl.sum(k * q, axis=0)
            h = h * decay + u[:, None] * k[None, :]
            tl.store(OUT + row * stride_o_tok + hv * stride_o_head + vs, o.to(OUT.dtype.element_ty))
            if WRITE_STEPS:
                step = STEPS + pid_b * stride_st_b + t * stride_st_t + hv * stride_st_head
                tl.store(step + tile, h.to(STEPS.dtype.element_ty))
        if WRITE_POOL:
            tl.store(pool, h.to(STATE.dtype.element_ty), mask=slot > 0)


@triton.jit
def accept_kernel(
    STATE,
    CONV_STATE,
    STEPS,
    CONV_STEPS,
    CACHE_INDICES,
    ACCEPTED,
    stride_s_slot,
    stride_cs_slot,
    stride_st_b,
    stride_st_t,
    stride_cst_b,
    stride_cst_t,
    state_numel,
    conv_numel,
    BLOCK: tl.constexpr,
):
    """Copy request b's accepted draft's state and conv window (``STEPS[b, ACCEPTED[b]]``)
    into its pool slot; padding (slot <= 0) and ACCEPTED[b] < 0 (none) copy nothing.
    Grid (B, cdiv(state_numel + conv_numel, BLOCK)); both steps buffers are contiguous
    per step."""
    pid_b = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(CACHE_INDICES + pid_b).to(tl.int64)
    step = tl.load(ACCEPTED + pid_b).to(tl.int64)
    ok = (slot > 0) & (step >= 0)
    in_state = ok & (offs < state_numel)
    src = STEPS + pid_b * stride_st_b + step * stride_st_t + offs
    tl.store(STATE + slot * stride_s_slot + offs, tl.load(src, mask=in_state), mask=in_state)
    coffs = offs - state_numel
    in_conv = ok & (coffs >= 0) & (coffs < conv_numel)
    csrc = CONV_STEPS + pid_b * stride_cst_b + step * stride_cst_t + coffs
    cdst = CONV_STATE + slot * stride_cs_slot + coffs
    tl.store(cdst, tl.load(csrc, mask=in_conv), mask=in_conv)
