"""The DSA runtime: the lightning indexer picks each query token's top-k keys, then sparse
absorbed MLA attends them; SGLang's DSA backend seams.

A generated ``backend.py`` subclasses :class:`DsaBackend` and sets class attributes only.
Per forward, ``init_forward_metadata`` (or a CUDA-graph capture / replay) fixes every query
row's visible keys (decode: the request's sequence; extend and chain verify: causal up to
the token itself) and a page-table row per query row. Per layer:

1. the caller writes the new tokens' indexer keys (``index_pool.set_index_k``, or
   ``index_k=`` to :meth:`DsaBackend.indexer`) and :meth:`DsaBackend.indexer` scores every
   visible key (q ``[T, 64, 128]`` in the index dtype, weights ``[T, 64]`` fp32: fp8 q with
   its scale folded into the weights, or an unquantized indexer's bf16 / fp16 / fp32 q; the
   index pool's dtype says which) and returns ``topk_indices [T, 2048]`` int32: logical
   positions in the request, -1 padded (SGLang's convention); the matching token slots
   stay in the metadata;
2. ``forward_decode`` / ``forward_extend(q, k, v, layer, forward_batch, save_kv_cache,
   q_rope, k_rope, topk_indices=...)`` writes the new latent rows (``k`` the latent ``[T,
   1, 512]`` or ``[T, 512]``, ``k_rope [T, 1, 64]``; the fp8 pool quantizes them into
   656-byte rows) and runs sparse MLA over the selected slots (positions from another
   indexer are mapped through the page table on device). q ``[T, H, 576]`` or ``[T, H,
   512]`` + q_rope; out ``[T, H * 512]`` (and the LSE ``[T, H]`` with ``return_lse``).

Nothing on decode and verify reads device values on the host: both are CUDA-graph
capturable (indexer and attention both replay from the static buffers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from attngen.families.dsa.pool import Fp8LatentPool, IndexKeyPool
from attngen.families.dsa.triton.config import DsaKey
from attngen.families.mha.selection import select_config
from attngen.families.mla.pool import MlaLatentPool
from attngen.runtime.backend_base import GRAPH_PHASES, AttentionBackendBase, kernel_device
from attngen.runtime.batch import (
    INDEX_DTYPES,
    AttentionLayer,
    ForwardBatch,
    ForwardMode,
    ReqToTokenPool,
    VerifyInfo,
)
from attngen.runtime.checks import AttngenInputError, check_at_least, check_tensor, fail
from attngen.runtime.graph import check_graph_host_lens, check_graph_rows

I32 = dict(dtype=torch.int32)


def dtype_name(dtype: torch.dtype | str) -> str:
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class DsaMetadata:
    """One forward's rows: every query row with its own page-table row and visible keys,
    and the buffers the indexer and sparse attention fill and read."""

    kind: str  # "decode" | "extend" | "verify"
    num_rows: int
    page_table: torch.Tensor  # [T, pages] int32: the row's request's physical pages
    row_lens: torch.Tensor  # [T] int32: keys the row sees (causal by position)
    logits: torch.Tensor  # [T, >= max row_lens] fp32 indexer scores
    topk_pos: torch.Tensor  # [T, topk] int32 logical positions (-1 padded)
    topk_slots: torch.Tensor  # [T, topk] int32 token slots (-1 padded)
    splits: int  # top-k splits of sparse MLA
    workspace: tuple[torch.Tensor, ...]  # split partials and counts
    out: torch.Tensor | None = None  # static output rows (graph mode)


@dataclass(frozen=True)
class DsaGraphBuffers:
    """Static rows of one capturable mode for up to ``max_bs`` requests of ``per_request``
    query rows each (row t is request t // n's draft t % n)."""

    per_request: int
    buffers: dict[str, torch.Tensor]  # graph.allocate_decode_buffers(max_bs=rows, ...)
    row_req: torch.Tensor  # [rows] int32: t // n
    row_offset: torch.Tensor  # [rows] int32: t % n + 1 - n
    out: torch.Tensor  # [rows, H, LORA]

    @property
    def max_bs(self) -> int:
        return int(self.out.shape[0]) // self.per_request

    def metadata(self, kind: str, bs: int, splits: int) -> DsaMetadata:
        rows, b = bs * self.per_request, self.buffers
        return DsaMetadata(
            kind=kind,
            num_rows=rows,
            page_table=b["page_table"][:rows],
            row_lens=b["seq_lens"][:rows],
            logits=b["logits"][:rows],
            topk_pos=b["topk_pos"][:rows],
            topk_slots=b["topk_slots"][:rows],
            splits=splits,
            workspace=(b["partial_o"], b["partial_lse"], b["num_splits"]),
            out=self.out[:rows],
        )


class DsaBackend(AttentionBackendBase):
    """DSA attention through one generated kernels module (see the module docstring)."""

    def __init__(
        self,
        *,
        num_heads: int,
        dtype: torch.dtype,
        device: torch.device | str,
        req_to_token_pool: ReqToTokenPool,
        kv_pool: MlaLatentPool | Fp8LatentPool,
        index_pool: IndexKeyPool,
        page_size: int = 64,
        kv_cache_dtype: torch.dtype | None = None,
        spec_topk: int | None = None,
    ) -> None:
        self._check_generated()
        self.num_heads = num_heads
        self.page_size = page_size
        self.dtype = dtype
        self.kv_cache_dtype = dtype if kv_cache_dtype is None else kv_cache_dtype
        dtypes = (dtype, self.kv_cache_dtype)
        self.device = kernel_device(device, self.backend, self.arch, dtypes)
        if not isinstance(index_pool, IndexKeyPool):
            fail("index_pool", "an IndexKeyPool", type(index_pool).__name__)
        self.config = select_config(
            self.kernels.CONFIGS,
            DsaKey(
                num_heads=num_heads,
                kv_lora_rank=None,  # type: ignore[arg-type]
                qk_rope_head_dim=None,  # type: ignore[arg-type]
                index_heads=None,  # type: ignore[arg-type]
                index_head_dim=None,  # type: ignore[arg-type]
                index_topk=None,  # type: ignore[arg-type]
                index_dtype=dtype_name(index_pool.dtype),  # the pool's keys say what it scores in
                page_size=page_size,
                dtype=dtype_name(dtype),
                kv_dtype=dtype_name(self.kv_cache_dtype),
                spec_topk=spec_topk,  # type: ignore[arg-type]
            ),
        )
        c = self.config
        for pool, name, want in (
            (kv_pool, "page_size", page_size),
            (kv_pool, "kv_lora_rank", c.kv_lora_rank),
            (kv_pool, "qk_rope_head_dim", c.qk_rope_head_dim),
            (kv_pool, "dtype", self.kv_cache_dtype),
            (kv_pool, "device", self.device),
            (index_pool, "page_size", page_size),
            (index_pool, "index_head_dim", c.index_head_dim),
            (index_pool, "device", self.device),
        ):
            label = "kv_pool" if pool is kv_pool else "index_pool"
            if getattr(pool, name) != want:
                fail(f"{label}.{name}", f"{want} (as the backend)", getattr(pool, name))
        if index_pool.num_slots < kv_pool.num_slots:
            fail("index_pool", f">= {kv_pool.num_slots} slots (kv_pool's)", index_pool.num_slots)
        if req_to_token_pool.device != self.device:
            fail("req_to_token_pool.device", f"{self.device}", req_to_token_pool.device)
        self.req_to_token_pool = req_to_token_pool
        self.kv_pool = kv_pool
        self.index_pool = index_pool
        self.max_context_len = req_to_token_pool.max_context_len
        self.max_pages = -(-self.max_context_len // page_size)
        self.forward_metadata: DsaMetadata | None = None
        self._graph_buffers: dict[str, Any] = {}

    # -- per-forward metadata ----

    def _rows(self, kind: str, rows: int, page_table, row_lens, width: int) -> DsaMetadata:
        c, dev = self.config, self.device
        splits = self.kernels.choose_splits(c, rows, self.num_sms)
        return DsaMetadata(
            kind=kind,
            num_rows=rows,
            page_table=page_table,
            row_lens=row_lens,
            logits=torch.empty((rows, max(width, 1)), dtype=torch.float32, device=dev),
            topk_pos=torch.empty((rows, c.index_topk), device=dev, **I32),
            topk_slots=torch.empty((rows, c.index_topk), device=dev, **I32),
            splits=splits,
            workspace=self.kernels.sparse_workspace(c, rows=rows, device=dev) if splits > 1 else (),
        )

    def _decode_metadata(self, fb: ForwardBatch) -> DsaMetadata:
        width = self._pages_for(fb.seq_lens_cpu)
        table = self._page_table(fb.req_pool_indices, width)
        lens = fb.seq_lens.to(torch.int32).contiguous()  # the kernels read it packed
        return self._rows("decode", fb.batch_size, table, lens, width * self.page_size)

    def _extend_metadata(self, fb: ForwardBatch) -> DsaMetadata:
        assert fb.extend_seq_lens is not None and fb.extend_seq_lens_cpu is not None
        assert fb.extend_prefix_lens is not None
        bs, rows = fb.batch_size, sum(fb.extend_seq_lens_cpu)
        verify = fb.forward_mode is ForwardMode.TARGET_VERIFY
        if verify:
            self._check_verify(fb.spec_info)
        ext = fb.extend_seq_lens.to(torch.int32)
        starts = torch.zeros((bs + 1,), device=self.device, **I32)
        torch.cumsum(ext, dim=0, dtype=torch.int32, out=starts[1:])
        arange = torch.arange(rows, device=self.device, **I32)
        row_req = torch.repeat_interleave(
            torch.arange(bs, device=self.device, **I32), ext, output_size=rows
        )
        within = arange - starts[row_req.long()]
        # causal: new token i sees the prefix and new tokens 0..i (chains: drafts 0..i)
        row_lens = (fb.extend_prefix_lens.to(torch.int32)[row_req.long()] + within + 1).to(
            torch.int32
        )
        width = self._pages_for(fb.seq_lens_cpu)
        table = self._page_table(fb.req_pool_indices, width)[row_req.long()]
        kind = "verify" if verify else "extend"
        return self._rows(kind, rows, table, row_lens, width * self.page_size)

    def _check_verify(self, info: Any) -> None:
        if not isinstance(info, VerifyInfo):
            fail("forward_batch.spec_info", "a VerifyInfo (TARGET_VERIFY)", type(info).__name__)
        n = self.config.num_draft_tokens
        if info.draft_token_num != n:
            fail("spec_info.draft_token_num", f"{n} (the spec's)", info.draft_token_num)
        if info.tree_mask is not None:
            fail("spec_info.tree_mask", "None (DSA verifies draft chains)", "a tensor")

    def _pages_for(self, seq_lens_cpu: torch.Tensor) -> int:
        longest = int(seq_lens_cpu.max()) if seq_lens_cpu.numel() else 0
        return max(1, -(-longest // self.page_size))

    def _page_table(
        self, req_pool_indices: torch.Tensor, width: int, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[B, width]`` int32 physical pages (the slot of each page's first token // ps)."""
        first_slots = self.req_to_token_pool.req_to_token[:, :: self.page_size][:, :width]
        gathered = torch.index_select(first_slots, 0, req_pool_indices)
        return torch.div(gathered, self.page_size, rounding_mode="floor", out=out)

    # -- the lightning indexer ----

    def indexer(
        self,
        q: torch.Tensor,
        weights: torch.Tensor,
        layer: AttentionLayer,
        forward_batch: ForwardBatch,
        index_k: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Top-k selection of every query row of this forward: writes ``index_k [T, 128]``
        (the new tokens' indexer keys, quantized for an fp8 pool) when given, scores the
        visible keys with q ``[T, 64, 128]`` in the index pool's dtype and weights fp32
        ``[T, 64]``, and returns
        ``topk_indices [T, topk]`` int32 logical positions (ascending, -1 padded)."""
        meta = self._meta()
        self._check_same_batch(forward_batch, "index")
        if index_k is not None:
            self.index_pool.set_index_k(layer.layer_id, forward_batch.out_cache_loc, index_k)
        check_tensor("q", q, shape=[meta.num_rows, None, None], device=self.device)
        launch = dict(config=self.config, trusted_metadata=True)
        self.kernels.indexer_logits(
            q,
            weights,
            self.index_pool.get_index_k_with_scale_buffer(layer.layer_id),
            meta.page_table,
            meta.row_lens,
            meta.logits,
            **launch,
        )
        self.kernels.topk(
            meta.logits,
            meta.row_lens,
            meta.topk_pos,
            page_table=meta.page_table,
            out_slot=meta.topk_slots,
            **launch,
        )
        return meta.topk_pos

    def _meta(self) -> DsaMetadata:
        meta = self.forward_metadata
        if not isinstance(meta, DsaMetadata):
            raise AttngenInputError(
                "DSA: needs DsaMetadata from init_forward_metadata (or CUDA-graph capture/"
                f"replay) for this forward; found {type(meta).__name__}"
            )
        return meta

    def positions_to_slots(self, topk_indices: torch.Tensor) -> torch.Tensor:
        """Token slots ``[T, topk]`` of logical positions (-1 kept), through each row's
        page table (on device, graph-capturable). A position outside the row's causal
        range ``0 .. row_len - 1`` (-1, any negative, or a later token: what a top-k over
        masked scores returns when a row has fewer keys than ``topk``) becomes -1, a pick
        that attends nothing; a position listed twice counts twice."""
        meta = self._meta()
        check_tensor(
            "topk_indices",
            topk_indices,
            dtype=INDEX_DTYPES,
            shape=[meta.num_rows, self.config.index_topk],
            device=self.device,
        )
        pos = topk_indices.long()
        valid = (pos >= 0) & (pos < meta.row_lens[:, None])
        ps = self.page_size
        page_idx = torch.where(valid, pos // ps, 0).clamp_max(meta.page_table.shape[1] - 1)
        pages = torch.gather(meta.page_table, 1, page_idx).long()
        return torch.where(valid, pages * ps + pos % ps, -1).to(torch.int32)

    # -- per-layer forward ----

    def forward_decode(
        self,
        q,
        k,
        v,
        layer,
        forward_batch,
        save_kv_cache=True,
        q_rope=None,
        k_rope=None,
        topk_indices=None,
        return_lse=False,
    ):
        """Sparse decode: one row per request over its selected keys; ``[B, H * 512]``."""
        self._check_phase("decode", forward_batch.forward_mode)
        return self._sparse(
            "decode",
            q,
            k,
            layer,
            forward_batch,
            save_kv_cache,
            q_rope,
            k_rope,
            topk_indices,
            return_lse,
        )

    def forward_extend(
        self,
        q,
        k,
        v,
        layer,
        forward_batch,
        save_kv_cache=True,
        q_rope=None,
        k_rope=None,
        topk_indices=None,
        return_lse=False,
    ):
        """Sparse extend / chain verify: one row per new token over its selected keys."""
        meta = self._meta()
        self._check_phase(
            "verify" if meta.kind == "verify" else "extend", forward_batch.forward_mode
        )
        return self._sparse(
            meta.kind,
            q,
            k,
            layer,
            forward_batch,
            save_kv_cache,
            q_rope,
            k_rope,
            topk_indices,
            return_lse,
        )

    def _sparse(
        self, kind, q, k, layer, fb, save_kv_cache, q_rope, k_rope, topk_indices, return_lse
    ):
        meta = self._meta()
        self._check_same_batch(fb, f"forward_{'decode' if kind == 'decode' else 'extend'}")
        if (meta.kind == "decode") != (kind == "decode"):
            raise AttngenInputError(f"DSA: the metadata is for {meta.kind}, not {kind}")
        c, rows = self.config, meta.num_rows
        width = c.kv_lora_rank + c.qk_rope_head_dim
        want = (self.num_heads, width, c.kv_lora_rank)
        got = (layer.num_q_heads, layer.head_dim, layer.v_head_dim)
        if got != want:
            fail(f"layer {layer.layer_id} (q heads, head_dim, v_head_dim)", f"{want}", got)
        last = c.kv_lora_rank if q_rope is not None else width
        check_tensor(
            "q", q, dtype=self.dtype, shape=[rows, self.num_heads, last], device=self.device
        )
        if topk_indices is None:
            fail("topk_indices", "the indexer's [T, topk] positions (DsaBackend.indexer)", None)
        if topk_indices is meta.topk_pos:
            slots = meta.topk_slots
        else:
            slots = self.positions_to_slots(topk_indices)
        if save_kv_cache:
            if k_rope is None:
                k = check_tensor("k", k, shape=[rows, None, width], device=self.device)
                k, k_rope = k[..., : c.kv_lora_rank], k[..., c.kv_lora_rank :]
            self.kv_pool.set_mla_kv_buffer(layer, fb.out_cache_loc, k, k_rope)
        out = meta.out
        if out is None:
            out = torch.empty(
                (rows, self.num_heads, c.kv_lora_rank), dtype=self.dtype, device=self.device
            )
        lse = None
        if return_lse:
            lse = torch.empty((rows, self.num_heads), dtype=torch.float32, device=self.device)
        self.kernels.sparse_mla(
            q,
            q_rope,
            self.kv_pool.get_key_buffer(layer.layer_id),
            slots,
            out,
            config=c,
            sm_scale=layer.scaling,
            lse=lse,
            workspace=meta.workspace or None,
            splits=meta.splits,
        )
        flat = out.view(rows, self.num_heads * c.kv_lora_rank)
        return (flat, lse) if return_lse else flat

    # -- CUDA graphs (decode, chain verify) ----

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Static buffers of decode and chain verify: per query row a page-table row, the
        indexer's scores over ``max_context_len`` keys (4 bytes each), its selections, and
        the split partials."""
        self._first_graph_state()
        check_at_least("max_bs", max_bs, 1)
        if "decode" in self.kernels.PHASES:
            self._graph_buffers["decode"] = self._graph_rows(max_bs, 1)
        if "verify" in self.kernels.PHASES and self.config.num_draft_tokens:
            self._graph_buffers["verify"] = self._graph_rows(max_bs, self.config.num_draft_tokens)

    def _graph_rows(self, max_bs: int, n: int) -> DsaGraphBuffers:
        c, rows = self.config, max_bs * n
        buffers = self.graph.allocate_decode_buffers(
            max_bs=rows,
            max_pages=self.max_pages,
            max_context_len=self.max_pages * self.page_size,
            index_topk=c.index_topk,
            num_q_heads=self.num_heads,
            max_splits=c.max_splits,
            kv_lora_rank=c.kv_lora_rank,
            device=self.device,
        )
        t = torch.arange(rows, device=self.device, **I32)
        out = torch.empty(
            (rows, self.num_heads, c.kv_lora_rank), dtype=self.dtype, device=self.device
        )
        return DsaGraphBuffers(n, buffers, t // n, t % n + 1 - n, out)

    def _tokens_per_request(self, mode: ForwardMode) -> int:
        return self.config.num_draft_tokens if mode is ForwardMode.TARGET_VERIFY else 1

    def _load_graph_rows(self, mode, bs, req_pool_indices, seq_lens, spec_info, seq_lens_cpu):
        if mode not in (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY):
            raise AttngenInputError("cuda graph: DSA captures DECODE and TARGET_VERIFY only")
        if mode is ForwardMode.TARGET_VERIFY:
            self._check_verify(spec_info)
        width = self.max_pages
        if seq_lens_cpu is not None:
            width = self._pages_for(check_graph_host_lens(seq_lens_cpu, bs, self.max_context_len))
        req_pool_indices = check_graph_rows("req_pool_indices", req_pool_indices, bs, self.device)
        seq_lens = check_graph_rows("seq_lens", seq_lens, bs, self.device)
        bufs: DsaGraphBuffers = self._graph_buffers[GRAPH_PHASES[mode]]
        rows = bs * bufs.per_request
        row_req = bufs.row_req[:rows].long()
        table = self._page_table(req_pool_indices, width)
        bufs.buffers["page_table"][:rows, :width].copy_(table[row_req])
        # row t of request b sees seq_len - n + (t % n) + 1 keys (decode: n = 1)
        lens = torch.index_select(seq_lens.to(torch.int32), 0, row_req)
        torch.add(lens, bufs.row_offset[:rows], out=bufs.buffers["seq_lens"][:rows])
        bufs.buffers["seq_lens"][:rows].clamp_(min=1)
        splits = self.kernels.choose_splits(self.config, rows, self.num_sms)
        kind = "decode" if mode is ForwardMode.DECODE else "verify"
        self.forward_metadata = bufs.metadata(kind, bs, splits)
