"""The base class of every generated MHA attention backend (SGLang's backend interface).

A generated ``backend.py`` subclasses :class:`TritonMhaBackend` and sets only class
attributes: its generated ``kernels`` module, ``spec_name``, ``arch``, ``num_sms`` and
``seq_len_fill_value``. Everything else (config selection, metadata, KV writes, CUDA-graph
buffers, input checks) lives here, once.

Per forward, ``init_forward_metadata`` builds what every layer shares: the page table
(``page_table[b, j]`` = physical page of request ``b``'s tokens ``j*ps .. j*ps+ps-1``),
``int32`` sequence lengths and, for decode, the per-request KV split counts and the split
partials' scratch; for extend, ``qo_indptr``, prefix lengths and the longest extend.
Per layer, ``forward_extend`` / ``forward_decode`` check their inputs, write the new
tokens' K/V into the pool at ``out_cache_loc`` and launch the kernel. Nothing on these
paths reads device values on the host, so decode is CUDA-graph capturable.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any, ClassVar, TypeVar

import torch

from attngen.runtime.batch import (
    INDEX_DTYPES,
    AttentionLayer,
    ForwardBatch,
    ForwardMode,
    PagedKVPool,
    ReqToTokenPool,
    check_max_seq_len,
)
from attngen.runtime.checks import AttngenInputError, check_at_least, check_tensor, fail
from attngen.runtime.configs import MhaTritonConfig
from attngen.runtime.graph import (
    DecodeGraphBuffers,
    DecodeMetadata,
    ExtendMetadata,
    check_graph_call,
    check_graph_rows,
)

# -- split-KV decode heuristic ----
# Splitting one request's KV over n programs costs a combine pass and n partial rows; it
# pays off only while the unsplit grid (one program per request and KV-head block) leaves
# SMs idle. So: allow up to ceil(TARGET_WAVES * num_sms / programs) splits (capped by the
# config's max_splits), and give every split at least MIN_SPLIT_TOKENS tokens, so short
# requests stay unsplit and long ones in a small batch spread over the whole GPU.
TARGET_WAVES = 4  # H200, batch 8 x 16k ctx: 8 splits 3.7 TB/s, 4 splits 3.3 TB/s
MIN_SPLIT_TOKENS = 256

F32 = torch.float32
Metadata = TypeVar("Metadata", DecodeMetadata, ExtendMetadata)


def decode_split_cap(*, programs_per_split: int, num_sms: int, max_splits: int) -> int:
    """Most KV splits worth having for a grid of ``programs_per_split`` (host ints only)."""
    wanted = -(-TARGET_WAVES * num_sms // max(programs_per_split, 1))
    return max(1, min(max_splits, wanted))


def decode_num_splits(seq_lens: torch.Tensor, *, cap: int, min_split_tokens: int) -> torch.Tensor:
    """Per-request split counts in ``1..cap``, computed on the device (no host sync)."""
    wanted = (seq_lens + (min_split_tokens - 1)) // min_split_tokens
    return torch.clamp(wanted, min=1, max=cap).to(torch.int32)


# -- config selection ----


def select_config(
    configs: Mapping[str, MhaTritonConfig],
    *,
    head_dim: int,
    v_head_dim: int,
    gqa_group: int,
    page_size: int,
    dtype: torch.dtype,
) -> MhaTritonConfig:
    """The one config whose shapes, page size and dtype match; else an error listing all."""
    want = (head_dim, v_head_dim, gqa_group, page_size, str(dtype).removeprefix("torch."))
    ordered = [configs[uri] for uri in sorted(configs)]
    matches = [c for c in ordered if _config_key(c) == want]
    if len(matches) == 1:
        return matches[0]
    available = "; ".join(_describe(c) for c in ordered) or "none"
    what = "no generated config" if not matches else "several generated configs"
    raise AttngenInputError(
        f"{what} for head_dim={head_dim} v_head_dim={v_head_dim} gqa_group={gqa_group} "
        f"page_size={page_size} dtype={want[-1]}; available: {available}"
    )


def _config_key(c: MhaTritonConfig) -> tuple[int, int, int, int, str]:
    return (c.head_dim, c.v_head_dim, c.gqa_group, c.page_size, c.dtype)


def _describe(c: MhaTritonConfig) -> str:
    return (
        f"head_dim={c.head_dim} v_head_dim={c.v_head_dim} gqa_group={c.gqa_group} "
        f"page_size={c.page_size} dtype={c.dtype} ({c.uri})"
    )


def canonical_device(device: torch.device | str) -> torch.device:
    """``"cuda"`` -> ``cuda:<current>``, so it compares equal to a tensor's ``.device``."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return dev


