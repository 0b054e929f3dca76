"""Encoder layers (vision towers such as SigLIP and CLIP, text encoders such as BERT) on
attngen's cache-free prefill.

transformers calls such a layer with ``is_causal=False`` and either no mask (a vision tower:
every patch of a row sees every other) or a bidirectional mask built from the 2-D padding
mask (a text encoder: every query of a row sees every key the padding mask keeps). The layer
runs the generated non-causal ``prefill`` kernel of a spec with a ``prefill`` phase and
``mask: {kind: none}`` (``mha_vision_encoder``, ``mha_vision_encoder_siglip``,
``mha_text_encoder_d32``), and no KV cache is written.

Without pads, the batch's B rows of S tokens become B requests of a ragged batch. With pads
(:class:`RowPlan`, built once per forward from the padding mask, whatever its pattern: left,
right or holes), each row's kept tokens become one request, and the row's padded positions
(whose outputs transformers' eager attention also computes, over the row's kept keys) are
packed as queries in requests of their own that carry copies of the row's kept K/V, so
every position's output is exact with one kernel launch. A row with no kept key gets the
mean of its values, as eager attention's uniform softmax over an all-masked row does.
Bidirectional attention over cached keys or keys of another length (cross-attention) is
refused by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attngen.integrations.transformers.options import Options
from attngen.integrations.transformers.select import Choice, LayerFeatures, choose
from attngen.runtime.checks import AttngenInputError

PHASES = ("prefill",)


class EncoderState:
    """The configs chosen for a model's encoder layers, one per (features, dtype, arch)."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.choices: dict[tuple[LayerFeatures, torch.dtype, str], Choice] = {}

    def choice(self, features: LayerFeatures, dtype: torch.dtype, device: torch.device) -> Choice:
        arch = self.options.arch_for(device)
        key = (features, dtype, arch)
        if key not in self.choices:
            self.choices[key] = choose(
                features,
                arch=arch,
                dtype=dtype,
                kv_dtype=dtype,  # no cache: K and V stay in the activation dtype
                backend=self.options.backend,
                phases=PHASES,
            )
        return self.choices[key]

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
        passes them, ``rows`` the padding's plan (None: every key kept); returns
        ``[B, S, Hq, Dv]`` in the query's dtype."""
        batch, heads, seq = int(query.shape[0]), int(query.shape[1]), int(query.shape[2])
        for name, tensor in (("key", key), ("value", value)):
            if tensor.dim() != 4 or tensor.shape[0] != batch or tensor.shape[2] != seq:
                raise AttngenInputError(
                    f"{name}: expected [{batch}, heads, {seq}, dim] like the query (an encoder "
                    f"layer attends within its own tokens), got {list(tensor.shape)}"
                )
        if rows is not None and (rows.batch, rows.seq) != (batch, seq):
            raise AttngenInputError(
                f"the padding mask covers {rows.batch} rows of {rows.seq} tokens, the layer's "
                f"query {batch} rows of {seq}"
            )
        dtype = self.options.activation_dtype(query.dtype)
        choice = self.choice(features, dtype, query.device)
        q = _rows(query, dtype)
        k = _rows(key, dtype)
        v = _rows(value, dtype)
        dv = features.v_head_dim
        if rows is None:
            out = torch.empty(batch * seq, heads, dv, dtype=dtype, device=q.device)
            cu_seqlens = torch.arange(0, batch + 1, dtype=torch.int32, device=q.device) * seq
            self._prefill(choice, q, k, v, cu_seqlens, out, seq, scaling)
            return out.view(batch, seq, heads, dv).to(query.dtype)
        out = torch.empty(batch * seq, heads, dv, dtype=dtype, device=q.device)
        if rows.max_len:
            packed = torch.empty(rows.q_index.numel(), heads, dv, dtype=dtype, device=q.device)
            q_p, k_p, v_p = q[rows.q_index], k[rows.kv_index], v[rows.kv_index]
            self._prefill(choice, q_p, k_p, v_p, rows.cu_seqlens, packed, rows.max_len, scaling)
            out[rows.out_dst] = packed[rows.out_src]
        for b in rows.empty:  # no kept key: eager's softmax over an all-masked row is uniform
            mean = value[b].float().mean(dim=1).repeat_interleave(heads // value.shape[1], 0)
            out[b * seq : (b + 1) * seq] = mean.to(dtype)
        return out.view(batch, seq, heads, dv).to(query.dtype)

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


@dataclass(frozen=True)
class RowPlan:
    """How a padded batch of ``batch`` rows of ``seq`` tokens becomes requests of the
    non-causal prefill: packed row ``i`` takes its query from flat position ``q_index[i]``
    (``b * seq + s``) and its key / value from ``kv_index[i]``; requests are delimited by
    ``cu_seqlens``; packed rows ``out_src`` hold the outputs of flat positions ``out_dst``
    (each position of a row with a kept key exactly once); ``empty`` lists the rows with no
    kept key."""

    batch: int
    seq: int
    q_index: torch.Tensor  # [T] int64
    kv_index: torch.Tensor  # [T] int64
    cu_seqlens: torch.Tensor  # [R + 1] int32
    max_len: int
    out_src: torch.Tensor  # [N] int64
    out_dst: torch.Tensor  # [N] int64
    empty: tuple[int, ...]

    @staticmethod
    def of(keys: torch.Tensor | None, batch: int, seq: int) -> RowPlan | None:
        """The plan of a ``[batch, seq]`` padding mask (True: a key to attend to); None when
        it keeps every key. One host sync (the mask is read on the host)."""
        if keys is None:
            return None
        if tuple(keys.shape) != (batch, seq):
            raise AttngenInputError(
                f"padding mask: expected [{batch}, {seq}] (an encoder layer attends within its "
                f"own tokens), got {list(keys.shape)}"
            )
        kept = keys.detach().to("cpu", torch.bool)
        if bool(kept.all()):
            return None
        q_parts, kv_parts, src, dst, lens, empty = [], [], [], [], [], []
        packed = 0
        for b in range(batch):
            valid = torch.nonzero(kept[b]).flatten() + b * seq
            n_valid = valid.numel()
            if n_valid == 0:
                empty.append(b)
                continue
            pads = torch.nonzero(~kept[b]).flatten() + b * seq
            # the kept tokens as one request, then the padded positions' queries in groups
            # of n_valid, each group with the row's kept K/V (fillers repeat its first query)
            for group in (valid, *pads.split(n_valid)):
                n = group.numel()
                if n == 0:  # an empty split of a row without pads
                    continue
                q_parts.append(torch.cat([group, group[:1].expand(n_valid - n)]))
                kv_parts.append(valid)
                src.append(torch.arange(packed, packed + n))
                dst.append(group)
                lens.append(n_valid)
                packed += n_valid
        device = keys.device
        cat = lambda parts: (  # noqa: E731
            torch.cat(parts).to(device)
            if parts
            else torch.empty(0, dtype=torch.long, device=device)
        )
        cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int64), 0).to(torch.int32)
        return RowPlan(
            batch=batch,
            seq=seq,
            q_index=cat(q_parts),
            kv_index=cat(kv_parts),
            cu_seqlens=cu.to(device),
            max_len=max(lens, default=0),
            out_src=cat(src),
            out_dst=cat(dst),
            empty=tuple(empty),
        )


def _rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[B, H, S, D]`` -> contiguous ``[B * S, H, D]`` in ``dtype``."""
    batch, heads, seq, dim = x.shape
    return x.transpose(1, 2).reshape(batch * seq, heads, dim).to(dtype).contiguous()
