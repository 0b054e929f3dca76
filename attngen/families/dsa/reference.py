"""Float64 oracles of DSA: indexer scores, top-k sets and sparse MLA.

Inputs are the kernels' own (quantized) inputs, widened to float64: the oracles measure
the kernels' arithmetic, not the quantization (tests bound that separately).
"""

from __future__ import annotations

import torch

F64 = torch.float64


def indexer_logits(
    q: torch.Tensor, weights: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor
) -> torch.Tensor:
    """``[T, S]``: k_scale[s] * sum_h weights[t, h] * relu(q[t, h] . k[s]) for fp8 (or any)
    q ``[T, H, D]``, weights ``[T, H]``, k ``[S, D]``, k_scale ``[S]``."""
    dots = torch.einsum("thd,sd->ths", q.to(F64), k.to(F64)).clamp_min(0)
    return torch.einsum("ths,th->ts", dots, weights.to(F64)) * k_scale.to(F64)[None, :]


def indexer_abs_sum(
    q: torch.Tensor, weights: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor
) -> torch.Tensor:
    """``[T, S]``: k_scale[s] * sum_h |weights[t, h]| * sum_d |q[t, h, d] k[s, d]|, the scale
    of the rounding errors of a score accumulated in limited precision."""
    dots = torch.einsum("thd,sd->ths", q.to(F64).abs(), k.to(F64).abs())
    return torch.einsum("ths,th->ts", dots, weights.to(F64).abs()) * k_scale.to(F64).abs()[None, :]


def topk_positions(scores: torch.Tensor, length: int, k: int) -> list[int]:
    """The tie rule of the kernel: the ``k`` best of ``scores[:length]`` by (higher score,
    lower position), returned in ascending position order (all of them when length <= k)."""
    s = scores[:length].double().cpu().tolist()
    order = sorted(range(length), key=lambda j: (-s[j], j))
    return sorted(order[:k])


def sparse_mla(
    q: torch.Tensor,
    rows: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    lora: int = 512,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Absorbed attention of q ``[T, H, lora + rope]`` over the latent rows ``rows [N,
    lora + rope]`` (dequantized) at ``indices [T, K]`` (-1: none). Returns (out ``[T, H,
    lora]``, natural-log lse ``[T, H]``); a row without keys gives zeros and -inf."""
    q = q.to(F64)
    rows = rows.to(F64)
    t, h, _ = q.shape
    out = torch.zeros((t, h, lora), dtype=F64, device=q.device)
    lse = torch.full((t, h), float("-inf"), dtype=F64, device=q.device)
    for i in range(t):
        sel = indices[i][indices[i] >= 0].long()
        if sel.numel() == 0:
            continue
        kv = rows[sel]
        s = q[i] @ kv.T * sm_scale
        lse[i] = torch.logsumexp(s, dim=-1)
        out[i] = torch.softmax(s, dim=-1) @ kv[:, :lora]
    return out, lse
