"""Tiny random-weight transformers models with attngen's features switched on, and the
judges that compare attngen against the model's own eager attention.

Every model has initializer_range 0.3 (at transformers' 0.02, a softcap or a window changes
the logits by ~1e-7 and nothing would be tested) and prompts longer than its windows.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

VOCAB = 512
PAD = 0
# A correct bf16 kernel rounds what the emulation rounds (q, k, v, o) and, in addition, the
# probabilities before P @ V and its own fp32 accumulation order: about one more rounding of
# the same size. LOGIT_FACTOR times the emulation's deviation covers that with room to spare.
LOGIT_FACTOR = 4.0
LAYER_FACTOR = 4.0
SENSITIVITY = 3.0  # a feature switched off must move the logits by this many bounds (so
# an implementation that ignored it would fail the bound by that much)


@dataclass(frozen=True)
class Case:
    """One model: its config factory, the attngen features it exercises, how to switch each
    feature off (to show the test would catch it), and the runs (page size, KV dtype)."""

    name: str
    make_config: Callable[[], Any]
    features: tuple[str, ...]
    runs: tuple[tuple[int, torch.dtype], ...]
    prompt_lengths: tuple[int, ...] = (150, 131, 203)
    switch_off: dict[str, Callable[[Any], Callable[[], None]]] = field(default_factory=dict)
    post_init: Callable[[Any, torch.Generator], None] | None = None
    vocab: int = VOCAB
    paged_reference: str = "paged|sdpa"  # transformers' own paged attention for this model


def _common(**kw: Any) -> dict[str, Any]:
    base = dict(
        vocab_size=VOCAB,
        num_hidden_layers=2,
        initializer_range=0.3,
        pad_token_id=PAD,
        bos_token_id=None,
        eos_token_id=None,
        max_position_embeddings=4096,
    )
    base.update(kw)
    return base


def llama_config() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        **_common(
            hidden_size=256,
            intermediate_size=512,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=128,
        )
    )


def qwen2_config() -> Any:
    from transformers import Qwen2Config

    cfg = Qwen2Config(
        **_common(
            hidden_size=512,
            intermediate_size=512,
            num_attention_heads=4,
            num_key_value_heads=1,
            use_sliding_window=True,
            sliding_window=64,
            max_window_layers=1,
            # two window layers: with one, switching its window off moved the logits by
            # only 2.9 bounds at one seed on the H200 (the power check asks for 3)
            num_hidden_layers=3,
        )
    )
    want = ["full_attention", "sliding_attention", "sliding_attention"]
    assert cfg.layer_types == want, cfg.layer_types
    return cfg


def gemma2_config() -> Any:
    from transformers import Gemma2Config

    return Gemma2Config(
        **_common(
            hidden_size=256,
            intermediate_size=512,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=128,
            sliding_window=64,
            attn_logit_softcapping=1.0,
            query_pre_attn_scalar=256,  # scaling 1/16, not head_dim ** -0.5
            layer_types=["sliding_attention", "full_attention"],
        )
    )


def gpt_oss_config() -> Any:
    from transformers import GptOssConfig

    return GptOssConfig(
        **_common(
            hidden_size=256,
            intermediate_size=256,
            num_attention_heads=8,
            num_key_value_heads=1,
            head_dim=64,
            sliding_window=128,
            num_local_experts=2,
            num_experts_per_tok=2,  # every expert always routed: no discontinuous routing
            layer_types=["sliding_attention", "full_attention"],
        )
    )


SINK_MEAN, SINK_STD = 10.0, 2.0
QK_SCALE = 0.25  # at init 0.3 raw scores have a std of ~20 (near one-hot rows); ~1.5 after this


def moderate_scores(model: Any) -> None:
    """Scale q_proj and k_proj so that the scores have a std of a few units: rows that are not
    one-hot, so window, softcap and sinks change many probabilities, and bf16 rounding does
    not flip near-tied maxima (which would make any bound loose)."""
    for module in model.modules():
        if hasattr(module, "q_proj") and hasattr(module, "k_proj"):
            module.q_proj.weight.data.mul_(QK_SCALE)
            module.k_proj.weight.data.mul_(QK_SCALE)


def _strong_sinks(model: Any, gen: torch.Generator) -> None:
    """Sinks of the size of the rows' largest scores, so that they take a real share of the
    softmax (at transformers' own init they are ~0 and change little)."""
    for module in model.modules():
        if isinstance(getattr(module, "sinks", None), torch.nn.Parameter):
            values = SINK_MEAN + SINK_STD * torch.randn(module.sinks.shape, generator=gen)
            module.sinks.data.copy_(values.to(module.sinks.device, module.sinks.dtype))


def _window_off(model: Any) -> Callable[[], None]:
    cfg = model.config
    old = cfg.sliding_window
    cfg.sliding_window = 1 << 20
    return lambda: setattr(cfg, "sliding_window", old)


def _attr_off(name: str, value: Any) -> Callable[[Any], Callable[[], None]]:
    def switch(model: Any) -> Callable[[], None]:
        saved = []
        for module in model.modules():
            if hasattr(module, name) and hasattr(module, "layer_idx"):
                saved.append((module, getattr(module, name)))
                setattr(module, name, value)
        assert saved, name

        def restore() -> None:
            for module, old in saved:
                setattr(module, name, old)

        return restore

    return switch


def _sinks_off(model: Any) -> Callable[[], None]:
    saved = []
    for module in model.modules():
        if isinstance(getattr(module, "sinks", None), torch.nn.Parameter):
            saved.append((module, module.sinks.data.clone()))
            module.sinks.data.fill_(-1e9)  # exp(-1e9) = 0: no sink

    def restore() -> None:
        for module, old in saved:
            module.sinks.data.copy_(old)

    return restore


BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn
CASES = {
    "llama": Case(
        "llama",
        llama_config,
        ("gqa 4",),
        ((1, BF16), (16, BF16), (64, BF16), (128, BF16), (16, FP8), (64, FP8)),
    ),
    "qwen2": Case(
        "qwen2",
        qwen2_config,
        ("sliding_window=64",),
        ((16, BF16), (64, BF16), (1, BF16)),
        switch_off={"sliding_window=64": _window_off},
    ),
    "gemma2": Case(
        "gemma2",
        gemma2_config,
        ("softcap=1.0", "sliding_window=64"),
        ((16, BF16), (64, BF16)),
        switch_off={
            "softcap=1.0": _attr_off("attn_logit_softcapping", None),
            "sliding_window=64": _window_off,
        },
    ),
    "gpt_oss": Case(
        "gpt_oss",
        gpt_oss_config,
        ("sinks", "sliding_window=128"),
        ((16, BF16), (64, BF16)),
        prompt_lengths=(300, 181, 233),
        switch_off={"sinks": _sinks_off, "sliding_window=128": _window_off},
        post_init=_strong_sinks,
        paged_reference="paged|eager",  # transformers 5.17 has no sdpa for gpt-oss (sinks)
    ),
}


def build(case: Case, seed: int, device: str) -> Any:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = case.make_config()
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    moderate_scores(model)
    if case.post_init is not None:
        case.post_init(model, torch.Generator().manual_seed(seed + 3))
    return model.to(device=device, dtype=torch.float32).eval()


def prompts(case: Case, seed: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded random prompts ``[B, S]`` and their mask."""
    gen = torch.Generator().manual_seed(seed + 1)
    width = max(case.prompt_lengths)
    ids = torch.full((len(case.prompt_lengths), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, n in enumerate(case.prompt_lengths):
        ids[b, width - n :] = torch.randint(1, case.vocab, (n,), generator=gen)
        mask[b, width - n :] = 1
    return ids.to(device), mask.to(device)


# -- the emulated bf16 attention: what a correctly rounded bf16 kernel would return ----


def _round_kv(
    x: torch.Tensor, kv_dtype: torch.dtype, scale: float, act: torch.dtype
) -> torch.Tensor:
    x = x.to(act).float()
    if kv_dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        limit = torch.finfo(kv_dtype).max
        x = (x / scale).clamp(-limit, limit).to(kv_dtype).float() * scale
    return x


def eager_of(module: Any) -> Callable[..., Any]:
    """The model's own eager attention function (its modeling file's)."""
    return sys.modules[type(module).__module__].eager_attention_forward


def register_emulation(kv_dtype: torch.dtype, act: torch.dtype, scale: float = 1.0) -> str:
    """Register ``attngen_emu``: the model's eager attention on q/k/v rounded to the kernels'
    activation dtype ``act`` (K/V through the fp8 cache's rounding too), output rounded."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    def emulated(module, query, key, value, attention_mask, **kwargs):
        indices = kwargs.pop("indices", None)
        if indices is not None:  # DSA: transformers folds the pick into the mask for eager only
            unpicked = torch.ones(
                (*indices.shape[:2], key.shape[2]), dtype=torch.bool, device=key.device
            ).scatter(-1, indices.long(), False)
            attention_mask = attention_mask.masked_fill(
                unpicked[:, None], torch.finfo(attention_mask.dtype).min
            )
        q = query.to(act).float()
        k = _round_kv(key, kv_dtype, scale, act)
        v = _round_kv(value, kv_dtype, scale, act)
        out, weights = eager_of(module)(module, q, k, v, attention_mask, **kwargs)
        return out.to(act).to(query.dtype), weights

    AttentionInterface.register("attngen_emu", emulated)
    AttentionMaskInterface.register("attngen_emu", eager_mask)
    return "attngen_emu"


# -- per-layer judge: each attngen layer against the model's eager attention, same inputs ----


@dataclass
class LayerRecord:
    step: int
    layer: int
    features: str
    error: float
    bound: float


class LayerJudge:
    """An attngen observer: every layer call of plain generate, against the model's own
    eager attention on the same q/k/v (fp32) with the mask built from attngen's padding mask,
    bounded by LAYER_FACTOR x the emulated bf16 attention's own deviation."""

    def __init__(self, kv_dtype: torch.dtype, act: torch.dtype, scale: float = 1.0) -> None:
        self.kv_dtype, self.act, self.scale = kv_dtype, act, scale
        self.records: list[LayerRecord] = []
        self.step = -1
        self._last_layer = 1 << 30

    def __call__(self, module, query, key, value, kwargs, out, runtime) -> None:
        layer = int(module.layer_idx)
        if layer <= self._last_layer:
            self.step += 1
        self._last_layer = layer
        fwd = runtime.generate.forward
        window = kwargs.get("sliding_window")
        # transformers' own mask function for this layer (what eager / sdpa apply), not
        # what attngen read from it; the window only names the layer's features
        layer_mask = kwargs["attention_mask"]
        mask = self._model_mask(fwd.padding_mask, query.shape[2], key.shape[2], layer_mask)
        if window is None:
            window = layer_mask.pattern.window
        eager = eager_of(module)
        extra = {
            k: kwargs[k]
            for k in ("sliding_window", "softcap", "s_aux")
            if kwargs.get(k) is not None
        }
        ref, _ = eager(
            module,
            query.float(),
            key.float(),
            value.float(),
            mask,
            scaling=kwargs["scaling"],
            dropout=0.0,
            **extra,
        )
        emu, _ = eager(
            module,
            query.to(self.act).float(),
            _round_kv(key, self.kv_dtype, self.scale, self.act),
            _round_kv(value, self.kv_dtype, self.scale, self.act),
            mask,
            scaling=kwargs["scaling"],
            dropout=0.0,
            **extra,
        )
        emu = emu.to(self.act).float()
        rows = fwd.q_rows
        flat = lambda t: t.reshape(-1, t.shape[-2], t.shape[-1]).index_select(0, rows)
        ref, emu, got = flat(ref), flat(emu), flat(out.float())
        rms = ref.pow(2).mean().sqrt().item()
        eps = torch.finfo(self.act).eps / 2  # unit roundoff
        bound = LAYER_FACTOR * max((emu - ref).abs().max().item(), eps * rms)
        error = (got - ref).abs().max().item()
        if not error == error:
            error = float("inf")
        from attngen.integrations.transformers import LayerFeatures

        features = LayerFeatures.of_call(
            query, key, value, window, kwargs.get("softcap"), kwargs.get("s_aux")
        ).describe()
        self.records.append(LayerRecord(self.step, layer, features, error, bound))

    @staticmethod
    def _model_mask(padding: torch.Tensor, q_len: int, k_len: int, layer_mask: Any) -> torch.Tensor:
        """The additive mask ``[B, 1, q_len, k_len]`` transformers' sdpa would build from the
        layer's ``mask_function`` and the padding mask (the last ``q_len`` / ``k_len`` of the
        ``total`` positions)."""
        from transformers.masking_utils import causal_mask_function, sdpa_mask

        total = int(padding.shape[1])
        visible = sdpa_mask(
            batch_size=int(padding.shape[0]),
            q_length=q_len,
            kv_length=k_len,
            q_offset=total - q_len,
            kv_offset=total - k_len,
            mask_function=layer_mask.mask_function or causal_mask_function,
            attention_mask=padding,
            allow_is_causal_skip=False,
            device=padding.device,
        )
        zero = torch.zeros((), device=padding.device)
        return torch.where(visible, zero, torch.finfo(torch.float32).min)

    @staticmethod
    def _mask(padding: torch.Tensor, q_len: int, k_len: int, window: int | None) -> torch.Tensor:
        total = int(padding.shape[1])
        q_pos = torch.arange(total - q_len, total, device=padding.device)
        k_pos = torch.arange(total - k_len, total, device=padding.device)
        visible = k_pos[None, :] <= q_pos[:, None]
        if window is not None:
            visible &= k_pos[None, :] > q_pos[:, None] - window
        visible = visible[None, None] & padding[:, None, None, total - k_len :]
        zero = torch.zeros((), device=padding.device)
        return torch.where(visible, zero, torch.finfo(torch.float32).min)

    def first_failure(self) -> LayerRecord | None:
        bad = [r for r in self.records if not r.error <= r.bound]
        return min(bad, key=lambda r: (r.step, r.layer)) if bad else None


# -- DeepSeek-V3 (MLA) ----

MLA_Q_SCALE, MLA_K_SCALE = 0.2, 0.25  # scores' std ~30 at init 0.3; ~1.5 after both


def deepseek_mla(q_lora_rank: int | None, mscale: float) -> dict[str, Any]:
    """DeepSeek's own MLA dims (the dims attngen's MLA kernels are lowered for) at 16 heads,
    yarn rope with ``mscale`` (it makes the softmax scale differ from 192 ** -0.5), dense
    MLPs (no MoE layer): the config fields DeepSeek-V2 and V3 share."""
    return dict(
        moe_intermediate_size=64,
        num_attention_heads=16,
        num_key_value_heads=16,
        q_lora_rank=q_lora_rank,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        first_k_dense_replace=2,  # both layers dense
        rope_parameters=dict(
            rope_type="yarn",
            rope_theta=10000.0,
            factor=4.0,
            original_max_position_embeddings=1024,
            mscale=mscale,
            mscale_all_dim=mscale,
            beta_fast=32.0,
            beta_slow=1.0,
        ),
    )


def deepseek_v3_config(hidden: int = 256, vocab: int = VOCAB, q_lora_rank: int | None = 64) -> Any:
    """DeepSeek-V3 attention (:func:`deepseek_mla`, a q LoRA, mscale 1) with interleaved
    rope weights."""
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        **_common(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=256,
            rope_interleave=True,
            **deepseek_mla(q_lora_rank, 1.0),
        )
    )


def _moderate_mla(model: Any, gen: torch.Generator) -> None:
    """As :func:`moderate_scores` for MLA: the q projection and the key's two sources (W_UK,
    the first qk_nope rows per head of kv_b_proj; the rope columns of kv_a_proj_with_mqa)."""
    del gen
    found = 0
    for module in model.modules():
        if hasattr(module, "kv_b_proj"):
            q = module.q_proj if module.q_proj is not None else module.q_b_proj
            q.weight.data.mul_(MLA_Q_SCALE)
            w = module.kv_b_proj.weight.data.view(module.num_heads, -1, module.kv_lora_rank)
            w[:, : module.qk_nope_head_dim].mul_(MLA_K_SCALE)
            module.kv_a_proj_with_mqa.weight.data[module.kv_lora_rank :].mul_(MLA_K_SCALE)
            found += 1
    assert found, "no MLA module"


def _yarn_scale_off(model: Any) -> Callable[[], None]:
    """The softmax scale without yarn's mscale factor (192 ** -0.5)."""
    saved = []
    for module in model.modules():
        if hasattr(module, "kv_b_proj"):
            saved.append((module, module.scaling))
            module.scaling = float(module.qk_head_dim) ** -0.5
            assert module.scaling != saved[-1][1], "yarn mscale is 1: nothing to switch off"

    def restore() -> None:
        for module, old in saved:
            module.scaling = old

    return restore


def _rope_interleave_off(model: Any) -> Callable[[], None]:
    """The other rope convention (halves instead of interleaved pairs)."""
    cfg = model.config
    cfg.rope_interleave = not cfg.rope_interleave
    return lambda: setattr(cfg, "rope_interleave", not cfg.rope_interleave)


class MlaLayerJudge(LayerJudge):
    """An attngen MLA observer: each DeepSeek-V3 layer's attention output (before o_proj)
    against the model's own eager attention on its decompressed q/k/v (fp32, the keys and
    values expanded from the whole latent by the module's ``expand_kv``), bounded by
    LAYER_FACTOR x the deviation of an emulation that rounds what attngen's path rounds:
    absorbed, q_latent = W_UK^T q_nope, q_rope, the latent and k_rope to the kernels' dtype,
    the latent output too (W_UV applied in fp32); ragged prefill, the decompressed q/k/v
    and the output."""

    def __call__(self, module, q_nope, q_rope, latent, k_rope, out, runtime) -> None:
        layer = int(module.layer_idx)
        if layer <= self._last_layer:
            self.step += 1
        self._last_layer = layer
        fwd = runtime.generate.forward
        q_len, k_len = int(q_nope.shape[2]), int(latent.shape[2])
        mask = self._mask(fwd.padding_mask, q_len, k_len, None)
        key, value = module.expand_kv(latent.float(), k_rope.float())
        query = torch.cat([q_nope, q_rope], dim=-1).float()
        ref, _ = eager_of(module)(
            module, query, key, value, mask, scaling=module.scaling, dropout=0.0
        )  # [B, S, H, v]
        heads, nope = int(module.num_heads), int(module.qk_nope_head_dim)
        w = module.kv_b_proj.weight.float().view(heads, nope + int(module.v_head_dim), -1)
        rnd = lambda t: t.float().to(self.act).float()  # noqa: E731
        if runtime.mla.last_path == "ragged":  # decompressed q/k/v and output rounded
            emu, _ = eager_of(module)(
                module, rnd(query), rnd(key), rnd(value), mask, scaling=module.scaling, dropout=0.0
            )
            emu = rnd(emu)
        else:
            q_latent = rnd(torch.einsum("bhsn,hnl->bhsl", q_nope.float(), w[:, :nope]))
            lat = _round_kv(latent, self.kv_dtype, self.scale, self.act)  # the pool's rounding
            scores = q_latent @ lat.transpose(-1, -2)
            kr = _round_kv(k_rope, self.kv_dtype, self.scale, self.act)
            scores = scores + rnd(q_rope) @ kr.transpose(-1, -2)
            probs = torch.softmax(scores * module.scaling + mask, dim=-1)
            emu = torch.einsum("bhsl,hvl->bshv", rnd(probs @ lat), w[:, nope:])
        rows = fwd.q_rows
        flat = lambda t: t.reshape(-1, t.shape[-2], t.shape[-1]).index_select(0, rows)  # noqa
        ref, emu, got = flat(ref), flat(emu), flat(out.float())
        rms = ref.pow(2).mean().sqrt().item()
        eps = torch.finfo(self.act).eps / 2
        bound = LAYER_FACTOR * max((emu - ref).abs().max().item(), eps * rms)
        error = (got - ref).abs().max().item()
        if not error == error:
            error = float("inf")
        features = (
            f"MLA {runtime.mla.last_path}, {heads} heads, latent {module.kv_lora_rank} + rope "
            f"{module.qk_rope_head_dim}, scaling {module.scaling:.4g}"
        )
        self.records.append(LayerRecord(self.step, layer, features, error, bound))


def emulate_mla_latent(model: Any, kv_dtype: torch.dtype, scale: float, act: torch.dtype):
    """For the emulated run of the logit bound with an fp8 latent cache: every DeepSeek-V3
    attention expands keys and values from its latent and roped k_rope rounded as attngen's
    pool stores them (``act``, then fp8 with ``scale``). Returns the restore."""
    saved = []
    for module in model.modules():
        if type(module).__name__ != "DeepseekV3Attention":
            continue

        def expand(kv, k_rot, _orig=module.expand_kv):
            return _orig(
                _round_kv(kv, kv_dtype, scale, act), _round_kv(k_rot, kv_dtype, scale, act)
            )

        saved.append(module)
        module.expand_kv = expand
    assert saved, "no DeepSeek-V3 attention module"

    def restore() -> None:
        for module in saved:
            del module.expand_kv  # the class's method again

    return restore


CASES["deepseek_v3"] = Case(
    "deepseek_v3",
    deepseek_v3_config,
    ("mla absorbed", "yarn mscale", "rope_interleave"),
    ((64, BF16), (1, BF16), (64, FP8)),
    switch_off={"yarn mscale": _yarn_scale_off, "rope_interleave": _rope_interleave_off},
    post_init=_moderate_mla,
)


# -- Qwen3-Next (GDN linear attention + full attention) ----


def qwen3_next_config(hidden: int = 256, vocab: int = VOCAB) -> Any:
    """Qwen3-Next: a gated-delta-rule layer (Qwen3-Next's dims: K = V = 128, 2 value heads
    per key head, conv 4) and a gated full-attention layer (GQA 4, head dim 64, partial
    rope); dense MLPs."""
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(
        **_common(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=256,
            mlp_only_layers=[0, 1],
            **_gdn_hybrid(k_heads=2, v_heads=4),
        )
    )


def _gdn_hybrid(k_heads: int, v_heads: int) -> dict[str, Any]:
    """A linear-attention layer (K = V = 128, conv 4) then a full-attention layer (GQA 4,
    head dim 64): the layers of the Qwen3-Next and Qwen3.5 test models."""
    return dict(
        layer_types=["linear_attention", "full_attention"],
        linear_num_key_heads=k_heads,
        linear_num_value_heads=v_heads,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
    )


def _gdn_decay_off(model: Any) -> Callable[[], None]:
    """No decay: ``A_log`` -> -inf makes ``g = 0`` (the state is never forgotten)."""
    saved = []
    for module in model.modules():
        if hasattr(module, "A_log") and hasattr(module, "dt_bias"):
            saved.append((module, module.A_log.data.clone()))
            module.A_log.data.fill_(-1e4)
    assert saved, "no GDN module"

    def restore() -> None:
        for module, old in saved:
            module.A_log.data.copy_(old)

    return restore


class GdnLayerJudge(LayerJudge):
    """An attngen GDN observer: each Qwen3-Next linear-attention layer's gated-delta-rule
    output (before the gated norm) against the module's own torch functions
    (``causal_conv1d_fn``, ``torch_chunk_gated_delta_rule``, fp32) over the whole sequence so
    far (the observer keeps the inputs of earlier steps; pads zeroed, as the module's own
    padding mask does), bounded by LAYER_FACTOR x the deviation of the same reference on
    inputs rounded to the kernels' dtype, the conv's output and the layer's output rounded
    too (attngen's conv writes the delta rule's q | k | v in that dtype), and on the GPU its
    products in TF32 as attngen's chunked kernels run theirs (``_reference``)."""

    def __init__(self, kv_dtype: torch.dtype, act: torch.dtype, scale: float = 1.0) -> None:
        super().__init__(kv_dtype, act, scale)
        self.history: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def __call__(self, module, mixed, a, b, out, runtime) -> None:
        layer = int(module.layer_idx)
        if layer <= self._last_layer:
            self.step += 1
        self._last_layer = layer
        fwd = runtime.generate.forward
        total, q_len = int(fwd.padding_mask.shape[1]), int(mixed.shape[1])
        if total == q_len:
            self.history.pop(layer, None)
        parts = (mixed.float(), a.float(), b.float())
        old = self.history.get(layer)
        hist = parts if old is None else tuple(torch.cat([o, p], 1) for o, p in zip(old, parts))
        self.history[layer] = hist
        assert hist[0].shape[1] == total, (hist[0].shape, total)
        keep = fwd.padding_mask[:, :, None].float()
        ref = self._reference(module, *(t * keep for t in hist))[:, -q_len:]
        rnd = lambda t: t.to(self.act).float()  # noqa: E731
        hist_act = (rnd(t) * keep for t in hist)
        emu = rnd(self._reference(module, *hist_act, rounded=self.act)[:, -q_len:])
        rows = runtime.gdn.rows  # this forward's real rows (it may run before any MHA layer)
        flat = lambda t: t.reshape(-1, t.shape[-2], t.shape[-1]).index_select(0, rows)  # noqa
        ref, emu, got = flat(ref), flat(emu), flat(out.float())
        rms = ref.pow(2).mean().sqrt().item()
        eps = torch.finfo(self.act).eps / 2
        bound = LAYER_FACTOR * max((emu - ref).abs().max().item(), eps * rms)
        error = (got - ref).abs().max().item()
        if not error == error:
            error = float("inf")
        features = (
            f"GDN, {module.num_k_heads} k / {module.num_v_heads} v heads of "
            f"{module.head_k_dim}/{module.head_v_dim}, conv {module.conv_kernel_size}"
        )
        self.records.append(LayerRecord(self.step, layer, features, error, bound))

    @staticmethod
    def _reference(module, mixed, a, b, rounded: torch.dtype | None = None) -> torch.Tensor:
        """The module's conv and delta rule in fp32; with ``rounded``, the conv's output (the
        delta rule's q | k | v) rounded to that dtype first, as attngen's conv writes it (in
        the activations' dtype, as SGLang's does), and on the GPU the delta rule's matrix
        products in TF32, as attngen's chunked kernels run them (``tl.dot`` on fp32 operands;
        ``attngen.families.gdn.testing`` derives their share of the error). Without the TF32
        products the emulation rounded less than attngen does: Qwen3.5 at seed 227733 left
        the layer bound by 1.07x (decode step 11), Qwen3-Next at seed 12 the logit bound by
        1.35x (step 55, every layer within its bound), at a93415d and cc60ca5 alike. With
        ``rounded`` the conv's weight and bias are rounded to it too, as the integration
        hands them to attngen's conv (in the backend's dtype). Without ``rounded``, fp32
        weights and products throughout (the exact reference)."""
        modeling = sys.modules[type(module).__module__]
        weight = module.conv1d.weight.float()[:, 0]
        bias = None if module.conv1d.bias is None else module.conv1d.bias.float()
        if rounded is not None:
            weight = weight.to(rounded).float()
            bias = None if bias is None else bias.to(rounded).float()
        x = modeling.causal_conv1d_fn(
            mixed.transpose(1, 2).contiguous(), weight, bias, activation=module.activation
        ).transpose(1, 2)
        if rounded is not None:
            x = x.to(rounded).float()
        bs, length = x.shape[:2]
        kd, vd = module.key_dim, module.value_dim
        q = x[..., :kd].reshape(bs, length, -1, module.head_k_dim)
        k = x[..., kd : 2 * kd].reshape(bs, length, -1, module.head_k_dim)
        v = x[..., 2 * kd : 2 * kd + vd].reshape(bs, length, -1, module.head_v_dim)
        ratio = module.num_v_heads // module.num_k_heads
        if ratio > 1:
            q, k = q.repeat_interleave(ratio, dim=2), k.repeat_interleave(ratio, dim=2)
        beta = b.sigmoid()
        g = -module.A_log.float().exp() * torch.nn.functional.softplus(a + module.dt_bias.float())
        tf32 = rounded is not None and x.is_cuda
        precision = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
        try:
            out, _ = modeling.torch_chunk_gated_delta_rule(
                q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True
            )
        finally:
            torch.set_float32_matmul_precision(precision)
        return out.float()  # [B, L, HV, V]


CASES["qwen3_next"] = Case(
    "qwen3_next",
    qwen3_next_config,
    ("gdn chunked + recurrent", "gdn decay", "gqa 4 (full attention)"),
    ((16, BF16),),  # the page size is the full-attention layer's only
    switch_off={"gdn decay": _gdn_decay_off},
)


# -- Qwen3.5 (GDN linear attention with 3 value heads per key head + gated full attention) ----


def qwen3_5_config(hidden: int = 256, vocab: int = VOCAB, moe: bool = False) -> Any:
    """Qwen3.5 (dense, or MoE with ``moe``): a gated-delta-rule layer of Qwen3.5-27B's shape
    per key head (K = V = 128, 3 value heads per key head, conv 4; separate q | k | v, z, b,
    a projections) and a gated full-attention layer (GQA 4, head dim 64)."""
    from transformers import Qwen3_5MoeTextConfig, Qwen3_5TextConfig

    experts = dict(
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
    )
    return (Qwen3_5MoeTextConfig if moe else Qwen3_5TextConfig)(
        **_common(
            vocab_size=vocab,
            hidden_size=hidden,
            **(experts if moe else dict(intermediate_size=256)),
            **_gdn_hybrid(k_heads=1, v_heads=3),
        )
    )


CASES["qwen3_5"] = Case(
    "qwen3_5",
    qwen3_5_config,
    ("gdn chunked + recurrent, GVA 3", "gdn decay", "gqa 4 (full attention)"),
    ((16, BF16),),  # the page size is the full-attention layer's only
    switch_off={"gdn decay": _gdn_decay_off},
)


def _gdn_module_inputs(module: Any, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A GDN module's pre-conv ``q | k | v`` channels, z, b and a, as its own forward
    computes them (Qwen3-Next's fused projections and head reordering, or Qwen3.5's
    separate ones)."""
    bs, length = hidden.shape[:-1]
    if hasattr(module, "in_proj_qkvz"):
        q, k, v, z, b, a = module.fix_query_key_value_ordering(
            module.in_proj_qkvz(hidden), module.in_proj_ba(hidden)
        )
        mixed = torch.cat([t.reshape(bs, length, -1) for t in (q, k, v)], dim=-1)
        return mixed, z, b, a
    z = module.in_proj_z(hidden).reshape(bs, length, -1, module.head_v_dim)
    return module.in_proj_qkv(hidden), z, module.in_proj_b(hidden), module.in_proj_a(hidden)


def emulate_gdn(model: Any, act: torch.dtype) -> Callable[[], None]:
    """For the emulated run of the logit bound: every GDN layer's inputs to the conv
    (``q | k | v`` channels, ``a``, ``b``), the conv's output and the layer's output rounded
    to ``act``, the rest fp32 (the module's own torch functions), as attngen's path rounds
    them. Teacher-forced forwards only (no cache). Returns a function restoring the
    modules."""
    saved = []
    for module in model.modules():
        if not (hasattr(module, "A_log") and hasattr(module, "conv1d")):
            continue

        def forward(hidden_states, cache_params=None, attention_mask=None, _m=module, **kwargs):
            assert cache_params is None, "emulate_gdn serves teacher-forced forwards only"
            hidden = hidden_states
            bs, length = hidden.shape[:-1]
            mixed, z, b, a = _gdn_module_inputs(_m, hidden)
            keep = torch.ones(bs, length, 1) if attention_mask is None else attention_mask
            keep = keep.reshape(bs, length, 1).to(hidden.device, torch.float32)
            rnd = lambda t: t.float().to(act).float()  # noqa: E731
            inputs = (rnd(t) * keep for t in (mixed, a, b))
            out = rnd(GdnLayerJudge._reference(_m, *inputs, rounded=act))
            normed = _m.norm(out.reshape(-1, out.shape[-1]), z.reshape(-1, z.shape[-1]))
            return _m.out_proj(normed.reshape(bs, length, -1))

        saved.append((module, module.forward))
        module.forward = forward

    def restore() -> None:
        for module, old in saved:
            module.forward = old

    return restore


# -- DeepSeek-V3.2 (DSA: lightning indexer + sparse MLA) ----

DSA_TOPK = 64  # specs/dsa/dsa_e2e_deepseek_v32.yaml: prompts of 131..203 tokens are sparse


def deepseek_v32_config(
    hidden: int = 256, vocab: int = VOCAB, index_topk: int = DSA_TOPK, layers: int = 2
) -> Any:
    """DeepSeek-V3.2: DeepSeek-V3's MLA at DeepSeek's dims with 16 heads and a q LoRA (the
    indexer reads it), DeepSeek-V3.2's indexer (64 heads x 128, half-split rope on its first
    64 dims, LayerNorm'd key, per-head weights) and a top-``index_topk`` smaller than the
    prompts; yarn rope (mscale); dense MLPs."""
    from transformers import DeepseekV32Config

    return DeepseekV32Config(
        **_common(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=256,
            moe_intermediate_size=64,
            num_hidden_layers=layers,
            num_attention_heads=16,
            num_key_value_heads=16,
            q_lora_rank=64,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
            first_k_dense_replace=layers,  # dense MLPs
            index_topk=index_topk,
            index_n_heads=64,
            index_head_dim=128,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=10000.0,
                factor=4.0,
                original_max_position_embeddings=1024,
                mscale=1.0,
                mscale_all_dim=1.0,
                beta_fast=32.0,
                beta_slow=1.0,
            ),
        )
    )


def hadamard(n: int, device: Any = None) -> torch.Tensor:
    """Orthonormal Hadamard matrix (Sylvester), the rotation DeepSeek-V3.2's fp8 indexer
    applies to q and k (dot products unchanged)."""
    h = torch.ones((1, 1))
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / n**0.5).to(device)


def dsa_index_qkw(module: Any, hidden: torch.Tensor, q_resid: torch.Tensor, cos, sin):
    """The indexer's q ``[B, S, H, D]``, k ``[B, S, D]`` and weights ``[B, S, H]`` exactly as
    transformers' ``DeepseekV32Indexer.forward`` computes them (fp32)."""
    ix = module.indexer
    bs, length = hidden.shape[:2]
    modeling = sys.modules[type(module).__module__]
    q = ix.wq_b(q_resid).view(bs, length, ix.n_heads, ix.head_dim)
    k = ix.k_norm(ix.wk(hidden)).unsqueeze(2)
    r = ix.qk_rope_head_dim
    q_rot, k_rot = modeling.apply_rotary_pos_emb(q[..., :r], k[..., :r], cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q[..., r:]], dim=-1)
    k = torch.cat([k_rot, k[..., r:]], dim=-1).squeeze(2)
    w = ix.weights_proj(hidden).float() * ix.n_heads**-0.5
    return q.float(), k.float(), w


def _fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of the last dim quantized to e4m3 with scale amax / 448: (codes as float, scale)."""
    scale = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / 448.0
    codes = (x / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float()
    return codes, scale.squeeze(-1)


def dsa_scores(module, q, k, w, act: torch.dtype | None, quantized: bool, with_bound=True):
    """Index scores ``[B, S, T]`` in float64 (and the rounding bound of attngen's kernel,
    ``SCORE_ABS_FACTOR`` (fp8) or ``SCORE_ABS_FACTOR_UNSCALED`` x the sum of |terms|):
    transformers' formula ``sum_h w * relu(softmax_scale * q . k)`` on q ``[B, S, H, D]``, k
    ``[B, T, D]``; with ``quantized``, on DeepSeek-V3.2's fp8 inputs (Hadamard-rotated, q
    per (token, head), k rounded to ``act`` then per key) as attngen's fp8 indexer receives
    them, else on q and k as the model computed them (what the unquantized indexer takes)."""
    from attngen.families.dsa.testing import SCORE_ABS_FACTOR, SCORE_ABS_FACTOR_UNSCALED

    scale = float(module.indexer.softmax_scale)
    if quantized:
        rot = hadamard(q.shape[-1], q.device)
        q, q_scale = _fp8_rows(q @ rot)
        k, k_scale = _fp8_rows((k @ rot).to(act).float())
        w = w * q_scale
    else:
        k_scale = torch.ones(k.shape[:2], device=k.device)
    q, k, w, k_scale = (t.double() for t in (q, k, w, k_scale))
    dots = torch.einsum("bshd,btd->bsht", q, k)
    scores = torch.einsum("bsht,bsh->bst", dots.clamp_min(0) * scale, w) * k_scale[:, None]
    if not with_bound:
        return scores, None
    absd = torch.einsum("bshd,btd->bsht", q.abs(), k.abs())
    abs_sum = torch.einsum("bsht,bsh->bst", absd * scale, w.abs()) * k_scale.abs()[:, None]
    return scores, (SCORE_ABS_FACTOR if quantized else SCORE_ABS_FACTOR_UNSCALED) * abs_sum


class DsaLayerJudge(LayerJudge):
    """An attngen DSA observer, per DeepSeek-V3.2 layer call of plain generate:

    - indexer: attngen's top-k positions of every real query row against the top-k of the
      float64 scores of transformers' indexer formula (computed here from the module's
      weights, not by the integration) on the inputs attngen's indexer takes: the fp8
      inputs DeepSeek-V3.2's inference code feeds its fp8 kernel (``quantized``, the
      integration's ``dsa_index_dtype=float8_e4m3fn``), or the model's own q and k (its
      default): equal sets, or picks outside the oracle's set whose oracle score is within
      the kernel's rounding bound of the k-th (``topk_agreement`` <= 1); and, reported
      (``recall``), the share of transformers' own picks that attngen keeps;
    - sparse attention: the layer's output (before o_proj) against the model's eager
      attention on its decompressed q/k/v (fp32) masked to attngen's picks (causal and
      padding too), bounded as ``MlaLayerJudge``'s absorbed path;
    - it records every real position's picks (as padded positions) so that the teacher-
      forced reference can replay them (``replay_dsa``)."""

    def __init__(
        self, kv_dtype: torch.dtype, act: torch.dtype, scale: float = 1.0, quantized: bool = False
    ) -> None:
        super().__init__(kv_dtype, act, scale)
        self.quantized = quantized  # attngen's indexer scores in fp8 (else the model's dtype)
        self.history: dict[int, tuple[torch.Tensor, ...]] = {}
        self.picks: dict[int, dict[tuple[int, int], torch.Tensor]] = {}
        self.kept = [0, 0]  # (transformers' fp32 picks that attngen also picked, all of them)
        self.index_rows = 0  # query rows whose picks were checked
        self.index_ties = 0  # rows whose pick differs from the oracle only at a tie

    @property
    def recall(self) -> float:
        return self.kept[0] / max(self.kept[1], 1)

    def __call__(
        self, module, hidden, q_resid, pos_emb, q_nope, q_rope, latent, k_rope, topk, out, rt
    ) -> None:
        from attngen.families.dsa.testing import topk_agreement

        layer = int(module.layer_idx)
        if layer <= self._last_layer:
            self.step += 1
        self._last_layer = layer
        fwd = rt.generate.forward
        total, q_len = int(fwd.padding_mask.shape[1]), int(hidden.shape[1])
        cos, sin = pos_emb
        q_ix, k_new, w = dsa_index_qkw(module, hidden, q_resid, cos, sin)
        old = self.history.get(layer) if total != q_len else None
        keys = k_new if old is None else torch.cat([old[0], k_new], 1)
        self.history[layer] = (keys,)
        assert keys.shape[1] == total, (keys.shape, total)
        pad = fwd.padding_mask
        real = pad.sum(dim=1).tolist()
        k_top = int(module.indexer.index_topk)
        scores, bound = dsa_scores(module, q_ix, keys, w, self.act, quantized=self.quantized)
        exact, _ = dsa_scores(module, q_ix, keys, w, self.act, quantized=False, with_bound=False)
        rows = fwd.q_rows.tolist()
        topk = topk.cpu()
        picked = torch.zeros((len(real), q_len, total), dtype=torch.bool, device=pad.device)
        failures = []
        for i, r in enumerate(rows):
            b, s = divmod(r, q_len)
            first = total - int(real[b])  # left pads
            t_abs = total - q_len + s  # padded position of this query
            n = t_abs - first + 1  # visible keys (causal, pads excluded)
            got = sorted(int(p) for p in topk[i].tolist() if p >= 0)
            sc = scores[b, s, first : t_abs + 1].cpu()
            bd = bound[b, s, first : t_abs + 1].cpu()
            overlap, worst = topk_agreement(sc, bd, got, k_top)
            self.index_rows += 1
            if worst > 1.0 or len(got) != min(n, k_top):
                failures.append((s, b, overlap, worst, len(got)))
            elif overlap < 1.0:
                self.index_ties += 1
            ex = exact[b, s, first : t_abs + 1].cpu()
            fp32_pick = set(torch.topk(ex, min(n, k_top)).indices.tolist())
            self.kept[0] += len(fp32_pick & set(got))
            self.kept[1] += len(fp32_pick)
            idx = torch.tensor(got, dtype=torch.long) + first
            picked[b, s, idx.to(pad.device)] = True
            self.picks.setdefault(layer, {})[(b, t_abs)] = idx
        index_error = float("inf") if failures else 0.0
        self.records.append(
            LayerRecord(
                self.step,
                layer,
                f"DSA indexer ({'fp8' if self.quantized else 'model dtype'}, top-{k_top}): "
                + (
                    f"{len(failures)} rows pick beyond a tie, first (query {failures[0][0]}, "
                    f"row {failures[0][1]}): overlap {failures[0][2]:.3f}, worst "
                    f"{failures[0][3]:.3g} x bound, {failures[0][4]} picks"
                    if failures
                    else "picks equal up to ties"
                ),
                index_error,
                0.0,
            )
        )
        # sparse absorbed MLA over attngen's picks
        causal = self._mask(pad, q_len, total, None)
        mask = causal.masked_fill(~picked[:, None], torch.finfo(torch.float32).min)
        key, value = module.expand_kv(latent.float(), k_rope.float())
        query = torch.cat([q_nope, q_rope], dim=-1).float()
        ref, _ = eager_of(module)(
            module, query, key, value, mask, scaling=module.scaling, dropout=0.0
        )
        heads, nope = int(module.num_heads), int(module.qk_nope_head_dim)
        wkv = module.kv_b_proj.weight.float().view(heads, nope + int(module.v_head_dim), -1)
        rnd = lambda t: t.float().to(self.act).float()  # noqa: E731
        q_latent = rnd(torch.einsum("bhsn,hnl->bhsl", q_nope.float(), wkv[:, :nope]))
        lat = rnd(latent)
        sc = q_latent @ lat.transpose(-1, -2) + rnd(q_rope) @ rnd(k_rope).transpose(-1, -2)
        probs = torch.softmax(sc * module.scaling + mask, dim=-1)
        emu = torch.einsum("bhsl,hvl->bshv", rnd(probs @ lat), wkv[:, nope:])
        flat = lambda t: t.reshape(-1, t.shape[-2], t.shape[-1]).index_select(0, fwd.q_rows)
        ref, emu, got_out = flat(ref), flat(emu), flat(out.float())
        rms = ref.pow(2).mean().sqrt().item()
        eps = torch.finfo(self.act).eps / 2
        att_bound = LAYER_FACTOR * max((emu - ref).abs().max().item(), eps * rms)
        error = (got_out - ref).abs().max().item()
        if not error == error:
            error = float("inf")
        features = (
            f"DSA sparse MLA over attngen's top-{k_top}, {heads} heads, scaling "
            f"{module.scaling:.4g}"
        )
        self.records.append(LayerRecord(self.step, layer, features, error, att_bound))


def replay_dsa(model: Any, judge: DsaLayerJudge) -> Callable[[], None]:
    """Every DeepSeek-V3.2 indexer of ``model`` returns attngen's recorded picks (padded
    positions; unrecorded rows, pads and the last token, pick themselves), so that teacher-
    forced reference forwards attend the keys attngen attended. ``module.indexer.dense =
    True`` makes one pick every key instead (dense attention). Returns the restore."""
    saved = []
    for module in model.modules():
        if type(module).__name__ != "DeepseekV32Attention":
            continue
        ix, layer = module.indexer, int(module.layer_idx)
        picks = judge.picks.get(layer, {})

        def forward(hidden_states, *args, _ix=ix, _picks=picks, **kwargs):
            bs, length = hidden_states.shape[:2]
            dev = hidden_states.device
            if getattr(_ix, "dense", False):
                return torch.arange(length, device=dev, dtype=torch.int32).expand(bs, length, -1)
            k = int(_ix.index_topk)
            out = torch.arange(length, device=dev)[None, :, None].repeat(bs, 1, k)
            for (b, t), idx in _picks.items():
                if t < length:
                    out[b, t, : len(idx)] = idx.to(dev)
            return out.to(torch.int32)

        saved.append((ix, ix.forward))
        ix.forward = forward
        ix.dense = False
    assert saved, "no DeepSeek-V3.2 attention module"

    def restore() -> None:
        for ix, old in saved:
            ix.forward = old
            ix.dense = False

    return restore


def _dsa_dense(model: Any) -> Callable[[], None]:
    """Sparse top-k off: every query attends every visible key (under ``replay_dsa``)."""
    found = [m.indexer for m in model.modules() if type(m).__name__ == "DeepseekV32Attention"]
    assert found and all(hasattr(ix, "dense") for ix in found), "replay_dsa not installed"
    for ix in found:
        ix.dense = True

    def restore() -> None:
        for ix in found:
            ix.dense = False

    return restore


def top_k_lower_first(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Positions of the ``k`` highest scores along the last dim, equal scores taken lower
    position first: attngen's indexer rule. ``torch.topk`` leaves the order among equal
    scores unspecified; with this rule the reference can differ from attngen's picks only
    where their scores differ, never by tie order."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]


def fp8_indexer(model: Any, act: torch.dtype) -> Callable[[], None]:
    """Every DeepSeek-V3.2 indexer picks its top-k from the fp8 scores DeepSeek-V3.2's
    inference code computes (``dsa_scores(quantized=True)``, float64 sums) instead of
    transformers' fp32 ones; cached keys through transformers' indexer cache. For the greedy
    reference run that attngen's tokens are compared with. Returns the restore."""
    saved = []
    for module in model.modules():
        if type(module).__name__ != "DeepseekV32Attention":
            continue
        ix = module.indexer

        def forward(
            hidden, q_resid, pos_emb, attention_mask, position_ids, past_key_values=None, _m=module
        ):
            cos, sin = pos_emb
            q, k, w = dsa_index_qkw(_m, hidden, q_resid, cos, sin)
            if past_key_values is not None:
                k = past_key_values.update_indexer(k, _m.layer_idx).float()
            scores, _ = dsa_scores(_m, q, k, w, act, quantized=True, with_bound=False)
            scores = scores.float()
            if attention_mask.dtype == torch.bool:
                scores = scores.masked_fill(~attention_mask, float("-inf"))
            else:
                scores = scores + attention_mask
            top = min(int(_m.indexer.index_topk), scores.shape[-1])
            return top_k_lower_first(scores, top).to(torch.int32)

        saved.append((ix, ix.forward))
        ix.forward = forward

    def restore() -> None:
        for ix, old in saved:
            ix.forward = old

    return restore


