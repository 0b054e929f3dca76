"""Experimental, not in the library and not lowered: MLA's ragged prefill (qk 128 + 64, v 128,
LSE out) with the tiles every row sees whole loaded by TMA (host-built descriptors).

Why: the library's ``ragged.py`` runs at 0.61x FA4 (bench/README). Its whole tiles are
cp.async gathers computed per thread (three stages); FA4 on sm90 feeds its MMA warpgroups
from a producer warp with TMA. This file measures how much of the gap TMA closes, before
anything changes in the library. Triton 3.6's automatic warp specialization
(``tl.range(..., warp_specialize=True)``) was tried on this loop and is not usable on
sm_90a: at 8 warps the pass leaves the loop as it is, at 4 warps it aborts (an assertion
in WSLowerToken.cpp or in MLIR's dominance check), compiled on CPU on 2026-12-02.

The tiles on the causal diagonal and the ragged end keep the library's masked pointer loads
(a TMA box past a request's end would read the next request's rows, and a NaN there would
survive a zero probability). Same arguments and semantics as ``ragged_attend_kernel`` for
q / k_nope / k_rope / v whose rows are 16-byte aligned; ``launch`` builds the descriptors.

CPU check (no GPU): ``python bench/experimental/mla_prefill_tma.py`` compiles every variant
for sm_90a and prints registers, spills, shared memory and whether the loop was warp
specialized. ``bench/mla.py --prefill-tma`` times them beside the library and FA4.
"""

import triton
import triton.language as tl

from attngen.families.mla.triton.kernels.ragged import LN2, LOG2E, _attend_tile

# (BLOCK_M, BLOCK_N, warps, stages) timed by bench/mla.py --prefill-variants
VARIANTS = (
    (128, 64, 8, 3),
    (128, 64, 8, 2),
    (128, 64, 8, 4),
    (128, 128, 8, 2),
)


@triton.jit
def _whole_tile(acc, m_i, l_i, q_nope, q_rope, k_desc, r_desc, v_desc, row, col_k, col_r,
                col_v, qk_scale, V_DIM: tl.constexpr):  # fmt: skip
    """One tile every row of the block sees whole (keys from row ``row`` of the flat
    descriptors) into the online softmax."""
    k_nope = k_desc.load([row, col_k])
    k_rope = r_desc.load([row, col_r])
    v = v_desc.load([row, col_v])
    s = tl.dot(q_nope, tl.trans(k_nope))
    s = tl.dot(q_rope, tl.trans(k_rope), s) * qk_scale
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, m_new, l_i


@triton.jit
def ragged_tma_kernel(
    Q,
    K_NOPE,
    K_ROPE,
    V,
    k_desc,
    r_desc,
    v_desc,
    QO_INDPTR,
    KV_INDPTR,
    OUT,
    LSE,
    sm_scale,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_rt,
    stride_rh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_lt,
    NOPE: tl.constexpr,
    ROPE: tl.constexpr,
    V_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    """``ragged_attend_kernel`` with the whole tiles through k_desc / r_desc / v_desc (the
    flat [tokens, columns] views of k_nope, k_rope and v: head h's columns start at
    h * stride_kh, h * stride_rh, h * stride_vh)."""
    off_h = tl.program_id(0)
    off_b = tl.program_id(1)
    off_m = tl.num_programs(2) - 1 - tl.program_id(2)
    q_lo = tl.load(QO_INDPTR + off_b)
    q_len = tl.load(QO_INDPTR + off_b + 1) - q_lo
    live = off_m * BLOCK_M < q_len  # a row block past the request's end does nothing
    kv_lo = tl.load(KV_INDPTR + off_b)
    kv_len = tl.load(KV_INDPTR + off_b + 1) - kv_lo
    offs_m = off_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = (offs_m < q_len) & live
    q_off = (q_lo + offs_m).to(tl.int64) * stride_qt + off_h * stride_qh
    q_rows = Q + tl.multiple_of(q_off, 16)[:, None]
    q_nope = tl.load(q_rows + tl.arange(0, NOPE)[None, :], mask=mask_m[:, None], other=0.0)
    q_rope = tl.load(
        q_rows + NOPE + tl.arange(0, ROPE)[None, :], mask=mask_m[:, None], other=0.0
    )
    q_pos = (kv_len - q_len) + offs_m
    kv_hi = kv_len
    n_full = kv_len // BLOCK_N * BLOCK_N
    if CAUSAL:
        first = kv_len - q_len + off_m * BLOCK_M
        kv_hi = tl.maximum(tl.minimum(kv_len, first + BLOCK_M), 0)
        n_full = tl.minimum(n_full, tl.maximum(first + 1, 0) // BLOCK_N * BLOCK_N)
    n_full = tl.where(live, n_full, 0)
    kv_hi = tl.where(live, kv_hi, 0)

    qk_scale = sm_scale * LOG2E
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, V_DIM], dtype=tl.float32)
    col_k = off_h * stride_kh
    col_r = off_h * stride_rh
    col_v = off_h * stride_vh
    for start_n in range(0, n_full, BLOCK_N):
        acc, m_i, l_i = _whole_tile(
            acc, m_i, l_i, q_nope, q_rope, k_desc, r_desc, v_desc, kv_lo + start_n,
            col_k, col_r, col_v, qk_scale, V_DIM,
        )  # fmt: skip
    for start_n in range(n_full, kv_hi, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q_nope, q_rope, K_NOPE, K_ROPE, V, kv_lo, start_n, kv_len,
            q_pos, qk_scale, off_h, stride_kt, stride_kh, stride_rt, stride_rh,
            stride_vt, stride_vh, NOPE, ROPE, V_DIM, BLOCK_N, CAUSAL, True,
        )  # fmt: skip

    has_keys = l_i > 0.0
    l_safe = tl.where(has_keys, l_i, 1.0)
    lse = tl.where(has_keys, (m_i + tl.math.log2(l_safe)) * LN2, float("-inf"))
    rows = (q_lo + offs_m).to(tl.int64)
    o_rows = tl.multiple_of(rows * stride_ot + off_h * stride_oh, 16)
    o_ptrs = OUT + o_rows[:, None] + tl.arange(0, V_DIM)[None, :]
    tl.store(o_ptrs, (acc / l_safe[:, None]).to(OUT.dtype.element_ty), mask=mask_m[:, None])
    tl.store(LSE + rows * stride_lt + off_h, lse, mask=mask_m)


