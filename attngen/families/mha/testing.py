"""MHA test helpers: the float64 oracle's output for a built paged batch, read through the
builder's own page table (the family's counterpart of MLA's and GDN's ``testing`` modules)."""

from __future__ import annotations

import torch

from attngen.families.mha.reference import paged_decode_ref, paged_extend_ref
from attngen.hooks import MaskHooks
from attngen.runtime.batch import ForwardMode
from attngen.runtime.checks import AttngenInputError
from attngen.runtime.nvfp4 import dequantize_nvfp4
from attngen.runtime.pools import FP8_DTYPES
from attngen.testing.batches import PagedBatch


def oracle_output(
    pb: PagedBatch,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    sm_scale: float,
    *,
    mask: MaskHooks | None = None,
    sinks: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    k_block_scales: torch.Tensor | None = None,
    v_block_scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """The torch oracle's ``[T, Hq, Dv]`` float64 output for ``pb``, read through the builder's
    own page table (not a backend's), from caches that already hold the new tokens' K/V.

    fp8 caches are dequantized first (``cache * scale``, per tensor or per kv head), NVFP4
    ones (uint8 codes, with their block scales) too: the oracle sees the values the kernels
    do."""
    dev = q.device
    if k_block_scales is not None:
        k_cache = dequantize_nvfp4(k_cache, k_block_scales, k_scale)
        v_cache = dequantize_nvfp4(v_cache, v_block_scales, v_scale)
    elif k_cache.dtype in FP8_DTYPES:
        k_cache = dequantize_fp8(k_cache, k_scale)
        v_cache = dequantize_fp8(v_cache, v_scale)
    if pb.batch.forward_mode is ForwardMode.DECODE:
        seq_lens = torch.tensor(pb.seq_lens, dtype=torch.int32, device=dev)
        return paged_decode_ref(
            q, k_cache, v_cache, pb.page_table, seq_lens, sm_scale, mask=mask, sinks=sinks
        )
    prefix = torch.tensor(pb.prefix_lens, dtype=torch.int32, device=dev)
    return paged_extend_ref(
        q,
        k_cache,
        v_cache,
        pb.page_table,
        pb.qo_indptr,
        prefix,
        sm_scale,
        mask=mask,
        sinks=sinks,
        tree_masks=pb.tree_masks,
    )


def dequantize_fp8(cache: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """``[pages, page_size, Hkv, D]`` fp8 -> float64 ``cache * scale`` ([1] or [Hkv] scale)."""
    if scale is None:
        raise AttngenInputError("dequantize_fp8: an fp8 cache needs its scale")
    return cache.double() * scale.double().view(1, 1, -1, 1)
