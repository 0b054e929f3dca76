"""attngen's own KV pools, shaped like a serving engine's: per-layer cache buffers that the
backends write new tokens into and the kernels read.

Every pool is addressed by *token slot* ``s`` (page ``s // page_size``, offset
``s % page_size``) through ``ReqToTokenPool`` (runtime/batch.py). Today: :class:`PagedKVPool`
(separate K and V, ``[pages, page_size, Hkv, D]``, bf16/fp16 or fp8 with quantizing writes)
and :class:`NvFp4KVPool` (packed e2m1 codes plus e4m3 block scales). The families still to
be lowered add their pools here beside them: one latent row per token for MLA (and DSA's
656-byte fp8 layout), DSA's fp8 indexer-key pages, and GDN's recurrent and conv states,
which are indexed by request slot, not by token slot.
"""

from __future__ import annotations

import torch

from attngen.runtime.batch import INDEX_DTYPES, AttentionLayer
from attngen.runtime.checks import AttngenInputError, check_at_least, check_tensor, fail
from attngen.runtime.nvfp4 import quantize_nvfp4


class PagedKVPool:
    """Per-layer paged K and V caches: ``[num_pages, page_size, num_kv_heads, head_dim]``."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        v_head_dim: int | None = None,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        for name, value in (
            ("num_layers", num_layers),
            ("num_pages", num_pages),
            ("page_size", page_size),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
        ):
            check_at_least(name, value, 1)
        self.page_size = page_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.v_head_dim = head_dim if v_head_dim is None else v_head_dim
        self.dtype = dtype
        shape = (num_pages, page_size, num_kv_heads)
        # zeroed, not left as the allocator's bytes: kernels that copy whole pages (TMA)
        # read slots no request has written, and 0 x NaN in P.V would reach the output
        self.k_buffer = [
            torch.zeros(shape + (head_dim,), dtype=dtype, device=device) for _ in range(num_layers)
        ]
        self.v_buffer = [
            torch.zeros(shape + (self.v_head_dim,), dtype=dtype, device=device)
            for _ in range(num_layers)
        ]

    @property
    def num_layers(self) -> int:
        return len(self.k_buffer)

    @property
    def num_pages(self) -> int:
        return int(self.k_buffer[0].shape[0])

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def device(self) -> torch.device:
        return self.k_buffer[0].device

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= layer_id < self.num_layers:
            raise AttngenInputError(f"layer_id: expected 0..{self.num_layers - 1}, got {layer_id}")
        return self.k_buffer[layer_id], self.v_buffer[layer_id]

    def set_kv_buffer(
        self, layer: AttentionLayer, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Scatter new tokens' ``k [T, Hkv, D]`` / ``v [T, Hkv, Dv]`` to token slots ``loc``.

        No host sync (graph-capturable); ``loc`` values must lie in ``0..num_slots-1``. An
        fp8 pool quantizes with ``layer.k_scale`` / ``layer.v_scale`` (see quantize_fp8).
        """
        k_cache, v_cache = self.get_kv_buffer(layer.layer_id)
        check_tensor("loc", loc, dtype=INDEX_DTYPES, shape=[None], device=self.device)
        num_tokens = int(loc.shape[0])
        src_dtypes = ACTIVATION_DTYPES if self.dtype in FP8_DTYPES else self.dtype
        check_tensor(
            "k",
            k,
            dtype=src_dtypes,
            device=self.device,
            shape=[num_tokens, self.num_kv_heads, self.head_dim],
        )
        check_tensor(
            "v",
            v,
            dtype=src_dtypes,
            device=self.device,
            shape=[num_tokens, self.num_kv_heads, self.v_head_dim],
        )
        if self.dtype in FP8_DTYPES:
            k = quantize_fp8(k, kv_scale("layer.k_scale", layer.k_scale, k), self.dtype)
            v = quantize_fp8(v, kv_scale("layer.v_scale", layer.v_scale, v), self.dtype)
        _scatter(k_cache.view(self.num_slots, self.num_kv_heads, self.head_dim), loc, k)
        _scatter(v_cache.view(self.num_slots, self.num_kv_heads, self.v_head_dim), loc, v)


