"""The MLA latent KV pool: one row per token and layer holding the token's compressed
latent (``kv_lora_rank`` = 512) and its rope key (64), 576 elements, as SGLang's MLA pool.

``kv_buffer[layer]`` is ``[num_pages, page_size, 1, 576]`` in bf16/fp16, or float8_e4m3fn
holding ``x / scale`` with one fp32 per-tensor scale per layer (``layer.k_scale``, ``[1]``);
readers dequantize with ``cache * scale``. ``dtype="nvfp4"``: uint8 ``[..., 288]`` e2m1
code pairs (low nibble first) plus ``block_scales[layer]`` float8_e4m3fn ``[..., 36]`` (one
per 16 elements), ``layer.k_scale`` the global scale (attngen.runtime.nvfp4). Addressed by token slot like every attngen pool
(page ``s // page_size``, offset ``s % page_size``).
"""

from __future__ import annotations

import torch

from attngen.runtime.batch import INDEX_DTYPES, AttentionLayer
from attngen.runtime.checks import check_at_least, check_tensor, fail
from attngen.runtime.nvfp4 import quantize_nvfp4
from attngen.runtime.pools import ACTIVATION_DTYPES, _scatter, quantize_fp8

LATENT_DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn, "nvfp4")


class MlaLatentPool:
    """Per-layer paged latent caches; ``set_mla_kv_buffer`` writes (and quantizes) tokens."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_pages: int,
        page_size: int,
        kv_lora_rank: int = 512,
        qk_rope_head_dim: int = 64,
        dtype: torch.dtype | str,
        device: torch.device | str,
    ) -> None:
        for name, value in (
            ("num_layers", num_layers),
            ("num_pages", num_pages),
            ("page_size", page_size),
            ("kv_lora_rank", kv_lora_rank),
            ("qk_rope_head_dim", qk_rope_head_dim),
        ):
            check_at_least(name, value, 1)
        if dtype not in LATENT_DTYPES:
            fail("dtype", " or ".join(str(d) for d in LATENT_DTYPES), dtype)
        self.page_size = page_size
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.dtype = dtype
        width = kv_lora_rank + qk_rope_head_dim
        rows = (num_pages, page_size, 1)
        if dtype == "nvfp4":
            if width % 16:
                fail("kv_lora_rank + qk_rope_head_dim", "a multiple of 16 (NVFP4 blocks)", width)
            codes = dict(dtype=torch.uint8, device=device)
            self.kv_buffer = [torch.zeros(rows + (width // 2,), **codes) for _ in range(num_layers)]
            e4m3 = dict(dtype=torch.float8_e4m3fn, device=device)
            self.block_scales = [
                torch.zeros(rows + (width // 16,), **e4m3) for _ in range(num_layers)
            ]
        else:
            self.kv_buffer = [
                torch.zeros(rows + (width,), dtype=dtype, device=device) for _ in range(num_layers)
            ]

    @property
    def width(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def num_layers(self) -> int:
        return len(self.kv_buffer)

    @property
    def num_pages(self) -> int:
        return int(self.kv_buffer[0].shape[0])

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def device(self) -> torch.device:
        return self.kv_buffer[0].device

    @property
    def quantized(self) -> bool:
        return self.dtype in (torch.float8_e4m3fn, "nvfp4")

    @property
    def fp4(self) -> bool:
        return self.dtype == "nvfp4"

    def get_block_scales(self, layer_id: int) -> torch.Tensor | None:
        """NVFP4: the layer's e4m3 block scales ``[pages, page_size, 1, 36]``; else None."""
        self.get_key_buffer(layer_id)  # checks layer_id
        return self.block_scales[layer_id] if self.fp4 else None

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """The layer's ``[num_pages, page_size, 1, 576]`` cache (SGLang's name)."""
        if not 0 <= layer_id < self.num_layers:
            fail("layer_id", f"0..{self.num_layers - 1}", layer_id)
        return self.kv_buffer[layer_id]

    def layer_scale(self, layer: AttentionLayer) -> torch.Tensor | None:
        """The layer's fp32 ``[1]`` dequant scale (fp8 pools), checked; None otherwise."""
        if not self.quantized:
            return None
        scale = layer.k_scale
        if scale is None:
            fail(
                f"layer {layer.layer_id}.k_scale",
                f"a float32 tensor [1] ({self.dtype} latent cache)",
                None,
            )
        return check_tensor(
            f"layer {layer.layer_id}.k_scale",
            scale,
            dtype=torch.float32,
            shape=[1],
            device=self.device,
        )

    def set_mla_kv_buffer(
        self,
        layer: AttentionLayer,
        loc: torch.Tensor,
        latent: torch.Tensor,
        k_rope: torch.Tensor,
    ) -> None:
        """Write new tokens' ``latent [T, 512]`` (or ``[T, 1, 512]``) and ``k_rope [T, 64]``
        (or ``[T, 1, 64]``) to token slots ``loc``; an fp8 pool quantizes both with the
        layer's scale (saturating). No host sync (graph-capturable)."""
        cache = self.get_key_buffer(layer.layer_id)
        check_tensor("loc", loc, dtype=INDEX_DTYPES, shape=[None], device=self.device)
        rows = int(loc.shape[0])
        src = ACTIVATION_DTYPES if self.quantized else self.dtype
        parts = []
        for name, x, dim in (
            ("latent", latent, self.kv_lora_rank),
            ("k_rope", k_rope, self.qk_rope_head_dim),
        ):
            if isinstance(x, torch.Tensor) and x.dim() == 3:
                check_tensor(name, x, shape=[rows, 1, dim])
                x = x[:, 0]
            parts.append(check_tensor(name, x, dtype=src, shape=[rows, dim], device=self.device))
        row = torch.cat(parts, dim=-1)
        scale = self.layer_scale(layer)
        if self.fp4:
            codes, scales = quantize_nvfp4(row, scale)
            _scatter(cache.view(self.num_slots, self.width // 2), loc, codes)
            bs = self.block_scales[layer.layer_id]
            _scatter(bs.view(self.num_slots, self.width // 16), loc, scales)
            return
        if scale is not None:
            row = quantize_fp8(row[:, None, :], scale, self.dtype)[:, 0]
        _scatter(cache.view(self.num_slots, self.width), loc, row)
