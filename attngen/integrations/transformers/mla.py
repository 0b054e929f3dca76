"""DeepSeek-V3 (and V2) attention (MLA) on attngen's absorbed MLA backends, in plain
``generate()``.

transformers' ``DeepseekV3Attention`` (and ``DeepseekV2Attention``, whose rope is complex)
hands its attention function decompressed q/k (``qk_nope + qk_rope`` wide) and v
(``v_head_dim``); the latent it caches never reaches the function. So :func:`patch`
replaces each such module's ``forward`` (while the model's attention implementation is
``"attngen"``; any other name runs the original) with one that computes the module's own
q, latent and roped key with its own weights and then, per :meth:`MlaGenerate.attend`:

- absorbs the key up-projection into q: ``q_latent[t, h] = W_UK[h]^T q_nope[t, h]``
  (``kv_b_proj``'s weight viewed ``[H, nope + v, kv_lora_rank]``; its first ``nope`` rows
  per head are W_UK, the rest W_UV), in the model's dtype, then casts to the kernels' dtype;
- writes the new tokens' ``[latent, k_rope]`` rows to attngen's :class:`MlaLatentPool` (bf16,
  or fp8 e4m3 with one scale per tensor, ``Options.kv_scale``, with ``kv_cache_dtype=
  torch.float8_e4m3fn``; a ragged prefill attends the new tokens' unquantized values) and
  runs the generated absorbed kernel over each request's latent rows (``forward_extend``
  for the prompt, causal; ``forward_decode`` for one new token per row);
- applies W_UV to the ``[T, H, kv_lora_rank]`` output (``o[t, h] = W_UV[h] o_latent[t,
  h]``), then the module's ``o_proj``.

The per-forward bookkeeping (left-padded rows, token slots, the ForwardBatch) is the MHA
path's :class:`~attngen.integrations.transformers.generate.GenerateState`: the same mask
function feeds both. transformers' DynamicCache is still updated with the latent (its
length drives the positions); attngen reads only its own pool.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch

from attngen.integrations.transformers.generate import Forward, GenerateState, _rows
from attngen.integrations.transformers.options import Options
from attngen.runtime.batch import AttentionLayer, ForwardMode, ReqToTokenPool
from attngen.runtime.checks import AttngenInputError
from attngen.integrations.transformers.select import (
    Choice,
    best_choice,
    dtype_name,
    patch_attention,
)

FAMILY = "mla"
NEEDED_PHASES = ("extend", "decode")
PAGE_SIZE_ORDER = (64, 16, 128, 1)  # auto page size: the first one generated


def cos_sin_rope(rotate: Any, position_embeddings: Any) -> Any:
    """``rotate(q, k, cos, sin)`` (a model's rope function) bound to its ``(cos, sin)``
    position embeddings, as :func:`latent_rows` takes it: (q_rope, k_rope) -> roped pair."""
    cos, sin = position_embeddings
    return lambda q, k: rotate(q, k, cos, sin)


def _v3_rope(module: Any, position_embeddings: Any) -> Any:
    """DeepSeek-V3: cos / sin tables, rotating interleaved pairs or halves by the config."""
    modeling = sys.modules[type(module).__module__]
    rotate = (
        modeling.apply_rotary_pos_emb_interleave
        if module.config.rope_interleave
        else modeling.apply_rotary_pos_emb
    )
    return cos_sin_rope(rotate, position_embeddings)


def _v2_rope(module: Any, position_embeddings: Any) -> Any:
    """DeepSeek-V2: complex rotations (``freqs_cis``) of interleaved pairs."""
    rotate = sys.modules[type(module).__module__].apply_rotary_emb
    return lambda q, k: rotate(q, k, position_embeddings)


# The MLA attention modules served, each with its rope: (module, the position embeddings
# transformers passes it) -> a function (q_rope, k_rope) -> the roped pair. Both modules
# have the same projections, norms and latent layout (q_proj or q_a / q_b, kv_a_proj_with_mqa,
# kv_a_layernorm, kv_b_proj, o_proj).
MODULE_CLASSES = {"DeepseekV3Attention": _v3_rope, "DeepseekV2Attention": _v2_rope}


@dataclass(frozen=True)
class MlaShape:
    """One MLA layer's dims, as the module's config gives them."""

    num_heads: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int

    @classmethod
    def of_module(cls, module: torch.nn.Module) -> MlaShape:
        return cls(
            int(module.num_heads),
            int(module.kv_lora_rank),
            int(module.qk_rope_head_dim),
            int(module.qk_nope_head_dim),
            int(module.v_head_dim),
        )

    def describe(self) -> str:
        return (
            f"num_heads={self.num_heads}, kv_lora_rank={self.kv_lora_rank}, "
            f"qk_rope_head_dim={self.qk_rope_head_dim}, qk_nope_head_dim="
            f"{self.qk_nope_head_dim}, v_head_dim={self.v_head_dim}"
        )


def choose_mla(
    shape: MlaShape,
    *,
    arch: str,
    dtype: torch.dtype,
    kv_dtype: torch.dtype,
    page_size: int | None = None,
    backend: str | None = None,
) -> Choice:
    """The generated MLA config serving ``shape``; an error naming what to add if none."""
    want: dict[str, Any] = dict(
        num_heads=shape.num_heads,
        kv_lora_rank=shape.kv_lora_rank,
        qk_rope_head_dim=shape.qk_rope_head_dim,
        qk_nope_head_dim=shape.qk_nope_head_dim,
        v_head_dim=shape.v_head_dim,
        dtype=dtype_name(dtype),
        kv_dtype=dtype_name(kv_dtype),
        spec_topk=0,
    )
    if page_size is not None:
        want["page_size"] = page_size
    choice = best_choice(arch, FAMILY, want, backend=backend, page_order=PAGE_SIZE_ORDER)
    if choice is None:
        on = f" on backend {backend}" if backend else ""
        fields = " ".join(f"{k}={v}" for k, v in want.items())
        raise AttngenInputError(
            f"no generated MLA config{on} for {arch} serves a DeepSeek-V3 attention layer with "
            f"{fields}; add a spec (specs/mla/*.yaml: phases [extend, decode], mla dims and "
            f"num_heads {shape.num_heads}, dtype {dtype_name(dtype)}) and run `make generate` (the "
            "Triton MLA kernels are lowered for DeepSeek's 512/64/128/128 dims only)"
        )
    return choice


class MlaGenerate:
    """attngen's latent pool and MLA backend for plain generation (one per model); the
    per-forward rows and slots are ``state``'s (the MHA path's bookkeeping)."""

    def __init__(self, options: Options, state: GenerateState) -> None:
        self.options = options
        self.state = state
        self.pool: Any = None
        self.req_pool: ReqToTokenPool | None = None
        self.backend: Any = None
        self.choice: Choice | None = None
        self.layers: dict[int, AttentionLayer] = {}
        self._ready: Any = None  # the Forward whose metadata is built (held: ids get reused)
        self.last_path = ""  # "ragged" or "absorbed": how the last layer call ran

    def attend(
        self,
        module: torch.nn.Module,
        q_nope: torch.Tensor,
        q_rope: torch.Tensor,
        latent: torch.Tensor,
        k_rope: torch.Tensor,
    ) -> torch.Tensor:
        """``q_nope [B, H, S, nope]``, ``q_rope [B, H, S, rope]`` (roped), ``latent [B, 1, S,
        kv_lora_rank]`` (normed), ``k_rope [B, 1, S, rope]`` (roped): the new positions.
        Returns the attention output ``[B, S, H, v_head_dim]`` in the model's dtype."""
        state = self.state
        bs, heads, q_len, _ = q_nope.shape
        fwd = state.current("MLA", "query", bs, q_len)
        shape = MlaShape.of_module(module)
        dtype = self.options.activation_dtype(q_nope.dtype)
        device = q_nope.device
        if fwd.batch is None:
            choice = self._choose(shape, dtype, device)
            state.page_size = choice.config.page_size
            state._build(fwd, device)
            self._ensure_storage(shape, dtype, device, int(module.config.num_hidden_layers))
        if self._ready is not fwd:
            self.backend.init_forward_metadata(fwd.batch)
            self._ready = fwd
        rows = fwd.q_rows
        w = module.kv_b_proj.weight.view(heads, shape.qk_nope_head_dim + shape.v_head_dim, -1)
        w_uk, w_uv = w[:, : shape.qk_nope_head_dim], w[:, shape.qk_nope_head_dim :]
        batch = fwd.batch
        ragged = (
            self.options.mla_prefill == "ragged"
            and batch.forward_mode is ForwardMode.EXTEND
            and not any(fwd.prefix)
        )
        self.last_path = "ragged" if ragged else "absorbed"
        if ragged:
            out = self._ragged(module, shape, q_nope, q_rope, latent, k_rope, w_uk, w_uv, dtype)
            return scatter_rows(fwd, out, latent, w_uv)
        qn = _rows(q_nope, rows, q_nope.dtype)  # [T, H, nope], the model's dtype
        q_latent = torch.einsum("thn,hnl->thl", qn, w_uk)
        q = torch.cat([q_latent, _rows(q_rope, rows, q_rope.dtype)], dim=-1).to(dtype)
        lat = _rows(latent, rows, dtype)  # [T, 1, kv_lora_rank]
        kr = _rows(k_rope, rows, dtype)  # [T, 1, rope]
        layer = self._layer(module, shape)
        if batch.forward_mode is ForwardMode.DECODE:
            out = self.backend.forward_decode(q, lat, None, layer, batch, k_rope=kr)
        else:
            out = self.backend.forward_extend(q, lat, None, layer, batch, k_rope=kr)
        o_latent = out.view(-1, heads, shape.kv_lora_rank).to(q_nope.dtype)
        o = torch.einsum("thl,hvl->thv", o_latent, w_uv)
        return scatter_rows(fwd, o, latent, w_uv)

    def _ragged(
        self,
        module: torch.nn.Module,
        shape: MlaShape,
        q_nope: torch.Tensor,
        q_rope: torch.Tensor,
        latent: torch.Tensor,
        k_rope: torch.Tensor,
        w_uk: torch.Tensor,
        w_uv: torch.Tensor,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        """A prompt (no cached tokens) as MHA over the new tokens: keys and values
        decompressed from the latent in the model's dtype (k_nope = W_UK latent, v = W_UV
        latent, k_rope shared by the heads), the generated ragged kernel (causal); the
        latent rows written to the pool for the decode steps. ``[T, H, v]``."""
        fwd = self.state.forward
        rows, batch = fwd.q_rows, fwd.batch
        lat = _rows(latent, rows, latent.dtype)[:, 0]  # [T, rank], the model's dtype
        k_nope = torch.einsum("tl,hnl->thn", lat, w_uk).to(dtype).contiguous()
        v = torch.einsum("tl,hvl->thv", lat, w_uv).to(dtype).contiguous()
        kr = _rows(k_rope, rows, dtype)  # [T, 1, rope]
        q = torch.cat([_rows(q_nope, rows, dtype), _rows(q_rope, rows, dtype)], dim=-1)
        self.pool.set_mla_kv_buffer(
            self._layer(module, shape), batch.out_cache_loc, lat.to(dtype), kr
        )
        layer = AttentionLayer(
            layer_id=int(module.layer_idx),
            num_q_heads=shape.num_heads,
            num_kv_heads=shape.num_heads,
            head_dim=shape.qk_nope_head_dim + shape.qk_rope_head_dim,
            v_head_dim=shape.v_head_dim,
            scaling=float(module.scaling),
        )
        out = self.backend.forward_extend(
            q.contiguous(), k_nope, v, layer, batch, save_kv_cache=False, k_rope=kr
        )
        return out.view(-1, shape.num_heads, shape.v_head_dim).to(q_nope.dtype)

    def kv_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The latent cache's dtype: the kernels' ``dtype`` or fp8 e4m3 (one scale per tensor,
        ``Options.kv_scale``, for the whole 576-wide row)."""
        kv = self.options.kv_dtype(dtype)
        if kv not in (dtype, torch.float8_e4m3fn):
            raise AttngenInputError(
                f"kv_cache_dtype {kv}: the MLA path of this integration serves a {dtype} or "
                "float8_e4m3fn latent cache"
            )
        return kv

    def _choose(self, shape: MlaShape, dtype: torch.dtype, device: torch.device) -> Choice:
        if self.choice is None:
            self.choice = choose_mla(
                shape,
                arch=self.options.arch_for(device),
                dtype=dtype,
                kv_dtype=self.kv_dtype(dtype),
                page_size=self.options.page_size,
                backend=self.options.backend,
            )
        return self.choice

    def _layer(self, module: torch.nn.Module, shape: MlaShape) -> AttentionLayer:
        layer_id = int(module.layer_idx)
        layer = self.layers.get(layer_id)
        if layer is None:
            width = shape.kv_lora_rank + shape.qk_rope_head_dim
            scale = None
            if self.pool is not None and self.pool.quantized:  # fp8: the latent's dequant scale
                scale = torch.tensor(
                    [self.options.kv_scale], dtype=torch.float32, device=self.pool.device
                )
            layer = AttentionLayer(
                layer_id=layer_id,
                num_q_heads=shape.num_heads,
                num_kv_heads=1,
                head_dim=width,
                v_head_dim=shape.kv_lora_rank,
                scaling=float(module.scaling),  # softmax scale of the 192-wide q.k (yarn too)
                k_scale=scale,
                v_scale=scale,
            )
            self.layers[layer_id] = layer
        return layer

    def _ensure_storage(
        self, shape: MlaShape, dtype: torch.dtype, device: torch.device, num_layers: int
    ) -> None:
        """A latent pool with room for every page in use (grown and copied when not), a
        request table wide enough, and the backend over both; rows rewritten from pages."""
        from attngen.families.mla.pool import MlaLatentPool

        state, choice = self.state, self.choice
        assert state.page_size is not None and choice is not None
        ps = state.page_size
        need = max(state.num_pages_used, 1)
        pool = self.pool
        kv_dtype = self.kv_dtype(dtype)
        if pool is None or pool.num_pages < need:
            grown = MlaLatentPool(
                num_layers=num_layers,
                num_pages=max(2 * need, -(-self.options.initial_tokens // ps)),
                page_size=ps,
                kv_lora_rank=shape.kv_lora_rank,
                qk_rope_head_dim=shape.qk_rope_head_dim,
                dtype=kv_dtype,
                device=device,
            )
            if pool is not None:
                for layer in range(num_layers):
                    grown.kv_buffer[layer][: pool.num_pages].copy_(pool.kv_buffer[layer])
            self.pool, self.backend = grown, None
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
                page_size=ps,
                dtype=dtype,
                device=device,
                req_to_token_pool=self.req_pool,
                kv_pool=self.pool,
                kv_lora_rank=shape.kv_lora_rank,
                qk_rope_head_dim=shape.qk_rope_head_dim,
                qk_nope_head_dim=shape.qk_nope_head_dim,
                v_head_dim=shape.v_head_dim,
                kv_cache_dtype=kv_dtype,
            )
            self._ready = None


# -- the module forward ----


def patch(model: torch.nn.Module, runtime: Any, name: str) -> int:
    """Give every DeepSeek-V2 / V3 attention module of ``model`` the attngen forward (used while
    the model's attention implementation is ``name``); returns how many were patched."""
    return patch_attention(model, MODULE_CLASSES, runtime, name, _mla_forward)


def latent_rows(
    module: Any,
    hidden: torch.Tensor,
    q_rope: torch.Tensor,
    past_key_values: Any,
    rotate: Any,
) -> tuple[torch.Tensor, ...]:
    """The module's new latent rows (its normed compressed kv) and roped k_rope, q_rope roped
    with them by ``rotate`` ((q_rope, k_rope) -> the pair roped as the model does), and the
    past + new latent and k_rope from transformers' cache (its own length bookkeeping; the
    new rows when there is no cache): ``(q_rope, latent, k_rope, all_latent, all_k_rope)``,
    ``[B, 1, S, ...]``."""
    bs, length = hidden.shape[:-1]
    rank, rope = module.kv_lora_rank, module.qk_rope_head_dim
    compressed = module.kv_a_proj_with_mqa(hidden)
    latent = module.kv_a_layernorm(compressed[..., :rank]).view(bs, 1, length, rank)
    k_rope = compressed[..., rank:].reshape(bs, 1, length, rope)
    q_rope, k_rope = rotate(q_rope, k_rope)
    all_latent, all_k_rope = latent, k_rope
    if past_key_values is not None:
        all_latent, all_k_rope = past_key_values.update(latent, k_rope, module.layer_idx)
    return q_rope, latent, k_rope, all_latent, all_k_rope


def _mla_forward(
    module: Any,
    runtime: Any,
    hidden: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    past_key_values: Any,
) -> tuple[torch.Tensor, None]:
    """The module's own projections, norm and rope, then attngen's absorbed MLA."""
    bs, length = hidden.shape[:-1]
    nope, rope = module.qk_nope_head_dim, module.qk_rope_head_dim
    if module.q_lora_rank is None:
        q = module.q_proj(hidden)
    else:
        q = module.q_b_proj(module.q_a_layernorm(module.q_a_proj(hidden)))
    q = q.view(bs, length, -1, nope + rope).transpose(1, 2)  # [B, H, S, nope + rope]
    q_nope, q_rope = q[..., :nope], q[..., nope:]
    rotate = MODULE_CLASSES[type(module).__name__](module, position_embeddings)
    q_rope, latent, k_rope, all_latent, all_k_rope = latent_rows(
        module, hidden, q_rope, past_key_values, rotate
    )
    out = runtime.mla.attend(module, q_nope, q_rope, latent, k_rope)
    for observe in runtime.mla_observers:  # tests: past + new latent, pre-o_proj output
        observe(module, q_nope, q_rope, all_latent, all_k_rope, out, runtime)
    return module.o_proj(out.reshape(bs, length, -1)), None


def scatter_rows(
    fwd: Forward, out: torch.Tensor, latent: torch.Tensor, w_uv: torch.Tensor
) -> torch.Tensor:
    """The real rows' outputs ``out [T, H, v_head_dim]`` at their positions of ``[B, S, H,
    v_head_dim]``. A pad position (left padding: before its row's tokens, in a forward
    without cached tokens) sees no key, and eager attention's uniform softmax over the
    all-masked row gives the mean of the forward's values: ``w_uv`` times the mean latent."""
    bs, q_len = fwd.batch_size, fwd.q_length
    heads, dv = int(out.shape[1]), int(out.shape[2])
    full = out.new_zeros((bs * q_len, heads, dv))
    if fwd.q_rows.numel() < bs * q_len and not any(fwd.prefix):
        mean = latent.float().mean(dim=2)[:, 0]  # [B, kv_lora_rank]
        means = torch.einsum("bl,hvl->bhv", mean, w_uv.float())  # [B, H, v_head_dim]
        full.view(bs, q_len, heads, dv)[:] = means[:, None].to(out.dtype)
    full[fwd.q_rows] = out
    return full.view(bs, q_len, heads, dv)
