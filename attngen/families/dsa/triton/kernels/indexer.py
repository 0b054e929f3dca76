"""DSA's lightning indexer: one score per (query token, visible key) from fp8 keys.

    logits[t, s] = k_scale[s] * sum_h w[t, h] * relu(q[t, h] . k[s])

q ``[T, H, D]`` and the keys are fp8 e4m3; ``w [T, H]`` fp32 holds the head weights with
q's dequant scale (and any softmax scale) already folded in, as DeepSeek-V3.2's indexer
does; each key carries one fp32 scale (its 128 values are one quantization block).

One program scores one query row against BLOCK_S of its visible keys in BLOCK_N-key tiles:
the H index heads are the M dimension of the fp8 tensor-core product, so a key tile is
read once for all heads. Keys come from the paged index-key pool (decode, extend, verify:
``[pages, PAGE_SIZE * (D + 4)]`` bytes, PAGE_SIZE keys of D fp8 values, then their
PAGE_SIZE fp32 scales) or from a contiguous ragged key tensor (prefill).
"""

import triton
import triton.language as tl


@triton.jit
def indexer_logits_kernel(
    Q,
    W,
    K8,
    KF,
    PAGE_TABLE,
    ROW_REQ,
    ROW_START,
    ROW_LENS,
    LOGITS,
    stride_qt,
    stride_qh,
    stride_wt,
    stride_kp,
    stride_kfp,
    stride_ptb,
    stride_lt,
    HEADS: tl.constexpr,
    DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    PAGED: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """Row t scores its keys 0 .. ROW_LENS[t]-1 in the slice [pid1 * BLOCK_S, +BLOCK_S).

    PAGED: key j of the row is token j of request ROW_REQ[t] (t when None) through
    PAGE_TABLE; K8 / KF are fp8 / fp32 views of the index pool (page rows stride_kp bytes /
    stride_kfp words apart). Else key j is row ROW_START[t] + j of the ragged K8 [S, DIM]
    (stride_kp apart) with scales KF [S]. LOGITS[t, j] (fp32) for visible j only.
    """
    off_t = tl.program_id(0)
    kv_len = tl.load(ROW_LENS + off_t)
    lo = tl.program_id(1) * BLOCK_S
    if lo < kv_len:
        hi = tl.minimum(lo + BLOCK_S, kv_len)
        # -- the row's index heads and their weights ----
        offs_h = tl.arange(0, HEADS)
        offs_d = tl.arange(0, DIM)
        q_ptrs = Q + off_t.to(tl.int64) * stride_qt + offs_h[:, None] * stride_qh
        q = tl.load(q_ptrs + offs_d[None, :])
        w = tl.load(W + off_t.to(tl.int64) * stride_wt + offs_h)
        if PAGED:
            if ROW_REQ is None:
                off_b = off_t
            else:
                off_b = tl.load(ROW_REQ + off_t)
            page_row = PAGE_TABLE + off_b.to(tl.int64) * stride_ptb
        else:
            row_start = tl.load(ROW_START + off_t).to(tl.int64)
        l_row = LOGITS + off_t.to(tl.int64) * stride_lt
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            mask_n = offs_n < hi
            # -- the tile's fp8 keys and scales ----
            if PAGED:
                # BLOCK_N divides PAGE_SIZE (the launcher checks): one page per tile
                page = tl.load(page_row + start_n // PAGE_SIZE).to(tl.int64)
                j = offs_n % PAGE_SIZE
                k_ptrs = K8 + page * stride_kp + j[:, None] * DIM + offs_d[None, :]
                k_scale = tl.load(KF + page * stride_kfp + PAGE_SIZE * DIM // 4 + j)
            else:
                rows = row_start + offs_n
                k_ptrs = K8 + rows[:, None] * stride_kp + offs_d[None, :]
                k_scale = tl.load(KF + rows, mask=mask_n, other=0.0)
            k = tl.load(k_ptrs, mask=mask_n[:, None], other=0.0)
            # -- scores: relu(q . k) per head, weighted sum over heads ----
            s = tl.dot(q, tl.trans(k))
            s = tl.maximum(s, 0.0) * w[:, None]
            logits = tl.sum(s, 0) * k_scale
            tl.store(l_row + offs_n, logits, mask=mask_n)