def _as_heads(name: str, x: object, rows: int, heads: int, dim: int) -> torch.Tensor:
    """Accept ``[rows, heads*dim]`` or ``[rows, heads, dim]``; return the 3-d view."""
    if isinstance(x, torch.Tensor) and x.dim() == 2:
        return check_tensor(name, x, shape=[rows, heads * dim]).reshape(rows, heads, dim)
    return check_tensor(name, x, shape=[rows, heads, dim])


class TritonMhaBackend:
    """Paged MHA/GQA attention through one generated Triton kernels module."""

    kernels: ClassVar[ModuleType]  # generated kernels.py: CAUSAL, CONFIGS, decode, extend
    graph: ClassVar[ModuleType]  # generated graph.py: allocate_decode_buffers, NUM_SMS
    spec_name: ClassVar[str]
    arch: ClassVar[str]  # e.g. "sm90"
    num_sms: ClassVar[int]  # SM count of the arch's reference part, for the split heuristic
    seq_len_fill_value: ClassVar[int] = 1  # seq_len of padded rows in captured graphs

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
    ) -> None:
        if getattr(type(self), "kernels", None) is None:
            raise TypeError(f"{type(self).__name__} has no kernels module: use a generated one")
        if num_kv_heads < 1 or num_q_heads % num_kv_heads != 0:
            fail("num_q_heads", f"a multiple of num_kv_heads={num_kv_heads} (>= 1)", num_q_heads)
        self.num_q_heads = num_q_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.v_head_dim = head_dim if v_head_dim is None else v_head_dim
        self.page_size = page_size
        self.dtype = dtype
        self.device = canonical_device(device)
        self.config = select_config(
            self.kernels.CONFIGS,
            head_dim=head_dim,
            v_head_dim=self.v_head_dim,
            gqa_group=num_q_heads // num_kv_heads,
            page_size=page_size,
            dtype=dtype,
        )
        self._check_pools(req_to_token_pool, kv_pool)
        self.req_to_token_pool = req_to_token_pool
        self.kv_pool = kv_pool
        self.max_context_len = req_to_token_pool.max_context_len
        self.max_pages = -(-self.max_context_len // page_size)
        self.forward_metadata: DecodeMetadata | ExtendMetadata | None = None
        self.graph_buffers: DecodeGraphBuffers | None = None

    def _check_pools(self, req_pool: ReqToTokenPool, kv_pool: PagedKVPool) -> None:
        for name in ("page_size", "dtype", "num_kv_heads", "head_dim", "v_head_dim", "device"):
            want, got = getattr(self, name), getattr(kv_pool, name)
            if got != want:
                fail(f"kv_pool.{name}", f"{want} (as the backend)", got)
        if req_pool.device != self.device:
            fail("req_to_token_pool.device", f"{self.device} (as the backend)", req_pool.device)

    # -- per-forward metadata ----

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        """Build the metadata every layer of this forward shares (no host sync)."""
        mode = forward_batch.forward_mode
        if mode is ForwardMode.IDLE:
            self.forward_metadata = None
            return
        if mode not in (ForwardMode.DECODE, ForwardMode.EXTEND):
            raise AttngenInputError(
                f"forward_mode: {type(self).__name__} runs EXTEND, DECODE and IDLE; "
                f"{mode.name} (speculative decoding) is not supported yet"
            )
        forward_batch.check(device=self.device, max_context_len=self.max_context_len)
        if mode is ForwardMode.DECODE:
            self.forward_metadata = self._decode_metadata(forward_batch)
        else:
            self.forward_metadata = self._extend_metadata(forward_batch)

    def _decode_metadata(self, fb: ForwardBatch) -> DecodeMetadata:
        bs = fb.batch_size
        partial = (bs, self.num_q_heads, self.config.max_splits)
        seq_lens = fb.seq_lens.to(torch.int32).contiguous()
        return DecodeMetadata(
            batch_size=bs,
            page_table=self._page_table(fb.req_pool_indices, self._pages_for(fb.seq_lens_cpu)),
            seq_lens=seq_lens,
            num_splits=self._num_splits(seq_lens, bs),
            partial_o=torch.empty(partial + (self.v_head_dim,), dtype=F32, device=self.device),
            partial_lse=torch.empty(partial, dtype=F32, device=self.device),
            out=None,
        )

    def _extend_metadata(self, fb: ForwardBatch) -> ExtendMetadata:
        assert fb.extend_seq_lens is not None and fb.extend_seq_lens_cpu is not None
        assert fb.extend_prefix_lens is not None
        qo_indptr = torch.zeros((fb.batch_size + 1,), dtype=torch.int32, device=self.device)
        torch.cumsum(fb.extend_seq_lens, dim=0, dtype=torch.int32, out=qo_indptr[1:])
        return ExtendMetadata(
            batch_size=fb.batch_size,
            num_tokens=sum(fb.extend_seq_lens_cpu),
            page_table=self._page_table(fb.req_pool_indices, self._pages_for(fb.seq_lens_cpu)),
            qo_indptr=qo_indptr,
            prefix_lens=fb.extend_prefix_lens.to(torch.int32).contiguous(),
            max_extend_len=max(fb.extend_seq_lens_cpu),
        )

    def _pages_for(self, seq_lens_cpu: torch.Tensor) -> int:
        """Page-table width that covers the longest request."""
        longest = int(seq_lens_cpu.max()) if seq_lens_cpu.numel() else 0
        return max(1, -(-longest // self.page_size))

    def _page_table(self, req_pool_indices: torch.Tensor, width: int) -> torch.Tensor:
        """``[B, width]`` int32: the slot of each page's first token, // page_size."""
        ps = self.page_size
        first_slots = self.req_to_token_pool.req_to_token[:, ::ps]
        return first_slots[req_pool_indices, :width] // ps

    def _num_splits(self, seq_lens: torch.Tensor, bs: int) -> torch.Tensor:
        group = self.num_q_heads // self.num_kv_heads
        head_blocks = self.num_kv_heads * -(-group // self.config.decode_block_h)
        cap = decode_split_cap(
            programs_per_split=bs * head_blocks,
            num_sms=self.num_sms,
            max_splits=self.config.max_splits,
        )
        min_tokens = max(MIN_SPLIT_TOKENS, self.config.decode_block_n)
        return decode_num_splits(seq_lens, cap=cap, min_split_tokens=min_tokens)

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

        ``sinks`` ([Hq] fp32 logits) is required exactly when the spec has attention sinks.
        """
        self._check_phase("extend")
        meta = self._metadata(ExtendMetadata, "forward_extend")
        rows = meta.num_tokens
        q = self._prepare(q, k, v, layer, forward_batch.out_cache_loc, rows, save_kv_cache)
        k_cache, v_cache = self.kv_pool.get_kv_buffer(layer.layer_id)
        out = self._new_out(rows)
        self.kernels.extend(
            q,
            k_cache,
            v_cache,
            meta.page_table,
            meta.qo_indptr,
            meta.prefix_lens,
            out,
            max_extend_len=meta.max_extend_len,
            config=self.config,
            sm_scale=layer.scaling,
            sinks=sinks,
        )
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
        self._check_phase("decode")
        meta = self._metadata(DecodeMetadata, "forward_decode")
        rows = meta.batch_size
        q = self._prepare(q, k, v, layer, forward_batch.out_cache_loc, rows, save_kv_cache)
        k_cache, v_cache = self.kv_pool.get_kv_buffer(layer.layer_id)
        out = self._new_out(rows) if meta.out is None else meta.out
        self.kernels.decode(
            q,
            k_cache,
            v_cache,
            meta.page_table,
            meta.seq_lens,
            meta.num_splits,
            out,
            meta.partial_o,
            meta.partial_lse,
            config=self.config,
            sm_scale=layer.scaling,
            sinks=sinks,
        )
        return out.view(rows, self.num_q_heads * self.v_head_dim)

    def _check_phase(self, phase: str) -> None:
        if phase not in self.kernels.PHASES:
            raise AttngenInputError(
                f"{self.spec_name}: phase {phase} is not generated for this spec "
                f"(phases: {', '.join(self.kernels.PHASES)})"
            )

    def _metadata(self, kind: type[Metadata], caller: str) -> Metadata:
        meta = self.forward_metadata
        if not isinstance(meta, kind):
            found = "none" if meta is None else type(meta).__name__
            raise AttngenInputError(
                f"{caller}: needs {kind.__name__} from init_forward_metadata (or CUDA-graph "
                f"capture/replay) for this forward; found {found}"
            )
        return meta

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

    # -- CUDA graphs (decode) ----

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Allocate the static decode metadata buffers, once for the backend's lifetime."""
        check_at_least("max_bs", max_bs, 1)
        buffers = self.graph.allocate_decode_buffers(
            max_bs=max_bs,
            max_pages=self.max_pages,
            num_q_heads=self.num_q_heads,
            max_splits=self.config.max_splits,
            v_head_dim=self.v_head_dim,
            device=self.device,
        )
        self.graph_buffers = DecodeGraphBuffers.allocate(
            buffers, max_num_tokens=max_num_tokens, dtype=self.dtype
        )

    def init_forward_metadata_capture_cuda_graph(
        self,
        bs: int,
        num_tokens: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        encoder_lens: torch.Tensor | None,
        forward_mode: ForwardMode,
        spec_info: Any,
    ) -> None:
        """Fill rows ``0..bs-1`` of the static buffers; the metadata points at them."""
        bufs = self._graph_buffers("capture", bs, num_tokens, forward_mode, encoder_lens)
        self._load_graph_rows(bufs, bs, req_pool_indices, seq_lens, width=self.max_pages)

    def init_forward_metadata_replay_cuda_graph(
        self,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_sum: int,
        encoder_lens: torch.Tensor | None,
        forward_mode: ForwardMode,
        spec_info: Any,
        seq_lens_cpu: torch.Tensor | None = None,
    ) -> None:
        """Copy a new (padded) batch into the same buffers, in place, before ``replay()``.

        Rows past the real requests carry the caller's padding (req_pool_index 0, seq_len
        ``seq_len_fill_value``); their outputs are junk the caller drops. With
        ``seq_lens_cpu`` only the page-table columns the longest request needs are copied.
        """
        bufs = self._graph_buffers("replay", bs, bs, forward_mode, encoder_lens)
        width = self.max_pages
        if seq_lens_cpu is not None:
            cpu = torch.device("cpu")
            check_tensor("seq_lens_cpu", seq_lens_cpu, dtype=INDEX_DTYPES, device=cpu)
            check_max_seq_len(seq_lens_cpu[:bs], self.max_context_len)
            width = self._pages_for(seq_lens_cpu[:bs])
        self._load_graph_rows(bufs, bs, req_pool_indices, seq_lens, width=width)

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return self.seq_len_fill_value

    def _graph_buffers(
        self, phase: str, bs: int, num_tokens: int, mode: ForwardMode, encoder_lens: Any
    ) -> DecodeGraphBuffers:
        if self.graph_buffers is None:
            raise AttngenInputError(f"cuda graph {phase}: call init_cuda_graph_state first")
        check_graph_call(phase, bs=bs, num_tokens=num_tokens, mode=mode, encoder_lens=encoder_lens)
        self.graph_buffers.check_fits(bs, num_tokens)
        return self.graph_buffers

    def _load_graph_rows(
        self,
        bufs: DecodeGraphBuffers,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        *,
        width: int,
    ) -> None:
        req_pool_indices = check_graph_rows("req_pool_indices", req_pool_indices, bs, self.device)
        seq_lens = check_graph_rows("seq_lens", seq_lens, bs, self.device)
        page_table = self._page_table(req_pool_indices, width)
        num_splits = self._num_splits(seq_lens, bs)
        bufs.load(bs, page_table=page_table, seq_lens=seq_lens, num_splits=num_splits)
        self.forward_metadata = bufs.metadata(bs)
