"""Float64 oracle of MLA attention: absorbed attention over the paged latent cache (decode,
extend, verify chains), the non-absorbed ragged MHA path with its LSE (prefill and prefix
chunks), and the merge of (output, LSE) pairs.

Plain float64 math, one request at a time, written to be read. Layouts as the kernels':

- latent cache ``[num_pages, page_size, 1, LORA + ROPE]``: each token's latent (first
  ``LORA`` columns, the absorbed key and value) and its rope key; a quantized cache holds
  ``x / scale`` and reads back as ``cache * scale``;
- ``page_table[b, j]``: the physical page of tokens ``j * page_size ..`` of request ``b``;
- LSEs are natural-log, ``-inf`` for a row that sees no key (whose output is zeros).
"""

from __future__ import annotations

import torch

F64 = torch.float64


def gather_latent(
    cache: torch.Tensor, page_table_row: torch.Tensor, length: int, scale: float = 1.0
) -> torch.Tensor:
    """Tokens ``0 .. length-1`` of one request in logical order: ``[length, LORA + ROPE]``
    float64, dequantized by ``scale``."""
    page_size = cache.shape[1]
    positions = torch.arange(length, device=cache.device)
    pages = page_table_row[positions // page_size].long()
    rows = cache[pages, positions % page_size, 0]
    return rows.to(F64) * scale


def softmax_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float, visible: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q [M, H, Dk]`` over per-head ``k [N, H, Dk]`` / ``v [N, H, Dv]`` (or shared
    ``[N, Dk]`` / ``[N, Dv]``) where ``visible [M, N]``; returns (out [M, H, Dv], lse [M, H])
    in float64."""
    q, k, v = q.to(F64), k.to(F64), v.to(F64)
    scores = (
        torch.einsum("mhd,nd->mhn", q, k) if k.dim() == 2 else torch.einsum("mhd,nhd->mhn", q, k)
    )
    scores = scores * sm_scale
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    seen = torch.isfinite(lse)
    probs = torch.exp(scores - torch.where(seen, lse, 0.0)[..., None])
    probs = torch.where(seen[..., None], probs, 0.0)
    out = (
        torch.einsum("mhn,nd->mhd", probs, v)
        if v.dim() == 2
        else torch.einsum("mhn,nhd->mhd", probs, v)
    )
    return out, lse


def absorbed_decode(
    q: torch.Tensor,
    cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: list[int],
    sm_scale: float,
    *,
    lora: int = 512,
    kv_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode: ``q [B, H, LORA + ROPE]``, one row per request over all of its keys."""
    outs, lses = [], []
    for b, n in enumerate(seq_lens):
        o, lse = absorbed(q[b : b + 1], cache, page_table[b], [n], sm_scale, lora, kv_scale)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def absorbed_extend(
    q: torch.Tensor,
    cache: torch.Tensor,
    page_table: torch.Tensor,
    prefix_lens: list[int],
    extend_lens: list[int],
    sm_scale: float,
    *,
    lora: int = 512,
    kv_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Extend / chain verify: ``q [T, H, LORA + ROPE]``, request b's rows back to back;
    its new token i (already in the cache) sees keys ``0 .. prefix + i`` (causal)."""
    outs, lses, row = [], [], 0
    for b, (prefix, n) in enumerate(zip(prefix_lens, extend_lens)):
        lens = [prefix + i + 1 for i in range(n)]
        o, lse = absorbed(q[row : row + n], cache, page_table[b], lens, sm_scale, lora, kv_scale)
        outs.append(o)
        lses.append(lse)
        row += n
    return torch.cat(outs), torch.cat(lses)


def absorbed(
    q: torch.Tensor,
    cache: torch.Tensor,
    page_table_row: torch.Tensor,
    visible_lens: list[int],
    sm_scale: float,
    lora: int,
    kv_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``q [M, H, LORA + ROPE]`` of one request over its latent keys: the key is the
    whole 576-wide row, the value its first ``lora`` columns, one KV head for all heads."""
    length = max(visible_lens, default=0)
    kv = gather_latent(cache, page_table_row, length, kv_scale)
    visible = torch.arange(length)[None, :] < torch.tensor(visible_lens)[:, None]
    return softmax_attention(q, kv, kv[:, :lora], sm_scale, visible.to(q.device))


def ragged_mha(
    q: torch.Tensor,
    k_nope: torch.Tensor,
    k_rope: torch.Tensor,
    v: torch.Tensor,
    qo_lens: list[int],
    kv_lens: list[int],
    sm_scale: float,
    causal: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-absorbed MLA: ``q [Tq, H, NOPE + ROPE]`` over ``k_nope [Tk, H, NOPE]``,
    ``k_rope [Tk, 1 or H, ROPE]`` and ``v [Tk, H, V]``, requests back to back. Causal aligns
    each request's queries to the end of its keys (query i sees keys ``<= kv - q + i``)."""
    heads = q.shape[1]
    k = torch.cat([k_nope.to(F64), k_rope.to(F64).expand(-1, heads, -1)], dim=-1)
    outs, lses, qo, kv = [], [], 0, 0
    for nq, nk in zip(qo_lens, kv_lens):
        visible = torch.ones(nq, nk, dtype=torch.bool, device=q.device)
        if causal:
            qpos = torch.arange(nq, device=q.device)[:, None] + (nk - nq)
            visible = torch.arange(nk, device=q.device)[None, :] <= qpos
        o, lse = softmax_attention(
            q[qo : qo + nq], k[kv : kv + nk], v[kv : kv + nk], sm_scale, visible
        )
        outs.append(o)
        lses.append(lse)
        qo, kv = qo + nq, kv + nk
    return torch.cat(outs), torch.cat(lses)


def merge_state(
    o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The softmax over the union of two disjoint key sets from each set's (out, lse)."""
    lse_a, lse_b = lse_a.to(F64), lse_b.to(F64)
    lse = torch.logaddexp(lse_a, lse_b)
    seen = torch.isfinite(lse)
    safe = torch.where(seen, lse, 0.0)
    w_a = torch.where(seen, torch.exp(lse_a - safe), 0.0)[..., None]
    w_b = torch.where(seen, torch.exp(lse_b - safe), 0.0)[..., None]
    return o_a.to(F64) * w_a + o_b.to(F64) * w_b, lse


def absorbed_tree(
    q: torch.Tensor,
    cache: torch.Tensor,
    page_table: torch.Tensor,
    prefix_lens: list[int],
    masks: list[torch.Tensor],
    sm_scale: float,
    *,
    lora: int = 512,
    kv_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tree verify: ``q [B * n, H, LORA + ROPE]``, request b's n drafts back to back, its
    drafts the cached tokens ``prefix .. prefix + n - 1``; draft i sees the whole prefix and
    the drafts j with ``masks[b][i, j]``."""
    outs, lses, row = [], [], 0
    for b, (prefix, mask) in enumerate(zip(prefix_lens, masks)):
        n = mask.shape[0]
        kv = gather_latent(cache, page_table[b], prefix + n, kv_scale)
        visible = torch.ones(n, prefix + n, dtype=torch.bool)
        visible[:, prefix:] = mask.cpu()
        o, lse = softmax_attention(
            q[row : row + n], kv, kv[:, :lora], sm_scale, visible.to(q.device)
        )
        outs.append(o)
        lses.append(lse)
        row += n
    return torch.cat(outs), torch.cat(lses)