CASES["deepseek_v32"] = Case(
    "deepseek_v32",
    deepseek_v32_config,
    ("dsa top-64 (indexer in the model's dtype)", "yarn mscale"),
    ((64, BF16),),
    switch_off={"sparse top-64": _dsa_dense, "yarn mscale": _yarn_scale_off},
    post_init=_moderate_mla,
)


# -- exact greedy tokens: cases whose reference has a top-1/top-2 margin at every step ----


def margin_case(case: Case, embed_scale: float) -> Case:
    """``case`` with its input embeddings multiplied by ``embed_scale`` (lm_head untied, so
    the output layer keeps its init): the residual stream is then dominated by the current
    token's embedding and every attention / MLP block adds a smaller share, so the logits'
    top-1/top-2 margins stay O(1) while the deviation a bf16 attention causes shrinks with
    that share. The features stay on (windows shorter than the prompts, softcap, sinks,
    GQA, MLA, GDN, DSA) and the power check still applies: a feature switched off moves the
    logits by the same number of bounds as before (both scale with the share)."""

    def make_config() -> Any:
        cfg = case.make_config()
        cfg.tie_word_embeddings = False
        return cfg

    def post_init(model: Any, gen: torch.Generator) -> None:
        if case.post_init is not None:
            case.post_init(model, gen)
        model.get_input_embeddings().weight.data.mul_(embed_scale)

    return dataclasses.replace(
        case,
        name=f"{case.name}_x{embed_scale:g}",
        make_config=make_config,
        post_init=post_init,
    )


