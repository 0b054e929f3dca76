"""Continuous batching (``generate_batch``) on attngen, over transformers' own paged cache.

transformers' ``PagedAttentionCache`` keeps, per layer, K and V as ``[slots, Hkv, D]`` (the
cache's blocks back to back) and hands the attention function, per layer group, the token
slots to read (``read_index``: every request's cached + new tokens, ``cu_seq_lens_k`` apart)
and to write (``write_index``: the new tokens). attngen reads those slots with its page-size-1
configs: a slot is a page, and a request's page table is its run of ``read_index``.

- Full-attention layers: the new K/V go to ``write_index``, then the extend kernel reads
  every key through the page table built from ``read_index`` (or from ``write_index`` when
  the batch reads no cache): no copy of the cache.
- Sliding-window layers: transformers keeps a ring of ``sliding_window`` slots per request
  and reads it before writing (new tokens may overwrite keys that earlier new tokens still
  see), so attngen takes the cache's own ``update`` (read, then write) and runs the kernel
  over the gathered ``[cached + new]`` keys, whose page table is their position.

An fp32 model (transformers keeps its paged cache in the model's dtype) runs attngen's
kernels in the activation dtype (``Options.dtype``, bf16 by default) on q and on K/V cast
from the fp32 cache: full-attention layers cast the whole layer cache once per call (a copy:
this is a reference path for exact-token tests against transformers' fp32 paged attention,
not a fast one), sliding layers the keys they gathered.

Everything is device work on tensors of shapes fixed by the padded batch (``max_seqlen_q``,
``max_seqlen_k`` and the index lengths are host ints of the graph key): no host sync, so
transformers can capture the forward in a CUDA graph. Padding tokens (past
``cu_seq_lens_q[-1]``) get zeros.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from attngen.integrations.transformers.options import Options
from attngen.integrations.transformers.select import Choice, LayerFeatures, choose
from attngen.runtime.checks import AttngenInputError

FULL, SLIDING = "full_attention", "sliding_attention"


class PagedState:
    """Config choices for the continuous-batching path (one per model)."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.choices: dict[tuple[LayerFeatures, torch.dtype], Choice] = {}
        # per layer, the query of its last call: a second call on the same query object is
        # the same forward calling the layer's attention again (DiffLlama)
        self.last_query: dict[int, weakref.ref] = {}

    def choice(self, features: LayerFeatures, dtype: torch.dtype, device: torch.device) -> Choice:
        """``dtype``: the kernels' (the model's, or the activation dtype of an fp32 model)."""
        key = (features, dtype)
        if key not in self.choices:
            if self.options.page_size not in (None, 1) or self.options.kv_cache_dtype not in (
                None,
                dtype,
            ):
                raise AttngenInputError(
                    "continuous batching reads transformers' own cache: token slots (page size "
                    f"1) in the kernels' dtype {dtype}; got page_size={self.options.page_size}, "
                    f"kv_cache_dtype={self.options.kv_cache_dtype}"
                )
            self.choices[key] = choose(
                features,
                arch=self.options.arch_for(device),
                dtype=dtype,
                kv_dtype=dtype,
                page_size=1,
                backend=self.options.backend,
            )
        return self.choices[key]

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
        cache: Any,
        read_index: list[torch.Tensor],
        write_index: list[torch.Tensor],
        cu_seq_lens_q: torch.Tensor,
        cu_seq_lens_k: torch.Tensor | dict[str, torch.Tensor],
        max_seqlen_q: int,
        max_seqlen_k: int | dict[str, int],
    ) -> torch.Tensor:
        """One layer over the packed batch: query ``[1, H, T, D]`` -> ``[1, T, H, Dv]``."""
        model_dtype = query.dtype
        if model_dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise AttngenInputError(
                f"continuous batching on attngen needs a bf16, fp16 or fp32 model, got "
                f"{model_dtype}"
            )
        dtype = self.options.activation_dtype(model_dtype)
        if model_dtype != torch.float32 and dtype != model_dtype:
            raise AttngenInputError(
                f"continuous batching reads transformers' {model_dtype} cache: the kernels' "
                f"dtype must be the model's, got Options.dtype={dtype}"
            )
        layer_idx = int(module.layer_idx)
        last = self.last_query.get(layer_idx)
        if last is not None and last() is query:
            raise AttngenInputError(
                f"the attention function ran twice for layer {layer_idx} in one forward (as "
                "DiffLlama's differential attention does, over two halves of V): the second "
                "call would overwrite the first call's values in the paged cache"
            )
        self.last_query[layer_idx] = weakref.ref(query)
        group, in_group = cache.layer_index_to_group_indices[layer_idx]
        sliding = cache.sliding_windows[layer_idx] != 1
        kind = SLIDING if sliding else FULL
        cu_k = cu_seq_lens_k[kind] if isinstance(cu_seq_lens_k, dict) else cu_seq_lens_k
        width = max_seqlen_k[kind] if isinstance(max_seqlen_k, dict) else max_seqlen_k
        choice = self.choice(features, dtype, query.device)
        heads, tokens = int(query.shape[1]), int(query.shape[2])
        q = query[0].transpose(0, 1).to(dtype).contiguous()  # [T, H, D]
        if sliding:
            k_all, v_all = cache.update(
                key_states=key,
                value_states=value,
                layer_idx=layer_idx,
                read_index=read_index,
                write_index=write_index,
            )
            slots = None  # the gathered keys' own positions
        else:
            k_all, v_all = cache.key_cache[in_group], cache.value_cache[in_group]
            k_new = key[0].transpose(0, 1).to(k_all.dtype)
            v_new = value[0].transpose(0, 1).to(v_all.dtype)
            k_all.index_copy_(0, write_index[group], k_new)
            v_all.index_copy_(0, write_index[group], v_new)
            reads = read_index[group]
            slots = reads if reads.numel() > 0 else write_index[group]
        k_all, v_all = k_all.to(dtype), v_all.to(dtype)  # no copy unless an fp32 model
        page_table = _page_table(cu_k, int(width), slots, int(k_all.shape[0]))
        lengths_q = cu_seq_lens_q[1:] - cu_seq_lens_q[:-1]
        prefix = ((cu_k[1:] - cu_k[:-1]) - lengths_q).to(torch.int32)
        dv = int(value.shape[-1])
        out = torch.zeros((tokens, heads, dv), dtype=dtype, device=query.device)
        choice.kernels.extend(
            q,
            k_all.unsqueeze(1),  # [slots, 1, Hkv, D]: page size 1
            v_all.unsqueeze(1),
            page_table,
            cu_seq_lens_q.to(torch.int32),
            prefix,
            out,
            max_extend_len=int(max_seqlen_q),
            config=choice.config,
            sm_scale=float(scaling),
            sinks=None if sinks is None else sinks.float(),
            trusted_metadata=True,
        )
        return out.to(model_dtype).unsqueeze(0)


