"""Float64 oracle of the gated delta rule (GDN) and its short causal conv, token by token.

Written to be read rather than to be fast: one request, one token, one value head at a time,
everything in float64. The Triton kernels (recurrent decode / verify, chunked prefill, conv)
are checked against these functions.

Per value head ``hv`` (key head ``hv // G``, ``G`` value heads per key head) the state ``S``
is ``K x V``; the pool stores it transposed, ``state[hv] = S^T`` (``[V, K]``, SGLang's
layout). For every token ``t``:

    g_t    = -exp(A_log[hv]) * softplus(a_t[hv] + dt_bias[hv])      (log decay, <= 0)
    beta_t = sigmoid(b_t[hv])
    q_t, k_t L2-normalised when ``l2norm`` (x / sqrt(sum x^2 + L2_EPS)); q_t *= scale
    S_t    = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
    o_t    = S_t^T q_t

The conv (Qwen3-Next's ``causal_conv1d`` with SiLU) runs over the concatenated q|k|v
channels ``x [T, conv_dim]`` with weights ``w [conv_dim, W]``: ``y_t[c] = silu(sum_j w[c, j]
x_{t-W+1+j}[c] + bias[c])``, inputs before the sequence taken from the conv state
``[conv_dim, W-1]`` (oldest first), which afterwards holds the last ``W-1`` inputs.
"""

from __future__ import annotations

import math

import torch

L2_EPS = 1e-6  # as Qwen3-Next's in-kernel q/k L2 norm
SOFTPLUS_THRESHOLD = 20.0  # softplus(x) = x above it (torch's default)

F64 = torch.float64


def gates(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(g, beta)`` float64 ``[T, HV]`` from the raw gate inputs ``a, b [T, HV]``."""
    x = a.to(F64) + dt_bias.to(F64)
    softplus = torch.where(x > SOFTPLUS_THRESHOLD, x, torch.log1p(torch.exp(x)))
    g = -torch.exp(A_log.to(F64)) * softplus
    return g, torch.sigmoid(b.to(F64))


def l2norm(x: torch.Tensor) -> torch.Tensor:
    x = x.to(F64)
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def gdn_step(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token for every value head: ``state [HV, V, K]`` (pool layout), ``q, k [HV, K]``
    (already normalised, scaled and repeated per value head), ``v [HV, V]``, ``g, beta [HV]``.
    Returns ``(o [HV, V], new state)``, float64."""
    s = state * torch.exp(g)[:, None, None]  # S^T, decayed
    kv = torch.einsum("hvk,hk->hv", s, k)  # (S^T k)
    u = beta[:, None] * (v - kv)
    s = s + u[:, :, None] * k[:, None, :]
    return torch.einsum("hvk,hk->hv", s, q), s


def gdn_sequence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None,
    *,
    scale: float,
    l2norm_qk: bool,
    parents: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One request: ``q, k [T, H, K]``, ``v [T, HV, V]``, ``g, beta [T, HV]``, initial
    ``state [HV, V, K]`` (None: zeros). ``parents`` (a draft tree): token ``t`` continues
    from token ``parents[t]``'s state (-1: the initial state); None: a chain.

    Returns ``(out [T, HV, V], final state [HV, V, K], every step's state [T, HV, V, K])``,
    float64; the final state is the last token's.
    """
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    G = HV // H
    qn = l2norm(q) if l2norm_qk else q.to(F64)
    kn = l2norm(k) if l2norm_qk else k.to(F64)
    qn = qn * scale
    s0 = torch.zeros(HV, V, K, dtype=F64) if state is None else state.to(F64).cpu()
    out = torch.empty(T, HV, V, dtype=F64)
    steps = torch.empty(T, HV, V, K, dtype=F64)
    for t in range(T):
        parent = t - 1 if parents is None else parents[t]
        prev = s0 if parent < 0 else steps[parent]
        qt = qn[t].cpu().repeat_interleave(G, 0)
        kt = kn[t].cpu().repeat_interleave(G, 0)
        out[t], steps[t] = gdn_step(prev, qt, kt, v[t].to(F64).cpu(), g[t].cpu(), beta[t].cpu())
    final = steps[T - 1] if T else s0
    return out, final, steps


def conv_sequence(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor | None,
    parents: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Causal conv + SiLU of one request: ``x [T, C]``, ``weight [C, W]``, ``bias [C]``,
    ``conv_state [C, W-1]`` (None: zeros). ``parents``: as :func:`gdn_sequence` (a tree
    token's window is its ancestors' inputs).

    Returns ``(y [T, C], final conv state [C, W-1], every step's window [T, C, W-1])``.
    """
    T, C = x.shape
    W = weight.shape[1]
    w = weight.to(F64).cpu()
    s0 = torch.zeros(C, W - 1, dtype=F64) if conv_state is None else conv_state.to(F64).cpu()
    y = torch.empty(T, C, dtype=F64)
    windows = torch.empty(T, C, W - 1, dtype=F64)
    for t in range(T):
        parent = t - 1 if parents is None else parents[t]
        prev = s0 if parent < 0 else windows[parent]
        full = torch.cat([prev, x[t].to(F64).cpu()[:, None]], dim=1)  # [C, W]
        acc = (full * w).sum(1)
        if bias is not None:
            acc = acc + bias.to(F64).cpu()
        y[t] = acc * torch.sigmoid(acc)
        windows[t] = full[:, 1:]
    final = windows[T - 1] if T else s0
    return y, final, windows


def default_scale(key_dim: int) -> float:
    return 1.0 / math.sqrt(key_dim)
