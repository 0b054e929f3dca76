"""Host side of the MHA kernels: check every argument, then launch (decode, extend, verify,
prefill). Nothing here reads device memory: the launchers are CUDA-graph capturable."""

from __future__ import annotations

import torch
import triton

from attngen.families.mha.triton.config import MhaTraits, MhaTritonConfig
from attngen.families.mha.triton.host.checks import (
    check_block_scales,
    check_config,
    check_io,
    check_kv_scales,
    check_lengths,
    check_paged_kv,
    check_sinks,
    check_split_buffers,
)
from attngen.families.mha.triton.host.options import (
    block_scale_args,
    decode_combine_options,
    decode_split_options,
    extend_options,
)
from attngen.families.mha.triton.kernels.decode import decode_combine_kernel, decode_split_kernel
from attngen.families.mha.triton.kernels.extend import extend_kernel
from attngen.runtime.checks import check_at_least, check_tensor, fail

# prefill reads no NVFP4 block scales: their strides are unused
NO_BLOCK_SCALE_STRIDES = dict.fromkeys(
    ("stride_ksp", "stride_kss", "stride_ksh", "stride_vsp", "stride_vss", "stride_vsh"), 0
)


def decode_workspace(
    config: MhaTritonConfig, *, batch_size: int, num_q_heads: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The scratch one eager decode call needs (split outputs and their log-sum-exps), in
    the layout decode's stage 1 writes and stage 2 reads; a CUDA-graph capture allocates
    the same buffers once (the plan's graph buffers partial_o / partial_lse)."""
    partial = (batch_size, num_q_heads, config.max_splits)
    partial_o = torch.empty(partial + (config.v_head_dim,), dtype=torch.float32, device=device)
    return partial_o, torch.empty(partial, dtype=torch.float32, device=device)


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
    config: MhaTritonConfig,
    traits: MhaTraits,
    sm_scale: float,
    sinks: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    k_block_scales: torch.Tensor | None = None,
    v_block_scales: torch.Tensor | None = None,
    trusted_metadata: bool = False,
) -> None:
    """Paged decode of q [B, Hq, D] into out [B, Hq, Dv]; no host sync (graph-capturable).

    seq_lens[b] keys of request b (the window's, under the mask) are split num_splits[b] ways
    (1 .. config.max_splits); partial_o [>=B, Hq, max_splits, Dv] and partial_lse [>=B, Hq,
    max_splits] (fp32) hold the splits between the two stages. seq_lens[b] == 0 gives
    zeros. sinks: fp32 [Hq] when the mask has sinks, else None. k_scale / v_scale: dequant
    scales of a quantized cache ([1] per tensor, [Hkv] per head), else None. An NVFP4 cache
    (kv_dtype "nvfp4": uint8 [pages, ps, Hkv, D/2] codes) also takes k_block_scales /
    v_block_scales (float8_e4m3fn [pages, ps, Hkv, D/16]); k_scale / v_scale are then its
    per-tensor global scales.

    trusted_metadata: the caches, page table, lengths, splits, out and workspace come from
    an attngen backend that built or checked them (pool at construction, metadata per
    forward); only q, sinks and the scales are checked here, once per layer call.
    """
    if not trusted_metadata:
        check_config(config, sm_scale)
    check_io("q", q, [None, None, config.head_dim], config)
    batch, num_heads = q.shape[0], q.shape[1]
    num_kv_heads = num_heads // config.gqa_group
    if not trusted_metadata:
        num_kv_heads = check_paged_kv(q, k_cache, v_cache, page_table, batch, config)
        check_lengths("seq_lens", seq_lens, batch, q.device)
        check_lengths("num_splits", num_splits, batch, q.device)
        check_io("out", out, [batch, num_heads, config.v_head_dim], config, q.device)
        check_split_buffers(partial_o, partial_lse, q, config)
        check_block_scales(k_block_scales, v_block_scales, k_cache, v_cache, config)
    check_sinks(sinks, q, traits.mask.sinks)
    check_kv_scales(k_scale, v_scale, num_kv_heads, config, q.device)
    if batch == 0:
        return

    block_scales = block_scale_args(config, traits, k_block_scales, v_block_scales)
    # -- stage 1: one program per (request, kv head, split) ----
    decode_split_kernel[(batch, num_kv_heads, config.max_splits)](
        q,
        k_cache,
        v_cache,
        page_table,
        seq_lens,
        num_splits,
        k_scale,
        v_scale,
        *block_scales[:2],
        partial_o,
        partial_lse,
        float(sm_scale),
        *q.stride()[:2],
        *k_cache.stride()[:3],
        *v_cache.stride()[:3],
        *block_scales[2:],
        page_table.stride(0),
        *partial_o.stride()[:3],
        *partial_lse.stride()[:2],
        **decode_split_options(config, traits),
    )
    # -- stage 2: one program per (request, query head) ----
    decode_combine_kernel[(batch, num_heads)](
        partial_o,
        partial_lse,
        num_splits,
        sinks,
        out,
        *partial_o.stride()[:3],
        *partial_lse.stride()[:2],
        *out.stride()[:2],
        **decode_combine_options(config, traits),
    )


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
    config: MhaTritonConfig,
    traits: MhaTraits,
    sm_scale: float,
    sinks: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    k_block_scales: torch.Tensor | None = None,
    v_block_scales: torch.Tensor | None = None,
    trusted_metadata: bool = False,
) -> None:
    """Ragged extend of q [T, Hq, D] into out [T, Hq, Dv] over the paged cache.

    Request b owns rows qo_indptr[b] .. qo_indptr[b+1]-1, at positions prefix_lens[b] + i;
    its new K/V are already in the cache. max_extend_len (host int) must be >= every
    request's extend length: it sizes the grid, and rows beyond it are not computed.
    sinks: fp32 [Hq] when the mask has sinks, else None. k_scale / v_scale as for decode. Also
    serves draft_extend (the draft model's causal extend over accepted tokens).
    trusted_metadata: as for decode.
    """
    check_config(config, sm_scale)
    if isinstance(max_extend_len, bool) or not isinstance(max_extend_len, int):
        fail("max_extend_len", "a Python int", type(max_extend_len).__name__)
    check_at_least("max_extend_len", max_extend_len, 0)
    _launch_paged_extend(
        q,
        k_cache,
        v_cache,
        page_table,
        qo_indptr,
        prefix_lens,
        out,
        max_extend_len,
        config,
        traits,
        sm_scale,
        sinks,
        (k_scale, v_scale, k_block_scales, v_block_scales),
        None,
        None,
        verify=False,
        trusted_metadata=trusted_metadata,
    )


