"""Experimental, not in the library and not lowered: MLA absorbed decode for 16 heads over
an fp8 e4m3 latent (per-tensor scale) on sm90, keys-major, with the score product's latent
operand taken from registers.

Why: the library's ``absorbed_keys_fp8.py`` is bound by the shared-memory pipe (ncu: L1/TEX
80%, DRAM 31%). Per 64-row tile it writes the widened tile (72 KB) and the score product
reads it back (72 KB) before the value product reads 64 KB of it again. Here each 64-column
chunk of the fp8 words is loaded straight into the registers of the warpgroup MMA's A
operand (one 16-byte vector per row and thread), widened there (cvt.rn.f16x2.e4m3x2,
exact), and multiplied by q from registers; only the 512 latent columns the value product
needs are written to shared memory (natural column order), and the rope never is. About
200 KB of shared-memory traffic a tile instead of 278.

The trick that makes a 16-byte vector land in the A fragment: the MMA's K order is free as
long as A and B agree. Within chunk j (64 values), lane q of a quad loads the 16 bytes
64j + 16q .. 64j + 16q + 15 of its row, and value e (0..3) of word g (0..3) is used as
logical column k' = 64j + 16g + 8 (e // 2) + 2q + (e % 2), exactly the columns the wgmma A
fragment gives that lane (k_width 2: pairs, +8, and one 16-wide k block per g). q is
staged in shared memory with its columns in the same order (``logical_to_physical``).

Same arguments and semantics as ``absorbed_keys_fp8_kernel`` (the bench swaps it in through
the launcher); 4 warps, 64 rows, 16 heads. Timed by ``bench/mla.py --experimental``.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.runtime.jit import constexpr_function

from attngen.families.mla.triton.kernels.absorbed_keys_wg import (
    finish_keys,
    keys_output_layout,
    keys_score_layout,
)
from attngen.families.mla.triton.kernels.absorbed_wg import LOG2E, rows_layout, split_range

CHUNK = gl.constexpr(64)  # latent values a chunk: 16 words a row
INFLIGHT = gl.constexpr(0)  # score products left running while the next chunk is widened


@constexpr_function
def chunk_words_layout():
    """Words [64 rows, 4 quads, 4 words] of one chunk, as the wgmma A fragment of 4 warps
    holds rows and columns: row bits 0-2 on lanes 2-4, bit 3 in a register, bits 4-5 on
    the warps; the quad index on lanes 0-1; the 4 words of a lane in registers (one
    16-byte load)."""
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [0, 0, 2], [8, 0, 0]],
        lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=[[16, 0, 0], [32, 0, 0]],
        block_bases=[],
        shape=[64, 4, 4],
    )


@gluon.jit
def logical_to_physical(k):
    """The cache column that logical column k of the score's K order reads (see above)."""
    x = k % 64
    g = (x >> 4) & 3
    e1 = (x >> 3) & 1
    q = (x >> 1) & 3
    e0 = x & 1
    return (k - x) + 16 * q + 4 * g + 2 * e1 + e0


@gluon.jit
def stage_q_permuted(qn_smem, qr_smem, Q_NOPE, Q_ROPE, off_t, off_hb, stride_qt, stride_qh,
                     stride_rt, stride_rh, NUM_HEADS: gl.constexpr, LORA: gl.constexpr,
                     ROPE: gl.constexpr, BLOCK_H: gl.constexpr):  # fmt: skip
    """q's heads of row off_t in fp16, columns in the score's K order."""
    ROWS: gl.constexpr = rows_layout(gl.num_warps())
    heads = off_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ROWS))
    mask = heads < NUM_HEADS
    offs_c = logical_to_physical(gl.arange(0, LORA, layout=gl.SliceLayout(0, ROWS)))
    offs_r = logical_to_physical(gl.arange(0, ROPE, layout=gl.SliceLayout(0, ROWS)))
    q_rows = Q_NOPE + off_t.to(gl.int64) * stride_qt + heads * stride_qh
    r_rows = Q_ROPE + off_t.to(gl.int64) * stride_rt + heads * stride_rh
    q_nope = gl.load(q_rows[:, None] + offs_c[None, :], mask=mask[:, None], other=0.0)
    q_rope = gl.load(r_rows[:, None] + offs_r[None, :], mask=mask[:, None], other=0.0)
    qn_smem.store(q_nope.to(gl.float16))
    qr_smem.store(q_rope.to(gl.float16))


