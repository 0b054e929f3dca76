"""Encoder layers (vision towers such as SigLIP and CLIP) on attngen's cache-free prefill.

transformers calls such a layer with ``is_causal=False`` and no mask at all: the model built
none because every token of a row sees every other token of that row (an image's patches).
The layer then runs the generated non-causal ``prefill`` kernel of a spec with a ``prefill``
phase and ``mask: {kind: none}`` (``mha_vision_encoder``, ``mha_vision_encoder_siglip``,
``mha_text_encoder_d32``): the batch's B rows of S tokens become B requests of a ragged
batch, and no KV cache is written. A non-causal layer that gets a mask (padding, a decoder
run bidirectionally) is refused by the caller: the prefill kernel takes no padding mask.
"""

from __future__ import annotations

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
    ) -> torch.Tensor:
        """``query [B, Hq, S, D]``, ``key`` / ``value [B, Hkv, S, D(v)]`` as transformers
        passes them; returns ``[B, S, Hq, Dv]`` in the query's dtype."""
        batch, heads, seq = int(query.shape[0]), int(query.shape[1]), int(query.shape[2])
        for name, tensor in (("key", key), ("value", value)):
            if tensor.dim() != 4 or tensor.shape[0] != batch or tensor.shape[2] != seq:
                raise AttngenInputError(
                    f"{name}: expected [{batch}, heads, {seq}, dim] like the query (an encoder "
                    f"layer attends within its own tokens), got {list(tensor.shape)}"
                )
        dtype = self.options.activation_dtype(query.dtype)
        choice = self.choice(features, dtype, query.device)
        q = _rows(query, dtype)
        k = _rows(key, dtype)
        v = _rows(value, dtype)
        out = torch.empty(batch * seq, heads, features.v_head_dim, dtype=dtype, device=q.device)
        cu_seqlens = torch.arange(0, batch + 1, dtype=torch.int32, device=q.device) * seq
        choice.kernels.prefill(
            q,
            k,
            v,
            cu_seqlens,
            out,
            max_seq_len=seq,
            config=choice.config,
            sm_scale=float(scaling),
        )
        return out.view(batch, seq, heads, features.v_head_dim).to(query.dtype)


def _rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[B, H, S, D]`` -> contiguous ``[B * S, H, D]`` in ``dtype``."""
    batch, heads, seq, dim = x.shape
    return x.transpose(1, 2).reshape(batch * seq, heads, dim).to(dtype).contiguous()
