"""attngen as a transformers attention implementation.

    from attngen.integrations import transformers as attngen_tf

    attngen_tf.enable(model, page_size=16)           # or kv_cache_dtype=torch.float8_e4m3fn
    model.generate(**inputs)                         # attngen kernels, attngen's own paged cache
    model.generate_batch(prompts, ...)               # continuous batching on transformers' cache

``enable`` registers two attention implementations and a mask function with transformers
and switches the model to ``"attngen"``: plain ``generate()`` then runs attngen's generated
MHA backends over attngen's own paged KV pool (``generate.py``). Continuous batching
switches the model to ``"paged|attngen"``, which reads transformers' paged cache through
``read_index`` / ``write_index`` (``paged.py``). Each layer is served by the generated
config whose mask hooks and shapes match what the model passes (``select.py``: sliding
window, logit softcap, attention sinks, GQA group, head dims); a layer that no generated
spec serves fails with what to add. DeepSeek-V3 attention modules (MLA) get a forward that
runs attngen's absorbed MLA over its latent pool in plain ``generate()`` (``mla.py``);
Qwen3-Next and Qwen3.5 linear-attention modules (GDN) one that runs attngen's conv and gated
delta rule over its request state pool (``gdn.py``); DeepSeek-V3.2 attention modules (DSA)
one that runs attngen's fp8 lightning indexer and sparse MLA with the module's own indexer
weights (``dsa.py``).

The registered mask function does not build a mask: it returns a description of the mask
transformers asks each layer type for (``masks.py``: causal, a sliding window, a chunk
size, bidirectional), and the attention function serves the layer with that window (also
when the layer passes no ``sliding_window``, as Qwen2-MoE's and PhiMoE's sliding layers do)
or refuses it, naming the layer, where attngen's kernels cannot apply the mask. Non-causal
layers with no mask (vision towers) or a bidirectional padding mask over their own tokens
(text encoders: BERT, SigLIP's text tower) run the cache-free prefill of ``encoder.py``, and
so do the plain causal layers of a model that does not generate (``Runtime.cache_free``:
CLIP's text tower, base models, classifiers), under any padding. Non-causal layers over
other keys (the cross-attention of encoder-decoder models such as BART and Whisper, a
decoder run with ``is_causal=False`` past its first forward) run decode requests over the
keys each row keeps (``cross.py``). Refused are non-causal attention under any other mask
or a window, packed sequences, ``or_mask_function``
overlays, custom 4-D masks, masks the model computes with, chunked attention past the first
chunk (Llama-4), a ``sliding_window`` its mask does not apply. ``enable`` refuses a model
whose attention does not go through transformers' AttentionInterface (Falcon, Bloom, MPT:
attngen would never run).

``observers`` (a list on the :class:`Runtime`) are called after every plain-generate layer
with ``(module, query, key, value, kwargs, output, runtime)``: tests use it to judge each
layer against the model's own eager attention; ``mla_observers``, ``gdn_observers`` and
``dsa_observers`` after every MLA / GDN / DSA layer of plain generate (see ``mla.py``,
``gdn.py``, ``dsa.py``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from attngen.integrations.transformers import dsa, gdn, masks, mla
from attngen.integrations.transformers.cross import CrossState, KeyPlan
from attngen.integrations.transformers.encoder import EncoderState, RowPlan
from attngen.integrations.transformers.generate import GenerateState, left_padded, move_pages
from attngen.integrations.transformers.masks import LayerMask
from attngen.integrations.transformers.options import Options
from attngen.integrations.transformers.paged import PagedState, layer_window
from attngen.integrations.transformers.select import LayerFeatures, choose
from attngen.runtime.checks import AttngenInputError

NAME = "attngen"
PAGED_NAME = "paged|attngen"
__all__ = ["NAME", "PAGED_NAME", "Options", "Runtime", "LayerFeatures", "choose", "enable"]

_RUNTIMES: dict[int, "Runtime"] = {}  # id(model config) -> the model's runtime


class Runtime:
    """attngen's state for one model: options, plain-generate cache, paged choices."""

    def __init__(self, config: Any, options: Options) -> None:
        self.options = options
        self.config = config
        num_layers = _num_layers(config)
        self.generate = GenerateState(options, num_layers)
        self.paged = PagedState(options)
        self.mla = mla.MlaGenerate(options, self.generate)  # DeepSeek-V3 layers (mla.py)
        self.gdn = gdn.GdnGenerate(options, self.generate)  # Qwen3-Next, Qwen3.5 linear layers
        self.dsa = dsa.DsaGenerate(options, self.generate)  # DeepSeek-V3.2 layers (dsa.py)
        self.encoder = EncoderState(options)  # cache-free layers (encoder.py)
        # non-causal layers over other keys: cross-attention, a bidirectional decoder's cache
        self.cross = CrossState(options, num_layers)
        # a model that does not generate (an encoder, a classifier, a reward model, CLIP's
        # text tower): its plain causal layers run cache-free too (set by enable)
        self.cache_free = False
        self.model_name = ""
        self.observers: list[Callable[..., None]] = []
        self.mla_observers: list[Callable[..., None]] = []
        self.gdn_observers: list[Callable[..., None]] = []
        self.dsa_observers: list[Callable[..., None]] = []

    def reorder(self, beam_idx: torch.Tensor) -> None:
        """Beam search's reorder between two forwards (row ``b`` continues from row
        ``beam_idx[b]``), in every cache attngen keeps for plain generate: the KV, latent
        and index-key pages, the GDN states. The cross path's keys need none: transformers
        reorders its cross cache into new tensors, which the cross path writes again."""
        moved = self.generate.reorder(beam_idx)
        if moved is not None:
            for pool in (self.generate.pool, self.mla.pool, self.dsa.pool, self.dsa.index_pool):
                move_pages(pool, *moved)
        self.gdn.reorder(beam_idx)


