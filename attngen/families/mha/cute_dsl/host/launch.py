"""Host side of the CuTe DSL MHA kernels: check every argument, then launch (prefill,
extend, verify, split-KV decode). Nothing here reads device memory, and the compiled kernel
is looked up, not rebuilt, after a module's first call of a config."""

from __future__ import annotations

from typing import Any

import torch

from attngen.families.mha.cute_dsl.config import MhaCuteConfig, MhaCuteTraits
from attngen.families.mha.cute_dsl.host.compile import (
    combine_shape,
    compiled_fwd,
    decode_shape,
    fwd_shape,
    verify_shape,
)
from attngen.runtime.checks import check_at_least, check_tensor, fail


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        fail(name, "a Python int", type(value).__name__)
    check_at_least(name, value, 0)
    return value


def _check_rows(name: str, t: object, shape: list[int | None], config: MhaCuteConfig,
                device: torch.device | None = None, dtype: str | None = None) -> torch.Tensor:  # fmt: skip
    """q, out, k/v or a cache: the config's dtype (or ``dtype``: a cache's), stride 1 in the
    last dim, 16-byte rows."""
    t = check_tensor(
        name, t, dtype=getattr(torch, dtype or config.dtype), shape=shape, device=device,
        last_dim_contiguous=True,
    )  # fmt: skip
    if t.device.type != "cuda":
        fail(name, "a CUDA tensor", t.device)
    row_strides = [s * t.element_size() for s in t.stride()[:-1]]
    if t.data_ptr() % 16 or any(s % 16 for s in row_strides):
        got = f"data_ptr % 16 = {t.data_ptr() % 16}, strides {t.stride()}"
        fail(name, "a 16-byte aligned data pointer and 16-byte multiple strides", got)
    return t


def _check_index(name: str, t: object, dims: int, device: torch.device) -> torch.Tensor:
    return check_tensor(
        name, t, dtype=torch.int32, shape=[None] * dims, device=device, last_dim_contiguous=True
    )


def _check_common(config: MhaCuteConfig, traits: MhaCuteTraits, sm_scale: object,
                  q: torch.Tensor, sinks: object) -> int:  # fmt: skip
    """sm_scale, q and sinks; returns the number of kv heads."""
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)):
        fail("sm_scale", "a Python float", type(sm_scale).__name__)
    _check_rows("q", q, [None, None, config.head_dim], config)
    num_heads = q.shape[1]
    if num_heads == 0 or num_heads % config.gqa_group:
        fail("q", f"a head count divisible by gqa_group ({config.gqa_group})", num_heads)
    if traits.mask.sinks:
        check_tensor("sinks", sinks, dtype=torch.float32, shape=[num_heads], device=q.device,
                     contiguous=True)  # fmt: skip
    elif sinks is not None:
        fail("sinks", "None (this module's mask has no sinks)", "a tensor")
    return num_heads // config.gqa_group


def _cute_rows(t: torch.Tensor) -> Any:
    from cutlass.cute.runtime import from_dlpack

    return from_dlpack(t, assumed_align=16).mark_layout_dynamic(leading_dim=t.dim() - 1)


def _cute_small(t: torch.Tensor | None) -> Any:
    if t is None:
        return None
    from cutlass.cute.runtime import from_dlpack

    align = min(4, t.element_size())  # int32 / fp32 tensors; the trees' uint8 masks
    return from_dlpack(t, assumed_align=align).mark_layout_dynamic(leading_dim=t.dim() - 1)


def launch_args(tensors: tuple, small: tuple, lse: torch.Tensor, sm_scale: float,
                max_rows: int, write_lse: bool, stream: Any) -> tuple:  # fmt: skip
    """The compiled kernel's arguments: row tensors (q, k, v, out), small ones (lengths,
    page table, sinks, a tree verify's masks and offsets; None where absent), the LSE rows
    (written when write_lse), scalars and the stream. Their types are part of the compiled
    kernel's on-disk identity (host.compile.LAUNCH_ARGS)."""
    import cutlass

    return (
        *(_cute_rows(t) for t in tensors),
        *(_cute_small(t) for t in small),
        _cute_small(lse),
        cutlass.Float32(sm_scale),
        cutlass.Int32(max_rows),
        cutlass.Int32(1 if write_lse else 0),
        stream,
    )


_NO_LSE: dict[torch.device, torch.Tensor] = {}


