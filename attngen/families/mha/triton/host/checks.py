"""Argument checks of the MHA launchers: shapes, dtypes, devices, strides, alignment."""

from __future__ import annotations

import torch

from attngen.families.mha.triton.config import MhaTritonConfig
from attngen.runtime.checks import check_at_least, check_tensor, fail


def io_torch_dtype(config: MhaTritonConfig) -> torch.dtype:
    """Torch dtype of q and out (the config names it the torch way)."""
    return getattr(torch, config.dtype)


def kv_torch_dtype(config: MhaTritonConfig) -> torch.dtype:
    """Torch dtype of the KV cache: the activations', fp8, or uint8 (NVFP4 code pairs)."""
    return torch.uint8 if config.kv_dtype == "nvfp4" else getattr(torch, config.kv_dtype)


def kv_row(config: MhaTritonConfig, dim: int) -> int:
    """Elements of one cached K or V row: dim, or dim / 2 bytes of NVFP4 code pairs."""
    return dim // 2 if config.kv_dtype == "nvfp4" else dim


def check_config(config: MhaTritonConfig, sm_scale: float) -> None:
    if not isinstance(config, MhaTritonConfig):
        fail("config", "an MhaTritonConfig", type(config).__name__)
    for field in ("head_dim", "v_head_dim"):
        # 16-byte rows in bf16/fp16 (the kernels' alignment hints); padded to a power of two
        value = getattr(config, field)
        if not 16 <= value <= 256 or value % 8:
            fail(f"config.{field}", "a multiple of 8 in 16 .. 256", value)
    value = config.decode_block_h
    if value < 16 or value & (value - 1):
        fail("config.decode_block_h", "a power of two >= 16", value)
    if config.decode_block_h < config.gqa_group:
        fail("config.decode_block_h", f">= gqa_group ({config.gqa_group})", config.decode_block_h)
    if config.spec_topk and config.verify_block_m < 16:
        fail("config.verify_block_m", ">= 16 for a speculative config", config.verify_block_m)
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)):
        fail("sm_scale", "a Python float", type(sm_scale).__name__)


def check_io(
    name: str,
    t: torch.Tensor,
    shape: list[int | None],
    config: MhaTritonConfig,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> None:
    """q, out or a cache: the config's dtype (or ``dtype``), stride 1 in the last dim."""
    dtype = io_torch_dtype(config) if dtype is None else dtype
    check_tensor(name, t, dtype=dtype, shape=shape, device=device, last_dim_contiguous=True)
    check_aligned(name, t)


def check_aligned(name: str, t: torch.Tensor) -> None:
    """Rows start on 16 bytes: the kernels promise the compiler so (tl.multiple_of)."""
    sizes, strides = t.shape[:-1], t.stride()[:-1]
    row_strides = [s * t.element_size() for s, n in zip(strides, sizes) if n > 1]
    if t.data_ptr() % 16 or any(s % 16 for s in row_strides):
        got = f"data_ptr % 16 = {t.data_ptr() % 16}, strides {t.stride()}"
        fail(name, "a 16-byte aligned data pointer and 16-byte multiple strides", got)


def check_paged_kv(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    batch: int,
    config: MhaTritonConfig,
) -> int:
    """Check the paged cache and page table against q; return the number of kv heads."""
    num_heads = q.shape[1]
    if num_heads == 0 or num_heads % config.gqa_group:
        fail("q", f"a head count divisible by gqa_group ({config.gqa_group})", num_heads)
    num_kv_heads = num_heads // config.gqa_group
    k_shape = [None, config.page_size, num_kv_heads, kv_row(config, config.head_dim)]
    check_io("k_cache", k_cache, k_shape, config, q.device, kv_torch_dtype(config))
    v_row = kv_row(config, config.v_head_dim)
    v_shape = [k_cache.shape[0], config.page_size, num_kv_heads, v_row]
    check_io("v_cache", v_cache, v_shape, config, q.device, kv_torch_dtype(config))
    check_tensor(
        "page_table",
        page_table,
        dtype=torch.int32,
        shape=[None, None],
        device=q.device,
        last_dim_contiguous=True,
    )
    check_at_least("page_table rows", page_table.shape[0], batch)
    return num_kv_heads


def check_lengths(name: str, t: torch.Tensor, rows: int, device: torch.device) -> None:
    """A contiguous int32 vector with at least ``rows`` entries (the rest are ignored)."""
    check_tensor(name, t, dtype=torch.int32, shape=[None], device=device, contiguous=True)
    check_at_least(f"{name} rows", t.shape[0], rows)


def check_split_buffers(
    partial_o: torch.Tensor,
    partial_lse: torch.Tensor,
    q: torch.Tensor,
    config: MhaTritonConfig,
) -> None:
    """Stage-1 outputs: fp32, one slot per (request, query head, split), at least B rows."""
    batch, num_heads = q.shape[0], q.shape[1]
    for name, t, shape in (
        ("partial_o", partial_o, [None, num_heads, config.max_splits, config.v_head_dim]),
        ("partial_lse", partial_lse, [None, num_heads, config.max_splits]),
    ):
        check_tensor(
            name, t, dtype=torch.float32, shape=shape, device=q.device, last_dim_contiguous=True
        )
        check_at_least(f"{name} rows", t.shape[0], batch)
    check_aligned("partial_o", partial_o)


def check_sinks(sinks: torch.Tensor | None, q: torch.Tensor, has_sinks: bool) -> None:
    """One fp32 logit per query head when the mask has sinks; None when it has not."""
    if not has_sinks:
        if sinks is not None:
            fail("sinks", "None (this spec has no attention sinks)", type(sinks).__name__)
        return
    if sinks is None:
        fail("sinks", "a float32 tensor [Hq] (this spec has attention sinks)", None)
    check_tensor(
        "sinks", sinks, dtype=torch.float32, shape=[q.shape[1]], device=q.device, contiguous=True
    )


def check_kv_scales(
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    num_kv_heads: int,
    config: MhaTritonConfig,
    device: torch.device,
) -> None:
    """fp32 dequant scales, [1] per tensor or [Hkv] per head; None for a bf16/fp16 cache."""
    if config.kv_scale == "none":
        for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
            if scale is not None:
                fail(name, f"None (a {config.kv_dtype} cache has no scales)", "a tensor")
        return
    rows = num_kv_heads if config.kv_scale == "per_head" else 1  # per_block: a global scale
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is None:
            want = f"a float32 tensor [{rows}] ({config.kv_scale} {config.kv_dtype} cache)"
            fail(name, want, None)
        check_tensor(name, scale, dtype=torch.float32, shape=[rows], device=device, contiguous=True)


def check_block_scales(
    k_block_scales: torch.Tensor | None,
    v_block_scales: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    config: MhaTritonConfig,
) -> None:
    """NVFP4: float8_e4m3fn [pages, page_size, Hkv, dim / 16] beside each cache; else None."""
    pairs = (
        ("k_block_scales", k_block_scales, k_cache),
        ("v_block_scales", v_block_scales, v_cache),
    )
    if config.kv_dtype != "nvfp4":
        for name, scales, _ in pairs:
            if scales is not None:
                fail(name, f"None (a {config.kv_dtype} cache has no block scales)", "a tensor")
        return
    for name, scales, cache in pairs:
        if scales is None:
            fail(name, "float8_e4m3fn block scales (the KV cache is NVFP4)", None)
        shape = [*cache.shape[:3], cache.shape[3] * 2 // 16]
        check_tensor(
            name,
            scales,
            dtype=torch.float8_e4m3fn,
            shape=shape,
            device=cache.device,
            last_dim_contiguous=True,
        )
