"""Non-causal attention over keys that are not the forward's own tokens: the cross-attention
layers of encoder-decoder models (BART, mBART, Marian, Pegasus, Whisper: the decoder's
queries over the encoder's outputs) and the layers of a decoder run bidirectionally past
its first forward (``config.is_causal = False``, queries over the cached keys).

transformers hands such a layer its queries ``[B, H, Sq, D]``, the keys and values it
attends to ``[B, Hkv, Sk, D]`` (the encoder's, computed once and reused from its cross
cache at every decoding step) and either no mask (Whisper: every key) or a bidirectional
mask built from the encoder's padding mask ``[B, Sk]`` (BART). Every query of row ``b``
sees the keys row ``b`` keeps, whichever its own position: that is decode attention, one
request per query over the row's kept keys, with no causal boundary (a decode request sees
its whole KV). So the layer runs the generated ``decode`` kernel of the layer's shape:
each row's kept keys are packed into pages of attngen's own pool (``CrossState``, one pool
for every cross layer of the model, page tables shared by a row's queries), and the
``B * Sq`` queries become decode requests. A row that keeps no key gets the mean of its
values, as eager attention's uniform softmax over an all-masked row does (zero with sinks).

The keys are written once: a layer whose key and value tensors are the ones written last
(same tensors, not modified in place since: transformers' cross cache hands the same tensors
to every decoding step) reuses its pages. The pool is rebuilt when the batch's shape or
padding changes. Host syncs: the padding mask is read once per forward (by the mask
function); the backend's slot check runs when the requests change (first forward, then the
first decoding step), not at every step.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from attngen.integrations.transformers.generate import (
    layer_index,
    layer_of,
    new_backend,
    uniform_rows,
)
from attngen.integrations.transformers.options import Options
from attngen.integrations.transformers.select import Choice, LayerFeatures, remembered_choice
from attngen.runtime.batch import AttentionLayer, ForwardBatch, ForwardMode, ReqToTokenPool
from attngen.runtime.checks import AttngenInputError
from attngen.runtime.pools import PagedKVPool

PHASES = ("decode",)


@dataclass(frozen=True)
class KeyPlan:
    """Which keys each row keeps: ``counts[b]`` kept keys of row ``b``'s ``kv_length``,
    ``kept`` the ``[batch, kv_length]`` mask on the host (None: every key kept)."""

    batch: int
    q_length: int
    kv_length: int
    counts: tuple[int, ...]
    kept: torch.Tensor | None

    @staticmethod
    def of(mask: torch.Tensor | None, batch: int, q_length: int, kv_length: int) -> KeyPlan:
        """The plan of a ``[batch, kv_length]`` padding mask (True: a key to attend to; None:
        every key). One host sync."""
        if mask is None:
            return KeyPlan(batch, q_length, kv_length, (kv_length,) * batch, None)
        if tuple(mask.shape) != (batch, kv_length):
            raise AttngenInputError(
                f"padding mask of the keys: expected [{batch}, {kv_length}], got "
                f"{list(mask.shape)}"
            )
        kept = mask.detach().to("cpu", torch.bool)
        if bool(kept.all()):
            return KeyPlan(batch, q_length, kv_length, (kv_length,) * batch, None)
        return KeyPlan(batch, q_length, kv_length, tuple(kept.sum(dim=1).tolist()), kept)

    @functools.cached_property
    def geometry(self) -> tuple[Any, ...]:
        """What the pool's pages depend on (not the query length)."""
        kept = None if self.kept is None else self.kept.numpy().tobytes()
        return (self.batch, self.kv_length, kept)

    def kept_positions(self) -> torch.Tensor:
        """The flat ``b * kv_length + j`` positions of the kept keys, row by row (int64)."""
        if self.kept is None:
            return torch.arange(self.batch * self.kv_length, dtype=torch.int64)
        return torch.nonzero(self.kept.flatten()).flatten()


@dataclass
class _Pages:
    """The pool's layout for one geometry: kept key ``i`` (row-major) sits in ``slots[i]``;
    ``gather[i]`` is its flat position in the layer's ``[B * Sk]`` keys."""

    geometry: tuple[Any, ...]
    pool: PagedKVPool
    req_pool: ReqToTokenPool
    slots: torch.Tensor  # [N] int64, on the device
    gather: torch.Tensor  # [N] int64, on the device
    last_slot: list[int]  # per row: the slot of its last kept key (0 for an empty row)


@dataclass
class _Requests:
    """One decode request per query of a row that keeps a key."""

    batch: ForwardBatch
    positions: torch.Tensor  # [R] int64: the flat b * Sq + i of each request's query
    empty_rows: torch.Tensor  # [E] int64: rows that keep no key