def _no_lse(device: torch.device) -> torch.Tensor:
    """The one-element LSE argument of a call that wants no LSE (never written)."""
    t = _NO_LSE.get(device)
    if t is None:
        t = _NO_LSE[device] = torch.empty((1, 1), dtype=torch.float32, device=device)
    return t


def _check_lse(lse: object, tokens: int, num_heads: int, device: torch.device) -> None:
    check_tensor("lse", lse, dtype=torch.float32, shape=[tokens, num_heads], device=device,
                 contiguous=True)  # fmt: skip


def _launch(arch: str, shape: Any, tensors: tuple, small: tuple, sm_scale: float,
            max_rows: int, lse: torch.Tensor | None = None) -> None:  # fmt: skip
    import cuda.bindings.driver as cuda

    device = tensors[0].device
    stream = cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)
    lse_arg = _no_lse(device) if lse is None else lse
    args = launch_args(tensors, small, lse_arg, sm_scale, max_rows, lse is not None, stream)
    compiled_fwd(arch, shape, args)(*args)


def prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    out: torch.Tensor,
    *,
    max_seq_len: int,
    config: MhaCuteConfig,
    traits: MhaCuteTraits,
    sm_scale: float,
    sinks: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> None:
    """Ragged attention with no cache: q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, Dv].

    Request b owns rows cu_seqlens[b] .. cu_seqlens[b+1]-1 of q, k, v and out; max_seq_len
    (host int) must be >= every request's length (it sizes the grid). lse: None, or
    [T, Hq] fp32 (contiguous) that gets each row's natural-log sum of exp of its scaled
    scores (the sinks included; -inf for a row that sees no key), as a merge of partial
    attentions needs."""
    _check_int("max_seq_len", max_seq_len)
    num_kv_heads = _check_common(config, traits, sm_scale, q, sinks)
    tokens, num_heads = q.shape[0], q.shape[1]
    _check_rows("k", k, [tokens, num_kv_heads, config.head_dim], config, q.device)
    _check_rows("v", v, [tokens, num_kv_heads, config.v_head_dim], config, q.device)
    _check_rows("out", out, [tokens, num_heads, config.v_head_dim], config, q.device)
    _check_index("cu_seqlens", cu_seqlens, 1, q.device)
    if lse is not None:
        _check_lse(lse, tokens, num_heads, q.device)
    if cu_seqlens.shape[0] < 2 or max_seq_len == 0 or tokens == 0:
        return
    shape = fwd_shape(config, traits, paged=False)
    small = (cu_seqlens, None, None, sinks, None, None)
    _launch(config.arch, shape, (q, k, v, out), small, sm_scale, max_seq_len, lse)


def extend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    qo_indptr: torch.Tensor,
    prefix_lens: torch.Tensor,
    out: torch.Tensor,
    *,
    max_extend_len: int,
    config: MhaCuteConfig,
    traits: MhaCuteTraits,
    sm_scale: float,
    sinks: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    trusted_metadata: bool = False,
) -> None:
    """Ragged extend of q [T, Hq, D] into out [T, Hq, Dv] over the paged cache
    [pages, page_size, Hkv, D]: request b owns rows qo_indptr[b] .. qo_indptr[b+1]-1 at
    positions prefix_lens[b] + i; its new K/V are already in the cache, read through
    page_table[b, j] (whole key tiles out of each page). max_extend_len (host int) sizes the grid.
    k_scale / v_scale: None (this backend reads caches of the activation dtype)."""
    _check_int("max_extend_len", max_extend_len)
    _paged_forward(
        (q, k_cache, v_cache, page_table, qo_indptr, prefix_lens, out),
        fwd_shape(config, traits, paged=True), max_rows=max_extend_len, config=config,
        traits=traits, sm_scale=sm_scale, sinks=sinks, k_scale=k_scale, v_scale=v_scale,
        trusted_metadata=trusted_metadata,
    )  # fmt: skip


