"""Per-forward attention metadata, and its static buffers for CUDA graphs.

``DecodeMetadata`` / ``ExtendMetadata`` are what ``init_forward_metadata`` builds once per
forward and every layer reads. A captured graph bakes in the device addresses of every tensor its kernels read, so the
decode metadata lives in buffers allocated once (``init_cuda_graph_state``) at the largest
batch the engine will capture. Capture and replay write the first ``bs`` rows in place and
hand the kernels views of those rows; nothing here ever reallocates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from attngen.runtime.batch import INDEX_DTYPES, ForwardMode, check_max_seq_len, tree_mask_bytes
from attngen.runtime.checks import AttngenInputError, check_at_least, check_tensor, fail


@dataclass(frozen=True)
class DecodeMetadata:
    batch_size: int
    page_table: torch.Tensor  # [>=B, pages] int32, physical page of each page index
    seq_lens: torch.Tensor  # [>=B] int32
    # [>=B] int32 in 1..max_splits, KV splits per request; None (eager, where a family's
    # kernels allow it): one split each, no partials
    num_splits: torch.Tensor | None
    workspace: tuple[torch.Tensor | None, ...]  # the kernels' scratch (decode_workspace layout)
    out: torch.Tensor | None  # static output rows (graph mode); None: a fresh tensor per call


@dataclass(frozen=True)
class ExtendMetadata:
    batch_size: int
    num_tokens: int  # new tokens over all requests
    page_table: torch.Tensor  # [B, pages] int32
    qo_indptr: torch.Tensor  # [B + 1] int32, start row of each request's new tokens
    prefix_lens: torch.Tensor  # [B] int32, cached tokens before the new ones
    max_extend_len: int
    no_prefix: bool = False  # no request has cached tokens (prefill may skip the cache)
    verify: bool = False  # TARGET_VERIFY: kernels.verify, draft rows per request fixed
    tree_mask: torch.Tensor | None = None  # verify with trees: bit-packed uint8
    tree_mask_indptr: torch.Tensor | None = None  # [>= B] int32 byte offsets
    out: torch.Tensor | None = None  # static output rows (graph mode)


@dataclass(frozen=True)
class VerifyGraphBuffers:
    """Target-verify metadata for up to ``max_bs`` requests of ``draft_token_num`` drafts.

    Each request's rows and tree-mask bytes sit at fixed offsets (b * n rows, b * bytes
    per request), so qo_indptr and tree_mask_indptr never change after allocation.
    """

    draft_token_num: int
    page_table: torch.Tensor  # [max_bs, max_pages] int32
    qo_indptr: torch.Tensor  # [max_bs + 1] int32: b * draft_token_num
    prefix_lens: torch.Tensor  # [max_bs] int32
    tree_mask: torch.Tensor  # [max_bs * mask_bytes] uint8 (1 byte when not a tree)
    tree_mask_indptr: torch.Tensor  # [max_bs + 1] int32: b * mask_bytes
    out: torch.Tensor  # [max_bs * draft_token_num, Hq, Dv]
    tree: bool

    @staticmethod
    def allocate(
        *,
        max_bs: int,
        max_pages: int,
        draft_token_num: int,
        tree: bool,
        num_q_heads: int,
        v_head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> VerifyGraphBuffers:
        n = draft_token_num
        mask_bytes = tree_mask_bytes(n) if tree else 0
        i32 = dict(dtype=torch.int32, device=device)
        return VerifyGraphBuffers(
            draft_token_num=n,
            page_table=torch.zeros((max_bs, max_pages), **i32),
            qo_indptr=torch.arange(max_bs + 1, **i32) * n,
            prefix_lens=torch.zeros((max_bs,), **i32),
            tree_mask=torch.zeros((max(1, max_bs * mask_bytes),), dtype=torch.uint8, device=device),
            tree_mask_indptr=torch.arange(max_bs + 1, **i32) * mask_bytes,
            out=torch.empty((max_bs * n, num_q_heads, v_head_dim), dtype=dtype, device=device),
            tree=tree,
        )

    @property
    def max_bs(self) -> int:
        return int(self.page_table.shape[0])

    def load(
        self,
        bs: int,
        *,
        page_table: torch.Tensor,
        seq_lens: torch.Tensor,
        tree_mask: torch.Tensor | None,
    ) -> None:
        """Copy one batch in place: seq_lens count the drafts; padded rows may be short."""
        load_page_table(self.page_table, bs, page_table)
        torch.clamp(seq_lens - self.draft_token_num, min=0, out=self.prefix_lens[:bs])
        if self.tree:
            want = int(self.tree_mask_indptr[bs])
            device = self.tree_mask.device
            check_tensor(
                "spec_info.tree_mask", tree_mask, dtype=torch.uint8, shape=[None], device=device
            )
            if tree_mask.shape[0] < want:
                fail(
                    "spec_info.tree_mask",
                    f">= {want} bytes (bs x packed n x n)",
                    tree_mask.shape[0],
                )
            self.tree_mask[:want].copy_(tree_mask[:want])

    def metadata(self, bs: int) -> ExtendMetadata:
        n = self.draft_token_num
        return ExtendMetadata(
            batch_size=bs,
            num_tokens=bs * n,
            page_table=self.page_table[:bs],
            qo_indptr=self.qo_indptr[: bs + 1],
            prefix_lens=self.prefix_lens[:bs],
            max_extend_len=n,
            verify=True,
            tree_mask=self.tree_mask if self.tree else None,
            tree_mask_indptr=self.tree_mask_indptr[: bs + 1] if self.tree else None,
            out=self.out[: bs * n],
        )


def load_page_table(static: torch.Tensor, bs: int, page_table: torch.Tensor) -> None:
    """Copy ``page_table`` ([bs, w], w <= the static width) into rows ``0..bs-1`` of
    ``static`` in place; columns past ``w`` keep stale, valid page ids no kernel reads."""
    width = int(page_table.shape[1])
    if width > static.shape[1]:
        raise AttngenInputError(
            f"page_table: expected <= {static.shape[1]} pages per request, got {width}"
        )
    static[:bs, :width].copy_(page_table)


@dataclass(frozen=True)
class DecodeGraphBuffers:
    """Decode metadata for up to ``max_bs`` requests, at fixed addresses.

    The generated ``graph.allocate_decode_buffers`` makes them from the plan: page_table,
    seq_lens and num_splits are metadata; every other buffer is the kernels' workspace,
    passed to them in the plan's order.
    """

    page_table: torch.Tensor  # [max_bs, max_pages] int32
    seq_lens: torch.Tensor  # [max_bs] int32
    num_splits: torch.Tensor  # [max_bs] int32
    workspace: tuple[torch.Tensor, ...]  # each [max_bs, ...]
    # [max_num_tokens, Hq, Dv]: the output of every layer in graph mode, so a layer's
    # result is valid until the next attention call (the model's o_proj reads it first)
    out: torch.Tensor

    METADATA = ("page_table", "seq_lens", "num_splits")

    @staticmethod
    def allocate(
        buffers: dict[str, torch.Tensor],
        *,
        max_num_tokens: int,
        num_q_heads: int,
        v_head_dim: int,
        dtype: torch.dtype,
    ) -> DecodeGraphBuffers:
        """Wrap the buffers a generated ``graph.allocate_decode_buffers`` made, plus ``out``."""
        page_table = buffers["page_table"]
        max_bs = int(page_table.shape[0])
        check_at_least("max_bs", max_bs, 1)
        check_at_least("max_num_tokens", max_num_tokens, max_bs)
        out = torch.empty(
            (max_num_tokens, num_q_heads, v_head_dim), dtype=dtype, device=page_table.device
        )
        workspace = tuple(
            b for name, b in buffers.items() if name not in DecodeGraphBuffers.METADATA
        )
        metadata = {name: buffers[name] for name in DecodeGraphBuffers.METADATA}
        return DecodeGraphBuffers(workspace=workspace, out=out, **metadata)

    @property
    def max_bs(self) -> int:
        return int(self.page_table.shape[0])

    @property
    def max_pages(self) -> int:
        return int(self.page_table.shape[1])

    def metadata(self, bs: int) -> DecodeMetadata:
        """Views of rows ``0..bs-1``: the same addresses at capture and at every replay."""
        return DecodeMetadata(
            batch_size=bs,
            page_table=self.page_table[:bs],
            seq_lens=self.seq_lens[:bs],
            num_splits=self.num_splits[:bs],
            workspace=tuple(w[:bs] for w in self.workspace),
            out=self.out[:bs],
        )


@dataclass(frozen=True)
class DraftExtendGraphBuffers:
    """Draft-extend metadata for up to ``max_bs`` requests of 1 .. ``max_tokens`` new tokens.

    The extend kernel's grid is fixed by max_tokens; each replay writes the requests'
    lengths (their cumulative row offsets and prefix lengths) in place.
    """

    max_tokens: int
    page_table: torch.Tensor  # [max_bs, max_pages] int32
    qo_indptr: torch.Tensor  # [max_bs + 1] int32
    prefix_lens: torch.Tensor  # [max_bs] int32
    out: torch.Tensor  # [max_bs * max_tokens, Hq, Dv]

    @staticmethod
    def allocate(
        *,
        max_bs: int,
        max_pages: int,
        max_tokens: int,
        num_q_heads: int,
        v_head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> DraftExtendGraphBuffers:
        i32 = dict(dtype=torch.int32, device=device)
        return DraftExtendGraphBuffers(
            max_tokens=max_tokens,
            page_table=torch.zeros((max_bs, max_pages), **i32),
            qo_indptr=torch.arange(max_bs + 1, **i32),  # one row each until loaded
            prefix_lens=torch.zeros((max_bs,), **i32),
            out=torch.empty(
                (max_bs * max_tokens, num_q_heads, v_head_dim), dtype=dtype, device=device
            ),
        )

    @property
    def max_bs(self) -> int:
        return int(self.page_table.shape[0])

    def load(
        self, bs: int, *, page_table: torch.Tensor, seq_lens: torch.Tensor, extend_lens: object
    ) -> None:
        """seq_lens count the new tokens; extend_lens[b] in 1 .. max_tokens (not checked on
        the host: graph replays do not sync)."""
        lens = check_graph_rows("spec_info.extend_lens", extend_lens, bs, page_table.device)
        load_page_table(self.page_table, bs, page_table)
        torch.cumsum(lens, dim=0, dtype=torch.int32, out=self.qo_indptr[1 : bs + 1])
        torch.clamp(seq_lens - lens, min=0, out=self.prefix_lens[:bs])

    def metadata(self, bs: int) -> ExtendMetadata:
        return ExtendMetadata(
            batch_size=bs,
            num_tokens=bs * self.max_tokens,
            page_table=self.page_table[:bs],
            qo_indptr=self.qo_indptr[: bs + 1],
            prefix_lens=self.prefix_lens[:bs],
            max_extend_len=self.max_tokens,
            out=self.out[: bs * self.max_tokens],
        )


def check_graph_call(
    phase: str,
    *,
    bs: int,
    num_tokens: int,
    mode: ForwardMode,
    encoder_lens: object,
    tokens_per_request: int = 1,
) -> None:
    """Graph capture/replay covers DECODE (one token per request), TARGET_VERIFY
    (``tokens_per_request`` drafts each) and DRAFT_EXTEND (room for that many tokens per
    request: num_tokens is bs * tokens_per_request); no cross-attention."""
    where = f"cuda graph {phase}"
    for name, value in (("bs", bs), ("num_tokens", num_tokens)):
        if isinstance(value, bool) or not hasattr(type(value), "__index__"):
            fail(f"{where}: {name}", "an integer", f"{type(value).__name__} {value!r}")
    if not isinstance(mode, ForwardMode):
        fail(f"{where}: forward_mode", "a ForwardMode", f"{type(mode).__name__} {mode!r}")
    if mode not in (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND):
        raise AttngenInputError(
            f"{where}: forward_mode {mode.name} is not graph-capturable; DECODE, "
            "TARGET_VERIFY and DRAFT_EXTEND are"
        )
    if encoder_lens is not None:
        fail(f"{where}: encoder_lens", "None (no cross-attention)", type(encoder_lens).__name__)
    if num_tokens != bs * tokens_per_request:
        what = f"bs * {tokens_per_request} = {bs * tokens_per_request} ({mode.name})"
        fail(f"{where}: num_tokens", what, num_tokens)


def check_fits(bufs: Any, bs: int, num_tokens: int) -> None:
    """``bs`` requests and ``num_tokens`` output rows fit static buffers allocated for
    ``bufs.max_bs`` requests with ``bufs.out`` rows."""
    if not 1 <= bs <= bufs.max_bs:
        raise AttngenInputError(
            f"bs: expected 1..{bufs.max_bs} (init_cuda_graph_state's max_bs), got {bs}"
        )
    if num_tokens > bufs.out.shape[0]:
        raise AttngenInputError(
            f"num_tokens: expected <= {bufs.out.shape[0]} (init_cuda_graph_state's "
            f"max_num_tokens), got {num_tokens}"
        )


def check_graph_rows(name: str, t: object, bs: int, device: torch.device) -> torch.Tensor:
    """A per-request index tensor with at least ``bs`` rows; returns its first ``bs``."""
    t = check_tensor(name, t, dtype=INDEX_DTYPES, shape=[None], device=device)
    if t.shape[0] < bs:
        fail(name, f">= bs={bs} rows", t.shape[0])
    return t[:bs]


def check_graph_host_lens(seq_lens_cpu: object, bs: int, max_context_len: int) -> torch.Tensor:
    """A replay's host copy of seq_lens (it sizes the page-table copy): >= ``bs`` rows on
    the host, lengths 1 .. max_context_len (padded rows: seq_len_fill_value); returns the
    first ``bs``. A short one would leave the longest request's columns stale."""
    lens = check_graph_rows("seq_lens_cpu", seq_lens_cpu, bs, torch.device("cpu"))
    check_max_seq_len(lens, max_context_len)
    if int(lens.min()) < 1:
        fail("seq_lens_cpu", "lengths >= 1 (padded rows: seq_len_fill_value)", lens.tolist())
    return lens