class CrossState:
    """attngen's pages of the keys every cross layer attends to, and their decode requests
    (one per model: its encoder-decoder layers share the batch's padding)."""

    def __init__(self, options: Options, num_layers: int) -> None:
        self.options = options
        self.num_layers = num_layers
        self.page_size: int | None = options.page_size
        self.choices: dict[tuple[Any, ...], Choice] = {}
        self.pages: _Pages | None = None
        self.requests: dict[int, _Requests] = {}  # q_length -> requests over self.pages
        self.backends: dict[tuple[LayerFeatures, torch.dtype], Any] = {}
        self.ready: dict[int, int] = {}  # id(backend) -> id(ForwardBatch) its metadata is for
        self.layers: dict[int, AttentionLayer] = {}
        self.written: dict[int, tuple[Any, ...]] = {}  # layer -> the key / value it holds

    def choice(self, features: LayerFeatures, dtype: torch.dtype, device: torch.device) -> Choice:
        return remembered_choice(
            self.choices, features, arch=self.options.arch_for(device), dtype=dtype,
            backend=self.options.backend, phases=PHASES, page_size=self.page_size,
        )  # fmt: skip

    def attend(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        scaling: float,
        features: LayerFeatures,
        plan: KeyPlan | None,
        sinks: torch.Tensor | None,
    ) -> torch.Tensor:
        """``query [B, H, Sq, D]`` over ``key`` / ``value [B, Hkv, Sk, D(v)]`` under ``plan``
        (None: every key); returns ``[B, Sq, H, Dv]`` in the query's dtype."""
        batch, heads, q_len = (int(x) for x in query.shape[:3])
        kv_len = int(key.shape[2])
        for name, tensor in (("key", key), ("value", value)):
            if tensor.dim() != 4 or tensor.shape[0] != batch or tensor.shape[2] != kv_len:
                raise AttngenInputError(
                    f"{name}: expected [{batch}, heads, {kv_len}, dim], got {list(tensor.shape)}"
                )
        if plan is None:
            plan = KeyPlan.of(None, batch, q_len, kv_len)
        if (plan.batch, plan.q_length, plan.kv_length) != (batch, q_len, kv_len):
            raise AttngenInputError(
                f"the layer's mask covers {plan.batch} rows of {plan.q_length} queries over "
                f"{plan.kv_length} keys, its call {batch} rows of {q_len} over {kv_len}"
            )
        dtype = self.options.activation_dtype(query.dtype)
        choice = self.choice(features, dtype, query.device)
        if self.page_size is None:  # auto: the first layer's best config's
            self.page_size = choice.config.page_size
        layer_id = layer_index(module, self.num_layers)
        pages = self._pages(plan, key, value, dtype)
        self._write(layer_id, pages, key, value, dtype)
        requests = self._requests(plan, pages, query.device)
        dv = int(value.shape[-1])
        out = torch.empty(batch * q_len, heads, dv, dtype=query.dtype, device=query.device)
        if requests.empty_rows.numel():
            # eager's softmax over a row that keeps no key is uniform: the mean of its values
            # (with sinks the sink takes it all: zero)
            fill = (
                uniform_rows(value, heads) if sinks is None else value.new_zeros(batch, heads, dv)
            )
            rows = requests.empty_rows
            out.view(batch, q_len, heads, dv)[rows] = fill[rows][:, None].to(query.dtype)
        if requests.positions.numel():
            backend = self._backend(features, dtype, choice, pages)
            if self.ready.get(id(backend)) != id(requests.batch):
                backend.init_forward_metadata(requests.batch)
                self.ready[id(backend)] = id(requests.batch)
            flat = query.transpose(1, 2).reshape(batch * q_len, heads, -1)
            q = flat.index_select(0, requests.positions).to(dtype).contiguous()
            layer = layer_of(self.layers, layer_id, query, key, value, scaling, None)
            got = backend.forward_decode(
                q,
                None,
                None,
                layer,
                requests.batch,
                save_kv_cache=False,
                sinks=None if sinks is None else sinks.float(),
            )
            out[requests.positions] = got.view(-1, heads, dv).to(query.dtype)
        return out.view(batch, q_len, heads, dv)

    # -- pages ----

    def _pages(
        self, plan: KeyPlan, key: torch.Tensor, value: torch.Tensor, dtype: torch.dtype
    ) -> _Pages:
        """The pool laid out for ``plan``'s kept keys (rebuilt, and every layer's keys
        written again, when the geometry changes; a layer of another K/V shape is refused)."""
        kv_heads, head_dim, v_dim = int(key.shape[1]), int(key.shape[-1]), int(value.shape[-1])
        current = self.pages
        if current is not None and current.geometry == plan.geometry:
            pool = current.pool
            if (pool.num_kv_heads, pool.head_dim, pool.v_head_dim) != (kv_heads, head_dim, v_dim):
                raise AttngenInputError(
                    f"kv heads {kv_heads}, head dims {head_dim}/{v_dim}: attngen's cross-"
                    f"attention pool holds {pool.num_kv_heads} heads of "
                    f"{pool.head_dim}/{pool.v_head_dim} (layers of different shapes are not "
                    "served)"
                )
            return current
        ps = self.page_size
        assert ps is not None
        slots: list[int] = []
        last_slot: list[int] = []
        page = 0
        for count in plan.counts:
            slots += [page * ps + j for j in range(count)]
            last_slot.append(slots[-1] if count else 0)
            page += -(-count // ps)
        device = key.device
        pool = PagedKVPool(
            num_layers=self.num_layers,
            num_pages=max(page, 1),
            page_size=ps,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            v_head_dim=v_dim,
            dtype=dtype,
            device=device,
        )
        req_pool = ReqToTokenPool(plan.batch, max(max(plan.counts), 1), device)
        start = 0
        for b, count in enumerate(plan.counts):
            if count:
                req_pool.write(b, 0, torch.tensor(slots[start : start + count]))
            start += count
        self.pages = _Pages(
            geometry=plan.geometry,
            pool=pool,
            req_pool=req_pool,
            slots=torch.tensor(slots, dtype=torch.int64, device=device),
            gather=plan.kept_positions().to(device),
            last_slot=last_slot,
        )
        self.requests.clear()
        self.backends.clear()  # they hold the old pool
        self.ready.clear()
        self.written.clear()
        return self.pages

    def _write(
        self,
        layer_id: int,
        pages: _Pages,
        key: torch.Tensor,
        value: torch.Tensor,
        dtype: torch.dtype,
    ) -> None:
        """The layer's kept keys and values into its pages, unless they hold these already."""
        held = self.written.get(layer_id)
        if held is not None:
            key_ref, key_version, value_ref, value_version = held
            if (key_ref() is key and value_ref() is value) and (
                key._version,
                value._version,
            ) == (key_version, value_version):
                return
        k_cache, v_cache = pages.pool.get_kv_buffer(layer_id)
        for cache, x in ((k_cache, key), (v_cache, value)):
            batch, heads, length, dim = x.shape
            flat = x.transpose(1, 2).reshape(batch * length, heads, dim)
            rows = flat.index_select(0, pages.gather).to(dtype)
            cache.view(-1, heads, dim).index_copy_(0, pages.slots, rows)
        self.written[layer_id] = (
            weakref.ref(key),
            key._version,
            weakref.ref(value),
            value._version,
        )

    def _requests(self, plan: KeyPlan, pages: _Pages, device: torch.device) -> _Requests:
        """The decode requests of ``plan``'s queries over ``pages`` (kept per query length:
        a generation's first forward and its steps differ)."""
        found = self.requests.get(plan.q_length)
        if found is not None:
            return found
        q_len = plan.q_length
        rows = [b for b, count in enumerate(plan.counts) if count]
        req = [b for b in rows for _ in range(q_len)]
        seq = [plan.counts[b] for b in req]
        as_int32 = dict(dtype=torch.int32, device=device)
        batch = ForwardBatch(
            batch_size=len(req),
            forward_mode=ForwardMode.DECODE,
            req_pool_indices=torch.tensor(req, **as_int32),
            seq_lens=torch.tensor(seq, **as_int32),
            seq_lens_cpu=torch.tensor(seq, dtype=torch.int32),
            # nothing is written (save_kv_cache=False); a valid slot per request
            out_cache_loc=torch.tensor(
                [pages.last_slot[b] for b in req], dtype=torch.int64, device=device
            ),
        )
        positions = [b * q_len + i for b in rows for i in range(q_len)]
        empty = [b for b, count in enumerate(plan.counts) if not count]
        found = _Requests(
            batch=batch,
            positions=torch.tensor(positions, dtype=torch.int64, device=device),
            empty_rows=torch.tensor(empty, dtype=torch.int64, device=device),
        )
        self.requests[q_len] = found
        return found

    # -- backends ----

    def _backend(
        self, features: LayerFeatures, dtype: torch.dtype, choice: Choice, pages: _Pages
    ) -> Any:
        backend = self.backends.get((features, dtype))
        if backend is None:
            backend = new_backend(choice, features, dtype, dtype, pages.pool, pages.req_pool)
            self.backends[(features, dtype)] = backend
        return backend
