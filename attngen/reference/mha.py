"""Torch oracle for paged multi-head attention (MHA / GQA), decode and extend.

Plain fp32 math, one request at a time, written to be read rather than to be fast. The
generated Triton kernels are checked against these functions.

Layouts (the same as the kernels'):

- ``k_cache`` ``[num_pages, page_size, Hkv, D]``, ``v_cache`` ``[num_pages, page_size, Hkv, Dv]``
- ``page_table[b, j]`` is the physical page that holds tokens ``j * page_size`` ..
  ``(j + 1) * page_size - 1`` of request ``b``
- query head ``h`` reads kv head ``h // (Hq // Hkv)`` (GQA groups are contiguous)
"""

from __future__ import annotations

import torch


def gather_kv(cache: torch.Tensor, page_table_row: torch.Tensor, length: int) -> torch.Tensor:
    """Tokens ``0 .. length-1`` of one request, in logical order: ``[length, Hkv, D]``."""
    page_size = cache.shape[1]
    positions = torch.arange(length, device=cache.device)
    pages = page_table_row[positions // page_size].long()
    slots = positions % page_size
    return cache[pages, slots]


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float, visible: torch.Tensor
) -> torch.Tensor:
    """Softmax attention of ``q [M, Hq, D]`` over ``k [N, Hkv, D]``, ``v [N, Hkv, Dv]``.

    ``visible [M, N]`` is True where query ``m`` may attend key ``n``; every row must have
    at least one visible key. Returns ``[M, Hq, Dv]`` fp32.
    """
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("mhd,nhd->hmn", q.float(), k) * sm_scale
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hmn,nhd->mhd", probs, v)


def paged_decode_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
) -> torch.Tensor:
    """One new query token per request over its whole cached sequence.

    ``q [B, Hq, D]``; request ``b`` attends cache positions ``0 .. seq_lens[b]-1``.
    A request with ``seq_lens[b] == 0`` gets zeros. Returns ``[B, Hq, Dv]`` fp32.
    """
    batch, num_heads = q.shape[:2]
    out = torch.zeros(batch, num_heads, v_cache.shape[-1], dtype=torch.float32, device=q.device)
    for b in range(batch):
        length = int(seq_lens[b])
        if length == 0:
            continue
        k = gather_kv(k_cache, page_table[b], length)
        v = gather_kv(v_cache, page_table[b], length)
        visible = torch.ones(1, length, dtype=torch.bool, device=q.device)
        out[b] = attention(q[b : b + 1], k, v, sm_scale, visible)[0]
    return out


def paged_extend_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    qo_indptr: torch.Tensor,
    prefix_lens: torch.Tensor,
    sm_scale: float,
    causal: bool = True,
) -> torch.Tensor:
    """Ragged new tokens over a paged cached prefix (their own K/V already in the cache).

    Request ``b`` owns query rows ``qo_indptr[b] .. qo_indptr[b+1]-1``; its query ``i`` sits
    at position ``prefix_lens[b] + i`` and, when ``causal``, sees keys at positions up to
    and including its own. Returns ``[T, Hq, Dv]`` fp32 (rows of no request stay zero).
    """
    total, num_heads = q.shape[:2]
    out = torch.zeros(total, num_heads, v_cache.shape[-1], dtype=torch.float32, device=q.device)
    for b in range(qo_indptr.shape[0] - 1):
        start, end = int(qo_indptr[b]), int(qo_indptr[b + 1])
        prefix = int(prefix_lens[b])
        if end == start:
            continue
        length = prefix + end - start
        k = gather_kv(k_cache, page_table[b], length)
        v = gather_kv(v_cache, page_table[b], length)
        query_pos = prefix + torch.arange(end - start, device=q.device)
        key_pos = torch.arange(length, device=q.device)
        if causal:
            visible = key_pos[None, :] <= query_pos[:, None]
        else:
            visible = torch.ones(end - start, length, dtype=torch.bool, device=q.device)
        out[start:end] = attention(q[start:end], k, v, sm_scale, visible)
    return out
