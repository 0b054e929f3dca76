"""Sparse MLA (absorbed) over each query row's selected token slots.

Every query head of row t attends the same TOPK keys: the latent rows at the slots
``INDICES[t, :]`` (-1: no key), key = the 576-wide row (512 latent + 64 rope), value =
its first 512 columns, as MLA's absorbed decode but gathered by slot instead of walked
through a page table. Two cache layouts:

- ``FP8 = False``: the latent pool's rows ``[slots, 576]`` in the activations' dtype;
- ``FP8 = True``: DeepSeek-V3.2's 656-byte rows: 512 e4m3 latent values, 4 fp32 scales
  (one per 128 values; value = e4m3 * scale), 64 bf16 rope values. The kernel reads them
  through three views of the same bytes (e4m3, fp32 words, 16-bit words), decodes the
  bf16 rope from its bits, and runs both products in fp16 (e4m3 -> fp16 is one
  conversion per pair; q's bf16 values convert exactly in fp16's normal range).

The latent is handled as 4 chunks of 128 columns, each with its own scale (1 for the
plain layout): chunk scales multiply the score columns, and the softmax weights of the
value product (P * scale, then rounded to the compute dtype), so the e4m3 values enter
both tensor-core products unscaled and exact. One program holds BLOCK_H heads of one row
over one split of its TOPK slots; with several splits it writes partials that MLA's
combine kernel merges (attngen.families.mla.triton.kernels.absorbed).
"""

import triton
import triton.language as tl

LN2 = tl.constexpr(0.6931471805599453)  # ln(2)
LOG2E = tl.constexpr(1.4426950408889634)  # 1/ln(2)
CHUNK = tl.constexpr(128)  # latent columns per fp8 scale


@triton.jit
def _latent_chunk(KV, KVF, rows, mask_n, c: tl.constexpr, stride_kv, stride_kvf, FP8: tl.constexpr):
    """Columns c*128 .. c*128+127 of the gathered rows (raw, unscaled) and their scales."""
    offs = c * CHUNK + tl.arange(0, CHUNK)
    # rows start on 16 bytes (576 x 2 or 656 bytes): vector loads
    row = tl.multiple_of(rows * stride_kv, 16)
    x = tl.load(KV + row[:, None] + offs[None, :], mask=mask_n[:, None], other=0.0)
    if FP8:
        scale = tl.load(KVF + rows * stride_kvf + 128 + c, mask=mask_n, other=0.0)
    else:
        scale = tl.full(rows.shape, 1.0, tl.float32)
    return x, scale