def _paged_forward(
    tensors: tuple[torch.Tensor, ...],
    shape: Any,
    *,
    max_rows: int,
    config: MhaCuteConfig,
    traits: MhaCuteTraits,
    sm_scale: float,
    sinks: torch.Tensor | None,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    trusted_metadata: bool,
    tree: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None),
) -> None:
    """Extend and verify: check the tensors they share (``tensors``: q, k_cache, v_cache,
    page_table, qo_indptr, prefix_lens, out), then launch ``shape``'s kernel (``tree``: a
    tree verify's masks and their offsets, checked by the caller)."""
    q, k_cache, v_cache, page_table, qo_indptr, prefix_lens, out = tensors
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is not None:
            fail(name, f"None (a {config.kv_dtype} cache has no scales)", "a tensor")
    num_kv_heads = _check_common(config, traits, sm_scale, q, sinks)
    tokens, num_heads = q.shape[0], q.shape[1]
    k_shape = [None, config.page_size, num_kv_heads, config.head_dim]
    _check_rows("k_cache", k_cache, k_shape, config, q.device)
    v_shape = [k_cache.shape[0], config.page_size, num_kv_heads, config.v_head_dim]
    _check_rows("v_cache", v_cache, v_shape, config, q.device)
    _check_rows("out", out, [tokens, num_heads, config.v_head_dim], config, q.device)
    _check_index("page_table", page_table, 2, q.device)
    _check_index("qo_indptr", qo_indptr, 1, q.device)
    _check_index("prefix_lens", prefix_lens, 1, q.device)
    batch = qo_indptr.shape[0] - 1
    if not trusted_metadata:
        check_at_least("page_table rows", page_table.shape[0], batch)
        check_at_least("prefix_lens rows", prefix_lens.shape[0], batch)
        if tree[1] is not None:
            check_at_least("tree_mask_indptr rows", tree[1].shape[0], batch)
    if batch < 1 or max_rows == 0 or tokens == 0:
        return
    small = (qo_indptr, prefix_lens, page_table, sinks, *tree)
    _launch(config.arch, shape, (q, k_cache, v_cache, out), small, sm_scale, max_rows)


def verify(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    qo_indptr: torch.Tensor,
    prefix_lens: torch.Tensor,
    out: torch.Tensor,
    *,
    config: MhaCuteConfig,
    traits: MhaCuteTraits,
    sm_scale: float,
    sinks: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    tree_mask: torch.Tensor | None = None,
    tree_mask_indptr: torch.Tensor | None = None,
    trusted_metadata: bool = False,
) -> None:
    """Speculative target verify: at most config.num_draft_tokens rows per request, every
    draft row seeing the whole cached prefix, with a grid fixed by the config and the batch
    (CUDA-graph capturable). Draft chains (config.spec_topk == 1) are causal over the drafts
    and run the extend kernel. Draft trees (spec_topk > 1) need tree_mask (uint8,
    bit-packed, contiguous) and tree_mask_indptr (int32 [>= B], the byte where each
    request's mask starts): draft row i of a request with n rows sees draft j when bit
    i * n + j of its mask is set (little-endian bits within a byte); the offsets and mask
    bytes are the caller's promise, as the page table is (not read on the host)."""
    if config.spec_topk < 1:
        fail("config.spec_topk", ">= 1 (a speculative config)", config.spec_topk)
    tree = config.spec_topk > 1
    if tree:
        check_tensor("tree_mask", tree_mask, dtype=torch.uint8, shape=[None], device=q.device,
                     contiguous=True)  # fmt: skip
        _check_index("tree_mask_indptr", tree_mask_indptr, 1, q.device)
    elif tree_mask is not None or tree_mask_indptr is not None:
        fail("tree_mask", "None for a draft chain (spec_topk 1: causal drafts)", "a tensor")
    _paged_forward(
        (q, k_cache, v_cache, page_table, qo_indptr, prefix_lens, out),
        verify_shape(config, traits), max_rows=config.num_draft_tokens, config=config,
        traits=traits, sm_scale=sm_scale, sinks=sinks, k_scale=k_scale, v_scale=v_scale,
        trusted_metadata=trusted_metadata, tree=(tree_mask, tree_mask_indptr),
    )  # fmt: skip


