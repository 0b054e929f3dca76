"""The GDN runtime: gated delta rule layers through one generated kernels module.

A generated ``backend.py`` subclasses :class:`GdnBackend` and sets only class attributes.
The neutral parts (metadata skeleton, graph plumbing) are
:class:`~attngen.runtime.backend_base.AttentionBackendBase`'s; GDN keeps no KV cache, so the
slot check is its own (request rows -> state slots of a
:class:`~attngen.runtime.state_pool.RequestStatePool`).

Per layer (SGLang's seams): ``forward_decode(layer, forward_batch, mixed_qkv, a, b)`` and
``forward_extend(...)`` take the projected ``mixed_qkv [T, 2*H*K + HV*V]`` (q | k | v
channels), the raw gate inputs ``a, b [T, HV]``; they run the causal conv (updating the
conv state), then the gated delta rule over views of its output, and return ``[T, HV*V]``.
EXTEND runs the chunked kernels (requests with a prefix start from their pool state),
DECODE the recurrent one (pool rows updated in place), TARGET_VERIFY the drafts (every
draft's state into the pool's step buffers); :meth:`GdnBackend.accept` then copies each
request's accepted draft into its pool slot. DECODE and TARGET_VERIFY are graph-capturable:
the slots, row offsets and parents live in static buffers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from attngen.runtime.backend_base import (
    GRAPH_PHASES,
    AttentionBackendBase,
    check_mirrors,
    host_mirrors,
    kernel_device,
)
from attngen.runtime.batch import ForwardBatch, ForwardMode, VerifyInfo
from attngen.runtime.checks import AttngenInputError, check_at_least, check_tensor, fail
from attngen.runtime.graph import check_graph_rows
from attngen.runtime.state_pool import RequestStatePool

NO_CONTEXT_LIMIT = 1 << 40  # a recurrent state has no context window


@dataclass(frozen=True)
class GdnLayer:
    """What a backend needs of the GDN layer calling it (SGLang's linear-attention layer)."""

    layer_id: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    A_log: torch.Tensor  # [HV] fp32
    dt_bias: torch.Tensor  # [HV] fp32
    conv_weight: torch.Tensor  # [conv_dim, W], conv_dim = 2 * H * K + HV * V
    conv_bias: torch.Tensor | None = None  # [conv_dim]
    scaling: float | None = None  # q scale; None: head_k_dim ** -0.5

    @property
    def conv_dim(self) -> int:
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim


@dataclass(frozen=True)
class GdnVerifyInfo(VerifyInfo):
    """A TARGET_VERIFY forward's drafts: ``draft_token_num`` per request and, for trees,
    ``parents [>= B, T]`` int32 (draft i continues from draft parents[b, i] < i; -1: the
    request's state); GDN needs no tree mask. Chains may pass a plain ``VerifyInfo``."""

    parents: torch.Tensor | None = None


@dataclass(frozen=True)
class GdnMetadata:
    batch_size: int
    mode: ForwardMode
    cache_indices: torch.Tensor  # [B] int32 pool slots (0: padding)
    query_start_loc: torch.Tensor  # [B + 1] int32 (decode: the batch rows in slot order)
    tokens_per_request: int = 1  # decode 1, verify num_draft_tokens (extend: ragged)
    has_initial_state: torch.Tensor | None = None  # extend: [B] int32, prefix > 0
    plan: Any = None  # extend: the library's ChunkPlan
    parents: torch.Tensor | None = None  # verify trees: [B, T] int32
    out: torch.Tensor | None = None  # graph mode: static output rows


@dataclass(frozen=True)
class GdnGraphBuffers:
    """One capturable mode's static buffers (the generated graph.allocate_decode_buffers')
    and its static output rows."""

    buffers: dict[str, torch.Tensor]
    out: torch.Tensor  # [max_num_tokens, HV, V]
    tokens_per_request: int

    @property
    def max_bs(self) -> int:
        return int(self.buffers["cache_indices"].shape[0])


def select_config(configs: Mapping[str, Any], want: dict[str, Any]) -> Any:
    """The one config matching ``want`` (None values are free); else a clear error."""
    given = {k: v for k, v in want.items() if v is not None}
    ordered = [configs[uri] for uri in sorted(configs)]
    matches = [c for c in ordered if all(getattr(c, k) == v for k, v in given.items())]
    if len(matches) == 1:
        return matches[0]
    available = "; ".join(c.uri for c in ordered) or "none"
    wanted = " ".join(f"{k}={v}" for k, v in given.items())
    if matches:
        raise AttngenInputError(
            f"several generated configs for {wanted}: pass spec_topk to choose; "
            f"available: {available}"
        )
    raise AttngenInputError(f"no generated config for {wanted}; available: {available}")


class GdnBackend(AttentionBackendBase):
    """Gated delta rule layers through one generated kernels module."""

    LAYER_ATTRS: ClassVar[tuple[str, ...]] = (
        "num_k_heads",
        "num_v_heads",
        "head_k_dim",
        "head_v_dim",
        "dtype",
    )

    def __init__(
        self,
        *,
        num_k_heads: int,
        num_v_heads: int,
        head_k_dim: int,
        head_v_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        state_pool: RequestStatePool,
        spec_topk: int | None = None,
        max_context_len: int = NO_CONTEXT_LIMIT,
    ) -> None:
        self._check_generated()
        if num_k_heads < 1 or num_v_heads % num_k_heads:
            fail("num_v_heads", f"a multiple of num_k_heads={num_k_heads} (>= 1)", num_v_heads)
        self.num_k_heads, self.num_v_heads = num_k_heads, num_v_heads
        self.head_k_dim, self.head_v_dim = head_k_dim, head_v_dim
        self.dtype = dtype
        self.device = kernel_device(device, self.backend, self.arch, (dtype,))
        self.config = select_config(
            self.kernels.CONFIGS,
            dict(
                key_dim=head_k_dim,
                value_dim=head_v_dim,
                v_heads_per_k_head=num_v_heads // num_k_heads,
                dtype=str(dtype).removeprefix("torch."),
                spec_topk=spec_topk,
            ),
        )
        self.conv_dim = 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim
        self._check_pool(state_pool)
        self.state_pool = state_pool
        self.max_context_len = max_context_len
        self.forward_metadata: GdnMetadata | None = None
        self._graph_buffers: dict[str, Any] = {}

    def _check_pool(self, pool: RequestStatePool) -> None:
        temporal = (self.num_v_heads, self.head_v_dim, self.head_k_dim)
        conv = (self.conv_dim, self.config.conv_kernel - 1)
        if pool.temporal_shape != temporal or pool.temporal[0].dtype != torch.float32:
            fail("state_pool temporal state", f"[*, {temporal}] float32", pool.temporal[0].shape)
        if pool.conv_shape != conv or pool.conv[0].dtype != self.dtype:
            fail("state_pool conv state", f"[*, {conv}] {self.dtype}", pool.conv[0].shape)
        if pool.device != self.device:
            fail("state_pool.device", f"{self.device} (as the backend)", pool.device)

    # -- per-forward metadata ----

    def _check_slots(self, fb: ForwardBatch) -> None:
        """Request rows inside the slot table and mapped to distinct slots 1..size, the device
        extend and prefix lengths equal to the host ones, and a tree verify's parents each an
        earlier draft or -1 (one sync)."""
        table = self.state_pool.req_to_slot
        rows = fb.req_pool_indices.long()
        bad_row = (rows < 1) | (rows >= table.shape[0])
        slots = table[rows.clamp(0, table.shape[0] - 1)]
        bad_slot = (slots < 1) | (slots > self.state_pool.size)
        mirrors = host_mirrors(fb)  # chunk plans come from the host lengths
        ordered = slots.sort().values  # two requests on one state slot: a write race
        shared = (ordered[1:] == ordered[:-1]).any()  # False for one request
        checks = [bad_row.any(), bad_slot.any(), shared]
        bad_parent = self._bad_parents(fb)
        checks.append(torch.zeros((), dtype=torch.bool, device=self.device))
        if bad_parent is not None:
            checks[-1] = bad_parent.any()
        parts = [torch.stack(checks).long(), *(t.long() for _, t, _ in mirrors)]
        synced = torch.cat(parts).tolist()  # the one sync
        flags, lengths = synced[: len(checks)], synced[len(checks) :]
        parent_flag = flags.pop()
        if flags[0]:
            b = int(bad_row.nonzero()[0, 0])
            what = f"a request row 1..{table.shape[0] - 1} (row 0 pads)"
            fail(f"forward_batch.req_pool_indices[{b}]", what, int(rows[b]))
        if flags[1]:
            b = int(bad_slot.nonzero()[0, 0])
            what = f"a state slot 1..{self.state_pool.size} (RequestStatePool.assign)"
            fail(f"state_pool.req_to_slot[{int(rows[b])}] (request {b})", what, int(slots[b]))
        if flags[2]:
            owners: dict[int, int] = {}
            for b, slot in enumerate(slots.tolist()):
                if slot in owners:
                    fail(
                        f"state_pool.req_to_slot[{int(rows[b])}] (request {b})",
                        f"a state slot of its own (request {owners[slot]} updates slot {slot})",
                        slot,
                    )
                owners[slot] = b
        check_mirrors(mirrors, lengths)
        if parent_flag:
            assert bad_parent is not None
            b, i = (int(x) for x in bad_parent.nonzero()[0])
            parent = int(fb.spec_info.parents[b, i])
            fail(f"spec_info.parents[{b}, {i}]", f"an earlier draft 0..{i - 1} or -1", parent)

    def _bad_parents(self, fb: ForwardBatch) -> torch.Tensor | None:
        """A tree verify's well-formed parents (int32 [>= B, T] on the device; a malformed
        tensor is refused by name when the metadata is built): True where draft i's parent
        is not -1 .. i - 1 (a later draft, or one outside the request, would read another
        request's step states)."""
        parents = getattr(fb.spec_info, "parents", None)
        n = self.config.num_draft_tokens
        ok = (
            fb.forward_mode is ForwardMode.TARGET_VERIFY
            and self.config.spec_topk > 1
            and isinstance(parents, torch.Tensor)
            and parents.dtype == torch.int32
            and parents.device == self.device
            and parents.dim() == 2
            and parents.shape[1] == n
            and parents.shape[0] >= fb.batch_size
        )
        if not ok:
            return None
        rows = parents[: fb.batch_size]
        steps = torch.arange(n, dtype=torch.int32, device=self.device)
        return (rows < -1) | (rows >= steps)

    def _decode_metadata(self, fb: ForwardBatch) -> GdnMetadata:
        bs = fb.batch_size
        slots = torch.empty((bs,), dtype=torch.int32, device=self.device)
        qsl = torch.empty((bs + 1,), dtype=torch.int32, device=self.device)
        slot_order(self._slots(fb.req_pool_indices), slots, qsl)
        return GdnMetadata(bs, fb.forward_mode, slots, qsl)

    def _extend_metadata(self, fb: ForwardBatch) -> GdnMetadata:
        assert fb.extend_seq_lens is not None and fb.extend_seq_lens_cpu is not None
        assert fb.extend_prefix_lens is not None
        bs = fb.batch_size
        slots = self._slots(fb.req_pool_indices)
        qsl = torch.zeros((bs + 1,), dtype=torch.int32, device=self.device)
        torch.cumsum(fb.extend_seq_lens, dim=0, dtype=torch.int32, out=qsl[1:])
        if fb.forward_mode is ForwardMode.TARGET_VERIFY:
            n, parents = self._verify_info(fb.spec_info, bs)
            return GdnMetadata(bs, fb.forward_mode, slots, qsl, n, parents=parents)
        plan = self.kernels.chunk_plan(
            list(fb.extend_seq_lens_cpu), self.config.chunk_size, self.device
        )
        has_initial = (fb.extend_prefix_lens > 0).to(torch.int32)
        return GdnMetadata(bs, fb.forward_mode, slots, qsl, 0, has_initial, plan)

    def _slots(self, req_pool_indices: torch.Tensor) -> torch.Tensor:
        return self.state_pool.slots(req_pool_indices)

    def _verify_info(self, info: Any, bs: int) -> tuple[int, torch.Tensor | None]:
        if not isinstance(info, VerifyInfo):
            fail("spec_info", "a GdnVerifyInfo (TARGET_VERIFY)", type(info).__name__)
        n, want = info.draft_token_num, self.config.num_draft_tokens
        if n != want:
            fail("spec_info.draft_token_num", f"{want} (the spec's num_draft_tokens)", n)
        parents = getattr(info, "parents", None)
        if self.config.spec_topk <= 1:
            if parents is not None:
                fail("spec_info.parents", "None (this spec verifies draft chains)", "a tensor")
            return n, None
        parents = check_tensor(
            "spec_info.parents", parents, dtype=torch.int32, shape=[None, n], device=self.device
        )
        if parents.shape[0] < bs:
            fail("spec_info.parents", f">= {bs} rows", parents.shape[0])
        return n, parents[:bs]

    # -- per-layer forward ----

    def forward_decode(
        self,
        layer: GdnLayer,
        forward_batch: ForwardBatch,
        mixed_qkv: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
    ) -> torch.Tensor:
        """One token per request; returns ``[B, HV * V]``."""
        self._check_phase("decode", forward_batch.forward_mode)
        meta = self._metadata(GdnMetadata, "forward_decode", forward_batch)
        _check_mode("forward_decode", meta, decode=True)
        return self._recurrent(layer, meta, mixed_qkv, a, b, verify=False)

    def forward_extend(
        self,
        layer: GdnLayer,
        forward_batch: ForwardBatch,
        mixed_qkv: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
    ) -> torch.Tensor:
        """EXTEND: ragged new tokens (chunked); TARGET_VERIFY: the drafts. ``[T, HV * V]``."""
        meta = self._metadata(GdnMetadata, "forward_extend", forward_batch)
        _check_mode("forward_extend", meta, decode=False)
        if meta.mode is ForwardMode.TARGET_VERIFY:
            self._check_phase("verify", meta.mode)
            return self._recurrent(layer, meta, mixed_qkv, a, b, verify=True)
        self._check_phase("extend", meta.mode)
        rows = meta.plan.num_tokens
        temporal, conv_states = self._layer(layer, mixed_qkv, a, b, rows)
        x = torch.empty_like(mixed_qkv)
        self.kernels.conv_prefill(
            mixed_qkv,
            layer.conv_weight,
            layer.conv_bias,
            conv_states,
            meta.cache_indices,
            meta.has_initial_state,
            meta.query_start_loc,
            x,
            config=self.config,
            max_len=meta.plan.max_len,
        )
        q, k, v = self._split(x)
        out = self._new_out(rows)
        self.kernels.extend(
            q,
            k,
            v,
            a,
            b,
            **self._gate_kwargs(layer, temporal, meta),
            has_initial_state=meta.has_initial_state,
            out=out,
            plan=meta.plan,
            config=self.config,
            scale=self._scale(layer),
        )
        return out.view(rows, -1)

    def _recurrent(
        self,
        layer: GdnLayer,
        meta: GdnMetadata,
        mixed_qkv: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        *,
        verify: bool,
    ) -> torch.Tensor:
        rows = meta.batch_size * meta.tokens_per_request
        temporal, conv_states = self._layer(layer, mixed_qkv, a, b, rows)
        steps, conv_steps = self.state_pool.steps(layer.layer_id) if verify else (None, None)
        x = torch.empty_like(mixed_qkv)
        self.kernels.conv_update(
            mixed_qkv,
            layer.conv_weight,
            layer.conv_bias,
            conv_states,
            meta.cache_indices,
            meta.query_start_loc,
            x,
            config=self.config,
            steps=conv_steps,
            parents=meta.parents,
            tokens_per_request=meta.tokens_per_request,
        )
        q, k, v = self._split(x)
        out = self._new_out(rows) if meta.out is None else meta.out[:rows]
        kwargs = dict(**self._gate_kwargs(layer, temporal, meta), out=out, config=self.config)
        if verify:
            self.kernels.target_verify(
                q, k, v, a, b, steps=steps, parents=meta.parents, scale=self._scale(layer), **kwargs
            )
        else:
            self.kernels.decode(q, k, v, a, b, scale=self._scale(layer), **kwargs)
        return out.view(rows, -1)

    def accept(self, accepted: torch.Tensor, layer_ids: list[int] | None = None) -> None:
        """After a TARGET_VERIFY forward: copy request b's accepted draft (``accepted[b]``,
        int32 [B]: the draft index whose state to keep; -1: keep the pool's) state and conv
        window into its pool slot, for every layer (or ``layer_ids``)."""
        meta = self._metadata(GdnMetadata, "accept")
        if meta.mode is not ForwardMode.TARGET_VERIFY:
            fail("accept", "the metadata of a TARGET_VERIFY forward", meta.mode.name)
        accepted = check_graph_rows("accepted", accepted, meta.batch_size, self.device)
        accepted = accepted.to(torch.int32).contiguous()
        if self.validate_slots and not _capturing(self.device):  # eager: one sync
            n = meta.tokens_per_request
            bad = (accepted[: meta.batch_size] < -1) | (accepted[: meta.batch_size] >= n)
            if bool(bad.any()):
                b = int(bad.nonzero()[0, 0])
                fail(f"accepted[{b}]", f"a draft 0..{n - 1} or -1 (keep)", int(accepted[b]))
        ids = range(self.state_pool.num_layers) if layer_ids is None else layer_ids
        for layer_id in ids:
            temporal, conv_states = self.state_pool.layer(layer_id)
            steps, conv_steps = self.state_pool.steps(layer_id)
            self.kernels.accept(
                temporal, conv_states, steps, conv_steps, meta.cache_indices, accepted
            )

    def _layer(
        self, layer: GdnLayer, mixed_qkv: Any, a: Any, b: Any, rows: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        got = (layer.num_k_heads, layer.num_v_heads, layer.head_k_dim, layer.head_v_dim)
        want = (self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim)
        if got != want:
            fail(f"layer {layer.layer_id} (k heads, v heads, K, V)", f"{want}", got)
        dev = self.device
        shape = [rows, self.conv_dim]
        check_tensor("mixed_qkv", mixed_qkv, dtype=self.dtype, shape=shape, device=dev)
        if mixed_qkv.stride(1) != 1:
            fail("mixed_qkv", "stride 1 in the last dim", f"strides {mixed_qkv.stride()}")
        for name, x in (("a", a), ("b", b)):
            check_tensor(name, x, dtype=self.dtype, shape=[rows, self.num_v_heads], device=dev)
        return self.state_pool.layer(layer.layer_id)

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views of the conv output's q | k | v channels as [T, heads, dim]."""
        h, kd = self.num_k_heads, self.head_k_dim
        q = x[:, : h * kd].view(-1, h, kd)
        k = x[:, h * kd : 2 * h * kd].view(-1, h, kd)
        v = x[:, 2 * h * kd :].view(-1, self.num_v_heads, self.head_v_dim)
        return q, k, v

    def _gate_kwargs(self, layer: GdnLayer, temporal: torch.Tensor, meta: GdnMetadata) -> dict:
        return dict(
            A_log=layer.A_log,
            dt_bias=layer.dt_bias,
            ssm_states=temporal,
            cache_indices=meta.cache_indices,
            query_start_loc=meta.query_start_loc,
        )

    def _scale(self, layer: GdnLayer) -> float:
        return self.head_k_dim**-0.5 if layer.scaling is None else layer.scaling

    def _new_out(self, rows: int) -> torch.Tensor:
        shape = (rows, self.num_v_heads, self.head_v_dim)
        return torch.empty(shape, dtype=self.dtype, device=self.device)

    # -- CUDA graphs (decode, target verify) ----

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Static buffers of every capturable phase the spec has, allocated once."""
        self._first_graph_state()
        check_at_least("max_bs", max_bs, 1)
        drafts = self.config.num_draft_tokens
        modes = [("decode", 1)] if "decode" in self.kernels.PHASES else []
        if "verify" in self.kernels.PHASES and drafts:
            modes.append(("verify", drafts))
        dims = dict(max_bs=max_bs, max_bs_plus_one=max_bs + 1, device=self.device)
        if "verify" in self.kernels.PHASES:
            dims["max_drafts"] = max(1, drafts)
        for phase, per_request in modes:
            buffers = self.graph.allocate_decode_buffers(**dims)
            qsl = torch.arange(max_bs + 1, dtype=torch.int32, device=self.device)
            buffers["query_start_loc"].copy_(qsl * per_request)
            rows = max(max_num_tokens, max_bs * per_request)
            out = torch.empty(
                (rows, self.num_v_heads, self.head_v_dim), dtype=self.dtype, device=self.device
            )
            self._graph_buffers[phase] = GdnGraphBuffers(buffers, out, per_request)

    def _tokens_per_request(self, mode: ForwardMode) -> int:
        return self.config.num_draft_tokens if mode is ForwardMode.TARGET_VERIFY else 1

    def _load_graph_rows(
        self,
        mode: ForwardMode,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        spec_info: Any,
        seq_lens_cpu: torch.Tensor | None,
    ) -> None:
        """Slots of the (padded) batch's request rows into the static buffer (decode: in
        slot order, with their rows); trees copy their parents; a verify's row offsets never
        change. No host sync."""
        if mode is ForwardMode.DRAFT_EXTEND:
            raise AttngenInputError("cuda graph: DRAFT_EXTEND is not lowered for GDN")
        bufs = self._graph_buffers[GRAPH_PHASES[mode]]
        rows = check_graph_rows("req_pool_indices", req_pool_indices, bs, self.device)
        cache_indices, qsl = bufs.buffers["cache_indices"], bufs.buffers["query_start_loc"]
        if mode is ForwardMode.DECODE:
            slot_order(self.state_pool.slots(rows), cache_indices[:bs], qsl[: bs + 1])
        else:
            self.state_pool.slots(rows, out=cache_indices[:bs])
        n, parents = bufs.tokens_per_request, None
        if mode is ForwardMode.TARGET_VERIFY:
            n, given = self._verify_info(spec_info, bs)
            if given is not None:
                parents = bufs.buffers["parents"][:bs, :n]
                parents.copy_(given)
        self.forward_metadata = GdnMetadata(
            bs,
            mode,
            cache_indices[:bs],
            qsl[: bs + 1],
            n,
            parents=parents,
            out=bufs.out,
        )


def slot_order(slots: torch.Tensor, cache_indices: torch.Tensor, rows: torch.Tensor) -> None:
    """A decode batch walked in ascending pool-slot order: ``cache_indices[i]`` is the i-th
    smallest slot and ``rows[i]`` the batch row of its request (``rows[B] = B``). The
    recurrent and conv decode kernels read request i's token at row ``rows[i]`` and write
    its output there, so outputs keep the batch's order while neighbouring programs read
    neighbouring pool rows (slots in the order the engine holds them cost about 1% of the
    decode's time on an H100: bench/README.md). No host sync."""
    bs = int(slots.shape[0])
    ordered, order = torch.sort(slots)
    cache_indices.copy_(ordered)
    rows[:bs].copy_(order)
    rows[bs:].fill_(bs)


def _check_mode(caller: str, meta: GdnMetadata, *, decode: bool) -> None:
    """One metadata type serves every mode: the layer call must be the one its mode runs
    (decode kernels on a verify's metadata would write the drafts into the pool)."""
    if (meta.mode is ForwardMode.DECODE) != decode:
        other = "forward_extend" if decode else "forward_decode"
        raise AttngenInputError(
            f"{caller}: the metadata is of a {meta.mode.name} forward (init_forward_metadata "
            f"or CUDA-graph capture/replay), which runs through {other}"
        )


def _capturing(device: torch.device) -> bool:
    """Whether a CUDA graph is being captured on ``device``'s current stream (no host sync
    may run then)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()
