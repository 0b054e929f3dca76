"""DSA's caches, addressed by token slot in 64-token pages like every attngen pool.

- The latent pool: in the activations' dtype it is MLA's (``MlaLatentPool``: one 576-wide
  row per token and layer). In fp8 it is DeepSeek-V3.2's 656-byte row
  (:class:`Fp8LatentPool`): 512 e4m3 latent values, 4 fp32 scales (one per 128 values,
  ``amax / 448``; value = e4m3 * scale), 64 bf16 rope values; ``[pages, 64, 1, 656]``
  float8_e4m3fn as SGLang and FlashMLA view it.
- The indexer's key pool (:class:`IndexKeyPool`): uint8 ``[pages, 64 * 132]`` per layer:
  the page's 64 keys of 128 e4m3 values, then their 64 fp32 scales (``amax / 448``); or,
  for an indexer that scores in bf16 / fp16 / fp32, the page's 64 keys in that dtype
  (``[pages, 64 * 128 * itemsize]`` bytes, no scales).

Writes quantize (saturating) and scatter without reading device values on the host, so
they are CUDA-graph capturable.
"""

from __future__ import annotations

import torch

from attngen.families.mla.pool import MlaLatentPool
from attngen.runtime.batch import INDEX_DTYPES, AttentionLayer
from attngen.runtime.checks import check_at_least, check_tensor, fail
from attngen.runtime.pools import ACTIVATION_DTYPES

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3 value
SCALE_BLOCK = 128  # latent values per fp8 scale
MIN_AMAX = 1e-12  # an all-zero block gets this amax (its codes are zeros anyway)