class NvFp4KVPool(PagedKVPool):
    """Per-layer paged NVFP4 caches: codes and block scales, one pair of tensors each for K, V.

    ``k_buffer[l]`` uint8 ``[num_pages, page_size, Hkv, head_dim / 2]`` (two e2m1 codes per
    byte, low nibble first) and ``k_block_scales[l]`` float8_e4m3fn ``[..., head_dim / 16]``
    (likewise V); the per-tensor global scales are the layer's ``k_scale`` / ``v_scale``
    ([1] fp32). ``dtype`` is the string ``"nvfp4"`` (torch has no such dtype).
    """

    def __init__(
        self,
        *,
        head_dim: int,
        v_head_dim: int | None = None,
        device: torch.device | str,
        **dims: int,
    ) -> None:
        """``dims``: num_layers, num_pages, page_size, num_kv_heads, as PagedKVPool takes them."""
        v_head_dim = head_dim if v_head_dim is None else v_head_dim
        for name, dim in (("head_dim", head_dim), ("v_head_dim", v_head_dim)):
            if dim % 16:
                fail(name, "a multiple of 16 (NVFP4 scales blocks of 16 elements)", dim)
        codes = dict(head_dim=head_dim // 2, v_head_dim=v_head_dim // 2)  # two per byte
        super().__init__(**codes, **dims, dtype=torch.uint8, device=device)
        num_layers, num_pages = self.num_layers, self.num_pages
        page_size, num_kv_heads = self.page_size, self.num_kv_heads
        self.head_dim, self.v_head_dim = head_dim, v_head_dim
        self.dtype = "nvfp4"  # type: ignore[assignment]
        shape = (num_pages, page_size, num_kv_heads)
        e4m3 = dict(dtype=torch.float8_e4m3fn, device=device)
        self.k_block_scales = [
            torch.zeros(shape + (head_dim // 16,), **e4m3) for _ in range(num_layers)
        ]
        self.v_block_scales = [
            torch.zeros(shape + (v_head_dim // 16,), **e4m3) for _ in range(num_layers)
        ]

    def get_kv_block_scales(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.get_kv_buffer(layer_id)  # checks layer_id
        return self.k_block_scales[layer_id], self.v_block_scales[layer_id]

    def set_kv_buffer(
        self, layer: AttentionLayer, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Quantize new tokens' K/V to NVFP4 with the layer's global scales and scatter them
        to token slots ``loc`` (no host sync)."""
        check_tensor("loc", loc, dtype=INDEX_DTYPES, shape=[None], device=self.device)
        rows = int(loc.shape[0])
        caches = self.get_kv_buffer(layer.layer_id) + self.get_kv_block_scales(layer.layer_id)
        k_cache, v_cache, k_bs, v_bs = caches
        for name, x, dim, cache, block_scales, scale in (
            ("k", k, self.head_dim, k_cache, k_bs, layer.k_scale),
            ("v", v, self.v_head_dim, v_cache, v_bs, layer.v_scale),
        ):
            shape = [rows, self.num_kv_heads, dim]
            check_tensor(name, x, dtype=ACTIVATION_DTYPES, device=self.device, shape=shape)
            global_scale = kv_scale(f"layer.{name}_scale", scale, x)
            if global_scale.shape[0] != 1:
                fail(
                    f"layer.{name}_scale",
                    "shape [1] (NVFP4's per-tensor global scale)",
                    tuple(global_scale.shape),
                )
            codes, scales = quantize_nvfp4(x, global_scale)
            _scatter(cache.view(self.num_slots, self.num_kv_heads, dim // 2), loc, codes)
            _scatter(block_scales.view(self.num_slots, self.num_kv_heads, dim // 16), loc, scales)


# -- fp8 KV cache ----


def _scatter(dst: torch.Tensor, loc: torch.Tensor, src: torch.Tensor) -> None:
    """``dst[loc] = src`` along dim 0; index_copy_ (one cheap launch) takes int64 indices and
    no fp8 dtypes, so one-byte elements travel as their bytes."""
    src = src.to(dst.dtype)
    if loc.dtype != torch.int64:
        dst[loc] = src
    elif dst.element_size() == 1:
        dst.view(torch.uint8).index_copy_(0, loc, src.view(torch.uint8))
    else:
        dst.index_copy_(0, loc, src)


ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def kv_scale(name: str, scale: object, x: torch.Tensor) -> torch.Tensor:
    """Check a dequant scale for ``x [T, Hkv, D]``: fp32 [1] or [Hkv] on x's device."""
    if scale is None:
        fail(name, "a float32 tensor [1] or [num_kv_heads] (the KV cache is fp8)", None)
    scale = check_tensor(name, scale, dtype=torch.float32, shape=[None], device=x.device)
    if scale.shape[0] not in (1, x.shape[1]):
        fail(name, f"shape [1] or [{x.shape[1]}]", tuple(scale.shape))
    return scale


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x [T, Hkv, D] / scale`` (per tensor or per kv head), saturated to the fp8 range.

    torch's cast gives NaN past the largest finite fp8 value, so values are clamped first.
    """
    limit = torch.finfo(dtype).max
    scaled = x.float() / scale.view(1, -1, 1)
    return scaled.clamp(-limit, limit).to(dtype)