def _patch_reorder(model: torch.nn.Module, runtime: Runtime) -> None:
    """Beam search reorders the model's cache between forwards through the model's
    ``_reorder_cache`` when it has one, else the cache's ``reorder_cache``: give the model
    one that reorders attngen's caches too (attngen's rows stayed in place before, and the
    beams continued from the wrong rows)."""
    original = getattr(model, "_attngen_original_reorder", None)
    if original is None:
        original = getattr(model, "_reorder_cache", None) or _reorder_transformers_cache
        model._attngen_original_reorder = original

    def reorder(past_key_values: Any, beam_idx: torch.Tensor) -> Any:
        if model.config._attn_implementation == NAME:
            runtime.reorder(beam_idx)
        return original(past_key_values, beam_idx)

    model._reorder_cache = reorder


def _reorder_transformers_cache(past_key_values: Any, beam_idx: torch.Tensor) -> Any:
    """What generate does without a model ``_reorder_cache``."""
    if not hasattr(past_key_values, "reorder_cache"):
        raise AttngenInputError(
            f"beam search over a {type(past_key_values).__name__}, which cannot be reordered"
        )
    past_key_values.reorder_cache(beam_idx)
    return past_key_values


def _num_layers(config: Any) -> int:
    """Layer indices the model's attention modules use: an encoder-decoder config's
    ``num_hidden_layers`` names its encoder's (BART, Whisper), its decoder may have more."""
    names = ("num_hidden_layers", "decoder_layers", "num_decoder_layers", "encoder_layers")
    return max(int(getattr(config, n, 0) or 0) for n in names)