def flat_desc(x, block_rows: int):
    """A TMA descriptor over [tokens, heads, d] rows as [tokens, columns]: one row per token,
    head h's d columns from h * stride(1) (a shared head, stride 0: the same columns)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    t, h, d = x.shape
    head_stride = x.stride(1) if h > 1 else 0
    cols = (h - 1) * head_stride + d
    return TensorDescriptor(x, [t, cols], [x.stride(0), 1], [block_rows, d])


def launch(q, k_nope, k_rope, v, qo_indptr, kv_indptr, out, lse, *, max_q_len, sm_scale,
           variant, causal=True):  # fmt: skip
    """Run one VARIANTS entry (the caller vouches for shapes and metadata, as the bench's
    trusted calls do)."""
    bm, bn, warps, stages = variant
    h = q.shape[1]
    batch = qo_indptr.shape[0] - 1
    rope_head_stride = 0 if k_rope.shape[1] == 1 else k_rope.stride(1)
    grid = (h, batch, triton.cdiv(max_q_len, bm))
    ragged_tma_kernel[grid](
        q, k_nope, k_rope, v,
        flat_desc(k_nope, bn), flat_desc(k_rope, bn), flat_desc(v, bn),
        qo_indptr, kv_indptr, out, lse, sm_scale,
        q.stride(0), q.stride(1), k_nope.stride(0), k_nope.stride(1), k_rope.stride(0),
        rope_head_stride, v.stride(0), v.stride(1), out.stride(0), out.stride(1), lse.stride(0),
        NOPE=k_nope.shape[2], ROPE=k_rope.shape[2], V_DIM=v.shape[2], BLOCK_M=bm, BLOCK_N=bn,
        CAUSAL=causal, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out


def compile_check(capability: int = 90) -> list[dict]:
    """Compile every variant for sm_{capability}a without a GPU: its registers, spills,
    shared memory and whether the whole tiles are TMA copies."""
    import contextlib
    import io
    import os

    os.environ.pop("TRITON_INTERPRET", None)
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from attngen.backends.triton.aot import parse_ptxas_log

    names = ragged_tma_kernel.arg_names
    found = []
    for bm, bn, warps, stages in VARIANTS:
        const = dict(NOPE=128, ROPE=64, V_DIM=128, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=True)
        sig = {}
        for n in names:
            if n in const:
                sig[n] = "constexpr"
            elif n in ("k_desc", "v_desc"):
                sig[n] = f"tensordesc<bf16[{bn}, 128]>"
            elif n == "r_desc":
                sig[n] = f"tensordesc<bf16[{bn}, 64]>"
            elif n in ("QO_INDPTR", "KV_INDPTR"):
                sig[n] = "*i32"
            elif n == "LSE":
                sig[n] = "*fp32"
            elif n == "sm_scale":
                sig[n] = "fp32"
            elif n.startswith("stride"):
                sig[n] = "i32"
            else:
                sig[n] = "*bf16"
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n][0] == "*"}
        triton.knobs.nvidia.dump_ptxas_log = True
        triton.knobs.compilation.always_compile = True
        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            k = triton.compile(
                ASTSource(ragged_tma_kernel, sig, const, attrs),
                target=GPUTarget("cuda", capability, 32),
                options=dict(num_warps=warps, num_stages=stages),
            )
        regs, spills = parse_ptxas_log(log.getvalue())
        found.append(
            dict(
                variant=(bm, bn, warps, stages),
                registers=regs,
                spills=spills,
                shared=k.metadata.shared,
                tma="async_tma_copy" in k.asm["ttgir"],
            )
        )
    return found


if __name__ == "__main__":
    for row in compile_check():
        print(row)