def verify(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    qo_indptr: torch.Tensor,
    prefix_lens: torch.Tensor,
    out: torch.Tensor,
    *,
    config: MhaTritonConfig,
    traits: MhaTraits,
    sm_scale: float,
    sinks: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    k_block_scales: torch.Tensor | None = None,
    v_block_scales: torch.Tensor | None = None,
    tree_mask: torch.Tensor | None = None,
    tree_mask_indptr: torch.Tensor | None = None,
    trusted_metadata: bool = False,
) -> None:
    """Speculative target verify: config.num_draft_tokens draft rows per request.

    As extend, with every request's extend length at most num_draft_tokens (the grid is
    fixed by the config and B: graph-capturable). Chains (config.spec_topk == 1) are causal
    over the drafts; trees (spec_topk > 1) need tree_mask (uint8, bit-packed) and
    tree_mask_indptr (int32 [>= B], byte offset of each request's mask): draft row i sees
    draft j when bit i * n + j of the request's mask is set (n its draft count; little-
    endian bits within a byte); every draft row sees the whole cached prefix.
    trusted_metadata: as for decode (the tree mask included).
    """
    check_config(config, sm_scale)
    if config.spec_topk < 1:
        fail("config.spec_topk", ">= 1 (a speculative config)", config.spec_topk)
    tree = config.spec_topk > 1
    if tree:
        if not trusted_metadata:
            check_tensor("tree_mask", tree_mask, dtype=torch.uint8, shape=[None], device=q.device)
            check_lengths("tree_mask_indptr", tree_mask_indptr, qo_indptr.shape[0] - 1, q.device)
    elif tree_mask is not None or tree_mask_indptr is not None:
        fail("tree_mask", "None for a draft chain (spec_topk 1: causal drafts)", "a tensor")
    _launch_paged_extend(
        q,
        k_cache,
        v_cache,
        page_table,
        qo_indptr,
        prefix_lens,
        out,
        config.num_draft_tokens,
        config,
        traits,
        sm_scale,
        sinks,
        (k_scale, v_scale, k_block_scales, v_block_scales),
        tree_mask,
        tree_mask_indptr,
        verify=True,
        trusted_metadata=trusted_metadata,
    )


