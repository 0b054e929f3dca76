"""Qwen3-Next and Qwen3.5 linear attention (gated delta rule, GDN) on attngen's GDN
backends, in plain ``generate()``.

transformers' ``Qwen3NextGatedDeltaNet``, ``Qwen3_5GatedDeltaNet`` and
``Qwen3_5MoeGatedDeltaNet`` run their short causal conv and the gated delta rule
(``torch_chunk_gated_delta_rule`` for prompts, ``torch_recurrent_gated_delta_rule`` for one
new token) over their own cache. They differ only in their input projections (Qwen3-Next:
``in_proj_qkvz`` and ``in_proj_ba`` with heads grouped per key head, reordered by
``fix_query_key_value_ordering``; Qwen3.5: ``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``
and ``in_proj_a``, already in q | k | v order), which :data:`MODULE_CLASSES` maps to one
function each. :func:`patch` replaces each such module's ``forward`` (while
the model's attention implementation is ``"attngen"``; any other name runs the original)
with one that keeps the module's projections, head ordering, gated RMSNorm and output
projection and hands the rest to a generated GDN backend (:meth:`GdnGenerate.attend`): the
real new tokens' pre-conv ``q | k | v`` channels and raw gate inputs ``a``, ``b`` go to
``forward_extend`` (attngen's causal conv, then its chunked kernels; a row with cached
tokens continues from its pool state) or ``forward_decode`` (conv update and the recurrent
kernel), which read and write the conv window and the fp32 recurrent state of each request
in attngen's :class:`~attngen.runtime.state_pool.RequestStatePool`. The module's conv
weight, ``A_log`` and ``dt_bias`` are passed as they are (the backend computes ``g = -exp(
A_log) softplus(a + dt_bias)`` and ``beta = sigmoid(b)`` itself).

Rows and pads come from the same per-forward bookkeeping as the attention layers
(:class:`~attngen.integrations.transformers.generate.GenerateState`): pads are dropped
before the kernels, so they never touch a state, and their outputs are zeros.
transformers' own cache for these layers is left untouched (the full-attention layers
keep its length).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from attngen.integrations.transformers.generate import Forward, GenerateState
from attngen.integrations.transformers.options import Options
from attngen.runtime.batch import ForwardBatch, ForwardMode
from attngen.runtime.checks import AttngenInputError
from attngen.integrations.transformers.select import Choice, best_choice

FAMILY = "gdn"
NEEDED_PHASES = ("extend", "decode")


def _grouped_inputs(module: Any, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Qwen3-Next: the fused projections, heads reordered by the module's own function."""
    bs, length = hidden.shape[:-1]
    qkvz = module.in_proj_qkvz(hidden)
    ba = module.in_proj_ba(hidden)
    query, key, value, z, b, a = module.fix_query_key_value_ordering(qkvz, ba)
    mixed = torch.cat([t.reshape(bs, length, -1) for t in (query, key, value)], dim=-1)
    return mixed, z, b, a