def enable(model: torch.nn.Module, **options: Any) -> Runtime:
    """Register attngen with transformers and switch ``model`` to it; ``options`` are
    :class:`Options` fields. Returns the model's :class:`Runtime` (a second call replaces it)."""
    register()
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else None
    runtime = Runtime(config or model.config, Options(**options))
    runtime.cache_free = not _generates(model)
    runtime.model_name = type(model).__name__
    # every config a module reads: a dual encoder's (CLIP, SigLIP) towers have their own
    configs = [model.config, config] + [getattr(m, "config", None) for m in model.modules()]
    for cfg in {id(c): c for c in configs if hasattr(c, "_attn_implementation")}.values():
        _RUNTIMES[id(cfg)] = runtime
    model.set_attn_implementation(NAME)
    if (config or model.config)._attn_implementation != NAME:
        # transformers only warns: the model's attention code does not go through its
        # AttentionInterface (e.g. Falcon, Bloom, MPT), so attngen would never run
        raise AttngenInputError(
            f"{type(model).__name__} does not run its attention through transformers' "
            "AttentionInterface, so attngen cannot serve it (its implementation stayed "
            f"{(config or model.config)._attn_implementation!r})"
        )
    mla.patch(model, runtime, NAME)
    gdn.patch(model, runtime, NAME)
    dsa.patch(model, runtime, NAME)
    _patch_reorder(model, runtime)
    return runtime


def _generates(model: torch.nn.Module) -> bool:
    """Whether ``model`` decodes with a KV cache (``generate``, continuous batching)."""
    can_generate = getattr(model, "can_generate", None)
    return bool(can_generate()) if callable(can_generate) else True


