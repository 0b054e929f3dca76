"""Plain ``model.generate()`` on attngen: attngen's own paged KV pool and per-forward batch.

transformers runs a padded batch ``[B, S]`` (prompts left-padded, every row one request)
and, with its DynamicCache, hands each attention layer the new positions' q and the past +
new K/V. attngen keeps its own cache instead: per forward (:meth:`GenerateState.begin`,
called by the registered mask function with the 2-D padding mask) it works out each row's
real new tokens; at the forward's first layer it gives them token slots in one
:class:`~attngen.runtime.pools.PagedKVPool` shared by all layers and builds one
:class:`~attngen.runtime.batch.ForwardBatch`; per layer (:meth:`GenerateState.attend`) it
packs the real new tokens' q/k/v (pads dropped), runs the generated backend chosen for the
layer's features (it writes the new K/V into the pool) and scatters the output back to
``[B, Sq, H, Dv]``; a pad position gets what eager attention computes there (it sees no
key: the mean of the layer's values, or zero where sinks take the softmax).

Host syncs: one per forward (the padding mask's row lengths) plus the backends' own slot
check; this path is for plain generation. Continuous batching is ``paged.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from attngen.integrations.transformers.options import FP8, Options
from attngen.integrations.transformers.select import Choice, LayerFeatures, choose
from attngen.runtime.batch import AttentionLayer, ForwardBatch, ForwardMode, ReqToTokenPool
from attngen.runtime.checks import AttngenInputError
from attngen.runtime.pools import PagedKVPool, quantize_fp8


@dataclass
class Forward:
    """What every layer of one forward shares."""

    prefix: list[int]  # cached tokens per row before this forward
    new: list[int]  # real new tokens per row
    q_length: int  # new positions per row (pads included)
    padding_mask: torch.Tensor  # [B, past + Sq] bool, on the device
    batch: ForwardBatch | None = None  # built at the first layer (page size known)
    q_rows: torch.Tensor | None = None  # [T] int64 rows of the [B * Sq] positions that are real
    ready: set[int] = field(default_factory=set)  # ids of backends whose metadata is built
    attended: set[int] = field(default_factory=set)  # layer ids whose K/V this forward wrote
    checked: bool = False  # the cached keys were compared with transformers' (or need not be)

    @property
    def batch_size(self) -> int:
        return len(self.prefix)

    @property
    def decode(self) -> bool:
        return self.q_length == 1 and min(self.prefix) > 0

    def forward_batch(
        self, req_pool_indices: torch.Tensor, out_cache_loc: torch.Tensor
    ) -> ForwardBatch:
        """This forward as a :class:`ForwardBatch` of one request a row (decode when every
        row adds one token to a cached prefix, else extend)."""
        device = req_pool_indices.device
        as_int32 = dict(dtype=torch.int32, device=device)
        seq = [p + n for p, n in zip(self.prefix, self.new)]
        decode = self.decode
        return ForwardBatch(
            batch_size=self.batch_size,
            forward_mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND,
            req_pool_indices=req_pool_indices,
            seq_lens=torch.tensor(seq, **as_int32),
            seq_lens_cpu=torch.tensor(seq, dtype=torch.int32),
            out_cache_loc=out_cache_loc,
            extend_prefix_lens=None if decode else torch.tensor(self.prefix, **as_int32),
            extend_seq_lens=None if decode else torch.tensor(self.new, **as_int32),
            extend_prefix_lens_cpu=None if decode else list(self.prefix),
            extend_seq_lens_cpu=None if decode else list(self.new),
        )

    def real_rows(self, device: torch.device | str) -> torch.Tensor:
        """The flat ``[B * Sq]`` positions of the real new tokens (each row's last ``new``)."""
        q_len = self.q_length
        rows = [b * q_len + q_len - n + i for b, n in enumerate(self.new) for i in range(n)]
        return torch.tensor(rows, dtype=torch.int64, device=device)


def left_padded(mask: torch.Tensor | None) -> bool:
    """Whether every row of a ``[B, S]`` padding mask is pads, then tokens (one host sync)."""
    return mask is None or bool(_tokens_last(mask.detach().to("cpu", torch.bool)).all())


def _tokens_last(host: torch.Tensor) -> torch.Tensor:
    """Per row of a ``[B, S]`` bool mask: are its kept tokens its last positions?"""
    ending = host.flip(1).int().cumprod(dim=1).sum(dim=1)  # kept tokens ending each row
    return host.sum(dim=1) == ending


def uniform_rows(value: torch.Tensor, heads: int) -> torch.Tensor:
    """What eager attention gives a query that sees no key (its softmax over the all-masked
    row is uniform): the mean of ``value [B, Hkv, S, Dv]`` over its S positions, per query
    head: ``[B, heads, Dv]`` in float32."""
    group = heads // int(value.shape[1])
    return value.float().mean(dim=2).repeat_interleave(group, 1)


class GenerateState:
    """attngen's cache and batch bookkeeping for plain generation (one per model)."""

    def __init__(self, options: Options, num_layers: int) -> None:
        self.options = options
        self.num_layers = num_layers
        self.page_size: int | None = options.page_size
        self.lengths: list[int] = []  # cached tokens per row
        self.pages: list[list[int]] = []  # physical pages per row
        self.num_pages_used = 0
        self.pool: PagedKVPool | None = None
        self.req_pool: ReqToTokenPool | None = None
        self.backends: dict[LayerFeatures, Any] = {}
        self.choices: dict[LayerFeatures, Choice] = {}
        self.layers: dict[int, AttentionLayer] = {}
        self.forward: Forward | None = None
        self.deferred: AttngenInputError | None = None  # why this forward has no bookkeeping
        self.uncached = False  # this generation's first forward ran without attngen's cache
        self.cropped = False  # this forward follows a crop of the cache (assisted decoding)

    # -- per forward ----

    def current(self, who: str, what: str, batch: int, length: int, note: str = "") -> Forward:
        """This forward, for a layer of kind ``who`` whose ``what`` holds ``batch`` x
        ``length`` new positions: refused when the mask function did not start one or its
        mask said another size."""
        fwd = self.forward
        if fwd is None and self.deferred is not None:
            raise self.deferred
        if fwd is None:
            raise AttngenInputError(
                f"attngen {who} ran without its mask function: enable attngen with "
                f"attngen.integrations.transformers.enable(model){note}"
            )
        if (batch, length) != (fwd.batch_size, fwd.q_length):
            raise AttngenInputError(
                f"{what}: batch {batch} x {length} new positions, but this forward's mask said "
                f"{fwd.batch_size} x {fwd.q_length}"
            )
        return fwd

    def begin(
        self,
        padding_mask: torch.Tensor | None,
        *,
        batch_size: int,
        q_length: int,
        q_offset: int,
        device: torch.device | str,
    ) -> None:
        """Start a forward of ``q_length`` new positions after ``q_offset`` cached ones."""
        total = int(q_offset) + int(q_length)
        fwd = self.forward
        if (
            fwd is not None
            and fwd.batch is None
            and (fwd.batch_size, fwd.q_length, int(fwd.padding_mask.shape[1]))
            == (batch_size, q_length, total)
        ):
            return  # the same forward asks again (one mask per layer type)
        if padding_mask is None:
            mask = torch.ones((batch_size, total), dtype=torch.bool, device=device)
        else:
            mask = padding_mask.to(device=device, dtype=torch.bool)
            if tuple(mask.shape) != (batch_size, total):
                raise AttngenInputError(
                    f"attention_mask: expected [{batch_size}, {total}] (cached + new "
                    f"positions), got {list(mask.shape)}"
                )
        if q_offset and self.uncached:
            raise AttngenInputError(
                "this generation's first forward was not left-padded: attngen served it "
                "exactly but without its KV cache; generating on from it needs left padding "
                "(a tokenizer's padding_side='left', what generate() expects)"
            )
        host = mask.cpu()
        real = host.sum(dim=1).tolist()
        tokens_last = _tokens_last(host).tolist()
        for b, n in enumerate(real):
            if n == 0 or not tokens_last[b]:
                raise AttngenInputError(
                    f"attention_mask row {b}: attngen serves left-padded batches (pads, then "
                    f"tokens), got {host[b].int().tolist()}"
                )
        new = [min(n, q_length) for n in real]
        prefix = [n - k for n, k in zip(real, new)]
        if q_offset == 0:
            self.uncached = False
            self.lengths = [0] * batch_size
            self.pages = [[] for _ in range(batch_size)]
            self.num_pages_used = 0
        if len(prefix) != len(self.lengths) or any(p > n for p, n in zip(prefix, self.lengths)):
            raise AttngenInputError(
                f"attngen's cache holds {self.lengths} tokens per row but this forward "
                f"continues after {prefix}: a cache attngen did not see grow (another "
                "generation's cache passed back, rows added or removed mid-generation) is not "
                "supported"
            )
        # prefix < lengths: transformers cropped its cache (assisted decoding and prompt
        # lookup drop the rejected draft tokens); attngen's rows drop them too, keeping their
        # pages (a GDN layer, whose recurrent state took them in, refuses: see ``cropped``)
        self.cropped = prefix != self.lengths
        self.lengths = list(prefix)  # a copy: _allocate grows lengths, not the forward's prefix
        self.forward = Forward(prefix, new, int(q_length), mask)

    def begin_or_defer(self, padding_mask: torch.Tensor | None, **begin: Any) -> None:
        """:meth:`begin` for a model whose plain causal layers run cache-free: a forward it
        refuses (a batch that is not left-padded) is refused only by the layers that take
        this path (windowed, chunked, sinks, MLA / GDN / DSA)."""
        try:
            self.begin(padding_mask, **begin)
            self.deferred = None
        except AttngenInputError as error:
            self.forward, self.deferred = None, error
            self.uncached = self.uncached or not begin.get("q_offset")

    def reorder(self, beam_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Beam search's reorder between two forwards: row ``b`` continues from what row
        ``beam_idx[b]`` held. Each row keeps its own pages; returns the pages whose contents
        move, as (source, destination) page indices on the pool's device (None: none move).
        The caller copies them in every paged pool (:func:`move_pages`): whole pages, so any
        pool layout; the rows of one prompt's beams have equal lengths, so a row's own pages
        hold what it takes over (a row taking over a longer one is refused)."""
        order = [int(i) for i in beam_idx.detach().flatten().tolist()]
        rows = len(self.lengths)
        if len(order) != rows or any(not 0 <= i < rows for i in order):
            raise AttngenInputError(
                f"beam_idx: expected {rows} row indices in 0..{rows - 1} (attngen's cache "
                f"holds {rows} rows), got {order}"
            )
        ps = self.page_size
        src: list[int] = []
        dst: list[int] = []
        for b, i in enumerate(order):
            length = self.lengths[i]
            if i == b or not length:
                continue
            assert ps is not None
            pages = -(-length // ps)
            if pages > len(self.pages[b]):
                raise AttngenInputError(
                    f"beam search moved row {i} ({length} tokens) into row {b}, whose "
                    f"{len(self.pages[b])} pages of {ps} tokens cannot hold it: attngen reorders "
                    "rows of equal lengths (the beams of one prompt)"
                )
            src += self.pages[i][:pages]
            dst += self.pages[b][:pages]
        self.lengths = [self.lengths[i] for i in order]
        if not src:
            return None
        device = beam_idx.device
        as_long = dict(dtype=torch.int64, device=device)
        return torch.tensor(src, **as_long), torch.tensor(dst, **as_long)

    def check_within_chunk(self, chunk: int) -> None:
        """A chunked causal mask (Llama-4's ``attention_chunk_size``: each token sees the
        earlier tokens of its own chunk of ``chunk`` positions) is the plain causal mask while
        every row fits in its first chunk; attngen's kernels have no chunked mask, so past
        that this layer is refused (as transformers refuses flash attention there)."""
        fwd = self.forward
        assert fwd is not None
        longest = max(p + n for p, n in zip(fwd.prefix, fwd.new))
        if longest > chunk:
            raise AttngenInputError(
                f"chunked attention (attention_chunk_size={chunk}): a row reaches {longest} "
                "tokens; attngen's kernels have no chunked mask and serve a chunked layer only "
                f"while every row fits in one chunk (up to {chunk} tokens, as causal attention)"
            )

    def _build(self, fwd: Forward, device: torch.device) -> None:
        """Slots, pools and the ForwardBatch of this forward (at its first layer)."""
        assert self.page_size is not None
        slots = self._allocate(fwd.prefix, fwd.new, self.page_size)
        requests = torch.arange(fwd.batch_size, dtype=torch.int32, device=device)
        out_cache_loc = torch.tensor(slots, dtype=torch.int64, device=device)
        fwd.batch = fwd.forward_batch(requests, out_cache_loc)
        fwd.q_rows = fwd.real_rows(device)

    def _allocate(self, prefix: list[int], new: list[int], ps: int) -> list[int]:
        """Token slots of every row's new tokens (pages taken as rows grow)."""
        slots: list[int] = []
        for b, (start, count) in enumerate(zip(prefix, new)):
            for pos in range(start, start + count):
                if pos // ps == len(self.pages[b]):
                    self.pages[b].append(self.num_pages_used)
                    self.num_pages_used += 1
                slots.append(self.pages[b][pos // ps] * ps + pos % ps)
            self.lengths[b] = start + count
        return slots

    # -- per layer ----

    def attend(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        scaling: float,
        features: LayerFeatures,
        sinks: torch.Tensor | None,
    ) -> torch.Tensor:
        """One layer's attention of this forward's new tokens; ``[B, Sq, H, Dv]``."""
        bs, heads, q_len, _ = query.shape
        fwd = self.current("attention", "query", bs, q_len, " (it registers both)")
        layer_id = layer_index(module, self.num_layers)
        if layer_id in fwd.attended:
            raise AttngenInputError(
                f"the attention function ran twice for layer {layer_id} in one forward (as "
                "DiffLlama's differential attention does, over two halves of V): attngen's "
                "cache holds one K/V per layer and forward, and the second call would "
                "overwrite the first call's values"
            )
        fwd.attended.add(layer_id)
        dtype = self.options.activation_dtype(query.dtype)
        if fwd.batch is None:
            if self.page_size is None:  # auto: what the first layer's best config uses
                self.page_size = self.choice(features, dtype, query.device).config.page_size
            self._build(fwd, query.device)
            self._ensure_storage(key, value, dtype)
        if not fwd.checked:
            self._check_cached(layer_id, fwd, key)
        backend = self._backend(features, dtype, query.device)
        if id(backend) not in fwd.ready:
            backend.init_forward_metadata(fwd.batch)
            fwd.ready.add(id(backend))
        layer = self._layer(layer_id, query, key, value, scaling)
        q = _rows(query, fwd.q_rows, dtype)
        k = _rows(key[:, :, -q_len:], fwd.q_rows, dtype)
        v = _rows(value[:, :, -q_len:], fwd.q_rows, dtype)
        sinks = None if sinks is None else sinks.float()
        batch = fwd.batch
        if batch.forward_mode is ForwardMode.DECODE:
            out = backend.forward_decode(q, k, v, layer, batch, sinks=sinks)
        else:
            out = backend.forward_extend(q, k, v, layer, batch, sinks=sinks)
        dv = int(value.shape[-1])
        full = query.new_zeros((bs * q_len, heads, dv))
        if sinks is None and fwd.q_rows.numel() < bs * q_len:
            # a pad row (before its row's tokens) sees no key: eager's softmax over the
            # all-masked row is uniform, the mean of every value transformers passed (past
            # and new); with sinks the sink takes it all and the row stays zero
            full.view(bs, q_len, heads, dv)[:] = uniform_rows(value, heads)[:, None]
        full[fwd.q_rows] = out.view(-1, heads, dv).to(query.dtype)
        return full.view(bs, q_len, heads, dv)

    def _check_cached(self, layer_id: int, fwd: Forward, key: torch.Tensor) -> None:
        """Once a forward, at its first layer past layer 0 whose keys cover every cached
        position (layer 0 in a one-layer model): each row's last cached key must be the one
        transformers passes from its own cache, else attngen's cache is not the one this
        forward continues (another generation's cache passed back, a cache reordered or
        edited outside ``generate``) and the forward is refused. Past layer 0 a key depends
        on every token before it, so one key a row stands for the row's whole history (at
        layer 0 it depends only on its own token and position). Each key vector within a
        quarter of its norm: fp8 pools and transformers' quantized caches pass, another
        history's key does not. One host sync a forward; NVFP4 pools are not compared."""
        pool = self.pool
        total, q_len = int(fwd.padding_mask.shape[1]), fwd.q_length
        if pool is None or not any(fwd.prefix) or isinstance(pool.dtype, str):
            fwd.checked = True
            return
        if int(key.shape[2]) < total or (layer_id == 0 and self.num_layers > 1):
            return  # a sliding layer's cache, or layer 0: a later layer compares
        fwd.checked = True
        assert self.req_pool is not None
        device = key.device
        rows = [b for b, p in enumerate(fwd.prefix) if p]
        last = [fwd.prefix[b] - 1 for b in rows]
        index = dict(dtype=torch.int64, device=device)
        rows_t, last_t = torch.tensor(rows, **index), torch.tensor(last, **index)
        slots = self.req_pool.req_to_token[rows_t, last_t].long()
        k_cache, _ = pool.get_kv_buffer(layer_id)
        flat = k_cache.view(-1, *k_cache.shape[2:])
        theirs = key[rows_t, :, total - q_len - 1].float()  # left padding: the last cached
        if pool.dtype in FP8:  # both through the pool's quantization (saturation included)
            scale = torch.tensor([self.options.kv_scale], device=device)
            ours = flat.view(torch.uint8)[slots].view(pool.dtype).float() * scale
            theirs = quantize_fp8(theirs, scale, pool.dtype).float() * scale
        else:
            ours = flat[slots].float()
        norm = theirs.norm(dim=-1)
        floor = norm.mean() * 1e-2
        if bool(((ours - theirs).norm(dim=-1) > 0.25 * torch.maximum(norm, floor)).any()):
            self.forward = None  # a later forward starts afresh
            raise AttngenInputError(
                "attngen's cache does not hold the keys transformers passes for the cached "
                "tokens: this forward continues a cache attngen did not build (another "
                "generation's cache passed back, or one reordered or edited outside "
                "generate())"
            )

    def choice(self, features: LayerFeatures, dtype: torch.dtype, device: torch.device) -> Choice:
        if features not in self.choices:
            self.choices[features] = choose(
                features,
                arch=self.options.arch_for(device),
                dtype=dtype,
                kv_dtype=self.options.kv_dtype(dtype),
                page_size=self.page_size,
                backend=self.options.backend,
            )
        return self.choices[features]

    def _backend(self, features: LayerFeatures, dtype: torch.dtype, device: torch.device) -> Any:
        backend = self.backends.get(features)
        if backend is None:
            assert self.pool is not None and self.req_pool is not None
            choice = self.choice(features, dtype, device)
            kv_dtype = self.options.kv_dtype(dtype)
            backend = new_backend(choice, features, dtype, kv_dtype, self.pool, self.req_pool)
            self.backends[features] = backend
        return backend

    def _layer(
        self,
        layer_id: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        scaling: float,
    ) -> AttentionLayer:
        scale = None
        if self.options.kv_cache_dtype in FP8:
            scale = torch.tensor([self.options.kv_scale], dtype=torch.float32, device=query.device)
        return layer_of(self.layers, layer_id, query, key, value, scaling, scale)

    # -- storage ----

    def _ensure_storage(self, key: torch.Tensor, value: torch.Tensor, dtype: torch.dtype) -> None:
        """Pools big enough for every page and row in use (grown, and copied, when not); the
        request rows of req_to_token rewritten from the page lists."""
        kv_heads, head_dim, v_dim = int(key.shape[1]), int(key.shape[-1]), int(value.shape[-1])
        pool = self.pool
        if pool is not None and (pool.num_kv_heads, pool.head_dim, pool.v_head_dim) != (
            kv_heads,
            head_dim,
            v_dim,
        ):
            raise AttngenInputError(
                f"kv heads {kv_heads}, head dims {head_dim}/{v_dim}: attngen's pool holds "
                f"{pool.num_kv_heads} heads of {pool.head_dim}/{pool.v_head_dim} (layers of "
                "different shapes are not served)"
            )
        need_pages = max(self.num_pages_used, 1)
        if pool is None or pool.num_pages < need_pages:
            self._grow_pool(key.device, kv_heads, head_dim, v_dim, dtype, need_pages)
            self.backends.clear()  # they hold the old pool
        rows, context = len(self.lengths), max(self.lengths, default=1)
        req = self.req_pool
        if req is None or req.size < rows or req.max_context_len < context:
            width = max(2 * context, self.options.initial_tokens)
            self.req_pool = ReqToTokenPool(max(rows, 1), width, key.device)
            self.backends.clear()  # they hold the old table's width
        self._write_req_to_token()

    def _grow_pool(
        self,
        device: torch.device,
        kv_heads: int,
        head_dim: int,
        v_dim: int,
        dtype: torch.dtype,
        need_pages: int,
    ) -> None:
        old, ps = self.pool, self.page_size
        assert ps is not None
        pool = PagedKVPool(
            num_layers=self.num_layers,
            num_pages=max(2 * need_pages, -(-self.options.initial_tokens // ps)),
            page_size=ps,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            v_head_dim=v_dim,
            dtype=self.options.kv_dtype(dtype),
            device=device,
        )
        if old is not None:
            n = old.num_pages
            for layer in range(self.num_layers):
                pool.k_buffer[layer][:n].copy_(old.k_buffer[layer])
                pool.v_buffer[layer][:n].copy_(old.v_buffer[layer])
        self.pool = pool

    def _write_req_to_token(self) -> None:
        assert self.req_pool is not None and self.page_size is not None
        ps = self.page_size
        for b, pages in enumerate(self.pages):
            if pages:
                base = torch.tensor(pages, dtype=torch.int32).repeat_interleave(ps) * ps
                slots = base + torch.arange(ps, dtype=torch.int32).repeat(len(pages))
                self.req_pool.write(b, 0, slots[: self.lengths[b]])


def _rows(x: torch.Tensor, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x [B, H, S, D]`` -> the given rows of its ``[B * S, H, D]`` view, in ``dtype``."""
    bs, heads, length, dim = x.shape
    flat = x.transpose(1, 2).reshape(bs * length, heads, dim)
    return flat.index_select(0, rows).to(dtype).contiguous()


def layer_index(module: torch.nn.Module, num_layers: int) -> int:
    """The module's own ``layer_idx``: attngen's caches keep one K/V per layer index."""
    index = getattr(module, "layer_idx", None)
    if isinstance(index, bool) or not isinstance(index, int) or not (0 <= index < num_layers):
        raise AttngenInputError(
            f"the attention module has no layer index of its own (layer_idx={index!r}; "
            "e.g. a block shared by several layers, as Zamba's and Zamba2's shared "
            f"transformer blocks): attngen keeps one KV cache per layer_idx in "
            f"0..{num_layers - 1} and cannot tell which layer this call is"
        )
    return index


def layer_of(
    layers: dict[int, AttentionLayer],
    layer_id: int,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float,
    kv_scale: torch.Tensor | None,
) -> AttentionLayer:
    """The backend's description of layer ``layer_id`` (kept in ``layers``; made again when
    its scaling changes), ``kv_scale`` its fp8 K and V scale (None: no fp8 cache)."""
    layer = layers.get(layer_id)
    if layer is None or layer.scaling != float(scaling):
        layer = AttentionLayer(
            layer_id=layer_id,
            num_q_heads=int(query.shape[1]),
            num_kv_heads=int(key.shape[1]),
            head_dim=int(query.shape[-1]),
            v_head_dim=int(value.shape[-1]),
            scaling=float(scaling),
            k_scale=kv_scale,
            v_scale=kv_scale,
        )
        layers[layer_id] = layer
    return layer


def new_backend(
    choice: Choice,
    features: LayerFeatures,
    dtype: torch.dtype,
    kv_dtype: torch.dtype,
    pool: PagedKVPool,
    req_pool: ReqToTokenPool,
) -> Any:
    """The generated backend of ``choice`` for layers of ``features`` over ``pool``."""
    return choice.backend_class(
        num_q_heads=features.gqa_group * pool.num_kv_heads,
        num_kv_heads=pool.num_kv_heads,
        head_dim=features.head_dim,
        v_head_dim=features.v_head_dim,
        page_size=pool.page_size,
        dtype=dtype,
        device=pool.device,
        req_to_token_pool=req_pool,
        kv_pool=pool,
        kv_cache_dtype=kv_dtype,
        kv_scale=choice.config.kv_scale,
    )


def move_pages(pool: Any, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy pages ``src`` over pages ``dst`` (all read before any is written) in every
    per-layer buffer of an attngen pool whose first dim is its pages (K / V, latents, block
    scales, index keys: whatever the layout within a page)."""
    if pool is None:
        return
    for value in vars(pool).values():
        if not isinstance(value, list):
            continue
        for buffer in value:
            if isinstance(buffer, torch.Tensor) and buffer.shape[0] == pool.num_pages:
                flat = buffer.view(torch.uint8)  # index copies of every dtype, fp8 included
                flat[dst.to(buffer.device)] = flat[src.to(buffer.device)]
