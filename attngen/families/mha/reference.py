"""Torch oracle for paged multi-head attention (MHA / GQA), decode and extend.

Plain float64 math, one request at a time, written to be read rather than to be fast. The
generated Triton kernels are checked against these functions.

Layouts (the same as the kernels'):

- ``k_cache`` ``[num_pages, page_size, Hkv, D]``, ``v_cache`` ``[num_pages, page_size, Hkv, Dv]``
- ``page_table[b, j]`` is the physical page that holds tokens ``j * page_size`` ..
  ``(j + 1) * page_size - 1`` of request ``b``
- query head ``h`` reads kv head ``h // (Hq // Hkv)`` (GQA groups are contiguous)

Masks and score modifiers follow the neutral hooks :class:`attngen.hooks.MaskHooks`
(causal, sliding window, logit softcap, attention sinks); ``mask=None`` means
``MaskHooks()``: causal, nothing else.
"""

from __future__ import annotations

import torch

from attngen.hooks import MaskHooks


def gather_kv(cache: torch.Tensor, page_table_row: torch.Tensor, length: int) -> torch.Tensor:
    """Tokens ``0 .. length-1`` of one request, in logical order: ``[length, Hkv, D]``."""
    page_size = cache.shape[1]
    positions = torch.arange(length, device=cache.device)
    pages = page_table_row[positions // page_size].long()
    slots = positions % page_size
    return cache[pages, slots]


def visible_keys(query_pos: torch.Tensor, length: int, mask: MaskHooks) -> torch.Tensor:
    """``[M, length]``: True where the query at ``query_pos[m]`` may attend key position ``n``."""
    key_pos = torch.arange(length, device=query_pos.device)[None, :]
    query_pos = query_pos[:, None]
    visible = torch.ones(query_pos.shape[0], length, dtype=torch.bool, device=query_pos.device)
    if mask.causal:
        visible &= key_pos <= query_pos
    if mask.window_left is not None:
        visible &= key_pos >= query_pos - mask.window_left
    return visible


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sm_scale: float,
    visible: torch.Tensor,
    logit_softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax attention of ``q [M, Hq, D]`` over ``k [N, Hkv, D]``, ``v [N, Hkv, Dv]``.

    ``visible [M, N]`` is True where query ``m`` may attend key ``n``. Scores are
    ``s = q.k * sm_scale``, capped to ``logit_softcap * tanh(s / logit_softcap)`` when the
    cap is > 0. ``sinks [Hq]`` (natural-log logits) join each head's softmax denominator
    only. A row with no visible key gives zeros. Computed in float64 from the inputs as
    given (already rounded to their dtype); returns ``[M, Hq, Dv]`` float64.
    """
    used = visible.any(dim=0)  # keys no query sees are not read (they may be stale or NaN)
    k, v, visible = k[used], v[used], visible[:, used]
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("mhd,nhd->hmn", q.double(), k) * sm_scale
    if logit_softcap > 0:
        scores = logit_softcap * torch.tanh(scores / logit_softcap)
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        # one extra logit per head in the softmax, whose probability multiplies nothing
        sink_column = sinks.double()[:, None, None].expand(-1, scores.shape[1], 1)
        probs = torch.softmax(torch.cat([scores, sink_column], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    probs = torch.nan_to_num(probs, nan=0.0)  # rows with no visible key (and no sink)
    return torch.einsum("hmn,nhd->mhd", probs, v)


def paged_decode_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    *,
    mask: MaskHooks | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """One new query token per request over its cached sequence.

    ``q [B, Hq, D]``; request ``b``'s query sits at position ``seq_lens[b] - 1`` and attends
    cache positions ``0 .. seq_lens[b]-1`` (those in its window, if ``mask`` has one). A
    request with ``seq_lens[b] == 0`` gets zeros. Returns ``[B, Hq, Dv]`` float64.
    """
    mask = MaskHooks() if mask is None else mask
    batch, num_heads = q.shape[:2]
    out = torch.zeros(batch, num_heads, v_cache.shape[-1], dtype=torch.float64, device=q.device)
    for b in range(batch):
        length = int(seq_lens[b])
        if length == 0:
            continue
        k = gather_kv(k_cache, page_table[b], length)
        v = gather_kv(v_cache, page_table[b], length)
        query_pos = torch.tensor([length - 1], device=q.device)
        visible = visible_keys(query_pos, length, mask)
        out[b] = attention(q[b : b + 1], k, v, sm_scale, visible, mask.logit_softcap or 0.0, sinks)[
            0
        ]
    return out


def paged_extend_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    qo_indptr: torch.Tensor,
    prefix_lens: torch.Tensor,
    sm_scale: float,
    *,
    mask: MaskHooks | None = None,
    sinks: torch.Tensor | None = None,
    tree_masks: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Ragged new tokens over a paged cached prefix (their own K/V already in the cache).

    Request ``b`` owns query rows ``qo_indptr[b] .. qo_indptr[b+1]-1``; its query ``i`` sits
    at position ``prefix_lens[b] + i`` and sees the keys ``mask`` allows among positions
    ``0 .. prefix_lens[b] + extend_len - 1``. With ``tree_masks`` (speculative verify of
    draft trees), query ``i`` sees the whole prefix and new key ``j`` iff
    ``tree_masks[b][i, j]``. Returns ``[T, Hq, Dv]`` float64 (rows of no request stay zero).
    """
    mask = MaskHooks() if mask is None else mask
    total, num_heads = q.shape[:2]
    out = torch.zeros(total, num_heads, v_cache.shape[-1], dtype=torch.float64, device=q.device)
    for b in range(qo_indptr.shape[0] - 1):
        start, end = int(qo_indptr[b]), int(qo_indptr[b + 1])
        prefix = int(prefix_lens[b])
        if end == start:
            continue
        length = prefix + end - start
        k = gather_kv(k_cache, page_table[b], length)
        v = gather_kv(v_cache, page_table[b], length)
        query_pos = prefix + torch.arange(end - start, device=q.device)
        visible = visible_keys(query_pos, length, mask)
        if tree_masks is not None:
            visible[:, :prefix] = True
            visible[:, prefix:] = tree_masks[b].to(visible.device)
        out[start:end] = attention(
            q[start:end], k, v, sm_scale, visible, mask.logit_softcap or 0.0, sinks
        )
    return out


def prefill_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    sm_scale: float,
    *,
    mask: MaskHooks | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cache-free ragged attention: request ``b`` is rows ``cu_seqlens[b] .. [b+1]-1`` of
    ``q [T, Hq, D]``, ``k [T, Hkv, D]`` and ``v [T, Hkv, Dv]``; query ``i`` sits at
    position ``i``. Returns ``[T, Hq, Dv]`` float64."""
    mask = MaskHooks() if mask is None else mask
    out = torch.zeros(*q.shape[:2], v.shape[-1], dtype=torch.float64, device=q.device)
    for b in range(cu_seqlens.shape[0] - 1):
        start, end = int(cu_seqlens[b]), int(cu_seqlens[b + 1])
        if end == start:
            continue
        visible = visible_keys(torch.arange(end - start, device=q.device), end - start, mask)
        out[start:end] = attention(
            q[start:end],
            k[start:end],
            v[start:end],
            sm_scale,
            visible,
            mask.logit_softcap or 0.0,
            sinks,
        )
    return out
