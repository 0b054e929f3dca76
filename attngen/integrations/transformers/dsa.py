"""DeepSeek-V3.2 attention (DSA) on attngen's indexer and sparse MLA, in plain ``generate()``.

transformers' ``DeepseekV32Attention`` runs MLA with a lightning indexer (``module.indexer``)
that picks each query token's ``index_topk`` keys; its eager path folds the pick into the
attention mask. :func:`patch` replaces each such module's ``forward`` (while the model's
attention implementation is ``"attngen"``) with one that computes, with the module's own
weights and transformers' conventions:

- the indexer's query ``wq_b(q_resid)`` ``[T, 64, 128]`` and key ``k_norm(wk(x))``
  ``[T, 128]``, roped on their first ``qk_rope_head_dim`` dims with the *half-split* rope
  (``apply_rotary_pos_emb``; the MLA part uses the interleaved one), and the head weights
  ``weights_proj(x) * index_n_heads ** -0.5``; the score of key s for token t is
  ``sum_h w[t, h] * relu(softmax_scale * q[t, h] . k[s])`` (``softmax_scale = 128 **
  -0.5``), causal;
- attngen's indexer scores them in the model's own dtype by default (``dsa_index_dtype``
  None), as transformers does: q and k as the model computed them (fp32 products of fp32
  or bf16 values, fp32 sums), ``softmax_scale * n_heads ** -0.5`` folded into the fp32
  weights (relu commutes with a positive scale), k kept in an
  :class:`~attngen.families.dsa.pool.IndexKeyPool` of that dtype. With ``dsa_index_dtype=
  torch.float8_e4m3fn`` it scores in fp8 as DeepSeek-V3.2's own inference code does (and as
  transformers' docstring describes it, which skips both steps): q and k are rotated by the
  orthonormal 128-point Hadamard transform (dot products unchanged; it spreads outliers
  over the dims), q is quantized to e4m3 with one scale per (token, head) (``amax /
  448``), folded into the weights too, and the fp8 pool quantizes k with one scale per key.
  Either way the top-``index_topk`` keys (ties: lower position) are logical positions in
  each request;
- the absorbed sparse MLA of those keys over attngen's latent pool, with q_latent = W_UK^T
  q_nope and o = W_UV o_latent as in ``mla.py``.

fp8 scoring moves scores by a few percent, so keys near the top-k boundary can be picked
differently from transformers' own indexer; the tests measure how often (see
``tests/integrations/transformers``). In the model's dtype the scores differ from
transformers' by the order of fp32 sums only. The per-forward bookkeeping is the MHA path's
:class:`~attngen.integrations.transformers.generate.GenerateState` (64-token pages, the
page size of every DSA spec). transformers' cache is updated with the latent only (its
length drives the positions).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch

from attngen.integrations.transformers.generate import GenerateState, _rows
from attngen.integrations.transformers.mla import MlaShape, cos_sin_rope, latent_rows, scatter_rows
from attngen.integrations.transformers.options import Options
from attngen.integrations.transformers.select import (
    Choice,
    best_choice,
    dtype_name,
    patch_attention,
)
from attngen.runtime.batch import AttentionLayer, ForwardMode, ReqToTokenPool
from attngen.runtime.checks import AttngenInputError

FAMILY = "dsa"
PAGE_SIZE = 64  # every DSA spec's (the indexer's key pages)
FP8 = torch.float8_e4m3fn
# how a spec's dsa.index_dtype names a torch dtype (for the error that says what to add)
SPEC_DTYPE = {FP8: "fp8_e4m3", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
MODULE_CLASSES = ("DeepseekV32Attention",)


def hadamard(n: int, device: Any = None) -> torch.Tensor:
    """The orthonormal ``n x n`` Hadamard matrix (Sylvester's construction, n a power of 2)."""
    if n < 1 or n & (n - 1):
        raise AttngenInputError(f"index_head_dim {n}: the Hadamard rotation needs a power of 2")
    h = torch.ones((1, 1), dtype=torch.float32)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(n)).to(device)


