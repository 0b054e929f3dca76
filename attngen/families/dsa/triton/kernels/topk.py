"""Top-k selection over indexer scores: the K highest-scoring visible keys of each row.

Tie rule (deterministic): a higher score first, then a lower position. Every score maps
to an order-preserving unsigned 32-bit key; the K-th largest key (the threshold) is found
by a bitwise search from the most significant bit, each step counting the row's keys at
or above a candidate (one pass over the row per step; the search stops as soon as exactly
K keys lie at or above the candidate). Then one compaction pass writes, in ascending
position order, every key above the threshold and as many threshold-equal keys as are
left, lowest positions first. A row with at most K visible keys selects all of them; the
rest of its K outputs are -1.

Outputs: logical positions ``[T, K]`` (key j of the row) and, with a page table, the
token slots of those positions (``page_table[req, j // PAGE_SIZE] * PAGE_SIZE + j %
PAGE_SIZE``; -1 padding kept).
"""

import triton
import triton.language as tl

SIGN = tl.constexpr(0x80000000)


@triton.jit
def _order_key(x):
    """fp32 -> uint32 whose unsigned order is the floats' order (-inf lowest)."""
    bits = x.to(tl.uint32, bitcast=True)
    neg = (bits & SIGN) != 0
    return tl.where(neg, bits ^ 0xFFFFFFFF, bits | SIGN)


@triton.jit
def _count_at_least(l_row, kv_len, cand, BLOCK: tl.constexpr):
    count = 0
    for start in range(0, kv_len, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < kv_len
        key = _order_key(tl.load(l_row + offs, mask=mask, other=0.0))
        count += tl.sum((mask & (key >= cand)).to(tl.int32), 0)
    return count


@triton.jit
def topk_kernel(
    LOGITS,
    ROW_LENS,
    ROW_REQ,
    PAGE_TABLE,
    OUT_POS,
    OUT_SLOT,
    stride_lt,
    stride_pt,
    stride_st,
    stride_ptb,
    TOPK: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Row t: the TOPK best of LOGITS[t, 0 .. ROW_LENS[t]-1] into OUT_POS[t] (int32) and,
    when OUT_SLOT is given, their slots through PAGE_TABLE row ROW_REQ[t] (t when None)."""
    off_t = tl.program_id(0)
    kv_len = tl.load(ROW_LENS + off_t)
    l_row = LOGITS + off_t.to(tl.int64) * stride_lt
    pos_row = OUT_POS + off_t.to(tl.int64) * stride_pt
    if OUT_SLOT is not None:
        slot_row = OUT_SLOT + off_t.to(tl.int64) * stride_st
        if ROW_REQ is None:
            off_b = off_t
        else:
            off_b = tl.load(ROW_REQ + off_t)
        page_row = PAGE_TABLE + off_b.to(tl.int64) * stride_ptb

    # -- threshold: the largest key with at least TOPK keys at or above it ----
    thresh = tl.zeros([], dtype=tl.uint32)  # rows of <= TOPK keys: all of them
    if kv_len > TOPK:
        bit = tl.full([], 0x80000000, tl.uint32)
        searching = 1
        for _ in range(32):
            if searching != 0:
                cand = thresh | bit
                count = _count_at_least(l_row, kv_len, cand, BLOCK)
                if count >= TOPK:
                    thresh = cand
                    if count == TOPK:  # exactly TOPK at or above: no tie to break
                        searching = 0
                bit = bit >> 1
    # keys above the threshold all go; threshold-equal ones fill what is left
    above = 0
    if kv_len > TOPK:
        above = _count_at_least(l_row, kv_len, thresh + 1, BLOCK)
        above = tl.where(thresh == 0xFFFFFFFF, 0, above)
    ties_left = TOPK - above

    # -- compaction in ascending position order ----
    written = 0
    for start in range(0, kv_len, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < kv_len
        key = _order_key(tl.load(l_row + offs, mask=mask, other=0.0))
        tie = mask & (key == thresh)
        tie_rank = tl.cumsum(tie.to(tl.int32), 0) - 1  # among this block's ties
        take = mask & ((key > thresh) | (tie & (tie_rank < ties_left)))
        take = take | (mask & (kv_len <= TOPK))
        ties_left -= tl.sum((tie & take).to(tl.int32), 0)
        dst = written + tl.cumsum(take.to(tl.int32), 0) - 1
        tl.store(pos_row + dst, offs, mask=take)
        if OUT_SLOT is not None:
            page = tl.load(page_row + offs // PAGE_SIZE, mask=take, other=0)
            tl.store(slot_row + dst, page * PAGE_SIZE + offs % PAGE_SIZE, mask=take)
        written += tl.sum(take.to(tl.int32), 0)

    # -- -1 padding after the selected keys ----
    for start in range(0, TOPK, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        pad = (offs >= written) & (offs < TOPK)
        tl.store(pos_row + offs, tl.full([BLOCK], -1, tl.int32), mask=pad)
        if OUT_SLOT is not None:
            tl.store(slot_row + offs, tl.full([BLOCK], -1, tl.int32), mask=pad)