@gluon.jit
def row_words(KV_CACHE, page_row, start_n, kv_end, stride_kv, PAGE_SIZE: gl.constexpr):
    """Word offsets of latent rows start_n .. start_n+63 through the page table and the rows'
    mask (rows at or past kv_end read as zeros), as [64, 1, 1] in the chunk layout."""
    L: gl.constexpr = chunk_words_layout()
    offs_n = start_n + gl.arange(0, 64, layout=gl.SliceLayout(1, gl.SliceLayout(2, L)))
    mask_n = offs_n < kv_end
    page = gl.load(page_row + offs_n // PAGE_SIZE, mask=mask_n, other=0).to(gl.int64)
    rows = page * PAGE_SIZE + (offs_n % PAGE_SIZE)
    base = gl.multiple_of(rows * stride_kv, 4)  # rows start on 16 bytes
    return base[:, None, None], mask_n[:, None, None]


@gluon.jit
def load_chunk(KV_CACHE, base, mask, col: gl.constexpr):
    """Words col .. col+15 of the rows (col: a multiple of 16), one 16-byte vector a lane."""
    L: gl.constexpr = chunk_words_layout()
    q = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, L)))
    g = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, L)))
    offs = col + 4 * q[None, :, None] + g[None, None, :]
    return gl.load(KV_CACHE + base + offs, mask=mask, other=0)


@gluon.jit
def widen_pairs(words):
    """Each word's four e4m3 values as two fp16 pairs (32-bit): lo = values 0, 1; hi = 2, 3."""
    return gl.inline_asm_elementwise(
        """{
        .reg .b16 a, b;
        mov.b32 {a, b}, $2;
        cvt.rn.f16x2.e4m3x2 $0, a;
        cvt.rn.f16x2.e4m3x2 $1, b;
        }""",
        "=r,=r,r",
        [words],
        dtype=(gl.int32, gl.int32),
        is_pure=True,
        pack=1,
    )


@gluon.jit
def unpack_pair(pair):
    """A 32-bit fp16 pair as its two fp16 values (low half first)."""
    return gl.inline_asm_elementwise(
        "mov.b32 {$0, $1}, $2;",
        "=h,=h,r",
        [pair],
        dtype=(gl.float16, gl.float16),
        is_pure=True,
        pack=1,
    )


@gluon.jit
def chunk_operand(lo, hi, S_LAYOUT: gl.constexpr):
    """The chunk's 64 x 64 fp16 A operand in the score's K order, in registers."""
    v0, v1 = unpack_pair(lo)
    v2, v3 = unpack_pair(hi)
    z = gl.join(gl.join(v0, v1), gl.join(v2, v3))  # [rows, quad, word, e0, e1]
    z = gl.permute(z, (0, 2, 4, 1, 3))  # [rows, word, e1, quad, e0]: the K order
    a = gl.reshape(z, [64, CHUNK])
    return gl.convert_layout(a, gl.DotOperandLayout(operand_index=0, parent=S_LAYOUT, k_width=2))