@triton.jit
def sparse_mla_kernel(
    Q_NOPE,
    Q_ROPE,
    KV,
    KVF,
    KV16,
    INDICES,
    NUM_SPLITS,
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
    stride_kvf,
    stride_kv16,
    stride_it,
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
    TOPK: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
    FP8: tl.constexpr,
    WRITE_LSE: tl.constexpr,
):
    """Heads h0 .. h0+BLOCK_H-1 of row t over slots INDICES[t, split * TOPK / SPLITS ..].

    KV: rows stride_kv elements apart (FP8: the e4m3 view, with KVF / KV16 the fp32 and
    16-bit views, rows stride_kvf / stride_kv16 apart). SPLITS == 1: OUT [T, H, LORA] and
    (WRITE_LSE) the natural-log LSE [T, H]; else PARTIAL_O / PARTIAL_LSE at [t, h, split]
    for the combine (NUM_SPLITS[t] = SPLITS). A row with no selected key: zeros, -inf.
    """
    tl.static_assert(LORA == 4 * CHUNK)
    off_t = tl.program_id(0)
    off_hb = tl.program_id(1)
    split = tl.program_id(2)
    split_len: tl.constexpr = TOPK // SPLITS

    # -- the row's query heads: four latent chunks and the rope part ----
    heads = off_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = heads < NUM_HEADS
    offs_k = tl.arange(0, CHUNK)
    offs_r = tl.arange(0, ROPE)
    q_ptrs = Q_NOPE + off_t.to(tl.int64) * stride_qt + heads[:, None] * stride_qh
    q0 = tl.load(q_ptrs + offs_k[None, :], mask=mask_h[:, None], other=0.0)
    q1 = tl.load(q_ptrs + CHUNK + offs_k[None, :], mask=mask_h[:, None], other=0.0)
    q2 = tl.load(q_ptrs + 2 * CHUNK + offs_k[None, :], mask=mask_h[:, None], other=0.0)
    q3 = tl.load(q_ptrs + 3 * CHUNK + offs_k[None, :], mask=mask_h[:, None], other=0.0)
    qr_ptrs = Q_ROPE + off_t.to(tl.int64) * stride_rt + heads[:, None] * stride_rh
    q_rope = tl.load(qr_ptrs + offs_r[None, :], mask=mask_h[:, None], other=0.0)
    dt = q0.dtype  # both products run in the activations' dtype, or (fp8 rows) fp16:
    if FP8:
        # e4m3 pairs become fp16 in one cvt on sm89+ (bf16 takes a longer path); q's bf16
        # values convert exactly while |q| < 65504 (and above fp16's subnormals), the
        # rope's bf16 bits through fp32 likewise; P in [0, 1] times a scale loses nothing
        dt = tl.float16
        q0, q1, q2, q3 = q0.to(dt), q1.to(dt), q2.to(dt), q3.to(dt)
        q_rope = q_rope.to(dt)

    # -- online softmax over the split's slots (base 2) ----
    qk_scale = sm_scale * LOG2E
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc0 = tl.zeros([BLOCK_H, CHUNK], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_H, CHUNK], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_H, CHUNK], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_H, CHUNK], dtype=tl.float32)
    i_row = INDICES + off_t.to(tl.int64) * stride_it
    for start_n in range(split * split_len, (split + 1) * split_len, BLOCK_N):
        slots = tl.load(i_row + start_n + tl.arange(0, BLOCK_N))
        mask_n = slots >= 0
        rows = tl.where(mask_n, slots, 0).to(tl.int64)
        c0, s0 = _latent_chunk(KV, KVF, rows, mask_n, 0, stride_kv, stride_kvf, FP8)
        c1, s1 = _latent_chunk(KV, KVF, rows, mask_n, 1, stride_kv, stride_kvf, FP8)
        c2, s2 = _latent_chunk(KV, KVF, rows, mask_n, 2, stride_kv, stride_kvf, FP8)
        c3, s3 = _latent_chunk(KV, KVF, rows, mask_n, 3, stride_kv, stride_kvf, FP8)
        if FP8:
            # bf16 rope after the 528 bytes of latent and scales: its bits are fp32's top half
            r_row = tl.multiple_of(rows * stride_kv16, 8)  # 656 bytes: 328 16-bit words
            r_ptrs = KV16 + r_row[:, None] + 264 + offs_r[None, :]
            bits = tl.load(r_ptrs, mask=mask_n[:, None], other=0).to(tl.uint16, bitcast=True)
            k_rope = (bits.to(tl.uint32) << 16).to(tl.float32, bitcast=True).to(dt)
            c0, c1, c2, c3 = c0.to(dt), c1.to(dt), c2.to(dt), c3.to(dt)
        else:
            r_ptrs = KV + tl.multiple_of(rows * stride_kv, 16)[:, None] + LORA + offs_r[None, :]
            k_rope = tl.load(r_ptrs, mask=mask_n[:, None], other=0.0)
        # -- scores: sum over chunks of (q_c . latent_c) * scale_c, plus q_rope . k_rope ----
        s = tl.dot(q_rope, tl.trans(k_rope))
        if FP8:
            s += tl.dot(q0, tl.trans(c0)) * s0[None, :]
            s += tl.dot(q1, tl.trans(c1)) * s1[None, :]
            s += tl.dot(q2, tl.trans(c2)) * s2[None, :]
            s += tl.dot(q3, tl.trans(c3)) * s3[None, :]
        else:
            s = tl.dot(q0, tl.trans(c0), s)
            s = tl.dot(q1, tl.trans(c1), s)
            s = tl.dot(q2, tl.trans(c2), s)
            s = tl.dot(q3, tl.trans(c3), s)
        s = tl.where(mask_n[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new > float("-inf"), m_new, 0.0)  # a block of -1s: exp2 finite
        p = tl.math.exp2(s - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        # -- values: the latent chunks, their scales on P ----
        if FP8:
            acc0 = tl.dot((p * s0[None, :]).to(dt), c0, acc0 * alpha[:, None])
            acc1 = tl.dot((p * s1[None, :]).to(dt), c1, acc1 * alpha[:, None])
            acc2 = tl.dot((p * s2[None, :]).to(dt), c2, acc2 * alpha[:, None])
            acc3 = tl.dot((p * s3[None, :]).to(dt), c3, acc3 * alpha[:, None])
        else:
            pd = p.to(dt)
            acc0 = tl.dot(pd, c0, acc0 * alpha[:, None])
            acc1 = tl.dot(pd, c1, acc1 * alpha[:, None])
            acc2 = tl.dot(pd, c2, acc2 * alpha[:, None])
            acc3 = tl.dot(pd, c3, acc3 * alpha[:, None])
        m_i = m_new

    # -- normalised output and natural-log LSE (no key: zeros and -inf) ----
    has_keys = l_i > 0.0
    l_safe = tl.where(has_keys, l_i, 1.0)
    lse = tl.where(has_keys, (m_i + tl.math.log2(l_safe)) * LN2, float("-inf"))
    inv = (1.0 / l_safe)[:, None]
    if SPLITS == 1:
        o_ptrs = OUT + off_t.to(tl.int64) * stride_ot + heads[:, None] * stride_oh
        _store_chunks(o_ptrs, acc0 * inv, acc1 * inv, acc2 * inv, acc3 * inv, mask_h)
        if WRITE_LSE:
            tl.store(LSE + off_t.to(tl.int64) * stride_lt + heads, lse, mask=mask_h)
    else:
        po_rows = off_t.to(tl.int64) * stride_pot + heads * stride_poh + split * stride_pos
        po_ptrs = PARTIAL_O + po_rows[:, None]
        _store_chunks(po_ptrs, acc0 * inv, acc1 * inv, acc2 * inv, acc3 * inv, mask_h)
        pl_ptrs = PARTIAL_LSE + off_t.to(tl.int64) * stride_plt + heads * stride_plh + split
        tl.store(pl_ptrs, lse, mask=mask_h)


@triton.jit
def _store_chunks(ptrs, o0, o1, o2, o3, mask_h):
    """Four [BLOCK_H, 128] chunks into consecutive columns of rows ``ptrs`` (converted to
    the destination's dtype)."""
    offs = tl.arange(0, CHUNK)[None, :]
    ty = ptrs.dtype.element_ty
    tl.store(ptrs + offs, o0.to(ty), mask=mask_h[:, None])
    tl.store(ptrs + CHUNK + offs, o1.to(ty), mask=mask_h[:, None])
    tl.store(ptrs + 2 * CHUNK + offs, o2.to(ty), mask=mask_h[:, None])
    tl.store(ptrs + 3 * CHUNK + offs, o3.to(ty), mask=mask_h[:, None])
