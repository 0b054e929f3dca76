"""The per-row vectors of the fused GDN kernel without the triangular inverse (experimental,
2026-12-06): when ``GdnFusedSm90(inverse=True)`` forms T = (I + M)^-1 itself, what it still
takes from a launch before it is G (the cumulative log decay within a chunk), beta and the
q / k inverse norms (q's with the scale), ``[HV, N]`` fp32 each, as attngen's Triton
prepare kernel writes them (its gate and norm helpers, imported, not copied). The norms are
row sums of squares here (the prepare kernel takes them from the Gram matrix it needs for
M anyway). ``gdn_fused_check.py --check --variants inv`` holds the outputs and final states
it leads to against the float64 recurrence.
"""

from __future__ import annotations

import triton
import triton.language as tl

from attngen.families.gdn.triton.kernels.chunk import _chunk_rows, _head_major
from attngen.families.gdn.triton.kernels.common import L2_EPS, gate_values


@triton.jit
def _inverse_norms(X, tok, stride_tok, rmask, KEY_DIM: tl.constexpr, L2NORM: tl.constexpr):
    x = tl.load(X + tok[:, None] * stride_tok + tl.arange(0, KEY_DIM)[None, :],
                mask=rmask[:, None], other=0.0).to(tl.float32)  # fmt: skip
    if L2NORM:
        return 1.0 / tl.sqrt(tl.sum(x * x, axis=1) + L2_EPS)
    return tl.where(rmask, 1.0, 1.0)


@triton.jit
def chunk_gates_kernel(
    Q, K, A, B, A_LOG, DT_BIAS, CHUNK_SEQ, CHUNK_START, QUERY_START_LOC,
    G_BUF, BETA_BUF, QS_BUF, KN_BUF, scale,
    stride_q_tok, stride_q_head, stride_k_tok, stride_k_head, stride_a_tok, stride_b_tok,
    num_rows,
    GROUP: tl.constexpr, KEY_DIM: tl.constexpr, CHUNK: tl.constexpr, L2NORM: tl.constexpr,
):  # fmt: skip
    """Per chunk and value head: G, beta and the inverse norms (no T)."""
    hv = tl.program_id(1)
    hk = hv // GROUP
    rows, rmask, tok = _chunk_rows(CHUNK_SEQ, CHUNK_START, QUERY_START_LOC, CHUNK)
    vec_rows = _head_major(hv, tok, num_rows)
    qs = _inverse_norms(Q + hk * stride_q_head, tok, stride_q_tok, rmask, KEY_DIM, L2NORM)
    kn = _inverse_norms(K + hk * stride_k_head, tok, stride_k_tok, rmask, KEY_DIM, L2NORM)
    tl.store(QS_BUF + vec_rows, qs * scale, mask=rmask)
    tl.store(KN_BUF + vec_rows, kn, mask=rmask)
    a = tl.load(A + tok * stride_a_tok + hv, mask=rmask, other=0.0)
    b = tl.load(B + tok * stride_b_tok + hv, mask=rmask, other=0.0)
    g, beta = gate_values(a, b, tl.load(A_LOG + hv), tl.load(DT_BIAS + hv).to(tl.float32))
    tl.store(G_BUF + vec_rows, tl.cumsum(tl.where(rmask, g, 0.0), axis=0), mask=rmask)
    tl.store(BETA_BUF + vec_rows, tl.where(rmask, beta, 0.0), mask=rmask)


def gates(x: dict, plan, qsl, cfg, scale: float):
    """G, beta, qs, kn ``[HV, N]`` fp32 for the chunks of ``plan`` (what the fused kernel
    reads beside q, k and v when it forms T itself)."""
    import torch

    q, k = x["q"], x["k"]
    n, hv = q.shape[0], x["v"].shape[1]
    g_buf, beta_buf, qs_buf, kn_buf = (
        torch.empty((hv, n), dtype=torch.float32, device=q.device) for _ in range(4)
    )
    args = [q, k, x["a"], x["b"], x["A_log"], x["dt_bias"], plan.chunk_seq, plan.chunk_start]
    args += [qsl, g_buf, beta_buf, qs_buf, kn_buf, scale, q.stride(0), q.stride(1)]
    args += [k.stride(0), k.stride(1), x["a"].stride(0), x["b"].stride(0), n]
    chunk_gates_kernel[(plan.num_chunks, hv)](
        *args, GROUP=cfg.v_heads_per_k_head, KEY_DIM=q.shape[2], CHUNK=cfg.chunk_size,
        L2NORM=cfg.l2norm, num_warps=4,
    )  # fmt: skip
    return g_buf, beta_buf, qs_buf, kn_buf
