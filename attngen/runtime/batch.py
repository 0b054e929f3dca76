"""attngen's own batch and KV-pool types, shaped like a serving engine's.

They mirror what SGLang hands an attention backend, so a generated backend runs (and is
tested) without the engine installed, and a thin adapter maps the engine's objects onto
these one field at a time.

Addressing, as in SGLang: every cached token has a *token slot* ``s``. The KV pool is
paged: slot ``s`` lives in page ``s // page_size`` at offset ``s % page_size``.
``ReqToTokenPool.req_to_token[r, j]`` is the slot of request row ``r``'s token ``j``; a
request's tokens fill whole pages in order, so ``req_to_token[r, j * page_size] //
page_size`` is the physical page of its ``j``-th page.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch

from attngen.runtime.checks import AttngenInputError, check_at_least, check_tensor, fail
from attngen.runtime.nvfp4 import quantize_nvfp4

INDEX_DTYPES = (torch.int32, torch.int64)


class ForwardMode(enum.Enum):
    """What one forward pass of the engine does (one value per batch)."""

    EXTEND = enum.auto()  # prefill, or extend new tokens over a cached prefix
    DECODE = enum.auto()  # one new token per request
    TARGET_VERIFY = enum.auto()  # spec decoding: the target model scores the draft tokens
    DRAFT_EXTEND = enum.auto()  # spec decoding: the draft model extends over accepted tokens
    IDLE = enum.auto()  # no tokens on this rank (data-parallel padding)

    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE

    def is_extend(self) -> bool:
        """Modes that run through ``forward_extend`` (several query tokens per request)."""
        return self in (ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND)

    def is_target_verify(self) -> bool:
        return self is ForwardMode.TARGET_VERIFY

    def is_draft_extend(self) -> bool:
        return self is ForwardMode.DRAFT_EXTEND

    def is_idle(self) -> bool:
        return self is ForwardMode.IDLE


@dataclass(frozen=True)
class ForwardBatch:
    """The per-forward inputs an attention backend reads (a subset of SGLang's).

    ``seq_lens`` count every token of a request including this forward's new ones. Extend
    fields are set for extend-like modes and ``None`` for decode.
    """

    batch_size: int
    forward_mode: ForwardMode
    req_pool_indices: torch.Tensor  # [B] int32/int64, rows of req_to_token
    seq_lens: torch.Tensor  # [B] int32, on the device
    seq_lens_cpu: torch.Tensor  # [B] int, on the host (same values)
    out_cache_loc: torch.Tensor  # [num_new_tokens] int64 token slots of the new tokens
    extend_prefix_lens: torch.Tensor | None = None  # [B] int32, cached tokens per request
    extend_seq_lens: torch.Tensor | None = None  # [B] int32, new tokens per request
    extend_prefix_lens_cpu: list[int] | None = None
    extend_seq_lens_cpu: list[int] | None = None
    spec_info: Any = None  # TARGET_VERIFY: a VerifyInfo (draft count, tree mask)

    @property
    def num_new_tokens(self) -> int:
        return int(self.out_cache_loc.shape[0])

    @property
    def seq_lens_sum(self) -> int:
        return int(self.seq_lens_cpu.sum())

    def check(self, *, device: torch.device, max_context_len: int) -> None:
        """Check shapes, dtypes, devices and the host-side lengths (no device sync)."""
        bs = self.batch_size
        if bs < 1:
            fail("forward_batch.batch_size", f">= 1 in {self.forward_mode.name} mode", bs)
        _check_index("req_pool_indices", self.req_pool_indices, bs, device)
        _check_index("seq_lens", self.seq_lens, bs, device)
        _check_index("seq_lens_cpu", self.seq_lens_cpu, bs, torch.device("cpu"))
        check_max_seq_len(self.seq_lens_cpu, max_context_len)
        num_new = self._check_extend(device) if self.forward_mode.is_extend() else bs
        _check_index("out_cache_loc", self.out_cache_loc, num_new, device)
        if self.forward_mode.is_target_verify():
            self._check_verify()

    def _check_verify(self) -> None:
        info = self.spec_info
        if not isinstance(info, VerifyInfo):
            fail(
                "forward_batch.spec_info", "a VerifyInfo in TARGET_VERIFY mode", type(info).__name__
            )
        n = info.draft_token_num
        if self.extend_seq_lens_cpu != [n] * self.batch_size:
            fail(
                "forward_batch.extend_seq_lens_cpu",
                f"spec_info.draft_token_num={n} for every request",
                self.extend_seq_lens_cpu,
            )

    def _check_extend(self, device: torch.device) -> int:
        """Check the extend fields; return the number of new tokens."""
        bs = self.batch_size
        _check_index("extend_prefix_lens", self.extend_prefix_lens, bs, device)
        _check_index("extend_seq_lens", self.extend_seq_lens, bs, device)
        prefix, ext = self.extend_prefix_lens_cpu, self.extend_seq_lens_cpu
        if prefix is None or ext is None or len(prefix) != bs or len(ext) != bs:
            fail(
                "forward_batch.extend_prefix_lens_cpu / extend_seq_lens_cpu",
                f"two lists of {bs} ints",
                (prefix, ext),
            )
        if min(ext) < 1:
            fail("forward_batch.extend_seq_lens_cpu", "lengths >= 1", ext)
        if min(prefix) < 0:
            fail("forward_batch.extend_prefix_lens_cpu", "lengths >= 0", prefix)
        totals = [p + e for p, e in zip(prefix, ext)]
        if totals != self.seq_lens_cpu.tolist():
            fail(
                "forward_batch.seq_lens_cpu",
                f"prefix + extend lengths {totals}",
                self.seq_lens_cpu.tolist(),
            )
        return sum(ext)


@dataclass(frozen=True)
class VerifyInfo:
    """What a TARGET_VERIFY forward adds: the drafts per request and, for trees, the mask.

    Every request verifies ``draft_token_num`` tokens (its ``extend_seq_lens``). Chains
    (topk 1) need no mask: draft ``i`` sees drafts ``0..i``. Trees (topk > 1) pass
    ``tree_mask`` (uint8, bit-packed by :func:`pack_tree_masks`) and ``tree_mask_indptr``
    (int32 ``[B + 1]``, byte offset of each request's mask); every draft sees the prefix.
    """

    draft_token_num: int
    tree_mask: torch.Tensor | None = None
    tree_mask_indptr: torch.Tensor | None = None


@dataclass(frozen=True)
class DraftExtendInfo:
    """What a captured DRAFT_EXTEND replay needs: each request's new tokens (accepted
    drafts + 1), ``extend_lens`` int32 ``[>= bs]`` on the device, 1 .. num_draft_tokens.
    Request b's rows follow request b-1's (cumulative), as in an eager extend batch."""

    extend_lens: torch.Tensor


def pack_tree_masks(masks: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Bit-pack per-request ``[n, n]`` bool masks (row i: the drafts draft i sees).

    Request b's bits start on a byte boundary at ``indptr[b]``; bit ``i * n + j`` sits in
    byte ``i * n + j >> 3`` at bit ``(i * n + j) & 7`` (little-endian), as the kernels read
    them. Returns ``(uint8 bytes, int32 indptr [B + 1])`` on the masks' device.
    """
    chunks, offsets = [], [0]
    weights = None
    for b, m in enumerate(masks):
        check_tensor(f"masks[{b}]", m, dtype=torch.bool, shape=[None, None])
        if m.shape[0] != m.shape[1]:
            fail(f"masks[{b}]", "a square [n, n] mask", tuple(m.shape))
        bits = m.reshape(-1).to(torch.uint8)
        bits = torch.nn.functional.pad(bits, (0, -bits.shape[0] % 8)).view(-1, 8)
        if weights is None or weights.device != bits.device:
            weights = torch.tensor([1 << i for i in range(8)], dtype=torch.uint8, device=m.device)
        chunks.append((bits * weights).sum(dim=1, dtype=torch.uint8))
        offsets.append(offsets[-1] + chunks[-1].shape[0])
    device = masks[0].device if masks else torch.device("cpu")
    packed = torch.cat(chunks) if chunks else torch.zeros(0, dtype=torch.uint8, device=device)
    return packed, torch.tensor(offsets, dtype=torch.int32, device=device)


def check_max_seq_len(seq_lens_cpu: torch.Tensor, max_context_len: int) -> None:
    """Host-side check that no request outgrows the req_to_token table."""
    longest = int(seq_lens_cpu.max()) if seq_lens_cpu.numel() else 0
    if longest > max_context_len:
        fail("seq_lens", f"<= {max_context_len} (the req_to_token width)", longest)


def _check_index(name: str, t: object, rows: int, device: torch.device) -> None:
    check_tensor(f"forward_batch.{name}", t, dtype=INDEX_DTYPES, shape=[rows], device=device)


@dataclass(frozen=True)
class AttentionLayer:
    """What a backend needs to know about the attention layer calling it."""

    layer_id: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int  # q/k head dim
    v_head_dim: int  # v / output head dim
    scaling: float  # softmax scale, usually head_dim ** -0.5
    # fp8 KV cache: fp32 dequant scales, [1] (per tensor) or [num_kv_heads] (per head);
    # cache = saturate(x / scale) on write, x ~= cache * scale on read. None otherwise.
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None


class ReqToTokenPool:
    """``req_to_token[max_reqs, max_context_len]`` int32: token slots of each request row."""

    def __init__(self, max_reqs: int, max_context_len: int, device: torch.device | str) -> None:
        check_at_least("max_reqs", max_reqs, 1)
        check_at_least("max_context_len", max_context_len, 1)
        self.req_to_token = torch.zeros(
            (max_reqs, max_context_len), dtype=torch.int32, device=device
        )

    @property
    def size(self) -> int:
        return int(self.req_to_token.shape[0])

    @property
    def max_context_len(self) -> int:
        return int(self.req_to_token.shape[1])

    @property
    def device(self) -> torch.device:
        return self.req_to_token.device

    def write(self, req_index: int, start: int, slots: torch.Tensor) -> None:
        """Set the slots of request row ``req_index``'s tokens ``start..start+len(slots)-1``."""
        end = start + int(slots.shape[0])
        if not 0 <= req_index < self.size or end > self.max_context_len:
            raise AttngenInputError(
                f"req_to_token write of row {req_index}, tokens {start}..{end - 1}: "
                f"out of the table [{self.size}, {self.max_context_len}]"
            )
        self.req_to_token[req_index, start:end] = slots.to(self.device, torch.int32)


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
        self.k_buffer = [
            torch.empty(shape + (head_dim,), dtype=dtype, device=device) for _ in range(num_layers)
        ]
        self.v_buffer = [
            torch.empty(shape + (self.v_head_dim,), dtype=dtype, device=device)
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
        k_cache.view(self.num_slots, self.num_kv_heads, self.head_dim)[loc] = k
        v_cache.view(self.num_slots, self.num_kv_heads, self.v_head_dim)[loc] = v


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
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        v_head_dim: int | None = None,
        device: torch.device | str,
    ) -> None:
        v_head_dim = head_dim if v_head_dim is None else v_head_dim
        for name, dim in (("head_dim", head_dim), ("v_head_dim", v_head_dim)):
            if dim % 16:
                fail(name, "a multiple of 16 (NVFP4 scales blocks of 16 elements)", dim)
        super().__init__(
            num_layers=num_layers,
            num_pages=num_pages,
            page_size=page_size,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim // 2,
            v_head_dim=v_head_dim // 2,
            dtype=torch.uint8,
            device=device,
        )
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
            cache.view(self.num_slots, self.num_kv_heads, dim // 2)[loc] = codes
            block_scales.view(self.num_slots, self.num_kv_heads, dim // 16)[loc] = scales


# -- fp8 KV cache ----

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