def _split_inputs(module: Any, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Qwen3.5 (dense and MoE): one projection each, q | k | v already in channel order."""
    bs, length = hidden.shape[:-1]
    z = module.in_proj_z(hidden).reshape(bs, length, -1, module.head_v_dim)
    return module.in_proj_qkv(hidden), z, module.in_proj_b(hidden), module.in_proj_a(hidden)


# module class -> its (pre-conv q | k | v [B, S, C], z [B, S, HV, V], b, a [B, S, HV])
MODULE_CLASSES = {
    "Qwen3NextGatedDeltaNet": _grouped_inputs,
    "Qwen3_5GatedDeltaNet": _split_inputs,
    "Qwen3_5MoeGatedDeltaNet": _split_inputs,
}


@dataclass(frozen=True)
class GdnShape:
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int

    @classmethod
    def of_module(cls, module: torch.nn.Module) -> GdnShape:
        return cls(
            int(module.num_k_heads),
            int(module.num_v_heads),
            int(module.head_k_dim),
            int(module.head_v_dim),
            int(module.conv_kernel_size),
        )


def choose_gdn(
    shape: GdnShape, *, arch: str, dtype: torch.dtype, backend: str | None = None
) -> Choice:
    """The generated GDN config serving a linear-attention layer; an error naming what to
    add."""
    if shape.num_k_heads < 1 or shape.num_v_heads % shape.num_k_heads:
        raise AttngenInputError(
            f"linear attention: {shape.num_v_heads} value heads are not a multiple of "
            f"{shape.num_k_heads} key heads"
        )
    want: dict[str, Any] = dict(
        key_dim=shape.head_k_dim,
        value_dim=shape.head_v_dim,
        v_heads_per_k_head=shape.num_v_heads // shape.num_k_heads,
        dtype=str(dtype).removeprefix("torch."),
        conv_kernel=shape.conv_kernel,
        l2norm=True,  # Qwen3-Next and Qwen3.5 normalize q and k in the delta rule
        spec_topk=0,
    )
    choice = best_choice(arch, FAMILY, want, backend=backend)
    if choice is None:
        on = f" on backend {backend}" if backend else ""
        fields = " ".join(f"{k}={v}" for k, v in want.items())
        raise AttngenInputError(
            f"no generated GDN config{on} for {arch} serves a linear-attention layer with "
            f"{fields}; add a spec (specs/gdn/*.yaml: phases [extend, decode], "
            "these gdn fields) and run `make generate`"
        )
    return choice


class GdnGenerate:
    """attngen's request state pool and GDN backend for plain generation (one per model)."""

    def __init__(self, options: Options, state: GenerateState) -> None:
        self.options = options
        self.state = state
        self.pool: Any = None
        self.backend: Any = None
        self.choice: Choice | None = None
        self.layers: dict[int, Any] = {}
        self._forward: Forward | None = None  # the forward whose batch below is built
        self._batch: ForwardBatch | None = None
        self.rows: torch.Tensor | None = None  # [T] real rows of the [B * S] positions

    def attend(
        self,
        module: torch.nn.Module,
        mixed_qkv: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        num_layers: int,
    ) -> torch.Tensor:
        """``mixed_qkv [B, S, 2 H K + HV V]`` (pre-conv q | k | v), ``a``, ``b`` ``[B, S,
        HV]``: the new positions. Returns the gated delta rule's output ``[B, S, HV, V]`` in
        the model's dtype (zeros at pads)."""
        bs, q_len, channels = mixed_qkv.shape
        fwd = self.state.current("GDN", "hidden states", bs, q_len)
        shape = GdnShape.of_module(module)
        dtype = self.options.activation_dtype(mixed_qkv.dtype)
        device = mixed_qkv.device
        if self._forward is not fwd:
            self._begin(fwd, shape, dtype, device, num_layers)
        batch, rows = self._batch, self.rows
        assert batch is not None and rows is not None
        layer = self._layer(module, shape)
        flat = lambda x: x.reshape(bs * q_len, -1).index_select(0, rows)  # noqa: E731
        x = flat(mixed_qkv).to(dtype).contiguous()
        a_rows, b_rows = flat(a).to(dtype).contiguous(), flat(b).to(dtype).contiguous()
        if batch.forward_mode is ForwardMode.DECODE:
            out = self.backend.forward_decode(layer, batch, x, a_rows, b_rows)
        else:
            out = self.backend.forward_extend(layer, batch, x, a_rows, b_rows)
        full = mixed_qkv.new_zeros((bs * q_len, shape.num_v_heads * shape.head_v_dim))
        full[rows] = out.to(mixed_qkv.dtype)
        return full.view(bs, q_len, shape.num_v_heads, shape.head_v_dim)

    def reorder(self, beam_idx: torch.Tensor) -> None:
        """Beam search's reorder: request row ``b`` continues from row ``beam_idx[b]``'s
        conv and recurrent states (state slot ``r + 1`` is row ``r``'s)."""
        pool = self.pool
        if pool is None:
            return
        rows = beam_idx.numel()
        src = beam_idx.to(device=pool.temporal[0].device, dtype=torch.int64).flatten() + 1
        dst = torch.arange(1, rows + 1, device=src.device)
        for states in (pool.temporal, pool.conv):
            for state in states:
                state[dst] = state[src]

    def _begin(
        self,
        fwd: Forward,
        shape: GdnShape,
        dtype: torch.dtype,
        device: torch.device,
        num_layers: int,
    ) -> None:
        """This forward's batch (request rows 1..B: row 0 pads the state pool) and rows; a
        new generation (no cached tokens) gets fresh state slots."""
        from attngen.runtime.state_pool import RequestStatePool

        bs = fwd.batch_size
        if self.state.cropped:
            raise AttngenInputError(
                "the cache was cropped (assisted decoding dropped draft tokens): a GDN layer's "
                "recurrent state has taken them in and cannot drop them"
            )
        if self.choice is None:
            self.choice = choose_gdn(
                shape,
                arch=self.options.arch_for(device),
                dtype=dtype,
                backend=self.options.backend,
            )
        pool = self.pool
        if pool is None or pool.size < bs:
            conv_dim = 2 * shape.num_k_heads * shape.head_k_dim
            conv_dim += shape.num_v_heads * shape.head_v_dim
            pool = RequestStatePool(
                num_layers=num_layers,
                size=max(bs, 1),
                max_reqs=max(bs, 1) + 1,
                temporal_shape=(shape.num_v_heads, shape.head_v_dim, shape.head_k_dim),
                temporal_dtype=torch.float32,
                conv_shape=(conv_dim, shape.conv_kernel - 1),
                conv_dtype=dtype,
                device=device,
            )
            if any(fwd.prefix):
                raise AttngenInputError(
                    "attngen's GDN state pool is new but this forward continues cached "
                    "tokens: the batch grew during generation (not supported)"
                )
            for r in range(1, bs + 1):
                pool.assign(r, r)
            self.pool = pool
            self.backend = self.choice.backend_class(
                num_k_heads=shape.num_k_heads,
                num_v_heads=shape.num_v_heads,
                head_k_dim=shape.head_k_dim,
                head_v_dim=shape.head_v_dim,
                dtype=dtype,
                device=device,
                state_pool=pool,
            )
        requests = torch.arange(1, bs + 1, dtype=torch.int32, device=device)
        no_slots = torch.zeros(sum(fwd.new), dtype=torch.int64, device=device)
        self._batch = fwd.forward_batch(requests, no_slots)
        self.rows = fwd.real_rows(device)
        self.backend.init_forward_metadata(self._batch)
        self._forward = fwd

    def _layer(self, module: torch.nn.Module, shape: GdnShape) -> Any:
        from attngen.families.gdn.runtime import GdnLayer

        layer_id = int(module.layer_idx)
        layer = self.layers.get(layer_id)
        if layer is None:
            bias = module.conv1d.bias
            layer = GdnLayer(
                layer_id=layer_id,
                num_k_heads=shape.num_k_heads,
                num_v_heads=shape.num_v_heads,
                head_k_dim=shape.head_k_dim,
                head_v_dim=shape.head_v_dim,
                A_log=module.A_log.detach().float(),
                dt_bias=module.dt_bias.detach().float(),
                conv_weight=module.conv1d.weight.detach()[:, 0].to(self.backend.dtype),
                conv_bias=None if bias is None else bias.detach().to(self.backend.dtype),
            )
            self.layers[layer_id] = layer
        return layer


# -- the module forward ----


def patch(model: torch.nn.Module, runtime: Any, name: str) -> int:
    """Give every linear-attention module of ``model`` (:data:`MODULE_CLASSES`) the attngen
    forward (used
    while the model's attention implementation is ``name``); returns how many."""
    count = 0
    num_layers = _num_layers(model)
    for module in model.modules():
        if type(module).__name__ not in MODULE_CLASSES:
            continue
        original = getattr(module, "_attngen_original_forward", None) or module.forward
        module._attngen_original_forward = original
        module._attngen_config = model.config  # the module keeps no config of its own
        inputs = MODULE_CLASSES[type(module).__name__]
        module.forward = types.MethodType(
            _make_forward(original, runtime, name, num_layers, inputs), module
        )
        count += 1
    return count


def _num_layers(model: torch.nn.Module) -> int:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else None
    return int((config or model.config).num_hidden_layers)


def _make_forward(
    original: Any, runtime: Any, name: str, num_layers: int, inputs: Callable[..., Any]
) -> Any:
    def forward(
        module: torch.nn.Module,
        hidden_states: torch.Tensor,
        cache_params: Any = None,
        attention_mask: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        if module._attngen_config._attn_implementation != name:
            return original(hidden_states, cache_params, attention_mask, **kwargs)
        return _gdn_forward(module, runtime, hidden_states, num_layers, inputs)

    return forward


def _gdn_forward(
    module: Any,
    runtime: Any,
    hidden: torch.Tensor,
    num_layers: int,
    inputs: Callable[..., tuple[torch.Tensor, ...]],
) -> torch.Tensor:
    """The module's own projections and head ordering (``inputs``), attngen's conv + gated
    delta rule, the module's gated norm and output projection."""
    bs, length = hidden.shape[:-1]
    mixed, z, b, a = inputs(module, hidden)
    out = runtime.gdn.attend(module, mixed, a, b, num_layers)  # [B, S, HV, V]
    for observe in runtime.gdn_observers:  # tests: the inputs attngen got and its output
        observe(module, mixed, a, b, out, runtime)
    normed = module.norm(out.reshape(-1, out.shape[-1]), z.reshape(-1, z.shape[-1]))
    return module.out_proj(normed.reshape(bs, length, -1))