# -- encoder towers (attngen's cache-free non-causal prefill: encoder.py) ----


def siglip_vision_tower(
    head_dim: int, heads: int, seed: int, image_size: int = 40, layers: int = 2
) -> Any:
    """A random-weight SigLIP vision tower (8-pixel patches), eager, fp32."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.SiglipVisionConfig(
        hidden_size=head_dim * heads,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        image_size=image_size,
        patch_size=8,
        num_channels=3,
    )
    model = transformers.SiglipVisionModel(cfg).eval()
    model.set_attn_implementation("eager")
    return model


def bert_encoder(head_dim: int, heads: int, seed: int, layers: int = 2) -> Any:
    """A random-weight BERT encoder (transformers' BertModel: bidirectional self-attention
    under the padding mask), eager, fp32."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=head_dim * heads,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=96,
        max_position_embeddings=512,
    )
    model = transformers.BertModel(cfg).eval()
    model.set_attn_implementation("eager")
    return model


def padded_rows(batch: int, seq: int, seed: int) -> torch.Tensor:
    """A ``[batch, seq]`` padding mask of every kind a tokenizer or a caller makes, cycling
    over the rows: none, left padding, right padding, holes, a single kept token, nothing kept
    (eager attention then averages the row's values)."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, seq, dtype=torch.long)
    for b in range(batch):
        kind = b % 6
        cut = int(torch.randint(1, seq, (1,), generator=gen))
        if kind == 1:
            mask[b, :cut] = 0
        elif kind == 2:
            mask[b, cut:] = 0
        elif kind == 3:
            mask[b] = (torch.rand(seq, generator=gen) < 0.6).long()
        elif kind == 4:
            mask[b] = 0
            mask[b, cut] = 1
        elif kind == 5:
            mask[b] = 0
    return mask


def float64_encoder_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    keys: torch.Tensor | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """[B, Hq, Sq, D] x [B, Hkv, Sk, D] -> [B, Sq, Hq, Dv] in float64. Without ``keys`` every
    key of its row (``causal``: up to the query) is visible: the MHA family's oracle
    (``prefill_ref``) over the rows as B requests. With a ``[B, Sk]`` padding mask ``keys``
    (or keys of another length than the queries: cross-attention), every query (padded ones
    too) attends to its row's kept keys (``causal``: up to it), as transformers' eager
    attention does; a query that sees no kept key gets the mean of its row's values (eager's
    softmax over an all-masked row is uniform)."""
    from attngen.families.mha.reference import prefill_ref
    from attngen.hooks import MaskHooks

    batch, heads, seq, _ = q.shape
    kv_len = k.shape[2]
    if keys is None and kv_len != seq:
        keys = torch.ones(batch, kv_len, dtype=torch.bool)
    if keys is not None:
        group = heads // k.shape[1]
        k64, v64 = (x.double().repeat_interleave(group, 1) for x in (k, v))
        scores = (q.double() @ k64.transpose(-1, -2)) * scale
        kept = keys.to(q.device, torch.bool)[:, None, None, :].expand(batch, 1, seq, kv_len)
        if causal:
            kept = kept & torch.ones(seq, kv_len, dtype=torch.bool, device=q.device).tril()
        probs = torch.softmax(scores.masked_fill(~kept, float("-inf")), dim=-1)
        out = probs @ v64
        empty = ~kept.any(dim=-1, keepdim=True)
        out = torch.where(empty, v64.mean(dim=2, keepdim=True).expand_as(out), out)
        return out.transpose(1, 2)
    rows = lambda x: x.transpose(1, 2).reshape(batch * seq, x.shape[1], x.shape[3])  # noqa: E731
    cu_seqlens = torch.arange(batch + 1, device=q.device) * seq
    hooks = MaskHooks(causal=causal)
    out = prefill_ref(rows(q), rows(k), rows(v), cu_seqlens, scale, mask=hooks)
    return out.view(batch, seq, heads, v.shape[3])


def record_encoder_calls(runtime: Any) -> list[tuple]:
    """(query, key, value, scaling, out, causal) of every cache-free layer call ``runtime``
    serves (encoder layers; causal layers of a model that does not generate)."""
    calls: list[tuple] = []
    attend = runtime.encoder.attend

    def recording(query, key, value, *, scaling, features, rows=None):  # noqa: ANN001, ANN202
        out = attend(query, key, value, scaling=scaling, features=features, rows=rows)
        calls.append((query, key, value, scaling, out, features.causal))
        return out

    runtime.encoder.attend = recording
    return calls


def record_cross_calls(runtime: Any) -> list[tuple]:
    """(query, key, value, scaling, out, keys) of every call ``runtime``'s cross path serves
    (cross-attention, a bidirectional decoder over its cache); ``keys`` the ``[B, Sk]``
    padding of the keys (None: every key)."""
    calls: list[tuple] = []
    attend = runtime.cross.attend

    def recording(module, query, key, value, *, plan, **kw):  # noqa: ANN001, ANN202, ANN003
        out = attend(module, query, key, value, plan=plan, **kw)
        keys = None if plan is None else plan.kept
        calls.append((query, key, value, kw["scaling"], out, keys))
        return out

    runtime.cross.attend = recording
    return calls


def tiny_qwen3(kv_heads: int = 1, vocab: int = 100) -> Any:
    """A 2-layer Qwen3 config (hidden 256, 4 query heads of 64, ``kv_heads`` K/V heads)."""
    import transformers

    return transformers.Qwen3Config(
        **_common(
            hidden_size=256, intermediate_size=256, vocab_size=vocab, num_attention_heads=4,
            num_key_value_heads=kv_heads, head_dim=64,
        )
    )  # fmt: skip


def eager_model(model_class: Any, config: Any, seed: int) -> Any:
    """``model_class(config)`` on transformers' eager attention, in eval mode, its weights
    drawn after ``torch.manual_seed(seed)``."""
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return model_class(config).eval()


# the GPU tests' BART: 8 heads of 64 (d_model 512)
BART_WIDE = dict(
    d_model=512, encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=256,
    decoder_ffn_dim=256, max_position_embeddings=512, vocab_size=VOCAB,
)  # fmt: skip


def bart(seed: int = 0, **sizes: Any) -> Any:
    """A BartForConditionalGeneration on eager attention: 2 encoder and 2 decoder layers of 2
    heads of 64 (d_model 128), vocab 100, unless ``sizes`` say otherwise."""
    import transformers

    settings = dict(
        d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=96, decoder_ffn_dim=96, vocab_size=100,
        max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=2, forced_eos_token_id=None,
    )  # fmt: skip
    settings.update(sizes)
    config = transformers.BartConfig(**settings)
    return eager_model(transformers.BartForConditionalGeneration, config, seed)


def record_crops(runtime: Any) -> list[tuple[int, int]]:
    """(row 0's length before, after) of every forward of ``runtime``'s plain generate that
    dropped cached tokens (transformers cropped its cache: assisted decoding)."""
    crops: list[tuple[int, int]] = []
    state = runtime.generate
    begin = state.begin

    def watching(mask, **kw):  # noqa: ANN001, ANN202, ANN003
        before = list(state.lengths)
        begin(mask, **kw)
        if kw["q_offset"] and state.lengths != before:
            crops.append((before[0], state.lengths[0]))

    state.begin = watching
    return crops


def cache_mirror(checked: list[int]) -> Callable[..., None]:
    """A plain-generate observer (``Runtime.observers``) that compares attngen's paged KV of
    every row, token by token, with the keys and values transformers hands the layer (its
    own cache, past + new, reordered by transformers itself under beam search): bitwise
    equal where attngen's cache holds the activation dtype; appends each layer it checked."""

    def observe(module, query, key, value, kwargs, out, runtime):  # noqa: ANN001, ANN202
        state = runtime.generate
        fwd, ps = state.forward, state.page_size
        k_cache, v_cache = state.pool.get_kv_buffer(module.layer_idx)
        for b, length in enumerate(state.lengths):
            kept = torch.nonzero(fwd.padding_mask[b]).flatten()
            assert kept.numel() == length, (b, kept.numel(), length)
            slots = [state.pages[b][t // ps] * ps + t % ps for t in range(length)]
            for cache, theirs, name in ((k_cache, key, "K"), (v_cache, value, "V")):
                ours = cache.view(-1, *cache.shape[2:])[slots]
                want = theirs[b][:, kept].transpose(0, 1).to(ours.dtype)
                assert torch.equal(ours, want), f"layer {module.layer_idx} row {b}: {name} differs"
        checked.append(module.layer_idx)

    return observe


@dataclass
class EagerRun:
    """One input through an fp32 eager model (``want``), a copy on attngen (``got``, with its
    ``runtime`` and the cache-free layer ``calls`` it recorded) and a copy on transformers'
    eager attention in the same dtype (``eager``)."""

    want: torch.Tensor
    got: torch.Tensor
    eager: torch.Tensor
    runtime: Any
    calls: list[tuple]


def run_against_eager(
    reference: Any,
    inputs: dict[str, torch.Tensor],
    output: str,
    dtype: torch.dtype = torch.float16,
    **options: Any,
) -> EagerRun:
    """``reference`` (fp32, eager) on ``inputs``, and two copies in ``dtype`` on the same
    inputs cast to it: one on attngen (``enable`` with ``options``), one on eager; each run's
    ``output`` field."""
    import copy

    from attngen.integrations import transformers as attngen_tf

    model = copy.deepcopy(reference).to(dtype)
    eager = copy.deepcopy(reference).to(dtype)
    runtime = attngen_tf.enable(model, **options)
    calls = record_encoder_calls(runtime)
    cast = {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}
    with torch.no_grad():
        want = getattr(reference(**inputs), output)
        got = getattr(model(**cast), output)
        theirs = getattr(eager(**cast), output)
    return EagerRun(want, got, theirs, runtime, calls)


def assert_within_eager(run: EagerRun) -> None:
    """attngen's output against the fp32 eager one: finite, and within twice the deviation
    of transformers' own eager run in the same dtype."""
    assert run.got.shape == run.want.shape and torch.isfinite(run.got).all()
    ours = (run.got.float() - run.want).abs().max().item()
    theirs = (run.eager.float() - run.want).abs().max().item()
    assert ours <= 2 * theirs, f"attngen deviates {ours:.3g}, eager in its dtype {theirs:.3g}"


def judge_encoder_tower(
    run: EagerRun,
    out_shape: tuple[int, ...] | None = None,
    keys: torch.Tensor | None = None,
) -> None:
    """Every recorded layer call against float64 attention of its own inputs under the
    padding mask ``keys`` (None: none; causal where the layer is; the kernels' tolerance),
    at every position, padded ones included, its output ``[B, S, Hq, Dv]`` (``out_shape``
    where given); then the model's output (:func:`assert_within_eager`)."""
    from attngen.testing.tolerance import assert_close

    assert run.calls, "no layer ran on attngen's cache-free path"
    for layer, (q, k, v, scale, out, causal) in enumerate(run.calls):
        shape = (q.shape[0], q.shape[2], q.shape[1], v.shape[3])
        assert out_shape in (None, shape), (out_shape, shape)
        assert out.shape == shape and out.dtype == q.dtype, (out.shape, out.dtype)
        want_layer = float64_encoder_attention(q, k, v, scale, keys, causal)
        assert_close(out, want_layer, msg=f"layer {layer}")
    assert_within_eager(run)
