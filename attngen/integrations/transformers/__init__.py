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
Qwen3-Next linear-attention modules (GDN) one that runs attngen's conv and gated delta rule
over its request state pool (``gdn.py``); DeepSeek-V3.2 attention modules (DSA) one that runs
attngen's fp8 lightning indexer and sparse MLA with the module's own indexer weights
(``dsa.py``).

``observers`` (a list on the :class:`Runtime`) are called after every plain-generate layer
with ``(module, query, key, value, kwargs, output, runtime)``: tests use it to judge each
layer against the model's own eager attention; ``mla_observers``, ``gdn_observers`` and
``dsa_observers`` after every MLA / GDN / DSA layer of plain generate (see ``mla.py``,
``gdn.py``, ``dsa.py``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from attngen.integrations.transformers import dsa, gdn, mla
from attngen.integrations.transformers.generate import GenerateState
from attngen.integrations.transformers.options import Options
from attngen.integrations.transformers.paged import PagedState
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
        self.generate = GenerateState(options, int(config.num_hidden_layers))
        self.paged = PagedState(options)
        self.mla = mla.MlaGenerate(options, self.generate)  # DeepSeek-V3 layers (mla.py)
        self.gdn = gdn.GdnGenerate(options, self.generate)  # Qwen3-Next linear layers (gdn.py)
        self.dsa = dsa.DsaGenerate(options, self.generate)  # DeepSeek-V3.2 layers (dsa.py)
        self.observers: list[Callable[..., None]] = []
        self.mla_observers: list[Callable[..., None]] = []
        self.gdn_observers: list[Callable[..., None]] = []
        self.dsa_observers: list[Callable[..., None]] = []


def enable(model: torch.nn.Module, **options: Any) -> Runtime:
    """Register attngen with transformers and switch ``model`` to it; ``options`` are
    :class:`Options` fields. Returns the model's :class:`Runtime` (a second call replaces it)."""
    register()
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else None
    runtime = Runtime(config or model.config, Options(**options))
    for cfg in {id(c): c for c in (model.config, config) if c is not None}.values():
        _RUNTIMES[id(cfg)] = runtime
    mla.patch(model, runtime, NAME)
    gdn.patch(model, runtime, NAME)
    dsa.patch(model, runtime, NAME)
    model.set_attn_implementation(NAME)
    return runtime


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
    **kwargs: Any,
) -> None:
    """The mask function registered for ``"attngen"``: hands the 2-D padding mask and the
    cached length to attngen's per-forward bookkeeping; the kernels apply causality and
    windows themselves, so the layers get no mask (None)."""
    offset = int(q_offset) if not isinstance(q_offset, torch.Tensor) else int(q_offset.item())
    runtime_of(config).generate.begin(
        attention_mask,
        batch_size=int(batch_size),
        q_length=int(q_length),
        q_offset=offset,
        device=device if device is not None else "cpu",
    )
    return None


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
    """The attention function of both registered names: ``[B, Sq, H, Dv]``, no weights."""
    if dropout:
        raise AttngenInputError(f"attngen serves inference only: dropout={dropout}")
    if kwargs.get("indices") is not None:
        raise AttngenInputError("sparse attention indices (DSA) are not served by this path")
    runtime = runtime_of(module.config)
    features = LayerFeatures.of_call(query, key, value, sliding_window, softcap, s_aux)
    if scaling is None:
        scaling = float(query.shape[-1]) ** -0.5
    if kwargs.get("cache") is not None:  # continuous batching: transformers' paged cache
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
    out = runtime.generate.attend(
        module, query, key, value, scaling=scaling, features=features, sinks=s_aux
    )
    for observe in runtime.observers:
        features_kw = dict(sliding_window=sliding_window, softcap=softcap, s_aux=s_aux)
        observe(
            module, query, key, value, dict(kwargs, scaling=scaling, **features_kw), out, runtime
        )
    return out, None


def _either(kwargs: dict[str, Any], name: str, other: str) -> Any:
    """transformers renamed some continuous-batching kwargs between releases."""
    return kwargs[name] if name in kwargs else kwargs[other]