def layer_window(module: torch.nn.Module, cache: Any, sliding_window: int | None) -> int | None:
    """The window (keys) of one layer in continuous batching: the one transformers' paged
    cache keeps for it (its mask there, and the ring the cache reads), which the
    ``sliding_window`` the layer passes must agree with (some models, e.g. Qwen2-MoE and
    PhiMoE, pass none for their sliding layers). A layer type the paged cache does not know
    (Llama-4's ``chunked_attention``: the cache keeps it as full attention) is refused."""
    layer_idx = int(module.layer_idx)
    types = getattr(module.config, "layer_types", None)
    kind = types[layer_idx] if types is not None and layer_idx < len(types) else None
    if kind is not None and kind not in (FULL, SLIDING):
        raise AttngenInputError(
            f"a {kind!r} layer: continuous batching on attngen serves {FULL!r} and {SLIDING!r} "
            "layers (transformers' paged cache keeps any other type as full attention)"
        )
    kept = int(cache.sliding_windows[layer_idx])
    window = None if kept == 1 else kept
    if sliding_window is not None and window != int(sliding_window):
        raise AttngenInputError(
            f"the layer passes sliding_window={sliding_window} but transformers' paged cache "
            f"keeps it as {'full attention' if window is None else f'a {window}-key window'}"
        )
    return window


def _page_table(
    cu_k: torch.Tensor, width: int, slots: torch.Tensor | None, num_rows: int
) -> torch.Tensor:
    """``[B, width]`` int32: key j of request b lives in row ``slots[cu_k[b] + j]`` (or row
    ``cu_k[b] + j`` itself when ``slots`` is None); entries past a request's keys are clamped
    in bounds and never read."""
    positions = cu_k[:-1, None].long() + torch.arange(width, device=cu_k.device)[None, :]
    if slots is None:
        return positions.clamp_(max=num_rows - 1).to(torch.int32)
    positions.clamp_(max=max(int(slots.shape[0]) - 1, 0))
    return slots[positions].to(torch.int32)
