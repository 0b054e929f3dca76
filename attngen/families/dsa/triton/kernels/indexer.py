"""DSA's lightning indexer: one score per (query token, visible key).

    logits[t, s] = k_scale[s] * sum_h w[t, h] * relu(q[t, h] . k[s])

With fp8 keys (SCALED, DeepSeek-V3.2's indexer): q ``[T, H, D]`` and the keys are e4m3; ``w
[T, H]`` fp32 holds the head weights with q's dequant scale (and any softmax scale) already
folded in; each key carries one fp32 scale (its D values are one quantization block).
Otherwise q and the keys are bf16, fp16 or fp32 as the model computes them, k_scale is 1,
and fp32 products are exact fp32 (IEEE: no TF32 rounding of the operands).

One program scores one query row against BLOCK_S of its visible keys in BLOCK_N-key tiles:
the H index heads are the M dimension of the tensor-core product, so a key tile is read
once for all heads. Keys come from the paged index-key pool (decode, extend, verify:
``[pages, PAGE_SIZE * D]`` keys of the index dtype, then with fp8 keys PAGE_SIZE fp32
scales) or from a contiguous ragged key tensor (prefill).
"""

import triton
import triton.language as tl


@triton.jit
def indexer_logits_kernel(
    Q,
    W,
    K,
    KS,
    PAGE_TABLE,
    ROW_REQ,
    ROW_START,
    ROW_LENS,
    LOGITS,
    stride_qt,
    stride_qh,
    stride_wt,
    stride_kp,
    stride_ksp,
    stride_ptb,
    stride_lt,
    HEADS: tl.constexpr,
    DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    PAGED: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr,
    SCALED: tl.constexpr,
    IEEE: tl.constexpr,
):
    """Row t scores its keys 0 .. ROW_LENS[t]-1 in the slice [pid1 * BLOCK_S, +BLOCK_S).

    PAGED: key j of the row is token j of request ROW_REQ[t] (t when None) through
    PAGE_TABLE; K / KS are views of the index pool in the key dtype / fp32 (page rows
    stride_kp / stride_ksp elements apart; KS only when SCALED). Else key j is row
    ROW_START[t] + j of the ragged K [S, DIM] (stride_kp apart) with scales KS [S] when
    SCALED. LOGITS[t, j] (fp32) for visible j only.
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
            # -- the tile's keys (and, fp8, their scales) ----
            if PAGED:
                # BLOCK_N divides PAGE_SIZE (the launcher checks): one page per tile
                page = tl.load(page_row + start_n // PAGE_SIZE).to(tl.int64)
                j = offs_n % PAGE_SIZE
                k_ptrs = K + page * stride_kp + j[:, None] * DIM + offs_d[None, :]
                if SCALED:  # the page's scales follow its PAGE_SIZE * DIM e4m3 codes
                    k_scale = tl.load(KS + page * stride_ksp + PAGE_SIZE * DIM // 4 + j)
            else:
                rows = row_start + offs_n
                k_ptrs = K + rows[:, None] * stride_kp + offs_d[None, :]
                if SCALED:
                    k_scale = tl.load(KS + rows, mask=mask_n, other=0.0)
            k = tl.load(k_ptrs, mask=mask_n[:, None], other=0.0)
            # -- scores: relu(q . k) per head, weighted sum over heads ----
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = tl.maximum(s, 0.0) * w[:, None]
            logits = tl.sum(s, 0)
            if SCALED:
                logits = logits * k_scale
            tl.store(l_row + offs_n, logits, mask=mask_n)
