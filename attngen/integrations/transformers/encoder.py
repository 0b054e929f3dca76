"""Cache-free layers on attngen's prefill kernels: encoder layers (vision towers such as
SigLIP and CLIP, text encoders such as BERT) and the causal layers of models that do not
generate (CLIP's text tower, a base ``Qwen3Model``, classifiers and reward models).

transformers calls an encoder layer with ``is_causal=False`` and either no mask (a vision
tower: every patch of a row sees every other) or a bidirectional mask built from the 2-D
padding mask (a text encoder: every query of a row sees every key the padding mask keeps).
The layer runs the generated non-causal ``prefill`` kernel of a spec with a ``prefill``
phase and ``mask: {kind: none}`` (``mha_vision_encoder``, ``mha_vision_encoder_siglip``,
``mha_text_encoder_d32``), and no KV cache is written. A causal layer of a model that does
not generate runs a causal ``prefill`` kernel (``mha_gqa_prefill``) the same way.

Without pads, the batch's B rows of S tokens become B requests of a ragged batch. With pads
(:class:`RowPlan`, built once per forward from the padding mask, whatever its pattern: left,
right or holes), each row's kept tokens become one request, and the row's padded positions
(whose outputs transformers' eager attention also computes, over the kept keys they see)
are packed as queries in bidirectional requests of their own that carry copies of those
keys, so every position's output is exact: one launch for an encoder layer, two for a
causal one. A position that sees no kept key gets the mean of its row's values, as eager
attention's uniform softmax over an all-masked row does. Attention over cached keys or keys
of another length (cross-attention) is ``cross.py``'s.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from attngen.integrations.transformers.generate import uniform_rows
from attngen.integrations.transformers.options import Options
from attngen.integrations.transformers.select import Choice, LayerFeatures, remembered_choice
from attngen.runtime.checks import AttngenInputError

PHASES = ("prefill",)


class EncoderState:
    """The configs chosen for a model's cache-free layers, one per (features, dtype, arch)."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.choices: dict[tuple[Any, ...], Choice] = {}

    def choice(self, features: LayerFeatures, dtype: torch.dtype, device: torch.device) -> Choice:
        return remembered_choice(
            self.choices, features, arch=self.options.arch_for(device), dtype=dtype,
            backend=self.options.backend, phases=PHASES,
        )  # fmt: skip

    def missing(self, features: LayerFeatures, query: torch.Tensor) -> AttngenInputError | None:
        """Why no generated prefill config serves a layer of ``features`` for this query's
        dtype and device (None: one does)."""
        try:
            self.choice(features, self.options.activation_dtype(query.dtype), query.device)
        except AttngenInputError as error:
            return error
        return None

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        scaling: float,
        features: LayerFeatures,
        rows: RowPlan | None = None,
    ) -> torch.Tensor:
        """``query [B, Hq, S, D]``, ``key`` / ``value [B, Hkv, S, D(v)]`` as transformers
        passes them, ``rows`` the padding's plan (None: every key kept; its ``causal`` must be
        the layer's); returns ``[B, S, Hq, Dv]`` in the query's dtype."""
        batch, heads, seq = int(query.shape[0]), int(query.shape[1]), int(query.shape[2])
        for name, tensor in (("key", key), ("value", value)):
            if tensor.dim() != 4 or tensor.shape[0] != batch or tensor.shape[2] != seq:
                raise AttngenInputError(
                    f"{name}: expected [{batch}, heads, {seq}, dim] like the query (a cache-free "
                    f"layer attends within its own tokens), got {list(tensor.shape)}"
                )
        if rows is not None and (rows.batch, rows.seq, rows.causal) != (
            batch,
            seq,
            features.causal,
        ):
            raise AttngenInputError(
                f"the padding plan covers {rows.batch} rows of {rows.seq} tokens "
                f"({'causal' if rows.causal else 'bidirectional'}), the layer's query {batch} "
                f"rows of {seq} ({features.describe()})"
            )
        dtype = self.options.activation_dtype(query.dtype)
        q = _rows(query, dtype)
        k = _rows(key, dtype)
        v = _rows(value, dtype)
        dv = features.v_head_dim
        out = torch.empty(batch * seq, heads, dv, dtype=dtype, device=q.device)
        if rows is None:
            cu_seqlens = torch.arange(0, batch + 1, dtype=torch.int32, device=q.device) * seq
            choice = self.choice(features, dtype, query.device)
            self._prefill(choice, q, k, v, cu_seqlens, out, seq, scaling)
            return out.view(batch, seq, heads, dv).to(query.dtype)
        for part, pads in ((rows.main, False), (rows.pads, True)):
            if part is not None:
                choice, group = self._part_choice(features, pads, dtype, query.device)
                packed = torch.empty(part.q_index.numel(), heads, dv, dtype=dtype, device=q.device)
                q_p, k_p, v_p = q[part.q_index], k[part.kv_index], v[part.kv_index]
                if group > 1:  # the bidirectional kernel of one query head per K/V head
                    k_p, v_p = (x.repeat_interleave(group, 1) for x in (k_p, v_p))
                self._prefill(choice, q_p, k_p, v_p, part.cu_seqlens, packed, part.max_len, scaling)
                out[part.out_dst] = packed[part.out_src]
        if rows.mean_dst.numel():
            out[rows.mean_dst] = uniform_rows(value, heads)[rows.mean_rows].to(dtype)
        return out.view(batch, seq, heads, dv).to(query.dtype)

    def _part_choice(
        self, features: LayerFeatures, pads: bool, dtype: torch.dtype, device: torch.device
    ) -> tuple[Choice, int]:
        """The config of a plan's part and how many times K/V heads are repeated for it: the
        layer's own for its kept tokens; for a causal layer's padded positions (queries over
        the kept keys before them) a bidirectional config of the layer's GQA group, else of
        group 1 with K/V repeated per query head."""
        if not pads or not features.causal:
            return self.choice(features, dtype, device), 1
        bidirectional = dataclasses.replace(features, causal=False)
        try:
            return self.choice(bidirectional, dtype, device), 1
        except AttngenInputError as error:
            if features.gqa_group == 1:
                raise _pads_need(error) from None
            try:
                one = dataclasses.replace(bidirectional, gqa_group=1)
                return self.choice(one, dtype, device), features.gqa_group
            except AttngenInputError:
                raise _pads_need(error) from None

    @staticmethod
    def _prefill(
        choice: Choice,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens: torch.Tensor,
        out: torch.Tensor,
        max_len: int,
        scaling: float,
    ) -> None:
        choice.kernels.prefill(
            q,
            k,
            v,
            cu_seqlens,
            out,
            max_seq_len=max_len,
            config=choice.config,
            sm_scale=float(scaling),
        )


