"""The MHA runtime: paged MHA/GQA attention through one generated kernels module.

A generated ``backend.py`` subclasses :class:`PagedMhaBackend` and sets only class
attributes (its ``kernels`` and ``graph`` modules, ``spec_name``, ``arch``, ``num_sms``,
``seq_len_fill_value``). The neutral parts (metadata skeleton, slot checks, graph
plumbing) are :class:`~attngen.runtime.backend_base.AttentionBackendBase`'s; this module
holds what is MHA's: config selection by :class:`~attngen.families.mha.key.MhaKey`, page
tables, KV writes, fp8/NVFP4 scales, the split-KV heuristic and the per-layer forwards.

Per forward, ``init_forward_metadata`` builds what every layer shares: the page table
(``page_table[b, j]`` = physical page of request ``b``'s tokens ``j*ps .. j*ps+ps-1``),
``int32`` sequence lengths and, for decode, the per-request KV split counts and the
kernels' workspace (``kernels.decode_workspace``); for extend, ``qo_indptr``, prefix
lengths and the longest extend. Per layer, ``forward_extend`` / ``forward_decode`` check
their inputs, write the new tokens' K/V into the pool at ``out_cache_loc`` and launch the
kernel. Nothing on these paths reads device values on the host, so decode is CUDA-graph
capturable.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from attngen.families.mha.key import MhaKey
from attngen.families.mha.selection import decode_num_splits, select_config
from attngen.runtime.backend_base import GRAPH_PHASES, AttentionBackendBase, kernel_device
from attngen.runtime.batch import (
    AttentionLayer,
    DraftExtendInfo,
    ForwardBatch,
    ForwardMode,
    ReqToTokenPool,
    VerifyInfo,
    tree_mask_bytes,
)
from attngen.runtime.checks import check_at_least, check_tensor, fail
from attngen.runtime.graph import (
    DecodeGraphBuffers,
    DecodeMetadata,
    DraftExtendGraphBuffers,
    ExtendMetadata,
    VerifyGraphBuffers,
    check_graph_host_lens,
    check_graph_rows,
)
from attngen.runtime.pools import PagedKVPool

# -- split-KV decode heuristic ----
# Splitting one request's KV over n programs costs a combine pass and n partial rows; it
# pays off only while the unsplit grid (one program per request and KV-head block) leaves
# SMs idle. A kernels module that does not state its decode's resident CTAs an SM (Triton)
# allows up to ceil(TARGET_WAVES * num_sms / programs) splits (capped by the config's
# max_splits); every split gets at least MIN_SPLIT_TOKENS tokens, so short requests stay
# unsplit and long ones in a small batch spread over the whole GPU.
TARGET_WAVES = 4  # H200, batch 8 x 16k ctx: 8 splits 3.7 TB/s, 4 splits 3.3 TB/s
MIN_SPLIT_TOKENS = 256
# A module that states them (DECODE_RESIDENT_CTAS: the CuTe DSL sm90 decode) takes the split
# count with the fewest waves of resident CTAs per unit of a request's work,
# ceil(n * programs / (num_sms * resident)) / n, the smallest n within WAVE_SLACK of the
# best: whole waves, and no extra wave of CTAs' fixed costs for a few percent. Measured on
# an H100 at 13 shapes (bench/experimental/cute_decode_splits.py, 2026-12-06, results in
# bench/README.md; bf16 and fp8 caches in CUDA graphs, counts 1-16 timed): the rule's count
# was within 2.1% of the fastest count everywhere (the fastest at 15 of 25 cache x shape
# rows), and at most 1.5% slower than TARGET_WAVES's, which was up to 19% (fp8) and 10%
# (bf16) slower than the rule's. Batch 8 x 8k tokens, 8 KV heads, fp8 (2 CTAs an SM): 4
# splits (one wave of 256 CTAs) 55 us, TARGET_WAVES's 9 (2.2 waves) 61, 5 (1.2 waves) 69.
WAVE_SLACK = 0.05


@functools.lru_cache(maxsize=4096)
def decode_split_cap(
    *, programs_per_split: int, num_sms: int, max_splits: int, resident_ctas: int = 0
) -> int:
    """Most KV splits worth having for a grid of ``programs_per_split`` (host ints only);
    ``resident_ctas``: the decode's CTAs an SM holds, 0 where the kernel does not say."""
    programs = max(programs_per_split, 1)
    if resident_ctas <= 0:
        wanted = -(-TARGET_WAVES * num_sms // programs)
        return max(1, min(max_splits, wanted))
    slots = num_sms * resident_ctas
    cost = {n: -(-n * programs // slots) / n for n in range(1, max(max_splits, 1) + 1)}
    best = min(cost.values())
    return min(n for n, c in cost.items() if c <= best * (1 + WAVE_SLACK))


def _as_heads(name: str, x: object, rows: int, heads: int, dim: int) -> torch.Tensor:
    """Accept ``[rows, heads*dim]`` or ``[rows, heads, dim]``; return the 3-d view."""
    if isinstance(x, torch.Tensor) and x.dim() == 2:
        return check_tensor(name, x, shape=[rows, heads * dim]).reshape(rows, heads, dim)
    return check_tensor(name, x, shape=[rows, heads, dim])


class PagedMhaBackend(AttentionBackendBase):
    """Paged MHA/GQA attention through one generated kernels module."""

    # what two backends sharing this layer's pools must agree on (hybrids check it)
    LAYER_ATTRS: ClassVar[tuple[str, ...]] = (
        "num_q_heads",
        "num_kv_heads",
        "head_dim",
        "v_head_dim",
        "page_size",
        "dtype",
    )
    OPTIONAL_LAYER_ATTRS: ClassVar[tuple[str, ...]] = ("kv_cache_dtype", "config.kv_scale")

    def __init__(
        self,
        *,
        num_q_heads: int,
        num_kv_heads: int,
        head_dim: int,
        v_head_dim: int | None = None,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
        req_to_token_pool: ReqToTokenPool,
        kv_pool: PagedKVPool,
        kv_cache_dtype: torch.dtype | str | None = None,
        kv_scale: str | None = None,
        spec_topk: int | None = None,
    ) -> None:
        """``kv_scale`` ("per_tensor", "per_head", ...) and ``spec_topk`` (0 none, 1 draft
        chains, > 1 trees) are needed only when the spec generates several of them."""
        self._check_generated()
        if num_kv_heads < 1 or num_q_heads % num_kv_heads != 0:
            fail("num_q_heads", f"a multiple of num_kv_heads={num_kv_heads} (>= 1)", num_q_heads)
        self.num_q_heads = num_q_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.v_head_dim = head_dim if v_head_dim is None else v_head_dim
        self.page_size = page_size
        self.dtype = dtype
        self.kv_cache_dtype = dtype if kv_cache_dtype is None else kv_cache_dtype
        dtypes = (dtype, self.kv_cache_dtype)
        self.device = kernel_device(device, self.backend, self.arch, dtypes)
        self.config = select_config(
            self.kernels.CONFIGS,
            MhaKey(
                head_dim=head_dim,
                v_head_dim=self.v_head_dim,
                gqa_group=num_q_heads // num_kv_heads,
                page_size=page_size,
                dtype=_dtype_name(dtype),
                kv_dtype=_dtype_name(self.kv_cache_dtype),
                kv_scale=kv_scale,  # type: ignore[arg-type]
                spec_topk=spec_topk,  # type: ignore[arg-type]
            ),
        )
        self._check_pools(req_to_token_pool, kv_pool)
        self.req_to_token_pool = req_to_token_pool
        self.kv_pool = kv_pool
        self.max_context_len = req_to_token_pool.max_context_len
        self.max_pages = -(-self.max_context_len // page_size)
        self.forward_metadata: DecodeMetadata | ExtendMetadata | None = None
        self._graph_buffers: dict[str, Any] = {}

    def _check_pools(self, req_pool: ReqToTokenPool, kv_pool: PagedKVPool) -> None:
        names = ("page_size", "num_kv_heads", "head_dim", "v_head_dim", "device")
        for pool_name, want in [(n, getattr(self, n)) for n in names] + [
            ("dtype", self.kv_cache_dtype)
        ]:
            got = getattr(kv_pool, pool_name)
            if got != want:
                fail(f"kv_pool.{pool_name}", f"{want} (as the backend)", got)
        if req_pool.device != self.device:
            fail("req_to_token_pool.device", f"{self.device} (as the backend)", req_pool.device)

    # -- per-forward metadata ----

    def _decode_metadata(self, fb: ForwardBatch) -> DecodeMetadata:
        bs = fb.batch_size
        seq_lens = fb.seq_lens.to(torch.int32).contiguous()  # a strided view stays strided
        return DecodeMetadata(
            batch_size=bs,
            page_table=self._page_table(fb.req_pool_indices, self._pages_for(fb.seq_lens_cpu)),
            seq_lens=seq_lens,
            num_splits=self._num_splits(seq_lens, bs),
            workspace=self.kernels.decode_workspace(
                self.config, batch_size=bs, num_q_heads=self.num_q_heads, device=self.device
            ),
            out=None,
        )

    def _extend_metadata(self, fb: ForwardBatch) -> ExtendMetadata:
        assert fb.extend_seq_lens is not None and fb.extend_seq_lens_cpu is not None
        assert fb.extend_prefix_lens is not None and fb.extend_prefix_lens_cpu is not None
        qo_indptr = torch.zeros((fb.batch_size + 1,), dtype=torch.int32, device=self.device)
        torch.cumsum(fb.extend_seq_lens, dim=0, dtype=torch.int32, out=qo_indptr[1:])
        verify = fb.forward_mode is ForwardMode.TARGET_VERIFY
        tree_mask, tree_mask_indptr = (
            self._tree_mask(fb.spec_info, fb.batch_size) if verify else (None, None)
        )
        return ExtendMetadata(
            batch_size=fb.batch_size,
            num_tokens=sum(fb.extend_seq_lens_cpu),
            page_table=self._page_table(fb.req_pool_indices, self._pages_for(fb.seq_lens_cpu)),
            qo_indptr=qo_indptr,
            prefix_lens=fb.extend_prefix_lens.to(torch.int32).contiguous(),
            max_extend_len=max(fb.extend_seq_lens_cpu),
            no_prefix=max(fb.extend_prefix_lens_cpu) == 0,
            verify=verify,
            tree_mask=tree_mask,
            tree_mask_indptr=tree_mask_indptr,
        )

    def _tree_mask(
        self, info: VerifyInfo, batch_size: int | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The verify mask tensors the config needs (trees), checked; None for chains."""
        n, want = info.draft_token_num, self.config.num_draft_tokens
        if n != want:
            fail("spec_info.draft_token_num", f"{want} (the spec's num_draft_tokens)", n)
        if self.config.spec_topk <= 1:
            if info.tree_mask is not None:
                fail("spec_info.tree_mask", "None (this spec verifies draft chains)", "a tensor")
            return None, None
        if batch_size is not None:  # eager: the mask and offsets the kernels will read
            if not self.validate_slots or info.tree_mask is None:  # else _device_checks did
                self._check_tree_mask(info, batch_size)
        else:  # graph replay: the static buffers keep their own offsets
            check_tensor("spec_info.tree_mask", info.tree_mask, dtype=torch.uint8, shape=[None])
        return info.tree_mask, info.tree_mask_indptr

    def _check_tree_mask(self, info: VerifyInfo, batch_size: int) -> None:
        """Host-side checks of a tree verify's mask: dtype, device, and exactly the bytes
        ``pack_tree_masks`` gives ``batch_size`` requests of ``num_draft_tokens`` drafts."""
        n = self.config.num_draft_tokens
        check_tensor("spec_info.tree_mask", info.tree_mask, dtype=torch.uint8, device=self.device)
        check_tensor(
            "spec_info.tree_mask_indptr",
            info.tree_mask_indptr,
            dtype=torch.int32,
            shape=[batch_size + 1],
            device=self.device,
            contiguous=True,
        )
        want = batch_size * tree_mask_bytes(n)
        if info.tree_mask.numel() != want:
            fail(
                "spec_info.tree_mask",
                f"{want} bytes ({batch_size} requests x {n}x{n} bits, see pack_tree_masks)",
                f"{info.tree_mask.numel()} bytes",
            )

    def _device_checks(self, fb: ForwardBatch) -> list[tuple[torch.Tensor, Callable[[], None]]]:
        """A tree verify's mask offsets: request b's mask starts at byte b * mask bytes."""
        info = fb.spec_info
        if not (fb.forward_mode.is_target_verify() and self.config.spec_topk > 1):
            return []
        if not isinstance(info, VerifyInfo) or info.tree_mask is None:
            return []  # the metadata builder names what is missing
        self._check_tree_mask(info, fb.batch_size)
        per = tree_mask_bytes(self.config.num_draft_tokens)
        want = torch.arange(fb.batch_size + 1, device=self.device, dtype=torch.int32) * per
        indptr = info.tree_mask_indptr

        def report() -> None:
            got = indptr.tolist()
            b = next(i for i, (g, w) in enumerate(zip(got, want.tolist())) if g != w)
            fail(f"spec_info.tree_mask_indptr[{b}]", f"{b * per} (b x {per} mask bytes)", got[b])

        return [((indptr != want).any(), report)]

    def _pages_for(self, seq_lens_cpu: torch.Tensor) -> int:
        """Page-table width that covers the longest request."""
        longest = int(seq_lens_cpu.max()) if seq_lens_cpu.numel() else 0
        return max(1, -(-longest // self.page_size))

    def _page_table(
        self, req_pool_indices: torch.Tensor, width: int, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[B, width]`` int32: the slot of each page's first token, // page_size (two ops;
        into ``out`` when given)."""
        ps = self.page_size
        first_slots = self.req_to_token_pool.req_to_token[:, ::ps][:, :width]
        gathered = torch.index_select(first_slots, 0, req_pool_indices)
        if ps == 1:  # token slots are pages
            return gathered if out is None else out.copy_(gathered)
        return torch.div(gathered, ps, rounding_mode="floor", out=out)

    def _num_splits(
        self, seq_lens: torch.Tensor, bs: int, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        group = self.num_q_heads // self.num_kv_heads
        head_blocks = self.num_kv_heads * -(-group // self.config.decode_block_h)
        cap = decode_split_cap(
            programs_per_split=bs * head_blocks,
            num_sms=self.num_sms,
            max_splits=self.config.max_splits,
            resident_ctas=self.kernels.DECODE_RESIDENT_CTAS.get(self.config.uri, 0),
        )
        min_tokens = max(MIN_SPLIT_TOKENS, self.config.decode_block_n)
        return decode_num_splits(seq_lens, cap=cap, min_split_tokens=min_tokens, out=out)

    # -- per-layer forward ----

    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: AttentionLayer,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of the new tokens over prefix + new tokens; returns ``[T, Hq*Dv]``.

        EXTEND / DRAFT_EXTEND run the extend kernel, or the cache-free prefill kernel when
        the spec generates prefill and no request has a cached prefix; TARGET_VERIFY runs
        verify. ``sinks`` ([Hq] fp32 logits) is required exactly when the spec has sinks.
        """
        meta = self._metadata(ExtendMetadata, "forward_extend", forward_batch)
        rows = meta.num_tokens
        self._layer_scales(layer)  # every path: a missing scale fails before any K/V write
        prefill = not meta.verify and meta.no_prefix and "prefill" in self.kernels.PHASES
        if prefill and k is not None and v is not None:
            q = self._prepare(q, k, v, layer, forward_batch.out_cache_loc, rows, save_kv_cache)
            k = _as_heads("k", k, rows, self.num_kv_heads, self.head_dim)
            v = _as_heads("v", v, rows, self.num_kv_heads, self.v_head_dim)
            out = self._new_out(rows)
            self.kernels.prefill(
                q,
                k.contiguous(),
                v.contiguous(),
                meta.qo_indptr,
                out,
                max_seq_len=meta.max_extend_len,
                config=self.config,
                sm_scale=layer.scaling,
                sinks=sinks,
            )
            return out.view(rows, self.num_q_heads * self.v_head_dim)
        self._check_phase("verify" if meta.verify else "extend", forward_batch.forward_mode)
        q, k_cache, v_cache, out, launch = self._cached_call(
            meta, q, k, v, layer, forward_batch, rows, save_kv_cache, sinks
        )
        cache = (q, k_cache, v_cache, meta.page_table, meta.qo_indptr, meta.prefix_lens, out)
        if meta.verify:
            tree = dict(tree_mask=meta.tree_mask, tree_mask_indptr=meta.tree_mask_indptr)
            self.kernels.verify(*cache, **tree, **launch)
        else:
            self.kernels.extend(*cache, max_extend_len=meta.max_extend_len, **launch)
        return out.view(rows, self.num_q_heads * self.v_head_dim)

    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: AttentionLayer,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of one new token per request over its whole KV; returns ``[B, Hq*Dv]``."""
        self._check_phase("decode", forward_batch.forward_mode)
        meta = self._metadata(DecodeMetadata, "forward_decode", forward_batch)
        rows = meta.batch_size
        q, k_cache, v_cache, out, launch = self._cached_call(
            meta, q, k, v, layer, forward_batch, rows, save_kv_cache, sinks
        )
        lengths = (meta.page_table, meta.seq_lens, meta.num_splits)
        self.kernels.decode(q, k_cache, v_cache, *lengths, out, *meta.workspace, **launch)
        return out.view(rows, self.num_q_heads * self.v_head_dim)

    def _cached_call(
        self,
        meta: DecodeMetadata | ExtendMetadata,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: AttentionLayer,
        fb: ForwardBatch,
        rows: int,
        save_kv_cache: bool,
        sinks: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """What a layer call over the cache shares: the layer's scales are checked before
        anything is written, the new K/V go into the pool; returns q [rows, Hq, D], the
        layer's caches, the output rows and the launch keywords (the metadata is the
        backend's own, so the launcher need not check it again)."""
        k_scale, v_scale = self._layer_scales(layer)
        launch = dict(config=self.config, sm_scale=layer.scaling, sinks=sinks)
        launch.update(k_scale=k_scale, v_scale=v_scale, **self._block_scales(layer))
        q = self._prepare(q, k, v, layer, fb.out_cache_loc, rows, save_kv_cache)
        k_cache, v_cache = self.kv_pool.get_kv_buffer(layer.layer_id)
        out = self._new_out(rows) if meta.out is None else meta.out
        return q, k_cache, v_cache, out, dict(launch, trusted_metadata=True)

    def _block_scales(self, layer: AttentionLayer) -> dict[str, torch.Tensor]:
        """NVFP4 caches: the pool's block-scale tensors of this layer, as kernel kwargs."""
        if self.config.kv_dtype != "nvfp4":
            return {}
        k_bs, v_bs = self.kv_pool.get_kv_block_scales(layer.layer_id)
        return {"k_block_scales": k_bs, "v_block_scales": v_bs}

    def _layer_scales(
        self, layer: AttentionLayer
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The layer's fp8 dequant scales, checked against the config, before any write."""
        granularity = self.config.kv_scale
        if granularity == "none":
            return None, None
        rows = self.num_kv_heads if granularity == "per_head" else 1  # per_block: global
        scales = []
        for name in ("k_scale", "v_scale"):
            scale = getattr(layer, name)
            if scale is None:
                fail(
                    f"layer {layer.layer_id}.{name}",
                    f"a float32 tensor [{rows}] ({granularity} scales of the "
                    f"{self.config.kv_dtype} KV cache)",
                    None,
                )
            check_tensor(
                f"layer {layer.layer_id}.{name}",
                scale,
                dtype=torch.float32,
                shape=[rows],
                device=self.device,
                contiguous=True,
            )
            scales.append(scale)
        return scales[0], scales[1]

    def _prepare(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: AttentionLayer,
        out_cache_loc: torch.Tensor,
        rows: int,
        save_kv_cache: bool,
    ) -> torch.Tensor:
        """Check the layer and q/k/v, write the new K/V into the pool; return q [T, Hq, D]."""
        self._check_layer(layer)
        q = _as_heads("q", q, rows, self.num_q_heads, self.head_dim)
        check_tensor("q", q, dtype=self.dtype, device=self.device)
        if save_kv_cache:
            k = _as_heads("k", k, rows, self.num_kv_heads, self.head_dim)
            v = _as_heads("v", v, rows, self.num_kv_heads, self.v_head_dim)
            self.kv_pool.set_kv_buffer(layer, out_cache_loc, k, v)
        return q.contiguous()

    def _new_out(self, rows: int) -> torch.Tensor:
        shape = (rows, self.num_q_heads, self.v_head_dim)
        return torch.empty(shape, dtype=self.dtype, device=self.device)

    def _check_layer(self, layer: AttentionLayer) -> None:
        got = (layer.num_q_heads, layer.num_kv_heads, layer.head_dim, layer.v_head_dim)
        want = (self.num_q_heads, self.num_kv_heads, self.head_dim, self.v_head_dim)
        if got != want:
            fail(
                f"layer {layer.layer_id} (q heads, kv heads, head_dim, v_head_dim)",
                f"{want} as the backend",
                got,
            )

    # -- CUDA graphs (decode, target verify) ----

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Allocate the static metadata buffers of every capturable phase the spec has
        (decode; verify and draft extend with ``num_draft_tokens`` rows per request), once."""
        self._first_graph_state()
        check_at_least("max_bs", max_bs, 1)
        rows = dict(max_bs=max_bs, max_pages=self.max_pages, num_q_heads=self.num_q_heads)
        out = dict(v_head_dim=self.v_head_dim, dtype=self.dtype, device=self.device)
        drafts = self.config.num_draft_tokens
        if "decode" in self.kernels.PHASES:
            buffers = self.graph.allocate_decode_buffers(
                **rows,
                max_splits=self.config.max_splits,
                v_head_dim=self.v_head_dim,
                device=self.device,
            )
            self._graph_buffers["decode"] = DecodeGraphBuffers.allocate(
                buffers,
                max_num_tokens=max_num_tokens,
                num_q_heads=self.num_q_heads,
                v_head_dim=self.v_head_dim,
                dtype=self.dtype,
            )
        if "verify" in self.kernels.PHASES:
            tree = self.config.spec_topk > 1
            self._graph_buffers["verify"] = VerifyGraphBuffers.allocate(
                **rows, **out, draft_token_num=drafts, tree=tree
            )
        if "draft_extend" in self.kernels.PHASES and drafts:
            self._graph_buffers["draft_extend"] = DraftExtendGraphBuffers.allocate(
                **rows, **out, max_tokens=drafts
            )

    def _tokens_per_request(self, mode: ForwardMode) -> int:
        speculative = (ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND)
        return self.config.num_draft_tokens if mode in speculative else 1

    def _load_graph_rows(
        self,
        mode: ForwardMode,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        spec_info: Any,
        seq_lens_cpu: torch.Tensor | None,
    ) -> None:
        width = self.max_pages
        if seq_lens_cpu is not None:  # replay: copy only the page-table columns in use
            width = self._pages_for(check_graph_host_lens(seq_lens_cpu, bs, self.max_context_len))
        req_pool_indices = check_graph_rows("req_pool_indices", req_pool_indices, bs, self.device)
        seq_lens = check_graph_rows("seq_lens", seq_lens, bs, self.device)
        bufs = self._graph_buffers[GRAPH_PHASES[mode]]
        if mode is ForwardMode.DECODE:  # straight into the static buffers: six ops
            bufs.seq_lens[:bs].copy_(seq_lens)
            self._num_splits(bufs.seq_lens[:bs], bs, out=bufs.num_splits[:bs])
            self._page_table(req_pool_indices, width, out=bufs.page_table[:bs, :width])
            self.forward_metadata = bufs.metadata(bs)
            return
        page_table = self._page_table(req_pool_indices, width)
        if mode is ForwardMode.TARGET_VERIFY:
            if not isinstance(spec_info, VerifyInfo):
                fail("spec_info", "a VerifyInfo (TARGET_VERIFY)", type(spec_info).__name__)
            tree_mask, _ = self._tree_mask(spec_info, None)  # the buffers check its size
            bufs.load(bs, page_table=page_table, seq_lens=seq_lens, tree_mask=tree_mask)
        else:
            if not isinstance(spec_info, DraftExtendInfo):
                fail("spec_info", "a DraftExtendInfo (DRAFT_EXTEND)", type(spec_info).__name__)
            lens = spec_info.extend_lens
            bufs.load(bs, page_table=page_table, seq_lens=seq_lens, extend_lens=lens)
        self.forward_metadata = bufs.metadata(bs)


def _dtype_name(dtype: torch.dtype | str) -> str:
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
