"""Absorbed MLA attention over the paged latent cache: every query head of a row attends
one shared KV head whose key is the 576-wide latent row (512 latent + 64 rope) and whose
value is its first 512 columns.

One program holds BLOCK_H query heads of one query row (a decode request, or one new token
of an extend / verify): the heads are the M dimension of both tensor-core products, so a
latent tile read once serves BLOCK_H heads. Stage 1 attends one split of the row's visible
keys; with one split it writes the final output and LSE itself, else a partial that stage
2 (``absorbed_combine_kernel``) merges. With LORA_PARTS > 1, LORA_PARTS programs share one
(row, head block, split): each computes the whole 576-wide score (its own latent columns
serve both products, the others only the score) and accumulates its own LORA / LORA_PARTS
output columns, so the accumulator is LORA_PARTS times smaller.
"""

import triton
import triton.language as tl

from attngen.families.mha.triton.kernels.fp4 import nvfp4_tile

LN2 = tl.constexpr(0.6931471805599453)  # ln(2)
LOG2E = tl.constexpr(1.4426950408889634)  # 1/ln(2)


@triton.jit
def _latent_rows(page_row, start_n, kv_end, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Token-slot offsets (in rows of the cache) of keys start_n .. start_n+BLOCK_N-1.

    A block inside one page needs one page-table read (PAGE_SIZE a multiple of BLOCK_N);
    otherwise one read per key. Keys at or past kv_end point at page 0, a real page (the
    loads are masked anyway)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    if PAGE_SIZE % BLOCK_N == 0:
        page = tl.load(page_row + start_n // PAGE_SIZE).to(tl.int64)
        return page * PAGE_SIZE + (offs_n % PAGE_SIZE)
    page = tl.load(page_row + offs_n // PAGE_SIZE, mask=offs_n < kv_end, other=0).to(tl.int64)
    return page * PAGE_SIZE + (offs_n % PAGE_SIZE)


@triton.jit
def _latent_cols(
    row_ptrs,
    rows,
    KV_BSCALE,
    stride_ks,
    mask_n,
    c0,
    WIDTH: tl.constexpr,
    BLOCK_N: tl.constexpr,
    KV_FP4: tl.constexpr,
    SECOND: tl.constexpr = False,
):
    """Columns c0 .. c0+WIDTH-1 of BLOCK_N latent rows (row_ptrs: each row's first
    element): the cache's values, or NVFP4 rows (e2m1 code pairs, e4m3 block scales per 16
    in KV_BSCALE rows stride_ks apart) decoded without their global scale. SECOND: a second
    load of the same elements, marked (evict_last) so it is not merged with the first."""
    # one return (Triton checks every return's type, the untaken constexpr branch too)
    if KV_FP4:
        offs2 = c0 // 2 + tl.arange(0, WIDTH // 2)
        offs16 = c0 // 16 + tl.arange(0, WIDTH // 16)
        tile = nvfp4_tile(
            row_ptrs[:, None] + offs2[None, :],
            KV_BSCALE + rows[:, None] * stride_ks + offs16[None, :],
            mask_n[:, None],
            BLOCK_N,
            WIDTH,
        )
    else:
        ptrs = row_ptrs[:, None] + (c0 + tl.arange(0, WIDTH))[None, :]
        if SECOND:
            tile = tl.load(ptrs, mask=mask_n[:, None], other=0.0, eviction_policy="evict_last")
        else:
            tile = tl.load(ptrs, mask=mask_n[:, None], other=0.0)
    return tile


@triton.jit
def _visible(
    mask_n,
    start_n,
    TREE_MASK,
    mask_row,
    draft,
    tree_lo,
    BLOCK_N: tl.constexpr,
    NUM_DRAFTS: tl.constexpr,
):
    """Keys start_n .. start_n+BLOCK_N-1 a row sees: the split's keys (mask_n), and with a
    draft tree (TREE_MASK given) the drafts its bit-mask row holds (the prefix whole)."""
    visible = mask_n
    if TREE_MASK is not None:
        col = start_n + tl.arange(0, BLOCK_N) - tree_lo
        in_tree = mask_n & (col >= 0)
        bit = draft * NUM_DRAFTS + col
        bits = tl.load(mask_row + bit // 8, mask=in_tree, other=0).to(tl.int32)
        visible = mask_n & ((col < 0) | (((bits >> (bit % 8)) & 1) != 0))
    return visible


@triton.jit
def absorbed_split_kernel(
    Q_NOPE,
    Q_ROPE,
    KV_CACHE,
    PAGE_TABLE,
    ROW_LENS,
    ROW_REQ,
    TREE_MASK,
    TREE_MASK_INDPTR,
    NUM_SPLITS,
    KV_SCALE,
    KV_BSCALE,
    OUT,
    LSE,
    PARTIAL_O,
    PARTIAL_LSE,
    sm_scale,
    stride_qt,
    stride_qh,
    stride_rt,
    stride_rh,
    stride_kv,
    stride_ks,
    stride_ptb,
    stride_ot,
    stride_oh,
    stride_lt,
    stride_pot,
    stride_poh,
    stride_pos,
    stride_plt,
    stride_plh,
    NUM_HEADS: tl.constexpr,
    LORA: tl.constexpr,
    ROPE: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    KV_SCALED: tl.constexpr,
    KV_FP4: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    NUM_DRAFTS: tl.constexpr,
    LORA_PARTS: tl.constexpr = 1,
    KEYS_MAJOR: tl.constexpr = False,
    VALUE_RELOAD: tl.constexpr = False,
):
    """Stage 1: heads h0 .. h0+BLOCK_H-1 of query row t over one split of its keys.

    Row t reads request ROW_REQ[t] (t itself when ROW_REQ is None: decode) and sees its
    keys 0 .. ROW_LENS[t]-1 (decode: the sequence length; extend and verify: the causal
    limit of that token; trees: the sequence length, with TREE_MASK as below). NUM_SPLITS [T] int32 (None: one split each, nothing partial). KV_CACHE rows are stride_kv elements apart, token slot s at row
    s (page s // PAGE_SIZE). KV_SCALED: the cache is fp8 (or, with KV_FP4, NVFP4: e2m1
    pairs with e4m3 block scales per 16 in KV_BSCALE rows stride_ks apart) with the fp32
    per-tensor (global) scale KV_SCALE, folded into the score scale and the output.
    Grid axis 1 is head block x LORA_PARTS (the part fastest). KEYS_MAJOR: both products
    are computed transposed (scores [keys, heads], output [columns, heads]), so the latent
    tile is their A operand and the heads their N (small head counts fill the MMA's M).
    VALUE_RELOAD: the value operand is loaded again (from L1/L2) instead of reusing the
    score's tile: a quantized tile decoded in registers has two consumers of different
    layouts, which keeps Triton from pipelining its load; two loads of one consumer each
    are pipelined.
    """
    off_t = tl.program_id(0)
    PART: tl.constexpr = LORA // LORA_PARTS
    if LORA_PARTS == 1:  # the column offsets stay compile-time constants
        off_hb = tl.program_id(1)
        part: tl.constexpr = 0
    else:
        off_hb = tl.program_id(1) // LORA_PARTS
        part = tl.program_id(1) % LORA_PARTS
    split = tl.program_id(2)
    if NUM_SPLITS is None:  # one split per row: no partials, no combine
        num_splits = 1
    else:
        num_splits = tl.minimum(tl.maximum(tl.load(NUM_SPLITS + off_t), 1), MAX_SPLITS)
    if ROW_REQ is None:
        off_b = off_t
    else:
        off_b = tl.load(ROW_REQ + off_t)
    kv_len = tl.load(ROW_LENS + off_t)
    draft = 0
    tree_lo = 0
    mask_row = TREE_MASK
    if TREE_MASK is not None:
        # -- draft tree: row t is draft t % NUM_DRAFTS of its request; the drafts are the
        # last NUM_DRAFTS keys, seen as the request's bit mask says (row-major n x n bits,
        # little-endian in bytes from TREE_MASK_INDPTR[b]); the prefix is seen whole ----
        draft = off_t % NUM_DRAFTS
        tree_lo = kv_len - NUM_DRAFTS
        mask_row = TREE_MASK + tl.load(TREE_MASK_INDPTR + off_b)

    # -- this split's BLOCK_N-aligned slice of the visible keys (may be empty) ----
    split_len = tl.cdiv(tl.cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N
    kv_start = tl.minimum(split * split_len, kv_len)
    kv_end = tl.minimum(kv_start + split_len, kv_len)

    # -- the row's query heads: latent and rope parts ----
    heads = off_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = heads < NUM_HEADS
    # own columns c0 .. c0+PART-1 (scores and output); with two parts, the other half
    # (scores only) starts at c1
    c0 = part * PART
    c1 = (1 - part) * PART
    offs_p = tl.arange(0, PART)
    offs_r = tl.arange(0, ROPE)
    q_row = off_t.to(tl.int64) * stride_qt
    r_row = off_t.to(tl.int64) * stride_rt
    q_ptrs = Q_NOPE + q_row + heads[:, None] * stride_qh
    q_nope = tl.load(q_ptrs + c0 + offs_p[None, :], mask=mask_h[:, None], other=0.0)
    if LORA_PARTS == 2:
        q_other = tl.load(q_ptrs + c1 + offs_p[None, :], mask=mask_h[:, None], other=0.0)
    q_rope = tl.load(
        Q_ROPE + r_row + heads[:, None] * stride_rh + offs_r[None, :],
        mask=mask_h[:, None],
        other=0.0,
    )

    # -- online softmax over the split's latent rows (base 2) ----
    kv_scale = 1.0
    if KV_SCALED:
        # fp8 rows become fp16 (one cvt per pair of e4m3 on sm89+; bf16 takes a longer
        # path), so both products run in fp16: q's bf16 values convert exactly while
        # |q| < 65504 (and above fp16's subnormals), P in [0, 1] loses nothing
        kv_scale = tl.load(KV_SCALE)
        q_nope = q_nope.to(tl.float16)
        q_rope = q_rope.to(tl.float16)
        if LORA_PARTS == 2:
            q_other = q_other.to(tl.float16)
    qk_scale = sm_scale * kv_scale * LOG2E
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    if KEYS_MAJOR:
        acc_t = tl.zeros([PART, BLOCK_H], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_H, PART], dtype=tl.float32)
    page_row = PAGE_TABLE + off_b.to(tl.int64) * stride_ptb
    for start_n in range(kv_start, kv_end, BLOCK_N):
        rows = _latent_rows(page_row, start_n, kv_end, PAGE_SIZE, BLOCK_N)
        mask_n = start_n + tl.arange(0, BLOCK_N) < kv_end
        # latent rows start on 16 elements (the launcher checks the stride): vector loads
        row_ptrs = KV_CACHE + tl.multiple_of(rows * stride_kv, 16)
        latent = _latent_cols(
            row_ptrs, rows, KV_BSCALE, stride_ks, mask_n, c0, PART, BLOCK_N, KV_FP4
        )
        k_rope = _latent_cols(
            row_ptrs, rows, KV_BSCALE, stride_ks, mask_n, LORA, ROPE, BLOCK_N, KV_FP4
        )
        if KV_SCALED:
            latent = latent.to(tl.float16)
            k_rope = k_rope.to(tl.float16)
        if LORA_PARTS == 2:
            other = _latent_cols(
                row_ptrs, rows, KV_BSCALE, stride_ks, mask_n, c1, PART, BLOCK_N, KV_FP4
            )
            if KV_SCALED:
                other = other.to(tl.float16)
        value = latent
        if VALUE_RELOAD:
            value = _latent_cols(
                row_ptrs, rows, KV_BSCALE, stride_ks, mask_n, c0, PART, BLOCK_N, KV_FP4, True
            )
            if KV_SCALED:
                value = value.to(tl.float16)
        if KEYS_MAJOR:
            # -- scores transposed, [keys, heads]: the latent tile is the A operand of
            # both products and q stays the (shared-memory) B operand ----
            s = tl.dot(latent, tl.trans(q_nope))
            if LORA_PARTS == 2:
                s = tl.dot(other, tl.trans(q_other), s)
            s = tl.dot(k_rope, tl.trans(q_rope), s)
            visible = _visible(
                mask_n, start_n, TREE_MASK, mask_row, draft, tree_lo, BLOCK_N, NUM_DRAFTS
            )
            s = tl.where(visible[:, None], s * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 0))
            m_use = m_new
            if TREE_MASK is not None:  # a tree may hide every key of a block
                m_use = tl.where(m_new > float("-inf"), m_new, 0.0)
            p = tl.math.exp2(s - m_use[None, :])
            alpha = tl.math.exp2(m_i - m_use)
            l_i = l_i * alpha + tl.sum(p, 0)
            acc_t = tl.dot(tl.trans(value), p.to(value.dtype), acc_t * alpha[None, :])
        else:
            # -- scores: q_nope . latent + q_rope . k_rope ----
            s = tl.dot(q_nope, tl.trans(latent))
            if LORA_PARTS == 2:
                s = tl.dot(q_other, tl.trans(other), s)
            s = tl.dot(q_rope, tl.trans(k_rope), s)
            visible = _visible(
                mask_n, start_n, TREE_MASK, mask_row, draft, tree_lo, BLOCK_N, NUM_DRAFTS
            )
            s = tl.where(visible[None, :], s * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = m_new
            if TREE_MASK is not None:  # a tree may hide every key of a block: keep exp2 finite
                m_use = tl.where(m_new > float("-inf"), m_new, 0.0)
            p = tl.math.exp2(s - m_use[:, None])
            alpha = tl.math.exp2(m_i - m_use)
            l_i = l_i * alpha + tl.sum(p, 1)
            # -- values: the latent itself ----
            acc = tl.dot(p.to(value.dtype), value, acc * alpha[:, None])
        m_i = m_new

    if KEYS_MAJOR:
        acc = tl.trans(acc_t)
    # -- normalised output and natural-log LSE (no key: zeros and -inf) ----
    has_keys = l_i > 0.0
    l_safe = tl.where(has_keys, l_i, 1.0)
    lse = tl.where(has_keys, (m_i + tl.math.log2(l_safe)) * LN2, float("-inf"))
    o = acc * (kv_scale / l_safe)[:, None]
    # rows of out and partial_o start on 16 elements (the launcher checks): vector stores;
    # every part holds the same LSE, part 0 writes it
    if num_splits == 1:  # one split: the final output (splits past num_splits: nothing)
        if split == 0:
            o_rows = off_t.to(tl.int64) * stride_ot + heads * stride_oh + c0
            o_ptrs = OUT + tl.multiple_of(o_rows, 16)[:, None] + offs_p[None, :]
            if NUM_HEADS % BLOCK_H == 0:
                tl.store(o_ptrs, o.to(OUT.dtype.element_ty))
            else:
                tl.store(o_ptrs, o.to(OUT.dtype.element_ty), mask=mask_h[:, None])
            if WRITE_LSE:
                tl.store(
                    LSE + off_t.to(tl.int64) * stride_lt + heads, lse, mask=mask_h & (part == 0)
                )
    elif split < num_splits:
        po_rows = off_t.to(tl.int64) * stride_pot + heads * stride_poh + split * stride_pos + c0
        po_ptrs = PARTIAL_O + tl.multiple_of(po_rows, 16)[:, None] + offs_p[None, :]
        if NUM_HEADS % BLOCK_H == 0:
            tl.store(po_ptrs, o)
        else:
            tl.store(po_ptrs, o, mask=mask_h[:, None])
        pl_ptrs = PARTIAL_LSE + off_t.to(tl.int64) * stride_plt + heads * stride_plh + split
        tl.store(pl_ptrs, lse, mask=mask_h & (part == 0))


@triton.jit
def absorbed_combine_kernel(
    PARTIAL_O,
    PARTIAL_LSE,
    NUM_SPLITS,
    OUT,
    LSE,
    stride_pot,
    stride_poh,
    stride_pos,
    stride_plt,
    stride_plh,
    stride_ot,
    stride_oh,
    stride_lt,
    LORA: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    WRITE_LSE: tl.constexpr,
):
    """Stage 2: merge one (row, head)'s splits by their LSEs; rows of one split were written
    by stage 1 directly and are left alone."""
    off_t = tl.program_id(0)
    off_h = tl.program_id(1)
    num_splits = tl.minimum(tl.maximum(tl.load(NUM_SPLITS + off_t), 1), MAX_SPLITS)
    if num_splits > 1:
        offs_c = tl.arange(0, LORA)
        po_row = PARTIAL_O + off_t.to(tl.int64) * stride_pot + off_h * stride_poh
        pl_row = PARTIAL_LSE + off_t.to(tl.int64) * stride_plt + off_h * stride_plh
        m = float("-inf")
        l = 0.0
        acc = tl.zeros([LORA], dtype=tl.float32)
        for split in range(0, num_splits):
            lse = tl.load(pl_row + split) * LOG2E
            if lse > float("-inf"):  # empty splits add nothing
                o = tl.load(po_row + split * stride_pos + offs_c)
                m_new = tl.maximum(m, lse)
                alpha = tl.math.exp2(m - m_new)
                weight = tl.math.exp2(lse - m_new)
                acc = acc * alpha + o * weight
                l = l * alpha + weight
                m = m_new
        l_safe = tl.where(l > 0.0, l, 1.0)
        out_ptrs = OUT + off_t.to(tl.int64) * stride_ot + off_h * stride_oh + offs_c
        tl.store(out_ptrs, (acc / l_safe).to(OUT.dtype.element_ty))
        if WRITE_LSE:
            lse_out = tl.where(l > 0.0, (m + tl.math.log2(l_safe)) * LN2, float("-inf"))
            tl.store(LSE + off_t.to(tl.int64) * stride_lt + off_h, lse_out)
