"""Launch options (constexprs, warps, stages) of the MHA kernels, by config and traits.

Memoized: configs and traits are frozen (hashable), so each launch looks its options up
instead of rebuilding them; callers must not mutate the returned dicts.

The launchers (:mod:`.launch`) and the ahead-of-time compile specs (:mod:`.compile`) share
them, so what is compiled is what runs.
"""

from __future__ import annotations

import functools

import torch
import triton

from attngen.families.mha.triton.config import MhaTraits, MhaTritonConfig
from attngen.hooks import MaskHooks


def shape_options(config: MhaTritonConfig) -> dict[str, int]:
    """The variant's shapes: HEAD_DIM / V_HEAD_DIM are the true head dims; BLOCK_D /
    BLOCK_DV, the next powers of two, the kernels' tile widths (no lane masks when equal)."""
    return {
        "GQA_GROUP": config.gqa_group,
        "HEAD_DIM": config.head_dim,
        "V_HEAD_DIM": config.v_head_dim,
        "BLOCK_D": triton.next_power_of_2(config.head_dim),
        "BLOCK_DV": triton.next_power_of_2(config.v_head_dim),
        "PAGE_SIZE": config.page_size,
    }


def mask_options(mask: MaskHooks) -> dict[str, int | float]:
    """The window and softcap hooks as Triton constexprs: -1 is no window, 0.0 no cap (a
    float constexpr also for 0, so the kernels specialise on it once)."""
    return {
        "WINDOW_LEFT": -1 if mask.window_left is None else mask.window_left,
        "LOGIT_SOFTCAP": 0.0 if mask.logit_softcap is None else float(mask.logit_softcap),
    }


def kv_scale_options(config: MhaTritonConfig) -> dict[str, bool]:
    return {
        "KV_SCALED": config.kv_scale != "none",
        "SCALE_PER_HEAD": config.kv_scale == "per_head",
        "KV_FP4": config.kv_dtype == "nvfp4",
    }


def block_scale_args(
    config: MhaTritonConfig,
    traits: MhaTraits,
    k_block_scales: torch.Tensor | None,
    v_block_scales: torch.Tensor | None,
) -> tuple:
    """NVFP4 block scales and their (page, slot, head) strides; (None, None, 0 x 6) else."""
    if config.kv_dtype != "nvfp4":
        return (None, None, 0, 0, 0, 0, 0, 0)
    if traits.fp4_scales_as_bytes:  # no fp8e4nv pointers on the arch: decode the bits
        k_block_scales = k_block_scales.view(torch.uint8)
        v_block_scales = v_block_scales.view(torch.uint8)
    return (
        k_block_scales,
        v_block_scales,
        *k_block_scales.stride()[:3],
        *v_block_scales.stride()[:3],
    )


@functools.cache
def decode_split_options(config: MhaTritonConfig, traits: MhaTraits) -> dict[str, int | float]:
    return {
        **shape_options(config),
        "BLOCK_H": config.decode_block_h,
        "BLOCK_N": config.decode_block_n,
        "MAX_SPLITS": config.max_splits,
        **mask_options(traits.mask),
        **kv_scale_options(config),
        "num_warps": config.decode_num_warps,
        "num_stages": config.decode_num_stages,
    }


@functools.cache
def decode_combine_options(config: MhaTritonConfig, traits: MhaTraits) -> dict[str, int | bool]:
    return {
        "V_HEAD_DIM": config.v_head_dim,
        "BLOCK_DV": triton.next_power_of_2(config.v_head_dim),
        "MAX_SPLITS": config.max_splits,
        "HAS_SINKS": traits.mask.sinks,
        "num_warps": config.combine_num_warps,
        "num_stages": 1,  # a short scalar loop: nothing to pipeline
    }


NO_KV_SCALES = {"KV_SCALED": False, "SCALE_PER_HEAD": False, "KV_FP4": False}


@functools.cache
def extend_options(
    config: MhaTritonConfig,
    traits: MhaTraits,
    *,
    tree: bool = False,
    paged: bool = True,
    verify: bool = False,
) -> dict[str, int | float | bool]:
    """extend (paged), verify (paged; a tree mask replaces causal on the drafts) and prefill
    (contiguous K/V). Verify packs the GQA group into the tile's rows (the config's verify
    tiles): drafts x group rows share each K/V load."""
    block_m, block_n = config.extend_block_m, config.extend_block_n
    warps = config.extend_num_warps
    if verify:
        block_m, block_n = config.verify_block_m, config.verify_block_n
        warps = config.verify_num_warps
    return {
        **shape_options(config),
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "CAUSAL": traits.mask.causal and not tree,
        **mask_options(traits.mask),
        "HAS_SINKS": traits.mask.sinks,
        **(kv_scale_options(config) if paged else NO_KV_SCALES),
        "MASK_TREE": tree,
        "PAGED": paged,
        "PACK_GQA": verify,
        "num_warps": warps,
        "num_stages": config.extend_num_stages,
    }