def _launch_paged_extend(
    q,
    k_cache,
    v_cache,
    page_table,
    qo_indptr,
    prefix_lens,
    out,
    max_extend_len,
    config,
    traits,
    sm_scale,
    sinks,
    scales,
    tree_mask,
    tree_mask_indptr,
    *,
    verify: bool,
    trusted_metadata: bool,
) -> None:
    """Check what extend and verify share, then launch (verify: tree_mask or chain).

    scales: (k_scale, v_scale, k_block_scales, v_block_scales), as decode takes them."""
    k_scale, v_scale, k_block_scales, v_block_scales = scales
    check_io("q", q, [None, None, config.head_dim], config)
    num_heads = q.shape[1]
    num_kv_heads = num_heads // config.gqa_group
    if not trusted_metadata:
        check_lengths("qo_indptr", qo_indptr, 1, q.device)
        batch = qo_indptr.shape[0] - 1
        num_kv_heads = check_paged_kv(q, k_cache, v_cache, page_table, batch, config)
        check_lengths("prefix_lens", prefix_lens, batch, q.device)
        check_io("out", out, [q.shape[0], num_heads, config.v_head_dim], config, q.device)
        check_block_scales(k_block_scales, v_block_scales, k_cache, v_cache, config)
    batch = qo_indptr.shape[0] - 1
    check_sinks(sinks, q, traits.mask.sinks)
    check_kv_scales(k_scale, v_scale, num_kv_heads, config, q.device)
    if batch == 0 or max_extend_len == 0 or q.shape[0] == 0:
        return
    block_scales = block_scale_args(config, traits, k_block_scales, v_block_scales)
    options = extend_options(config, traits, tree=tree_mask is not None, verify=verify)
    if options["PACK_GQA"]:  # programs per (row tile of tokens x group, kv head, request)
        rows = max_extend_len * config.gqa_group
        grid = (triton.cdiv(rows, options["BLOCK_M"]), num_kv_heads, batch)
    else:
        grid = (triton.cdiv(max_extend_len, options["BLOCK_M"]), num_heads, batch)
    extend_kernel[grid](
        q,
        k_cache,
        v_cache,
        page_table,
        qo_indptr,
        prefix_lens,
        sinks,
        k_scale,
        v_scale,
        *block_scales[:2],
        tree_mask,
        tree_mask_indptr,
        out,
        float(sm_scale),
        *q.stride()[:2],
        *k_cache.stride()[:3],
        *v_cache.stride()[:3],
        *block_scales[2:],
        page_table.stride(0),
        *out.stride()[:2],
        **options,
    )


def prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    out: torch.Tensor,
    *,
    max_seq_len: int,
    config: MhaTritonConfig,
    traits: MhaTraits,
    sm_scale: float,
    sinks: torch.Tensor | None = None,
) -> None:
    """Ragged attention with no cache: q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, Dv].

    Request b owns rows cu_seqlens[b] .. cu_seqlens[b+1]-1 of q, k, v and out (encoder /
    vision-tower attention, or a first prefill chunk). The activation dtype throughout.
    """
    check_config(config, sm_scale)
    if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int):
        fail("max_seq_len", "a Python int", type(max_seq_len).__name__)
    check_at_least("max_seq_len", max_seq_len, 0)
    check_io("q", q, [None, None, config.head_dim], config)
    tokens, num_heads = q.shape[0], q.shape[1]
    if num_heads == 0 or num_heads % config.gqa_group:
        fail("q", f"a head count divisible by gqa_group ({config.gqa_group})", num_heads)
    num_kv_heads = num_heads // config.gqa_group
    check_io("k", k, [tokens, num_kv_heads, config.head_dim], config, q.device)
    check_io("v", v, [tokens, num_kv_heads, config.v_head_dim], config, q.device)
    check_lengths("cu_seqlens", cu_seqlens, 1, q.device)
    check_io("out", out, [tokens, num_heads, config.v_head_dim], config, q.device)
    check_sinks(sinks, q, traits.mask.sinks)
    batch = cu_seqlens.shape[0] - 1
    if batch == 0 or max_seq_len == 0 or tokens == 0:
        return

    options = extend_options(config, traits, paged=False)
    grid = (triton.cdiv(max_seq_len, options["BLOCK_M"]), num_heads, batch)
    extend_kernel[grid](
        Q=q,
        K_CACHE=k,  # contiguous [T, Hkv, D]: "page" t holds token t
        V_CACHE=v,
        PAGE_TABLE=None,
        QO_INDPTR=cu_seqlens,
        PREFIX_LENS=None,
        SINKS=sinks,
        K_SCALE=None,
        V_SCALE=None,
        K_BSCALE=None,
        V_BSCALE=None,
        TREE_MASK=None,
        TREE_MASK_INDPTR=None,
        OUT=out,
        sm_scale=float(sm_scale),
        stride_qt=q.stride(0),
        stride_qh=q.stride(1),
        stride_kp=0,
        stride_ks=k.stride(0),
        stride_kh=k.stride(1),
        stride_vp=0,
        stride_vs=v.stride(0),
        stride_vh=v.stride(1),
        **NO_BLOCK_SCALE_STRIDES,
        stride_ptb=0,
        stride_ot=out.stride(0),
        stride_oh=out.stride(1),
        **options,
    )