def quantize_blocks(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [T, n * block]`` -> (e4m3 codes ``[T, n * block]``, fp32 scales ``[T, n]``) with
    scale = amax / 448 per block (codes saturate at +-448)."""
    t, width = x.shape
    blocks = x.float().view(t, width // block, block)
    scale = blocks.abs().amax(dim=-1).clamp_min(MIN_AMAX) / FP8_MAX
    codes = (blocks / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return codes.view(t, width), scale


def pack_latent_656(latent: torch.Tensor, k_rope: torch.Tensor) -> torch.Tensor:
    """uint8 ``[T, 656]`` rows of ``latent [T, 512]`` and ``k_rope [T, 64]``."""
    codes, scale = quantize_blocks(latent, SCALE_BLOCK)
    rope = k_rope.to(torch.bfloat16)
    parts = (codes.view(torch.uint8), scale.view(torch.uint8), rope.view(torch.uint8))
    return torch.cat([p.reshape(latent.shape[0], -1) for p in parts], dim=-1)


def unpack_latent_656(rows: torch.Tensor, lora: int = 512) -> torch.Tensor:
    """float32 ``[N, lora + rope]`` values of 656-byte rows (uint8 or e4m3 ``[N, 656]``)."""
    raw = rows.contiguous().view(torch.uint8)
    n, blocks = raw.shape[0], lora // SCALE_BLOCK
    codes = raw[:, :lora].contiguous().view(FP8).float().view(n, blocks, SCALE_BLOCK)
    scale = raw[:, lora : lora + 4 * blocks].contiguous().view(torch.float32)
    rope = raw[:, lora + 4 * blocks :].contiguous().view(torch.bfloat16).float()
    return torch.cat([(codes * scale[..., None]).view(n, lora), rope], dim=-1)


class Fp8LatentPool:
    """Per-layer paged latent caches in the 656-byte fp8 layout (see the module docstring);
    ``set_mla_kv_buffer`` quantizes new tokens."""

    dtype = FP8
    quantized = True
    fp4 = False

    def __init__(
        self,
        *,
        num_layers: int,
        num_pages: int,
        page_size: int,
        kv_lora_rank: int = 512,
        qk_rope_head_dim: int = 64,
        device: torch.device | str,
    ) -> None:
        for name, value in (
            ("num_layers", num_layers),
            ("num_pages", num_pages),
            ("page_size", page_size),
        ):
            check_at_least(name, value, 1)
        if kv_lora_rank % SCALE_BLOCK:
            fail("kv_lora_rank", f"a multiple of {SCALE_BLOCK}", kv_lora_rank)
        self.page_size = page_size
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        shape = (num_pages, page_size, 1, self.row_bytes)
        self.kv_buffer = [torch.zeros(shape, dtype=FP8, device=device) for _ in range(num_layers)]

    @property
    def row_bytes(self) -> int:
        """656: the latent's codes, its fp32 scales and the bf16 rope."""
        lora = self.kv_lora_rank
        return lora + 4 * (lora // SCALE_BLOCK) + 2 * self.qk_rope_head_dim

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

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """The layer's ``[num_pages, page_size, 1, 656]`` float8_e4m3fn cache."""
        if not 0 <= layer_id < self.num_layers:
            fail("layer_id", f"0..{self.num_layers - 1}", layer_id)
        return self.kv_buffer[layer_id]

    def set_mla_kv_buffer(
        self, layer: AttentionLayer, loc: torch.Tensor, latent: torch.Tensor, k_rope: torch.Tensor
    ) -> None:
        """Quantize new tokens' ``latent [T, 512]`` (or ``[T, 1, 512]``) and ``k_rope [T,
        64]`` (or ``[T, 1, 64]``) into 656-byte rows at token slots ``loc``."""
        cache = self.get_key_buffer(layer.layer_id)
        check_tensor("loc", loc, dtype=INDEX_DTYPES, shape=[None], device=self.device)
        rows = int(loc.shape[0])
        parts = []
        for name, x, dim in (
            ("latent", latent, self.kv_lora_rank),
            ("k_rope", k_rope, self.qk_rope_head_dim),
        ):
            if isinstance(x, torch.Tensor) and x.dim() == 3:
                check_tensor(name, x, shape=[rows, 1, dim])
                x = x[:, 0]
            parts.append(
                check_tensor(
                    name, x, dtype=ACTIVATION_DTYPES, shape=[rows, dim], device=self.device
                )
            )
        packed = pack_latent_656(*parts)
        cache.view(torch.uint8).view(self.num_slots, self.row_bytes)[loc.long()] = packed


def latent_pool(
    *,
    num_layers: int,
    num_pages: int,
    page_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
    kv_lora_rank: int = 512,
    qk_rope_head_dim: int = 64,
) -> MlaLatentPool | Fp8LatentPool:
    """DSA's latent pool: MLA's in bf16/fp16, the 656-byte layout in float8_e4m3fn."""
    dims = dict(kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim)
    if dtype == FP8:
        return Fp8LatentPool(
            num_layers=num_layers, num_pages=num_pages, page_size=page_size, device=device, **dims
        )
    if dtype not in (torch.bfloat16, torch.float16):
        fail("dtype", "torch.bfloat16, torch.float16 or torch.float8_e4m3fn", dtype)
    return MlaLatentPool(
        num_layers=num_layers,
        num_pages=num_pages,
        page_size=page_size,
        dtype=dtype,
        device=device,
        **dims,
    )


INDEX_KEY_DTYPES = (FP8, torch.bfloat16, torch.float16, torch.float32)


class IndexKeyPool:
    """The lightning indexer's key cache, uint8 ``[pages, page_bytes]`` per layer: with
    ``dtype`` float8_e4m3fn (DeepSeek-V3.2's), ``page_size`` keys of D e4m3 values, then
    their fp32 scales; with bf16 / fp16 / fp32, ``page_size`` keys of D values of it."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_pages: int,
        page_size: int,
        index_head_dim: int = 128,
        dtype: torch.dtype = FP8,
        device: torch.device | str,
    ) -> None:
        for name, value in (
            ("num_layers", num_layers),
            ("num_pages", num_pages),
            ("page_size", page_size),
            ("index_head_dim", index_head_dim),
        ):
            check_at_least(name, value, 1)
        if dtype not in INDEX_KEY_DTYPES:
            fail("dtype", f"one of {', '.join(map(str, INDEX_KEY_DTYPES))}", dtype)
        self.page_size = page_size
        self.index_head_dim = index_head_dim
        self.dtype = dtype
        shape = (num_pages, self.page_bytes)
        self.buffer = [
            torch.zeros(shape, dtype=torch.uint8, device=device) for _ in range(num_layers)
        ]

    @property
    def scaled(self) -> bool:
        """fp8 keys, each with an fp32 scale."""
        return self.dtype == FP8

    @property
    def page_bytes(self) -> int:
        if self.scaled:
            return self.page_size * (self.index_head_dim + 4)
        return self.page_size * self.index_head_dim * self.dtype.itemsize

    @property
    def num_layers(self) -> int:
        return len(self.buffer)

    @property
    def num_slots(self) -> int:
        return int(self.buffer[0].shape[0]) * self.page_size

    @property
    def device(self) -> torch.device:
        return self.buffer[0].device

    def get_index_k_with_scale_buffer(self, layer_id: int) -> torch.Tensor:
        """The layer's uint8 ``[pages, page_size * (D + 4)]`` buffer (SGLang's name)."""
        if not 0 <= layer_id < self.num_layers:
            fail("layer_id", f"0..{self.num_layers - 1}", layer_id)
        return self.buffer[layer_id]

    def _byte_offsets(self, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat byte offsets of fp8 slots' keys ``[N, D]`` and scales ``[N, 4]``."""
        loc = loc.long()
        page, j = loc // self.page_size, loc % self.page_size
        base = page * self.page_bytes
        d = self.index_head_dim
        keys = (base + j * d)[:, None] + torch.arange(d, device=loc.device)
        scales = (base + self.page_size * d + 4 * j)[:, None] + torch.arange(4, device=loc.device)
        return keys, scales

    def keys(self, layer_id: int) -> torch.Tensor:
        """A bf16 / fp16 / fp32 pool's keys as ``[slots, D]`` of its dtype (a view)."""
        assert not self.scaled, "fp8 keys interleave with their scales: use gather()"
        buf = self.get_index_k_with_scale_buffer(layer_id)
        return buf.view(self.dtype).view(-1, self.index_head_dim)

    def set_index_k(self, layer_id: int, loc: torch.Tensor, index_k: torch.Tensor) -> None:
        """Write new tokens' indexer keys ``index_k [T, D]`` into token slots ``loc``:
        quantized with one scale per key (fp8), else converted to the pool's dtype."""
        buf = self.get_index_k_with_scale_buffer(layer_id)
        check_tensor("loc", loc, dtype=INDEX_DTYPES, shape=[None], device=self.device)
        check_tensor(
            "index_k",
            index_k,
            dtype=(*ACTIVATION_DTYPES, torch.float32),
            shape=[loc.shape[0], self.index_head_dim],
            device=self.device,
        )
        if not self.scaled:
            self.keys(layer_id)[loc.long()] = index_k.to(self.dtype)
            return
        codes, scale = quantize_blocks(index_k, self.index_head_dim)
        keys, scales = self._byte_offsets(loc)
        flat = buf.view(-1)
        flat[keys] = codes.view(torch.uint8)
        flat[scales] = scale.contiguous().view(torch.uint8).view(-1, 4)

    def gather(self, layer_id: int, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys ``[N, D]`` in the pool's dtype, fp32 scales ``[N]``: ones unless fp8) of
        token slots ``loc``."""
        if not self.scaled:
            keys = self.keys(layer_id)[loc.long()]
            return keys, torch.ones(keys.shape[0], dtype=torch.float32, device=keys.device)
        flat = self.get_index_k_with_scale_buffer(layer_id).view(-1)
        keys, scales = self._byte_offsets(loc)
        return flat[keys].view(FP8), flat[scales].contiguous().view(torch.float32).view(-1)