def decode_workspace(
    config: MhaCuteConfig, *, batch_size: int, num_q_heads: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The scratch one eager decode call needs: each split's output rows and log-sum-exps
    (fp32), as the split kernel writes and the combine reads them; a CUDA-graph capture
    allocates the same buffers once (the plan's graph buffers partial_o / partial_lse)."""
    partial = (batch_size, num_q_heads, config.max_splits)
    partial_o = torch.empty(partial + (config.v_head_dim,), dtype=torch.float32, device=device)
    return partial_o, torch.empty(partial, dtype=torch.float32, device=device)


def _check_split_buffers(partial_o: object, partial_lse: object, batch: int, num_heads: int,
                         config: MhaCuteConfig, device: torch.device) -> None:  # fmt: skip
    splits = config.max_splits
    o = check_tensor("partial_o", partial_o, dtype=torch.float32,
                     shape=[None, num_heads, splits, config.v_head_dim], device=device,
                     contiguous=True)  # fmt: skip
    lse = check_tensor("partial_lse", partial_lse, dtype=torch.float32,
                       shape=[o.shape[0], num_heads, splits], device=device,
                       contiguous=True)  # fmt: skip
    check_at_least("partial_o rows", lse.shape[0], batch)


def decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    num_splits: torch.Tensor,
    out: torch.Tensor,
    partial_o: torch.Tensor,
    partial_lse: torch.Tensor,
    *,
    config: MhaCuteConfig,
    traits: MhaCuteTraits,
    sm_scale: float,
    sinks: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    trusted_metadata: bool = False,
) -> None:
    """Split-KV paged decode of q [B, Hq, D] into out [B, Hq, Dv]; no host sync (CUDA-graph
    capturable: both grids are fixed by B, the heads and config.max_splits).

    Request b's seq_lens[b] keys (its new token already in the cache at position
    seq_lens[b] - 1), read through page_table[b, j], are split num_splits[b] ways (1 ..
    config.max_splits); stage 1 writes each split's rows into partial_o [>= B, Hq,
    max_splits, Dv] and partial_lse [>= B, Hq, max_splits] (fp32, contiguous), stage 2
    merges them into out (with the sinks, when the mask has them). seq_lens[b] == 0 gives
    zeros. k_scale / v_scale: the per-tensor dequant scales ([1] fp32 on q's device) of an
    fp8 e4m3 cache (config.kv_dtype "float8_e4m3fn"; K's folds into the softmax scale, V's
    into the output), else None.

    trusted_metadata: the page table, lengths and splits come from an attngen backend that
    built them; the tensors' shapes, dtypes and strides are checked either way.
    """
    fp8 = config.kv_dtype != config.dtype
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if fp8:
            check_tensor(name, scale, dtype=torch.float32, shape=[1], device=q.device,
                         contiguous=True)  # fmt: skip
        elif scale is not None:
            fail(name, f"None (a {config.kv_dtype} cache has no scales)", "a tensor")
    if "decode" not in traits.phases:
        fail("phase", f"one of {traits.phases} (this module generates no decode)", "decode")
    num_kv_heads = _check_common(config, traits, sm_scale, q, sinks)
    batch, num_heads = q.shape[0], q.shape[1]
    k_shape = [None, config.page_size, num_kv_heads, config.head_dim]
    _check_rows("k_cache", k_cache, k_shape, config, q.device, config.kv_dtype)
    v_shape = [k_cache.shape[0], config.page_size, num_kv_heads, config.v_head_dim]
    _check_rows("v_cache", v_cache, v_shape, config, q.device, config.kv_dtype)
    _check_rows("out", out, [batch, num_heads, config.v_head_dim], config, q.device)
    _check_index("page_table", page_table, 2, q.device)
    _check_index("seq_lens", seq_lens, 1, q.device)
    _check_index("num_splits", num_splits, 1, q.device)
    _check_split_buffers(partial_o, partial_lse, batch, num_heads, config, q.device)
    if not trusted_metadata:
        for name, t in (("page_table", page_table), ("seq_lens", seq_lens),
                        ("num_splits", num_splits)):  # fmt: skip
            check_at_least(f"{name} rows", t.shape[0], batch)
    if batch == 0:
        return
    import cuda.bindings.driver as cuda
    import cutlass

    stream = cuda.CUstream(torch.cuda.current_stream(q.device).cuda_stream)
    split_args = (
        *(_cute_rows(t) for t in (q, k_cache, v_cache)),
        *(_cute_small(t) for t in (partial_o, seq_lens, num_splits, page_table, partial_lse)),
        *(_cute_small(t) for t in ((k_scale, v_scale) if fp8 else (None, None))),
        cutlass.Float32(sm_scale),
        stream,
    )
    compiled_fwd(config.arch, decode_shape(config, traits), split_args)(*split_args)
    combine_args = (
        *(_cute_small(t) for t in (partial_o, partial_lse, num_splits, sinks)),
        _cute_rows(out),
        stream,
    )
    compiled_fwd(config.arch, combine_shape(config, traits), combine_args)(*combine_args)
