"""The attention core every MHA kernel shares: page addressing, hook points
(mask_mod, score_mod, the sinks' softmax-stat update) and the online-softmax key loop."""

import triton
import triton.language as tl

from attngen.families.mha.triton.kernels.fp4 import nvfp4_tile


@triton.jit
def _block_pages(
    page_row,
    start_n,
    kv_lo,
    kv_len,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASK_KV_LO: tl.constexpr,
    PAGED: tl.constexpr,
):
    """Physical page and in-page slot of tokens start_n .. start_n+BLOCK_N-1 of one request.

    start_n is a multiple of BLOCK_N. Tokens at or past kv_len (or, with MASK_KV_LO, before
    kv_lo: left of a sliding window, whose pages may be gone) get page 0, a real page, so
    their addresses stay inside the cache; callers still mask those loads. Without PAGED
    (prefill: K/V rows of the request lie contiguously) the "page" is 0 and the slot is
    the token index.
    """
    if not PAGED:
        page = 0
        slots = start_n + tl.arange(0, BLOCK_N)
    elif PAGE_SIZE % BLOCK_N == 0:
        # -- the block lies inside one page: one page-table read ----
        page = tl.load(page_row + start_n // PAGE_SIZE).to(tl.int64)
        slots = start_n % PAGE_SIZE + tl.arange(0, BLOCK_N)
    else:
        # -- the block spans pages (or part of one): one page-table read per token ----
        offs_n = start_n + tl.arange(0, BLOCK_N)
        needed = offs_n < kv_len
        if MASK_KV_LO:
            needed = needed & (offs_n >= kv_lo)
        page = tl.load(page_row + offs_n // PAGE_SIZE, mask=needed, other=0).to(tl.int64)
        slots = offs_n % PAGE_SIZE
    return page, slots


@triton.jit
def load_kv_scale(SCALE, off_kvh, KV_SCALED: tl.constexpr, SCALE_PER_HEAD: tl.constexpr):
    """The dequant scale of one kv head's K or V (1.0 for a bf16/fp16 cache)."""
    scale = 1.0
    if KV_SCALED:
        if SCALE_PER_HEAD:
            scale = tl.load(SCALE + off_kvh)
        else:
            scale = tl.load(SCALE)
    return scale


@triton.jit
def _tree_mask_bits(mask_row, q_pos, offs_n, tree_lo, tree_len):
    """Hook mask_mod for speculative trees: [M, N] True where a draft row sees a draft key.

    The request's draft tokens sit at positions tree_lo .. tree_lo + tree_len - 1; its mask
    is tree_len x tree_len bits, row-major, bit j of a row in byte j // 8 at bit j % 8
    (little-endian), starting at mask_row. Keys before tree_lo (the cached prefix) are
    visible to every draft row; keys outside the drafts' range give False here.
    """
    row = q_pos - tree_lo
    col = offs_n - tree_lo
    in_tree = ((row >= 0) & (row < tree_len))[:, None] & ((col >= 0) & (col < tree_len))[None, :]
    bit = row[:, None] * tree_len + col[None, :]
    bits = tl.load(mask_row + bit // 8, mask=in_tree, other=0).to(tl.int32)
    allowed = in_tree & (((bits >> (bit % 8)) & 1) != 0)
    return allowed | (col < 0)[None, :]


@triton.jit
def score_scale(sm_scale, LOGIT_SOFTCAP: tl.constexpr):
    """The factor _score_mod expects on q.k: base 2 folded in, or natural units / cap."""
    if LOGIT_SOFTCAP > 0:
        return sm_scale / LOGIT_SOFTCAP
    else:
        return sm_scale * 1.44269504  # 1/ln(2)


@triton.jit
def _score_mod(qk, qk_scale, LOGIT_SOFTCAP: tl.constexpr):
    """Hook score_mod: raw q.k -> base-2 scores. Softcap: cap * tanh(s / cap), s natural."""
    if LOGIT_SOFTCAP > 0:
        # tanh(x) = 1 - 2 / (e^(2x) + 1): exp2 overflows to inf (-> 1) or 0 (-> -1), never NaN
        e2x = tl.math.exp2(qk * qk_scale * 2.88539008)  # 2/ln(2)
        return (1.0 - 2.0 / (e2x + 1.0)) * (LOGIT_SOFTCAP * 1.44269504)
    else:
        return qk * qk_scale


@triton.jit
def attend_kv_blocks(
    acc,
    l_i,
    m_i,
    q,
    q_pos,
    qk_scale,
    k_base,  # this kv head's K and V cache rows
    v_base,
    ks_base,  # their NVFP4 block scales (None: not KV_FP4)
    vs_base,
    page_row,  # the request's page-table row (None: not PAGED)
    strides,  # page and slot strides of K, V and their block scales (kp, ks, vp, vs, ...)
    mask_row,  # the request's tree mask (None: not MASK_TREE)
    tree,  # (tree_lo, tree_len): where the drafts sit among the keys, for MASK_TREE
    span,  # (lo, hi, kv_lo, kv_len): the key blocks to visit and the visible key range
    TILE: tl.constexpr,  # (HEAD_DIM, V_HEAD_DIM, BLOCK_D, BLOCK_DV, PAGE_SIZE, BLOCK_N, PAGED, KV_FP4)
    MASK_KV_LEN: tl.constexpr,
    MASK_CAUSAL: tl.constexpr,
    WINDOW_LEFT: tl.constexpr,
    LOGIT_SOFTCAP: tl.constexpr,
    MASK_TREE: tl.constexpr,
):
    """Online-softmax update of (acc, l_i, m_i) over key blocks lo, lo+BLOCK_N, .. < hi.

    qk_scale comes from score_scale; running scores are in base 2. Hook mask_mod, chosen by
    constexprs: MASK_KV_LEN hides keys at or past kv_len; MASK_CAUSAL (only with MASK_KV_LEN)
    keys after each query row's position q_pos; WINDOW_LEFT >= 0 keys before kv_lo (not even
    loaded: the lowest key any row may see) and before q_pos - WINDOW_LEFT. Without
    MASK_KV_LEN every block must lie wholly below kv_len. MASK_TREE (only with
    MASK_KV_LEN, not with MASK_CAUSAL) applies the speculative tree mask of _tree_mask_bits.
    A row may see no key of a block only if m_i is finite by then (-inf - -inf would be
    NaN): windowed and tree callers start m_i at -1e30. Head dims are padded to BLOCK_D /
    BLOCK_DV (powers of two): padded lanes load 0, so they add nothing to q.k, and give acc
    columns that the callers do not store. An fp8 cache is upcast to q's dtype here; KV_FP4
    (NVFP4: packed e2m1 pairs at k_base/v_base, e4m3 block scales at ks_base/vs_base, no
    padded dims) is decoded here. The per-tensor scales are the callers' (K in qk_scale,
    V on the output).
    """
    HEAD_DIM: tl.constexpr = TILE[0]
    V_HEAD_DIM: tl.constexpr = TILE[1]
    BLOCK_D: tl.constexpr = TILE[2]
    BLOCK_DV: tl.constexpr = TILE[3]
    PAGE_SIZE: tl.constexpr = TILE[4]
    BLOCK_N: tl.constexpr = TILE[5]
    PAGED: tl.constexpr = TILE[6]
    KV_FP4: tl.constexpr = TILE[7]
    stride_kp, stride_ks, stride_vp, stride_vs, stride_ksp, stride_kss, stride_vsp, stride_vss = (
        strides
    )
    tree_lo, tree_len = tree
    lo, hi, kv_lo, kv_len = span
    tl.static_assert(MASK_KV_LEN or not MASK_CAUSAL)
    tl.static_assert(MASK_KV_LEN or not MASK_TREE)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    for start_n in range(lo, hi, BLOCK_N):
        # -- gather the block's keys and values through the page table ----
        page, slots = _block_pages(
            page_row, start_n, kv_lo, kv_len, PAGE_SIZE, BLOCK_N, WINDOW_LEFT >= 0, PAGED
        )
        offs_n = start_n + tl.arange(0, BLOCK_N)
        if MASK_KV_LEN or WINDOW_LEFT >= 0:
            if MASK_KV_LEN:
                in_range = offs_n < kv_len
                if WINDOW_LEFT >= 0:
                    in_range = in_range & (offs_n >= kv_lo)
            else:
                in_range = offs_n >= kv_lo
        if KV_FP4:
            # -- NVFP4: decode packed e2m1 codes times their e4m3 block scales ----
            if MASK_KV_LEN or WINDOW_LEFT >= 0:
                rows = in_range[:, None]
            else:
                rows = (offs_n < hi)[:, None]  # every row: the block lies below kv_len
            k_rows = k_base + (page * stride_kp + slots * stride_ks)[:, None]
            v_rows = v_base + (page * stride_vp + slots * stride_vs)[:, None]
            ks_rows = ks_base + (page * stride_ksp + slots * stride_kss)[:, None]
            vs_rows = vs_base + (page * stride_vsp + slots * stride_vss)[:, None]
            k = nvfp4_tile(
                k_rows + tl.arange(0, BLOCK_D // 2)[None, :],
                ks_rows + tl.arange(0, BLOCK_D // 16)[None, :],
                rows,
                BLOCK_N,
                BLOCK_D,
            )
            v = nvfp4_tile(
                v_rows + tl.arange(0, BLOCK_DV // 2)[None, :],
                vs_rows + tl.arange(0, BLOCK_DV // 16)[None, :],
                rows,
                BLOCK_N,
                BLOCK_DV,
            )
        else:
            k_ptrs = k_base + (page * stride_kp + slots * stride_ks)[:, None] + offs_d[None, :]
            v_ptrs = v_base + (page * stride_vp + slots * stride_vs)[:, None] + offs_dv[None, :]
            k_ptrs = tl.multiple_of(k_ptrs, [16, 16])  # 16-byte aligned rows: vector loads
            v_ptrs = tl.multiple_of(v_ptrs, [16, 16])
            if MASK_KV_LEN or WINDOW_LEFT >= 0:
                k_mask = in_range[:, None]
                v_mask = in_range[:, None]
                if HEAD_DIM < BLOCK_D:
                    k_mask = k_mask & (offs_d < HEAD_DIM)[None, :]
                if V_HEAD_DIM < BLOCK_DV:
                    v_mask = v_mask & (offs_dv < V_HEAD_DIM)[None, :]
                k = tl.load(k_ptrs, mask=k_mask, other=0.0)
                v = tl.load(v_ptrs, mask=v_mask, other=0.0)
            else:
                if HEAD_DIM < BLOCK_D:
                    k = tl.load(k_ptrs, mask=(offs_d < HEAD_DIM)[None, :], other=0.0)
                else:
                    k = tl.load(k_ptrs)
                if V_HEAD_DIM < BLOCK_DV:
                    v = tl.load(v_ptrs, mask=(offs_dv < V_HEAD_DIM)[None, :], other=0.0)
                else:
                    v = tl.load(v_ptrs)
        k = k.to(q.dtype)  # fp8 / fp4 cache: to q's type (a no-op for a bf16/fp16 cache)
        v = v.to(q.dtype)
        # -- compute qk; hook score_mod ----
        qk = _score_mod(tl.dot(q, tl.trans(k)), qk_scale, LOGIT_SOFTCAP)
        # -- hook mask_mod ----
        if MASK_KV_LEN or WINDOW_LEFT >= 0:
            visible = in_range[None, :]
            if MASK_CAUSAL:
                visible = visible & (offs_n[None, :] <= q_pos[:, None])
            if WINDOW_LEFT >= 0:
                visible = visible & (offs_n[None, :] >= q_pos[:, None] - WINDOW_LEFT)
            if MASK_TREE:
                visible = visible & _tree_mask_bits(mask_row, q_pos, offs_n, tree_lo, tree_len)
            qk = tl.where(visible, qk, float("-inf"))
        # -- update the running max and rescale what came before ----
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        # -- compute pv ----
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def sink_denominator(l_i, m_i, sink, HAS_SINKS: tl.constexpr):
    """Hook softmax-stat update: the row's softmax denominator (base-2 running max m_i).

    A sink (natural-log logit) adds e^sink to the denominator only. Rows that saw no key
    (l_i == 0) get 1, so their zero accumulator stays zero.
    """
    if HAS_SINKS:
        l_i = l_i + tl.math.exp2(sink * 1.44269504 - m_i)  # 1/ln(2)
    return tl.where(l_i > 0.0, l_i, 1.0)