def indexer_inputs(
    module: Any,
    hidden: torch.Tensor,
    q_resid: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """transformers' indexer q ``[B, S, H, D]``, k ``[B, S, D]`` (roped, before any rotation or
    quantization) and head weights ``[B, S, H]`` fp32 (``weights_proj * n_heads ** -0.5``),
    computed with the module's own indexer weights as ``DeepseekV32Indexer.forward`` does."""
    ix = module.indexer
    bs, length = hidden.shape[:2]
    rope = int(ix.qk_rope_head_dim)
    q = ix.wq_b(q_resid).view(bs, length, ix.n_heads, ix.head_dim)
    k = ix.k_norm(ix.wk(hidden)).unsqueeze(2)  # [B, S, 1, D]
    modeling = sys.modules[type(module).__module__]
    cos, sin = position_embeddings
    q_rot, k_rot = modeling.apply_rotary_pos_emb(
        q[..., :rope], k[..., :rope], cos, sin, unsqueeze_dim=2
    )
    q = torch.cat([q_rot, q[..., rope:]], dim=-1)
    k = torch.cat([k_rot, k[..., rope:]], dim=-1).squeeze(2)
    weights = ix.weights_proj(hidden.to(ix.weights_proj.weight.dtype)).float()
    return q, k, weights * ix.n_heads**-0.5


def quantize_query(
    q: torch.Tensor, weights: torch.Tensor, softmax_scale: float, rotation: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q ``[T, H, D]`` rotated and quantized to e4m3 (one scale per row and head) and the
    weights ``[T, H]`` with that scale and ``softmax_scale`` folded in (fp32)."""
    from attngen.families.dsa.pool import quantize_blocks

    t, heads, dim = q.shape
    rotated = q.float() @ rotation
    codes, scale = quantize_blocks(rotated.reshape(t, heads * dim), dim)
    folded = weights.float() * scale * softmax_scale
    return codes.view(t, heads, dim), folded.contiguous()


def choose_dsa(
    shape: MlaShape,
    module: Any,
    *,
    arch: str,
    dtype: torch.dtype,
    kv_dtype: torch.dtype,
    index_dtype: torch.dtype,
    backend: str | None = None,
) -> Choice:
    """The generated DSA config serving a DeepSeek-V3.2 layer; an error naming what to add."""
    ix = module.indexer
    want: dict[str, Any] = dict(
        num_heads=shape.num_heads,
        kv_lora_rank=shape.kv_lora_rank,
        qk_rope_head_dim=shape.qk_rope_head_dim,
        index_heads=int(ix.n_heads),
        index_head_dim=int(ix.head_dim),
        index_topk=int(ix.index_topk),
        index_dtype=dtype_name(index_dtype),
        page_size=PAGE_SIZE,
        dtype=dtype_name(dtype),
        kv_dtype=dtype_name(kv_dtype),
    )
    choice = best_choice(arch, FAMILY, want, backend=backend, page_order=(PAGE_SIZE,))
    if choice is None:
        on = f" on backend {backend}" if backend else ""
        fields = " ".join(f"{k}={v}" for k, v in want.items())
        raise AttngenInputError(
            f"no generated DSA config{on} for {arch} serves a DeepSeek-V3.2 attention layer "
            f"with {fields}; add a spec (specs/dsa/*.yaml: phases [extend, decode], mla dims, "
            f"num_heads {shape.num_heads}, dsa index_topk {int(ix.index_topk)}, index_dtype "
            f"{SPEC_DTYPE.get(index_dtype, index_dtype)}) and run `make generate`"
        )
    return choice


class DsaGenerate:
    """attngen's latent and indexer-key pools and DSA backend for plain generation (one
    per model); the per-forward rows and slots are ``state``'s."""

    def __init__(self, options: Options, state: GenerateState) -> None:
        self.options = options
        self.state = state
        self.pool: Any = None
        self.index_pool: Any = None
        self.req_pool: ReqToTokenPool | None = None
        self.backend: Any = None
        self.choice: Choice | None = None
        self.layers: dict[int, AttentionLayer] = {}
        self.rotation: torch.Tensor | None = None
        self.index_dtype: torch.dtype | None = None  # what the indexer scores in
        self._ready: Any = None  # the Forward whose metadata is built
        self.last_topk: torch.Tensor | None = None  # [T, topk] positions of the last layer

    def attend(
        self,
        module: torch.nn.Module,
        hidden: torch.Tensor,
        q_resid: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        q_nope: torch.Tensor,
        q_rope: torch.Tensor,
        latent: torch.Tensor,
        k_rope: torch.Tensor,
    ) -> torch.Tensor:
        """The new positions: ``hidden [B, S, hidden]``, ``q_resid [B, S, q_lora_rank]``,
        ``q_nope [B, H, S, nope]``, ``q_rope [B, H, S, rope]`` (roped), ``latent [B, 1, S,
        kv_lora_rank]`` (normed), ``k_rope [B, 1, S, rope]`` (roped). Returns the attention
        output ``[B, S, H, v_head_dim]`` in the model's dtype."""
        state = self.state
        bs, heads, q_len, _ = q_nope.shape
        fwd = state.current("DSA", "query", bs, q_len)
        shape = MlaShape.of_module(module)
        dtype = self.options.activation_dtype(q_nope.dtype)
        device = q_nope.device
        if fwd.batch is None:
            self._choose(shape, module, dtype, device)
            if state.page_size not in (None, PAGE_SIZE):
                raise AttngenInputError(
                    f"page_size {state.page_size}: DeepSeek-V3.2 (DSA) layers need "
                    f"{PAGE_SIZE}-token pages (enable with page_size=None or {PAGE_SIZE})"
                )
            state.page_size = PAGE_SIZE
            state._build(fwd, device)
            self._ensure_storage(shape, dtype, device, int(module.config.num_hidden_layers))
        if self._ready is not fwd:
            self.backend.init_forward_metadata(fwd.batch)
            self._ready = fwd
        rows, batch = fwd.q_rows, fwd.batch
        layer = self._layer(module, shape)

        # the lightning indexer: scores of every visible key, top-k positions
        ix = module.indexer
        q_ix, k_ix, weights = indexer_inputs(module, hidden, q_resid, position_embeddings)
        q_ix = q_ix.reshape(bs * q_len, ix.n_heads, ix.head_dim).index_select(0, rows)
        weights = weights.reshape(bs * q_len, ix.n_heads).index_select(0, rows)
        k_ix = k_ix.reshape(bs * q_len, ix.head_dim).index_select(0, rows)
        if self.index_dtype == FP8:
            if self.rotation is None or self.rotation.device != device:
                self.rotation = hadamard(int(ix.head_dim), device)
            q_in, w = quantize_query(q_ix, weights, float(ix.softmax_scale), self.rotation)
            k_in = (k_ix.float() @ self.rotation).to(dtype).contiguous()
        else:  # the model's own values: its dtype, unrotated, the scale in the weights
            q_in = q_ix.to(self.index_dtype).contiguous()
            w = (weights.float() * float(ix.softmax_scale)).contiguous()
            k_in = k_ix.to(self.index_dtype).contiguous()
        topk = self.backend.indexer(q_in, w, layer, batch, index_k=k_in)
        self.last_topk = topk

        # sparse absorbed MLA over the selected keys
        w_kv = module.kv_b_proj.weight.view(heads, shape.qk_nope_head_dim + shape.v_head_dim, -1)
        w_uk, w_uv = w_kv[:, : shape.qk_nope_head_dim], w_kv[:, shape.qk_nope_head_dim :]
        qn = _rows(q_nope, rows, q_nope.dtype)
        q_latent = torch.einsum("thn,hnl->thl", qn, w_uk)
        q = torch.cat([q_latent, _rows(q_rope, rows, q_rope.dtype)], dim=-1).to(dtype)
        lat = _rows(latent, rows, dtype)
        kr = _rows(k_rope, rows, dtype)
        run = (
            self.backend.forward_decode
            if batch.forward_mode is ForwardMode.DECODE
            else self.backend.forward_extend
        )
        out = run(q.contiguous(), lat, None, layer, batch, k_rope=kr, topk_indices=topk)
        o_latent = out.view(-1, heads, shape.kv_lora_rank).to(q_nope.dtype)
        o = torch.einsum("thl,hvl->thv", o_latent, w_uv)
        return scatter_rows(fwd, o, latent, w_uv)  # pads: eager's mean, as MLA's

    def _choose(
        self, shape: MlaShape, module: Any, dtype: torch.dtype, device: torch.device
    ) -> Choice:
        if self.choice is None:
            if self.options.kv_cache_dtype not in (None, dtype):
                raise AttngenInputError(
                    f"kv_cache_dtype {self.options.kv_cache_dtype}: the DSA path of this "
                    f"integration serves a {dtype} latent cache only"
                )
            model_dtype = module.indexer.wq_b.weight.dtype
            self.index_dtype = self.options.dsa_index_dtype or model_dtype
            self.choice = choose_dsa(
                shape,
                module,
                arch=self.options.arch_for(device),
                dtype=dtype,
                kv_dtype=dtype,
                index_dtype=self.index_dtype,
                backend=self.options.backend,
            )
        return self.choice

    def _layer(self, module: torch.nn.Module, shape: MlaShape) -> AttentionLayer:
        layer_id = int(module.layer_idx)
        layer = self.layers.get(layer_id)
        if layer is None:
            layer = AttentionLayer(
                layer_id=layer_id,
                num_q_heads=shape.num_heads,
                num_kv_heads=1,
                head_dim=shape.kv_lora_rank + shape.qk_rope_head_dim,
                v_head_dim=shape.kv_lora_rank,
                scaling=float(module.scaling),  # the 192-wide q.k's softmax scale (yarn too)
            )
            self.layers[layer_id] = layer
        return layer

    def _ensure_storage(
        self, shape: MlaShape, dtype: torch.dtype, device: torch.device, num_layers: int
    ) -> None:
        """Latent and indexer-key pools with room for every page in use (grown and copied
        when not), a request table wide enough, and the backend over all three."""
        from attngen.families.dsa.pool import IndexKeyPool, latent_pool

        state, choice = self.state, self.choice
        assert choice is not None
        need = max(state.num_pages_used, 1)
        if self.pool is None or self.pool.num_pages < need:
            pages = max(2 * need, -(-self.options.initial_tokens // PAGE_SIZE))
            pool = latent_pool(
                num_layers=num_layers,
                num_pages=pages,
                page_size=PAGE_SIZE,
                dtype=dtype,
                device=device,
                kv_lora_rank=shape.kv_lora_rank,
                qk_rope_head_dim=shape.qk_rope_head_dim,
            )
            index = IndexKeyPool(
                num_layers=num_layers,
                num_pages=pages,
                page_size=PAGE_SIZE,
                index_head_dim=choice.config.index_head_dim,
                dtype=self.index_dtype,
                device=device,
            )
            if self.pool is not None:
                n = self.pool.num_pages
                for layer in range(num_layers):
                    pool.kv_buffer[layer][:n].copy_(self.pool.kv_buffer[layer])
                    index.buffer[layer][:n].copy_(self.index_pool.buffer[layer])
            self.pool, self.index_pool, self.backend = pool, index, None
        rows, context = len(state.lengths), max(state.lengths, default=1)
        req = self.req_pool
        if req is None or req.size < rows or req.max_context_len < context:
            width = max(2 * context, self.options.initial_tokens)
            self.req_pool = ReqToTokenPool(max(rows, 1), width, device)
            self.backend = None
        state.req_pool = self.req_pool
        state._write_req_to_token()
        if self.backend is None:
            self.backend = choice.backend_class(
                num_heads=shape.num_heads,
                dtype=dtype,
                device=device,
                req_to_token_pool=self.req_pool,
                kv_pool=self.pool,
                index_pool=self.index_pool,
                page_size=PAGE_SIZE,
                kv_cache_dtype=dtype,
            )
            self._ready = None


# -- the module forward ----


def patch(model: torch.nn.Module, runtime: Any, name: str) -> int:
    """Give every DeepSeek-V3.2 attention module of ``model`` the attngen forward (used while
    the model's attention implementation is ``name``); returns how many were patched."""
    return patch_attention(model, MODULE_CLASSES, runtime, name, _dsa_forward)


def _dsa_forward(
    module: Any,
    runtime: Any,
    hidden: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    past_key_values: Any,
) -> tuple[torch.Tensor, None]:
    """The module's own projections, norms and ropes, then attngen's indexer and sparse MLA."""
    bs, length = hidden.shape[:-1]
    nope, rope = module.qk_nope_head_dim, module.qk_rope_head_dim
    q_resid = module.q_a_layernorm(module.q_a_proj(hidden))
    q = module.q_b_proj(q_resid).view(bs, length, -1, nope + rope).transpose(1, 2)
    q_nope, q_rope = q[..., :nope], q[..., nope:]
    interleave = sys.modules[type(module).__module__].apply_rotary_pos_emb_interleave
    q_rope, latent, k_rope, all_latent, all_k_rope = latent_rows(
        module, hidden, q_rope, past_key_values, cos_sin_rope(interleave, position_embeddings)
    )
    out = runtime.dsa.attend(
        module, hidden, q_resid, position_embeddings, q_nope, q_rope, latent, k_rope
    )
    for observe in runtime.dsa_observers:  # tests: the layer's inputs, attngen's pick, output
        observe(
            module,
            hidden,
            q_resid,
            position_embeddings,
            q_nope,
            q_rope,
            all_latent,
            all_k_rope,
            runtime.dsa.last_topk,
            out,
            runtime,
        )
    return module.o_proj(out.reshape(bs, length, -1)), None