def register() -> None:
    """Make ``"attngen"`` and ``"paged|attngen"`` known to transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention)
    AttentionInterface.register(PAGED_NAME, attention)
    AttentionMaskInterface.register(NAME, padding_mask)


def runtime_of(config: Any) -> Runtime:
    runtime = _RUNTIMES.get(id(config))
    if runtime is None:
        raise AttngenInputError(
            "this model has no attngen runtime: call "
            "attngen.integrations.transformers.enable(model) first"
        )
    return runtime


def padding_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    attention_mask: torch.Tensor | None = None,
    config: Any = None,
    device: Any = None,
    mask_function: Callable[..., Any] | None = None,
    **kwargs: Any,
) -> LayerMask:
    """The mask function registered for ``"attngen"``: hands the 2-D padding mask and the
    cached length to attngen's per-forward bookkeeping and returns, instead of a mask tensor,
    a :class:`~attngen.integrations.transformers.masks.LayerMask`: the kernels apply
    causality and windows themselves, and the layers that get it check that they can
    (``masks.py``: a chunked, bidirectional or custom mask is refused, not served as causal)."""
    offset, kv_offset = _host_int(q_offset), _host_int(kv_offset)
    generate = runtime_of(config).generate
    pattern = masks.classify(mask_function)
    if pattern.bidirectional:
        return _bidirectional(pattern, mask_function, attention_mask, batch_size, q_length,
                              kv_length, offset, kv_offset)  # fmt: skip
    if pattern.refused is not None:
        # no layer is served under it (a layer that uses it is refused), so it does not start
        # or restart the forward's bookkeeping: BartForCausalLM asks every forward for an
        # unused bidirectional cross-attention mask of other lengths and no cache
        return LayerMask(pattern, mask_function, generate.forward)
    runtime = runtime_of(config)
    begin = dict(
        batch_size=int(batch_size),
        q_length=int(q_length),
        q_offset=offset,
        device=device if device is not None else "cpu",
    )
    # a first forward padded other than on the left (scoring a right-padded batch) is served
    # cache-free as a model that does not generate is; generating on from it is refused
    scoring = offset == 0 and int(kv_length) == int(q_length) and not left_padded(attention_mask)
    if not runtime.cache_free and not scoring:
        generate.begin(attention_mask, **begin)
        return LayerMask(pattern, mask_function, generate.forward)
    if offset or int(kv_length) != int(q_length):
        refused = masks.MaskPattern(
            refused=f"a forward over {int(kv_length) - int(q_length)} cached tokens in "
            f"{runtime.model_name}, which does not generate: attngen serves such a model "
            "cache-free (enable attngen on a model class that generates to decode with a cache)"
        )
        return LayerMask(refused, mask_function, None)
    # windowed, chunked, sink and MLA / GDN / DSA layers still take the plain-generate path:
    # its bookkeeping starts as usual, and what it refuses (a batch that is not left-padded)
    # is raised by the layers that take it
    generate.begin_or_defer(attention_mask, **begin)
    plain = pattern.window is None and pattern.chunk is None
    rows = (
        RowPlan.of(attention_mask, int(batch_size), int(q_length), causal=True) if plain else None
    )
    return LayerMask(pattern, mask_function, generate.forward, rows, cache_free=plain)


def _host_int(x: Any) -> int:
    """An offset transformers passes as an int or a one-element tensor (a static cache's)."""
    return int(x.item()) if isinstance(x, torch.Tensor) else int(x)


def _bidirectional(
    pattern: masks.MaskPattern,
    mask_function: Callable[..., Any] | None,
    attention_mask: torch.Tensor | None,
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int,
    kv_offset: int,
) -> LayerMask:
    """An encoder's self-attention mask (``create_bidirectional_mask``): the padding mask's
    :class:`~attngen.integrations.transformers.encoder.RowPlan` for the encoder path. Over
    other keys (cross-attention: the encoder's; a decoder run with ``is_causal=False`` past
    its first forward: the cache's), the :class:`~attngen.integrations.transformers.cross.
    KeyPlan` of the keys each row keeps, for the cross path."""
    if q_offset or kv_offset or int(kv_length) != int(q_length):
        keys = KeyPlan.of(attention_mask, int(batch_size), int(q_length), int(kv_length))
        return LayerMask(pattern, mask_function, None, keys=keys)
    rows = RowPlan.of(attention_mask, int(batch_size), int(q_length), causal=False)
    return LayerMask(pattern, mask_function, None, rows, cache_free=True)


def attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The attention function of both registered names: ``[B, Sq, H, Dv]``, no weights. A
    layer attngen cannot serve as transformers would run it fails with an error that names
    the layer."""
    try:
        return _attention(
            module, query, key, value, attention_mask, scaling, dropout, sliding_window,
            softcap, s_aux, kwargs,
        )  # fmt: skip
    except AttngenInputError as error:
        raise AttngenInputError(f"{layer_name(module)}: {error}") from None


def layer_name(module: torch.nn.Module) -> str:
    """``layer 3 (Qwen3Attention)``, as errors name a layer."""
    index = getattr(module, "layer_idx", None)
    return f"layer {index} ({type(module).__name__})"


def _attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None,
    dropout: float,
    sliding_window: int | None,
    softcap: float | None,
    s_aux: torch.Tensor | None,
    kwargs: dict[str, Any],
) -> tuple[torch.Tensor, None]:
    if dropout:
        raise AttngenInputError(
            f"attngen serves inference only: dropout={dropout} (call model.eval())"
        )
    if kwargs.get("indices") is not None:
        raise AttngenInputError("sparse attention indices (DSA) are not served by this path")
    paged = kwargs.get("cache") is not None  # continuous batching: transformers' paged cache
    bidirectional = isinstance(attention_mask, LayerMask) and attention_mask.pattern.bidirectional
    unmasked_or_padded = attention_mask is None or bidirectional
    # every query of a row over the keys the row keeps, keys not the forward's own tokens
    over_keys = (
        not paged
        and _non_causal(module, kwargs)
        and (
            (attention_mask is None and key.shape[-2] != query.shape[-2])
            or (bidirectional and attention_mask.keys is not None)
        )
    )
    encoder = not paged and not over_keys and unmasked_or_padded and _non_causal(module, kwargs)
    cache_free_causal = (
        not paged
        and isinstance(attention_mask, LayerMask)
        and attention_mask.cache_free
        and not attention_mask.pattern.bidirectional
        and not _non_causal(module, kwargs)
        and s_aux is None
    )
    _refuse_unserved(module, kwargs, paged, encoder or over_keys)
    runtime = runtime_of(module.config)
    if scaling is None:
        scaling = float(query.shape[-1]) ** -0.5
    if over_keys:  # cross-attention (cross.py): decode requests over the kept keys
        if sliding_window is not None:
            raise AttngenInputError(
                f"a non-causal layer with sliding_window={sliding_window} over other keys: "
                "attngen's cross-attention path attends to every key the mask keeps"
            )
        # decode attention over a request's whole KV: the causal spec's decode kernel
        features = LayerFeatures.of_call(query, key, value, None, softcap, s_aux, causal=True)
        plan = attention_mask.keys if attention_mask is not None else None
        out = runtime.cross.attend(
            module, query, key, value, scaling=scaling, features=features, plan=plan, sinks=s_aux
        )
        return out, None
    if encoder:  # a vision tower's layer: no mask, no cache (encoder.py)
        if sliding_window is not None:
            raise AttngenInputError(
                f"a non-causal layer with sliding_window={sliding_window}: attngen's encoder "
                "kernels attend over the whole row"
            )
        features = LayerFeatures.of_call(query, key, value, None, softcap, s_aux, causal=False)
        rows = attention_mask.rows if bidirectional else None
        out = runtime.encoder.attend(
            query, key, value, scaling=scaling, features=features, rows=rows
        )
        return out, None
    if cache_free_causal:  # a causal layer of a model that does not generate (encoder.py)
        _window(sliding_window, None)  # a window the mask does not apply is refused
        features = LayerFeatures.of_call(query, key, value, None, softcap, None, causal=True)
        missing = runtime.encoder.missing(features, query)
        if missing is not None and runtime.generate.forward is None:
            raise missing
        if missing is None:
            out = runtime.encoder.attend(
                query, key, value, scaling=scaling, features=features, rows=attention_mask.rows
            )
            return out, None
        # no prefill spec serves the layer (only extend / decode specs do): the
        # plain-generate path serves this left-padded batch
    if paged:
        if attention_mask is not None:
            raise AttngenInputError(_custom_mask(attention_mask))
        window = layer_window(module, kwargs["cache"], sliding_window)
        features = LayerFeatures.of_call(query, key, value, window, softcap, s_aux)
        out = runtime.paged.attend(
            module,
            query,
            key,
            value,
            scaling=scaling,
            features=features,
            sinks=s_aux,
            cache=kwargs["cache"],
            read_index=kwargs["read_index"],
            write_index=kwargs["write_index"],
            cu_seq_lens_q=kwargs["cu_seq_lens_q"],
            cu_seq_lens_k=kwargs["cu_seq_lens_k"],
            max_seqlen_q=_either(kwargs, "max_seqlen_q", "max_length_q"),
            max_seqlen_k=_either(kwargs, "max_seqlen_k", "max_length_k"),
        )
        return out, None
    mask = _layer_mask(attention_mask, runtime)
    window = _window(sliding_window, mask.pattern.window)
    if mask.pattern.chunk is not None:
        runtime.generate.check_within_chunk(mask.pattern.chunk)
    features = LayerFeatures.of_call(query, key, value, window, softcap, s_aux)
    out = runtime.generate.attend(
        module, query, key, value, scaling=scaling, features=features, sinks=s_aux
    )
    for observe in runtime.observers:
        features_kw = dict(sliding_window=sliding_window, softcap=softcap, s_aux=s_aux)
        observe(
            module,
            query,
            key,
            value,
            dict(kwargs, scaling=scaling, attention_mask=mask, **features_kw),
            out,
            runtime,
        )
    return out, None


def _non_causal(module: torch.nn.Module, kwargs: dict[str, Any]) -> bool:
    """The call's ``is_causal`` where it passes one (CLIP's text tower passes True to a module
    whose flag, shared with the vision tower, is False), else the module's, as transformers'
    sdpa attention reads them."""
    if kwargs.get("is_causal") is not None:
        return kwargs["is_causal"] is False
    return getattr(module, "is_causal", True) is False


def _refuse_unserved(
    module: torch.nn.Module, kwargs: dict[str, Any], paged: bool, served: bool
) -> None:
    """Call arguments (and module flags) that change what attention computes and that
    attngen's kernels do not apply: refused, not ignored. ``served``: a non-causal layer
    without a mask, or under a bidirectional padding mask, which the encoder or cross path
    serves."""
    if _non_causal(module, kwargs) and not served:
        raise AttngenInputError(
            "non-causal attention under a mask other than a bidirectional padding mask "
            "(is_causal=False, e.g. use_bidirectional_attention): attngen serves non-causal "
            "layers with no mask or a padding mask only (encoders, vision towers, "
            "cross-attention)"
        )
    for name, what in (
        ("position_bias", "an additive position bias"),
        ("block_indices", "block-sparse attention indices"),
    ):
        if kwargs.get(name) is not None:
            raise AttngenInputError(f"{what} ({name}): attngen's kernels do not apply it")
    if not paged and kwargs.get("cu_seq_lens_q") is not None:
        raise AttngenInputError(
            "packed sequences (cu_seq_lens_q / cu_seq_lens_k): attngen's plain-generate path "
            "serves one sequence per row of the padded batch"
        )


def _layer_mask(attention_mask: Any, runtime: Runtime) -> LayerMask:
    """The layer's mask as attngen's mask function described it this forward."""
    if not isinstance(attention_mask, LayerMask):
        if attention_mask is None:
            raise AttngenInputError(
                "the layer got no mask from attngen's mask function this forward (the model "
                "did not build it with transformers' create_*_mask functions); attngen cannot "
                "tell which mask the layer needs"
            )
        raise AttngenInputError(_custom_mask(attention_mask))
    if attention_mask.pattern.refused is not None:
        raise AttngenInputError(
            f"transformers built this layer {attention_mask.pattern.refused}; attngen's "
            "kernels apply causal masks with an optional sliding window only"
        )
    if attention_mask.pattern.bidirectional:
        raise AttngenInputError(
            "transformers built this layer a bidirectional mask but the layer does not say it "
            "is non-causal (is_causal): attngen serves bidirectional masks on non-causal "
            "layers only"
        )
    if attention_mask.forward is not runtime.generate.forward:
        raise AttngenInputError(
            "the layer's mask was built for an earlier forward (masks reused across "
            "forwards are not served: attngen's bookkeeping is per forward)"
        )
    return attention_mask


def _custom_mask(attention_mask: Any) -> str:
    shape = list(attention_mask.shape) if hasattr(attention_mask, "shape") else None
    what = f"{type(attention_mask).__name__}" + (f" of shape {shape}" if shape else "")
    return (
        f"the layer got an attention mask attngen did not build ({what}: a custom mask "
        "passed to the model, or one the layer made itself); attngen's kernels cannot "
        "express it"
    )


def _window(sliding_window: int | None, mask_window: int | None) -> int | None:
    """The layer's window: what its mask applies; the ``sliding_window`` it passes must agree
    (eager and sdpa apply the mask, flash attention the argument)."""
    if sliding_window is None or mask_window == int(sliding_window):
        return mask_window
    if mask_window is None:
        raise AttngenInputError(
            f"the layer passes sliding_window={sliding_window} but transformers built it a "
            "mask without that window; attngen cannot tell which one the model means"
        )
    raise AttngenInputError(
        f"the layer passes sliding_window={sliding_window} but transformers built it a mask "
        f"with a window of {mask_window} keys"
    )


def _either(kwargs: dict[str, Any], name: str, other: str) -> Any:
    """transformers renamed some continuous-batching kwargs between releases."""
    return kwargs[name] if name in kwargs else kwargs[other]
