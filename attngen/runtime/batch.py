"""attngen's own batch types, shaped like a serving engine's (the pools: runtime/pools.py).

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
import math
import numbers
from dataclasses import dataclass
from typing import Any

import torch

from attngen.runtime.checks import AttngenInputError, check_at_least, check_tensor, fail

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
        if self.forward_mode.is_decode() and bs and int(self.seq_lens_cpu.min()) < 1:
            fail(
                "forward_batch.seq_lens_cpu",
                "lengths >= 1 in DECODE mode (they count the new token, cached before the call)",
                self.seq_lens_cpu.tolist(),
            )
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
        for name, values in (("extend_prefix_lens_cpu", prefix), ("extend_seq_lens_cpu", ext)):
            if not isinstance(values, (list, tuple)) or len(values) != bs:
                got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
                fail(f"forward_batch.{name}", f"a list of {bs} Python ints", got)
            odd = [v for v in values if not isinstance(v, int) or isinstance(v, bool)]
            if odd:
                fail(f"forward_batch.{name}", "Python ints", f"{type(odd[0]).__name__} {odd[0]!r}")
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


def tree_mask_bytes(num_draft_tokens: int) -> int:
    """Bytes of one request's packed ``[n, n]`` tree mask (whole bytes, see below)."""
    return -(-num_draft_tokens * num_draft_tokens // 8)


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

    def __post_init__(self) -> None:
        scaling = self.scaling
        if isinstance(scaling, bool) or not isinstance(scaling, numbers.Real):
            fail("layer.scaling", "a real number (the softmax scale)", type(scaling).__name__)
        if not math.isfinite(scaling):
            fail("layer.scaling", "a finite softmax scale", scaling)


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
