"""Random paged batches for tests and benchmarks (CPU or CUDA alike).

Every K/V element of a pool and every q/k/v is fresh ``torch.randn`` (never zeros), so a
kernel that reads the wrong page or an unwritten slot shows. Pages are handed out in a
shuffled physical order, so a kernel that assumes contiguous pages fails.

As in SGLang, request row 0 of ``req_to_token`` and physical page 0 are reserved: CUDA-graph
padding rows use request 0, and their K/V writes land in page 0, so padding never touches a
real request's tokens. Each batch built here lays its requests out afresh (new rows, new
pages); it does not continue an earlier batch.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attngen.runtime.batch import (
    AttentionLayer,
    ForwardBatch,
    ForwardMode,
    ReqToTokenPool,
    VerifyInfo,
    pack_tree_masks,
)
from attngen.runtime.pools import FP8_DTYPES, NvFp4KVPool, PagedKVPool
from attngen.runtime.checks import AttngenInputError

PADDING_REQ = 0  # request row used by CUDA-graph padding rows
PADDING_PAGE = 0  # physical page reserved for padding: never given to a request
PADDING_SLOT = 0  # token slot (in PADDING_PAGE) that padding rows' K/V writes land in


@dataclass(frozen=True)
class PagedBatch:
    """A built batch plus the facts a test checks against, independent of any backend."""

    batch: ForwardBatch
    page_table: torch.Tensor  # [B, pages of the longest request] int32, from the allocation
    prefix_lens: list[int]  # cached tokens per request before this forward
    extend_lens: list[int]  # new tokens per request (1 for decode)
    tree_masks: list[torch.Tensor] | None = None  # TARGET_VERIFY of draft trees: [n, n] bool

    @property
    def seq_lens(self) -> list[int]:
        return [p + e for p, e in zip(self.prefix_lens, self.extend_lens)]

    @property
    def qo_indptr(self) -> torch.Tensor:
        """``[B + 1]`` int32 row offsets of each request's new tokens (on the batch device)."""
        ends = torch.tensor([0] + self.extend_lens, dtype=torch.int64).cumsum(0)
        return ends.to(torch.int32).to(self.batch.seq_lens.device)


def make_pools(
    *,
    num_layers: int,
    max_reqs: int,
    max_context_len: int,
    num_pages: int,
    page_size: int,
    num_kv_heads: int,
    head_dim: int,
    v_head_dim: int | None = None,
    dtype: torch.dtype | str,
    device: torch.device | str,
    generator: torch.Generator | None = None,
) -> tuple[ReqToTokenPool, PagedKVPool]:
    """A ``req_to_token`` table and a paged KV pool whose every element is random normal
    (``dtype="nvfp4"``: random codes, block scales uniform in [0.25, 2])."""
    req_pool = ReqToTokenPool(max_reqs, max_context_len, device)
    shape = dict(
        num_layers=num_layers,
        num_pages=num_pages,
        page_size=page_size,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        device=device,
    )
    if dtype == "nvfp4":
        fp4 = NvFp4KVPool(**shape)
        for buf in fp4.k_buffer + fp4.v_buffer:
            codes = torch.randint(0, 256, buf.shape, generator=generator, device=buf.device)
            buf.copy_(codes.to(torch.uint8))
        for buf in fp4.k_block_scales + fp4.v_block_scales:
            noise = torch.empty(buf.shape, device=buf.device).uniform_(0.25, 2, generator=generator)
            buf.copy_(noise.to(buf.dtype))
        return req_pool, fp4
    kv_pool = PagedKVPool(dtype=dtype, **shape)
    for buf in kv_pool.k_buffer + kv_pool.v_buffer:
        if buf.dtype in FP8_DTYPES:  # random normal values, stored exactly in fp8
            noise = torch.empty(buf.shape, device=buf.device).normal_(generator=generator)
            buf.copy_(noise.to(buf.dtype))
        else:
            buf.normal_(generator=generator)
    return req_pool, kv_pool


Q_STD = 2.0
# The GPU suite's long batches (what the tolerance must resolve: outputs averaged over
# thousands of keys): (prefix_lens, extend_lens) of the long extend, seq_lens of the long decode.
LONG_EXTEND = ([4096, 0, 1000, 37], [1536, 2048, 1, 300])
LONG_DECODE = [8192, 1, 3000, 4097, 513]


