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
    """One token for every value head (any leading batch dims ``...``): ``state [..., HV, V,
    K]`` (pool layout), ``q, k [..., HV, K]`` (already normalised, scaled and repeated per
    value head), ``v [..., HV, V]``, ``g, beta [..., HV]``. Returns ``(o [..., HV, V], new
    state)``, float64."""
    s = state * torch.exp(g)[..., None, None]  # S^T, decayed
    kv = torch.einsum("...vk,...k->...v", s, k)  # (S^T k)
    u = beta[..., None] * (v - kv)
    s = s + u[..., :, None] * k[..., None, :]
    return torch.einsum("...vk,...k->...v", s, q), s


def prepare_qk(
    q: torch.Tensor, k: torch.Tensor, group: int, *, scale: float, l2norm_qk: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k ``[..., H, K]`` -> float64 ``[..., HV, K]``: normalised, q scaled, repeated per
    value head (value head ``hv`` reads key head ``hv // group``)."""
    qn = l2norm(q) if l2norm_qk else q.to(F64)
    kn = l2norm(k) if l2norm_qk else k.to(F64)
    return (qn * scale).repeat_interleave(group, -2), kn.repeat_interleave(group, -2)


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
    keep_steps: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One request: ``q, k [T, H, K]``, ``v [T, HV, V]``, ``g, beta [T, HV]``, initial
    ``state [HV, V, K]`` (None: zeros). ``parents`` (a draft tree): token ``t`` continues
    from token ``parents[t]``'s state (-1: the initial state); None: a chain.

    Returns ``(out [T, HV, V], final state [HV, V, K], every step's state [T, HV, V, K] or
    None without keep_steps)``, float64 on q's device; the final state is the last token's.
    """
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    dev = q.device
    qn, kn = prepare_qk(q, k, HV // H, scale=scale, l2norm_qk=l2norm_qk)
    s0 = torch.zeros(HV, V, K, dtype=F64, device=dev) if state is None else state.to(dev, F64)
    out = torch.empty(T, HV, V, dtype=F64, device=dev)
    steps = torch.empty(T, HV, V, K, dtype=F64, device=dev) if keep_steps or parents else None
    prev = s0
    for t in range(T):
        if parents is not None:
            prev = s0 if parents[t] < 0 else steps[parents[t]]
        out[t], prev = gdn_step(prev, qn[t], kn[t], v[t].to(F64), g[t], beta[t])
        if steps is not None:
            steps[t] = prev
    return out, prev, steps


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

    Returns ``(y [T, C], final conv state [C, W-1], every step's window [T, C, W-1])``,
    float64 on x's device.
    """
    T, C = x.shape
    W = weight.shape[1]
    dev = x.device
    w = weight.to(dev, F64)
    s0 = torch.zeros(C, W - 1, dtype=F64, device=dev)
    if conv_state is not None:
        s0 = conv_state.to(dev, F64)
    xs = x.to(F64)
    if parents is None:  # a chain: one vectorised pass over the padded sequence
        full = torch.cat([s0.T, xs], dim=0)  # [W-1+T, C]
        win = full.unfold(0, W, 1)  # [T, C, W]
        acc = (win * w).sum(-1)
        windows = win[:, :, 1:]
    else:
        acc = torch.empty(T, C, dtype=F64, device=dev)
        windows = torch.empty(T, C, W - 1, dtype=F64, device=dev)
        for t in range(T):
            prev = s0 if parents[t] < 0 else windows[parents[t]]
            full = torch.cat([prev, xs[t][:, None]], dim=1)  # [C, W]
            acc[t] = (full * w).sum(1)
            windows[t] = full[:, 1:]
    if bias is not None:
        acc = acc + bias.to(dev, F64)
    y = acc * torch.sigmoid(acc)
    final = windows[T - 1] if T else s0
    return y, final, windows


def default_scale(key_dim: int) -> float:
    return 1.0 / math.sqrt(key_dim)
