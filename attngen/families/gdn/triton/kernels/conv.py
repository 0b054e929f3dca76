"""The short causal conv (kernel width 4) over the q|k|v channels, with SiLU, and its
per-request conv state ``[slots + 1, conv_dim, 3]`` (the last three inputs, oldest first).

conv_update_kernel: T tokens per request from the request's conv state (decode: T = 1 and
the pool row is updated in place; verify: the T drafts' windows go to ``STEPS`` and the
pool is left alone; trees read each draft's window from its parent's). A request whose
slot is <= 0 (padding) reads zeros and writes no state.

conv_prefill_kernel: ragged new tokens of each request, parallel over token blocks; the
first three inputs come from the conv state when the request has one, and the program of
the first token block (the only one that reads the old state) writes the new one.
"""

import triton
import triton.language as tl

WIDTH = tl.constexpr(4)


@triton.jit
def _silu(acc):
    return acc / (1.0 + tl.exp(-acc))


@triton.jit
def _weights(WEIGHT, BIAS, cs, cmask, HAS_BIAS: tl.constexpr):
    w0 = tl.load(WEIGHT + cs * WIDTH + 0, mask=cmask, other=0.0).to(tl.float32)
    w1 = tl.load(WEIGHT + cs * WIDTH + 1, mask=cmask, other=0.0).to(tl.float32)
    w2 = tl.load(WEIGHT + cs * WIDTH + 2, mask=cmask, other=0.0).to(tl.float32)
    w3 = tl.load(WEIGHT + cs * WIDTH + 3, mask=cmask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(BIAS + cs, mask=cmask, other=0.0).to(tl.float32)
    else:
        bias = tl.zeros_like(w0)
    return w0, w1, w2, w3, bias


@triton.jit
def conv_update_kernel(
    X,
    WEIGHT,
    BIAS,
    CONV_STATE,
    CACHE_INDICES,
    QUERY_START_LOC,
    Y,
    STEPS,
    PARENTS,
    stride_x_tok,
    stride_cs_slot,
    stride_cs_c,
    stride_y_tok,
    stride_st_b,
    stride_st_t,
    stride_st_c,
    stride_par_b,
    conv_dim,
    T: tl.constexpr,
    BLOCK_C: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    WRITE_POOL: tl.constexpr,
    WRITE_STEPS: tl.constexpr,
    TREE: tl.constexpr,
):
    pid_b = tl.program_id(0)
    cs = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cs < conv_dim
    w0, w1, w2, w3, bias = _weights(WEIGHT, BIAS, cs, cmask, HAS_BIAS)
    slot = tl.load(CACHE_INDICES + pid_b).to(tl.int64)
    row0 = tl.load(QUERY_START_LOC + pid_b).to(tl.int64)
    smask = cmask & (slot > 0)
    # -- the request's window: the last three inputs ----
    pool = CONV_STATE + slot * stride_cs_slot + cs * stride_cs_c
    p0 = tl.load(pool + 0, mask=smask, other=0.0)
    p1 = tl.load(pool + 1, mask=smask, other=0.0)
    p2 = tl.load(pool + 2, mask=smask, other=0.0)
    s0, s1, s2 = p0, p1, p2
    for t in tl.static_range(T):
        if TREE:
            # -- a draft continues from its parent's window (-1: the request's) ----
            parent = tl.load(PARENTS + pid_b * stride_par_b + t)
            tl.debug_barrier()  # the parent's window was stored by this program
            prev = STEPS + pid_b * stride_st_b + parent * stride_st_t + cs * stride_st_c
            from_step = cmask & (parent >= 0)
            s0 = tl.where(parent >= 0, tl.load(prev + 0, mask=from_step, other=0.0), p0)
            s1 = tl.where(parent >= 0, tl.load(prev + 1, mask=from_step, other=0.0), p1)
            s2 = tl.where(parent >= 0, tl.load(prev + 2, mask=from_step, other=0.0), p2)
        x = tl.load(X + (row0 + t) * stride_x_tok + cs, mask=cmask, other=0.0)
        acc = bias + w0 * s0.to(tl.float32) + w1 * s1.to(tl.float32)
        acc += w2 * s2.to(tl.float32) + w3 * x.to(tl.float32)
        tl.store(Y + (row0 + t) * stride_y_tok + cs, _silu(acc).to(Y.dtype.element_ty), mask=cmask)
        s0, s1, s2 = s1, s2, x.to(CONV_STATE.dtype.element_ty)
        if WRITE_STEPS:
            step = STEPS + pid_b * stride_st_b + t * stride_st_t + cs * stride_st_c
            tl.store(step + 0, s0, mask=cmask)
            tl.store(step + 1, s1, mask=cmask)
            tl.store(step + 2, s2, mask=cmask)
    if WRITE_POOL:
        tl.store(pool + 0, s0, mask=smask)
        tl.store(pool + 1, s1, mask=smask)
        tl.store(pool + 2, s2, mask=smask)


@triton.jit
def _input_or_state(X, pool, start, pos, tmask, cs, cmask, init, stride_x_tok, stride_cs_c):
    """Input at positions ``pos`` [BLOCK_T] of the request (pos < 0: the conv state's
    entry 3 + pos when the request has one, else 0), as fp32 [BLOCK_T, BLOCK_C]."""
    rows = tmask[:, None] & cmask[None, :]
    xv = tl.load(
        X + (start + pos)[:, None] * stride_x_tok + cs[None, :],
        mask=rows & (pos >= 0)[:, None],
        other=0.0,
    ).to(tl.float32)
    sv = tl.load(
        pool + cs[None, :] * stride_cs_c + (3 + pos)[:, None],
        mask=rows & (pos < 0)[:, None] & init,
        other=0.0,
    ).to(tl.float32)
    return xv + sv


@triton.jit
def conv_prefill_kernel(
    X,
    WEIGHT,
    BIAS,
    CONV_STATE,
    CACHE_INDICES,
    HAS_INITIAL,
    QUERY_START_LOC,
    Y,
    stride_x_tok,
    stride_cs_slot,
    stride_cs_c,
    stride_y_tok,
    conv_dim,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    pid_b = tl.program_id(0)
    cs = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    pid_t = tl.program_id(2)
    cmask = cs < conv_dim
    start = tl.load(QUERY_START_LOC + pid_b).to(tl.int64)
    length = tl.load(QUERY_START_LOC + pid_b + 1).to(tl.int64) - start
    slot = tl.load(CACHE_INDICES + pid_b).to(tl.int64)
    init = (tl.load(HAS_INITIAL + pid_b) != 0) & (slot > 0)
    pool = CONV_STATE + slot * stride_cs_slot
    w0, w1, w2, w3, bias = _weights(WEIGHT, BIAS, cs, cmask, HAS_BIAS)
    ts = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = ts < length
    # -- y_t = silu(sum_j w_j x_{t-3+j} + bias) ----
    acc = bias[None, :] + w0[None, :] * _input_or_state(
        X, pool, start, ts - 3, tmask, cs, cmask, init, stride_x_tok, stride_cs_c
    )
    acc += w1[None, :] * _input_or_state(
        X, pool, start, ts - 2, tmask, cs, cmask, init, stride_x_tok, stride_cs_c
    )
    acc += w2[None, :] * _input_or_state(
        X, pool, start, ts - 1, tmask, cs, cmask, init, stride_x_tok, stride_cs_c
    )
    acc += w3[None, :] * _input_or_state(
        X, pool, start, ts, tmask, cs, cmask, init, stride_x_tok, stride_cs_c
    )
    out = Y + (start + ts)[:, None] * stride_y_tok + cs[None, :]
    tl.store(out, _silu(acc).to(Y.dtype.element_ty), mask=tmask[:, None] & cmask[None, :])
    # -- the new conv state: the last three inputs (first token block only) ----
    if pid_t == 0:
        last = length - 3 + tl.arange(0, 4)
        lmask = tl.arange(0, 4) < 3
        window = _input_or_state(
            X, pool, start, last, lmask, cs, cmask, init, stride_x_tok, stride_cs_c
        )
        tl.debug_barrier()  # every read of the old state is done
        dst = pool + cs[None, :] * stride_cs_c + tl.arange(0, 4)[:, None]
        wmask = lmask[:, None] & cmask[None, :] & (slot > 0)
        tl.store(dst, window.to(CONV_STATE.dtype.element_ty), mask=wmask)