def random_qkv(
    num_tokens: int,
    layer: AttentionLayer,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh ``q [T, Hq, D]``, ``k [T, Hkv, D]``, ``v [T, Hkv, Dv]``, random normal, q with
    standard deviation ``Q_STD``: scores of std ~2 at the usual 1/sqrt(D) scale give a
    softmax as peaked as trained models' are, on which a 1% scale error shows."""
    shapes = (
        (num_tokens, layer.num_q_heads, layer.head_dim),
        (num_tokens, layer.num_kv_heads, layer.head_dim),
        (num_tokens, layer.num_kv_heads, layer.v_head_dim),
    )
    q, k, v = (torch.randn(s, generator=generator, device=device, dtype=dtype) for s in shapes)
    return q * Q_STD, k, v  # a power of two: exact in every dtype


class PagedBatchBuilder:
    """Lays out random requests in shuffled pages of one pool pair and builds batches.

    ``seed`` makes a run reproducible; left ``None``, a fresh one is drawn and kept in
    ``self.seed`` so a failing test can print it.
    """

    def __init__(
        self, req_to_token_pool: ReqToTokenPool, kv_pool: PagedKVPool, *, seed: int | None = None
    ) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.kv_pool = kv_pool
        self.seed = random.SystemRandom().randrange(2**31) if seed is None else seed
        self._layout_rng = random.Random(self.seed)
        self.generator = torch.Generator(device=kv_pool.device).manual_seed(self.seed)

    @property
    def device(self) -> torch.device:
        return self.kv_pool.device

    def extend(self, prefix_lens: Sequence[int], extend_lens: Sequence[int]) -> PagedBatch:
        """An EXTEND batch: request ``b`` has ``prefix_lens[b]`` cached tokens (random K/V
        already in the pool) and ``extend_lens[b] >= 1`` new ones."""
        prefix, ext = list(prefix_lens), list(extend_lens)
        if len(prefix) != len(ext) or not ext or min(ext) < 1 or min(prefix) < 0:
            raise AttngenInputError(
                f"extend batch: expected equal-length prefix_lens >= 0 and extend_lens >= 1, "
                f"got {prefix} and {ext}"
            )
        return self._build(ForwardMode.EXTEND, prefix, ext)

    def decode(self, seq_lens: Sequence[int]) -> PagedBatch:
        """A DECODE batch: request ``b`` has ``seq_lens[b] - 1`` cached tokens plus one new."""
        lens = list(seq_lens)
        if not lens or min(lens) < 1:
            raise AttngenInputError(f"decode batch: expected seq_lens >= 1, got {lens}")
        return self._build(ForwardMode.DECODE, [n - 1 for n in lens], [1] * len(lens))

    def draft_extend(self, prefix_lens: Sequence[int], extend_lens: Sequence[int]) -> PagedBatch:
        """A DRAFT_EXTEND batch (the draft model's causal extend over accepted tokens)."""
        pb = self.extend(prefix_lens, extend_lens)
        batch = dataclasses.replace(pb.batch, forward_mode=ForwardMode.DRAFT_EXTEND)
        return dataclasses.replace(pb, batch=batch)

    def verify(self, prefix_lens: Sequence[int], draft_token_num: int, *, tree: bool) -> PagedBatch:
        """A TARGET_VERIFY batch of ``draft_token_num`` drafts per request; ``tree``: each
        request gets a random draft tree (each draft's parent an earlier draft or the root),
        bit-packed into its VerifyInfo."""
        n = draft_token_num
        pb = self.extend(prefix_lens, [n] * len(prefix_lens))
        masks = [self._random_tree(n) for _ in prefix_lens] if tree else None
        packed, indptr = pack_tree_masks(masks) if masks else (None, None)
        if packed is not None:
            packed, indptr = packed.to(self.device), indptr.to(self.device)
        batch = dataclasses.replace(
            pb.batch,
            forward_mode=ForwardMode.TARGET_VERIFY,
            spec_info=VerifyInfo(n, packed, indptr),
        )
        return dataclasses.replace(pb, batch=batch, tree_masks=masks)

    def _random_tree(self, n: int) -> torch.Tensor:
        mask = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            parent = self._layout_rng.randint(-1, i - 1)
            if parent >= 0:
                mask[i] = mask[parent]
            mask[i, i] = True
        return mask

    def qkv(
        self, num_tokens: int, layer: AttentionLayer, dtype: torch.dtype | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Random q/k/v for ``num_tokens`` new tokens, of ``dtype`` (default: the pool's;
        an fp8 pool needs the activations' dtype here)."""
        dtype = self.kv_pool.dtype if dtype is None else dtype
        if dtype in FP8_DTYPES or dtype == "nvfp4":
            raise AttngenInputError("qkv: pass the activation dtype for an fp8 KV pool")
        dev, gen = self.device, self.generator
        return random_qkv(num_tokens, layer, dtype=dtype, device=dev, generator=gen)

    def _build(self, mode: ForwardMode, prefix: list[int], ext: list[int]) -> PagedBatch:
        seq_lens = [p + e for p, e in zip(prefix, ext)]
        rows, pages = self._allocate(seq_lens)
        slots = [self._write_row(r, pg, n) for r, pg, n in zip(rows, pages, seq_lens)]
        new_slots = [s[p:] for s, p in zip(slots, prefix)]
        dev = self.device
        i32 = torch.int32
        is_extend = mode is ForwardMode.EXTEND
        batch = ForwardBatch(
            batch_size=len(seq_lens),
            forward_mode=mode,
            req_pool_indices=torch.tensor(rows, dtype=torch.int64, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=i32, device=dev),
            seq_lens_cpu=torch.tensor(seq_lens, dtype=i32),
            out_cache_loc=torch.cat(new_slots).to(dev),
            extend_prefix_lens=torch.tensor(prefix, dtype=i32, device=dev) if is_extend else None,
            extend_seq_lens=torch.tensor(ext, dtype=i32, device=dev) if is_extend else None,
            extend_prefix_lens_cpu=list(prefix) if is_extend else None,
            extend_seq_lens_cpu=list(ext) if is_extend else None,
        )
        return PagedBatch(batch, _page_table(pages, dev), prefix, ext)

    def _allocate(self, seq_lens: list[int]) -> tuple[list[int], list[list[int]]]:
        """Distinct request rows (not row 0) and shuffled physical pages (not page 0)."""
        ps, rng = self.kv_pool.page_size, self._layout_rng
        free_rows = self.req_to_token_pool.size - 1
        pages_needed = [-(-n // ps) for n in seq_lens]
        free_pages = self.kv_pool.num_pages - 1
        if len(seq_lens) > free_rows or sum(pages_needed) > free_pages:
            raise AttngenInputError(
                f"batch of {len(seq_lens)} requests needing {sum(pages_needed)} pages does not "
                f"fit {free_rows} request rows and {free_pages} pages (row 0 / page 0 reserved)"
            )
        rows = rng.sample(range(1, free_rows + 1), len(seq_lens))
        shuffled = rng.sample(range(1, free_pages + 1), sum(pages_needed))
        starts = itertools.accumulate(pages_needed, initial=0)
        return rows, [shuffled[s : s + n] for s, n in zip(starts, pages_needed)]

    def _write_row(self, row: int, pages: list[int], length: int) -> torch.Tensor:
        """Point row ``row``'s tokens ``0..length-1`` at ``pages``; return their slots."""
        ps = self.kv_pool.page_size
        page_ids = torch.tensor(pages, dtype=torch.int64).repeat_interleave(ps)
        offsets = torch.arange(ps, dtype=torch.int64).repeat(len(pages))
        slots = (page_ids * ps + offsets)[:length]
        self.req_to_token_pool.write(row, 0, slots)
        return slots


def _page_table(pages: list[list[int]], device: torch.device) -> torch.Tensor:
    width = max(1, max(len(p) for p in pages))
    table = torch.full((len(pages), width), PADDING_PAGE, dtype=torch.int32)
    for b, row in enumerate(pages):
        table[b, : len(row)] = torch.tensor(row, dtype=torch.int32)
    return table.to(device)


def pad_decode_batch(batch: ForwardBatch, bs: int, seq_len_fill_value: int) -> ForwardBatch:
    """Pad a DECODE batch to ``bs`` rows the way a CUDA-graph runner does.

    Padding rows use request row 0, length ``seq_len_fill_value`` and write their K/V to
    slot 0 (the reserved page), so they never disturb real requests.
    """
    real = batch.batch_size
    if batch.forward_mode is not ForwardMode.DECODE or not 1 <= real <= bs:
        raise AttngenInputError(
            f"pad_decode_batch: expected a DECODE batch of 1..{bs} rows, "
            f"got {batch.forward_mode.name} with {real}"
        )
    pad = bs - real

    def padded(t: torch.Tensor, value: int) -> torch.Tensor:
        return torch.cat([t, torch.full((pad,), value, dtype=t.dtype, device=t.device)])

    return ForwardBatch(
        batch_size=bs,
        forward_mode=ForwardMode.DECODE,
        req_pool_indices=padded(batch.req_pool_indices, PADDING_REQ),
        seq_lens=padded(batch.seq_lens, seq_len_fill_value),
        seq_lens_cpu=padded(batch.seq_lens_cpu, seq_len_fill_value),
        out_cache_loc=padded(batch.out_cache_loc, PADDING_SLOT),
    )