def _pads_need(error: AttngenInputError) -> AttngenInputError:
    return AttngenInputError(
        "padded positions after a row's first kept token (right padding, holes) in a causal "
        "layer attend to the kept keys before them, as eager attention computes them: that "
        "takes a bidirectional cache-free prefill kernel (left-padded batches do not need "
        f"it): {error}"
    )


@dataclass(frozen=True)
class Requests:
    """Requests of one prefill launch over a padded batch's flat positions (``b * seq + s``):
    packed row ``i`` takes its query from position ``q_index[i]`` and its key / value from
    ``kv_index[i]``; requests are delimited by ``cu_seqlens``; packed rows ``out_src`` hold
    the outputs of positions ``out_dst``."""

    q_index: torch.Tensor  # [T] int64
    kv_index: torch.Tensor  # [T] int64
    cu_seqlens: torch.Tensor  # [R + 1] int32
    max_len: int
    out_src: torch.Tensor  # [N] int64
    out_dst: torch.Tensor  # [N] int64


class _Builder:
    """Collects requests: ``add(queries, keys)`` packs ``queries`` (flat positions) over
    ``keys`` (flat positions, at least as many), fillers repeating the first query."""

    def __init__(self) -> None:
        self.q: list[torch.Tensor] = []
        self.kv: list[torch.Tensor] = []
        self.src: list[torch.Tensor] = []
        self.dst: list[torch.Tensor] = []
        self.lens: list[int] = []
        self.packed = 0

    def add(self, queries: torch.Tensor, keys: torch.Tensor) -> None:
        n, width = queries.numel(), keys.numel()
        self.q.append(torch.cat([queries, queries[:1].expand(width - n)]))
        self.kv.append(keys)
        self.src.append(torch.arange(self.packed, self.packed + n))
        self.dst.append(queries)
        self.lens.append(width)
        self.packed += width

    def build(self, device: torch.device) -> Requests | None:
        if not self.lens:
            return None
        cu = torch.zeros(len(self.lens) + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(torch.tensor(self.lens, dtype=torch.int64), 0).to(torch.int32)
        return Requests(
            q_index=torch.cat(self.q).to(device),
            kv_index=torch.cat(self.kv).to(device),
            cu_seqlens=cu.to(device),
            max_len=max(self.lens),
            out_src=torch.cat(self.src).to(device),
            out_dst=torch.cat(self.dst).to(device),
        )


@dataclass(frozen=True)
class RowPlan:
    """How a padded batch of ``batch`` rows of ``seq`` tokens becomes requests of the
    cache-free prefill, every position written once and equal to what eager attention
    computes there. ``main``: each row's kept tokens as one request (causal or not, as the
    layer). ``pads``: the padded positions that see ``c >= 1`` kept keys (all of the row's
    kept keys in a bidirectional layer, those before them in a causal one) as queries of
    bidirectional requests over copies of those ``c`` keys, up to ``c`` queries a request
    (None: no such position; a bidirectional layer's go into ``main``, one launch).
    ``mean_dst``: the positions that see no kept key (eager's softmax over an all-masked row
    is uniform: the mean of the row's ``seq`` values), of rows ``mean_rows``."""

    batch: int
    seq: int
    causal: bool
    main: Requests | None
    pads: Requests | None
    mean_dst: torch.Tensor  # [M] int64
    mean_rows: torch.Tensor  # [M] int64

    @staticmethod
    def of(keys: torch.Tensor | None, batch: int, seq: int, causal: bool) -> RowPlan | None:
        """The plan of a ``[batch, seq]`` padding mask (True: a key to attend to); None when
        it keeps every key. One host sync (the mask is read on the host)."""
        if keys is None:
            return None
        if tuple(keys.shape) != (batch, seq):
            raise AttngenInputError(
                f"padding mask: expected [{batch}, {seq}] (a cache-free layer attends within "
                f"its own tokens), got {list(keys.shape)}"
            )
        kept = keys.detach().to("cpu", torch.bool)
        if bool(kept.all()):
            return None
        main, pads = _Builder(), _Builder()
        mean_dst: list[torch.Tensor] = []
        mean_rows: list[int] = []
        for b in range(batch):
            valid = torch.nonzero(kept[b]).flatten()
            padded = torch.nonzero(~kept[b]).flatten()
            # kept keys before each padded position (causal) or all of them
            seen = (
                torch.searchsorted(valid, padded)
                if causal
                else torch.full_like(padded, valid.numel())
            )
            if valid.numel():
                main.add(valid + b * seq, valid + b * seq)
            for c in torch.unique(seen).tolist():
                group = padded[seen == c] + b * seq
                if c == 0:
                    mean_dst.append(group)
                    mean_rows += [b] * group.numel()
                    continue
                for chunk in group.split(c):
                    (pads if causal else main).add(chunk, valid[:c] + b * seq)
        device = keys.device
        return RowPlan(
            batch=batch,
            seq=seq,
            causal=causal,
            main=main.build(device),
            pads=pads.build(device),
            mean_dst=(torch.cat(mean_dst) if mean_dst else torch.empty(0, dtype=torch.long)).to(
                device
            ),
            mean_rows=torch.tensor(mean_rows, dtype=torch.long).to(device),
        )


def _rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[B, H, S, D]`` -> contiguous ``[B * S, H, D]`` in ``dtype``."""
    batch, heads, seq, dim = x.shape
    return x.transpose(1, 2).reshape(batch * seq, heads, dim).to(dtype).contiguous()