@gluon.jit
def store_values(lat_op, lo, hi, j: gl.constexpr):
    """Chunk j's fp16 pairs into columns 64j .. 64j+63 of the value operand (natural order),
    through its 32-bit view."""
    ROWS: gl.constexpr = lat_op.shape[0]
    HALF: gl.constexpr = lat_op.shape[1] // 2
    view = lat_op._reinterpret(
        gl.int32, [ROWS, HALF], gl.NVMMASharedLayout.get_default_for([ROWS, HALF], gl.int32)
    )
    pairs = gl.reshape(gl.join(lo, hi), [ROWS, CHUNK // 2])  # [rows, quad, word, half]
    view.slice(j * (CHUNK // 2), CHUNK // 2, dim=1).store(pairs)


@gluon.jit
def chunk_score(words, q_smem, col: gl.constexpr, s, a_prev, lat_op, j: gl.constexpr,
                STORE: gl.constexpr, S_LAYOUT: gl.constexpr):  # fmt: skip
    """Widen one chunk's words, store them for the value product (STORE), and issue s += A
    . q[:, col .. col+63]^T with A from registers; then wait for the previous chunk's
    product (its A, a_prev, lives until then: wgmma reads registers while it runs).
    Returns (s, this chunk's A)."""
    lo, hi = widen_pairs(words)
    if STORE:
        store_values(lat_op, lo, hi, j)
    a = chunk_operand(lo, hi, S_LAYOUT)
    s = warpgroup_mma(a, q_smem.slice(col, CHUNK, dim=1).permute((1, 0)), s, is_async=True)
    if INFLIGHT == 0:  # this product done before the next chunk is widened
        s, a = warpgroup_mma_wait(num_outstanding=0, deps=(s, a))
    else:  # the previous one done; this one runs on while the next chunk is widened
        s, _, a = warpgroup_mma_wait(num_outstanding=1, deps=(s, a_prev, a))
    return s, a


@gluon.jit
def mla_keys_fp8_regs_kernel(
    Q_NOPE,
    Q_ROPE,
    KV_CACHE,
    PAGE_TABLE,
    ROW_LENS,
    ROW_REQ,
    NUM_SPLITS,
    KV_SCALE,
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
    stride_ptb,
    stride_ot,
    stride_oh,
    stride_lt,
    stride_pot,
    stride_poh,
    stride_pos,
    stride_plt,
    stride_plh,
    NUM_HEADS: gl.constexpr,
    LORA: gl.constexpr,
    ROPE: gl.constexpr,
    PAGE_SIZE: gl.constexpr,
    BLOCK_H: gl.constexpr,
    BLOCK_N: gl.constexpr,
    MAX_SPLITS: gl.constexpr,
    WRITE_LSE: gl.constexpr,
):
    gl.static_assert(BLOCK_N == 64, "64 latent rows: the MMA's M")

    gl.static_assert(gl.num_warps() == 4, "one warpgroup")
    gl.static_assert(LORA == 8 * CHUNK and ROPE == CHUNK, "DeepSeek's 512 + 64")
    f16: gl.constexpr = gl.float16
    S_LAYOUT: gl.constexpr = keys_score_layout(BLOCK_H, 4)
    O_LAYOUT: gl.constexpr = keys_output_layout(BLOCK_H, 4)
    LAT_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, LORA], f16)
    QN_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, LORA], f16)
    QR_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, ROPE], f16)
    P_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_H], f16)
    LW: gl.constexpr = LORA // 4  # words of a row's latent part

    # 16 heads, one head block: the launcher's grid (rows x head blocks, 1, splits) is one
    # program per row (row_and_head_block's division costs this kernel a spill)
    gl.static_assert(NUM_HEADS <= BLOCK_H, "one head block")
    off_t = gl.program_id(0)
    off_hb = gl.program_id(1)  # 0: the grid has one program per row on its second axis
    split = gl.program_id(2)
    off_b, num_splits, kv_start, kv_end = split_range(
        ROW_LENS, ROW_REQ, NUM_SPLITS, off_t, split, MAX_SPLITS, BLOCK_N
    )
    qn_smem = gl.allocate_shared_memory(f16, [BLOCK_H, LORA], QN_SH)
    qr_smem = gl.allocate_shared_memory(f16, [BLOCK_H, ROPE], QR_SH)
    stage_q_permuted(
        qn_smem, qr_smem, Q_NOPE, Q_ROPE, off_t, off_hb, stride_qt, stride_qh, stride_rt,
        stride_rh, NUM_HEADS, LORA, ROPE, BLOCK_H,
    )  # fmt: skip
    lat_op = gl.allocate_shared_memory(f16, [BLOCK_N, LORA], LAT_SH)
    p_smem = gl.allocate_shared_memory(f16, [BLOCK_N, BLOCK_H], P_SH)
    page_row = PAGE_TABLE + off_b.to(gl.int64) * stride_ptb
    fence_async_shared()

    kv_scale = gl.load(KV_SCALE)
    qk_scale = sm_scale * kv_scale * LOG2E
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(0, S_LAYOUT))
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(0, S_LAYOUT))
    acc = gl.zeros([LORA, BLOCK_H], gl.float32, layout=O_LAYOUT)
    offs_ns = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, S_LAYOUT))
    num_tiles = gl.cdiv(kv_end - kv_start, BLOCK_N)

    # the first tile's chunks 0-4; from here on each chunk's words are loaded five chunks
    # ahead of their use (chunks 5-8 of a tile during its chunks 0-3, chunks 0-4 of the next
    # tile during its chunks 4-8), so about six chunks of words are live, not ten
    base, mask = row_words(KV_CACHE, page_row, kv_start, kv_end, stride_kv, PAGE_SIZE)
    c0 = load_chunk(KV_CACHE, base, mask, 0)
    c1 = load_chunk(KV_CACHE, base, mask, 16)
    c2 = load_chunk(KV_CACHE, base, mask, 32)
    c3 = load_chunk(KV_CACHE, base, mask, 48)
    c4 = load_chunk(KV_CACHE, base, mask, 64)
    for it in range(num_tiles):
        start_n = kv_start + it * BLOCK_N
        gl.thread_barrier()  # the last tile's value product is done with lat_op
        base, mask = row_words(KV_CACHE, page_row, start_n, kv_end, stride_kv, PAGE_SIZE)
        nbase, nmask = row_words(
            KV_CACHE, page_row, start_n + BLOCK_N, kv_end, stride_kv, PAGE_SIZE
        )
        s = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=S_LAYOUT)
        # chunk 0 (no earlier product to wait for), then the others
        lo, hi = widen_pairs(c0)
        store_values(lat_op, lo, hi, 0)
        a = chunk_operand(lo, hi, S_LAYOUT)
        s = warpgroup_mma(a, qn_smem.slice(0, CHUNK, dim=1).permute((1, 0)), s, is_async=True)
        if INFLIGHT == 0:
            s, a = warpgroup_mma_wait(num_outstanding=0, deps=(s, a))
        t5 = load_chunk(KV_CACHE, base, mask, 80)
        s, a = chunk_score(c1, qn_smem, 64, s, a, lat_op, 1, True, S_LAYOUT)
        t6 = load_chunk(KV_CACHE, base, mask, 96)
        s, a = chunk_score(c2, qn_smem, 128, s, a, lat_op, 2, True, S_LAYOUT)
        t7 = load_chunk(KV_CACHE, base, mask, 112)
        s, a = chunk_score(c3, qn_smem, 192, s, a, lat_op, 3, True, S_LAYOUT)
        tr = load_chunk(KV_CACHE, base, mask, LW)
        s, a = chunk_score(c4, qn_smem, 256, s, a, lat_op, 4, True, S_LAYOUT)
        c0 = load_chunk(KV_CACHE, nbase, nmask, 0)
        s, a = chunk_score(t5, qn_smem, 320, s, a, lat_op, 5, True, S_LAYOUT)
        c1 = load_chunk(KV_CACHE, nbase, nmask, 16)
        s, a = chunk_score(t6, qn_smem, 384, s, a, lat_op, 6, True, S_LAYOUT)
        c2 = load_chunk(KV_CACHE, nbase, nmask, 32)
        s, a = chunk_score(t7, qn_smem, 448, s, a, lat_op, 7, True, S_LAYOUT)
        c3 = load_chunk(KV_CACHE, nbase, nmask, 48)
        s, a = chunk_score(tr, qr_smem, 0, s, a, lat_op, 0, False, S_LAYOUT)
        c4 = load_chunk(KV_CACHE, nbase, nmask, 64)
        s, _ = warpgroup_mma_wait(num_outstanding=0, deps=(s, a))

        s = gl.where(((start_n + offs_ns) < kv_end)[:, None], s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 0))
        p = gl.exp2(s - m_new[None, :])
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, 0)
        m_i = m_new
        p_smem.store(p.to(f16))
        fence_async_shared()  # P and this tile's values, for the value product
        gl.thread_barrier()
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(0, O_LAYOUT))[None, :]
        acc = warpgroup_mma(lat_op.permute((1, 0)), p_smem, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))

    finish_keys(
        acc * kv_scale, m_i, l_i, off_t, off_hb, split, num_splits, OUT, LSE, PARTIAL_O,
        PARTIAL_LSE, stride_ot, stride_oh, stride_lt, stride_pot, stride_poh, stride_pos,
        stride_plt, stride_plh, NUM_HEADS, LORA, BLOCK_H, WRITE_LSE, S_LAYOUT, O_LAYOUT,
    )  # fmt: skip


def compile_check() -> int:
    """Compile the kernel for sm_90a on CPU as the launcher would launch it for the
    generated h_q 16 fp8 spec (page 64), print registers, spills and shared memory; exit
    status 1 on any spill. ``python bench/experimental/mla_keys_fp8_regs.py``, outside
    TRITON_INTERPRET."""
    import importlib

    import attngen.families.mla.triton.host.launch as launch
    from attngen.backends.triton.aot import compile_spec

    launch.absorbed_keys_fp8_kernel = mla_keys_fp8_regs_kernel  # what --experimental does
    mod = importlib.import_module("generated.sm90.triton.mla.mla_deepseek_v3_fp8.kernels")
    cfg = next(c for c in mod.CONFIGS.values() if c.num_heads == 16 and c.page_size == 64)
    status = 0
    for spec in mod.compile_specs(cfg):
        if spec.fn is mla_keys_fp8_regs_kernel:
            r = compile_spec(spec, 90)
            print(f"{spec.name}: {r.registers} registers, {r.spill_bytes} B spill, "
                  f"{r.shared_bytes} B shared memory", flush=True)  # fmt: skip
            status = max(status, int(r.spill_bytes > 0))
    return status


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.exit(compile_check())
