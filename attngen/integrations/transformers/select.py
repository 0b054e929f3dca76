"""Which generated MHA config serves one transformers attention layer.

A layer is described by what transformers hands its attention function: the q/k/v shapes and
the feature kwargs (``sliding_window``, ``softcap``, ``s_aux``). Generated MHA modules fix
their mask hooks per spec (``kernels.HOOKS``) and their shapes per config (``CONFIGS``), so
serving a layer means finding a generated module whose hooks equal the layer's and a config
whose key equals its shape, page size and KV dtype. Backends are tried in the arch's
preference order (``attngen.selection.preference``), page sizes in :data:`PAGE_SIZE_ORDER`
unless the user fixed one.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import lru_cache
import types
from types import ModuleType
from collections.abc import Callable
from typing import Any

import torch

from attngen.hooks import MaskHooks
from attngen.runtime.checks import AttngenInputError
from attngen.runtime.select import GENERATED_PACKAGE, available_specs, load_backend_class
from attngen.spec.enums import TORCH_DTYPE_NAME, MaskKind
from attngen.selection import preference

FAMILY = "mha"
NEEDED_PHASES = ("extend", "decode")
PAGE_SIZE_ORDER = (64, 16, 128, 32, 1)  # auto page size: the first one generated
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


@dataclass(frozen=True)
class LayerFeatures:
    """One attention layer as transformers calls it: shapes and mask/score features."""

    head_dim: int
    v_head_dim: int
    gqa_group: int
    window_left: int | None  # transformers' sliding_window W sees W keys: window_left W - 1
    logit_softcap: float | None
    sinks: bool
    causal: bool = True  # False: an encoder layer (every token sees every token of its row)

    @classmethod
    def of_call(
        cls,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        sliding_window: int | None,
        softcap: float | None,
        s_aux: torch.Tensor | None,
        causal: bool = True,
    ) -> LayerFeatures:
        heads, kv_heads = int(query.shape[1]), int(key.shape[1])
        if kv_heads < 1 or heads % kv_heads:
            raise AttngenInputError(
                f"query heads {heads} are not a multiple of key/value heads {kv_heads}"
            )
        if sliding_window is not None and int(sliding_window) < 1:
            raise AttngenInputError(f"sliding_window: expected >= 1 or None, got {sliding_window}")
        return cls(
            head_dim=int(query.shape[-1]),
            v_head_dim=int(value.shape[-1]),
            gqa_group=heads // kv_heads,
            window_left=None if sliding_window is None else int(sliding_window) - 1,
            logit_softcap=None if not softcap else float(softcap),
            sinks=s_aux is not None,
            causal=causal,
        )

    @property
    def hooks(self) -> MaskHooks:
        return MaskHooks(
            causal=self.causal,
            window_left=self.window_left,
            logit_softcap=self.logit_softcap,
            sinks=self.sinks,
            tree=False,
        )

    def describe(self) -> str:
        """The features, as a failure message names them."""
        parts = []
        if self.window_left is not None:
            parts.append(f"sliding_window={self.window_left + 1}")
        if self.logit_softcap is not None:
            parts.append(f"softcap={self.logit_softcap:g}")
        if self.sinks:
            parts.append("sinks")
        shape = f"head_dim={self.head_dim}, v_head_dim={self.v_head_dim}, gqa={self.gqa_group}"
        return ", ".join(parts or ["causal" if self.causal else "bidirectional"]) + f" ({shape})"


@dataclass(frozen=True)
class Choice:
    """A generated config that serves a layer: its kernels module and its Backend class."""

    arch: str
    backend: str  # attngen kernel backend name
    spec: str
    config: Any  # the kernels module's config (has .uri, .page_size, .kv_scale)
    kernels: ModuleType

    @property
    def backend_class(self) -> type:
        return load_backend_class(self.arch, self.spec, self.backend)

    def describe(self) -> str:
        return f"{self.backend}/{self.spec}/{self.config.uri}"


def choose(
    features: LayerFeatures,
    *,
    arch: str,
    dtype: torch.dtype,
    kv_dtype: torch.dtype,
    page_size: int | None = None,
    backend: str | None = None,
    phases: tuple[str, ...] = NEEDED_PHASES,
) -> Choice:
    """The generated config for ``features`` in a module that generates ``phases``; an error
    naming what to add when there is none."""
    want = dict(
        head_dim=features.head_dim,
        v_head_dim=features.v_head_dim,
        gqa_group=features.gqa_group,
        dtype=dtype_name(dtype),
        kv_dtype=dtype_name(kv_dtype),
        spec_topk=0,
    )
    if kv_dtype in FP8:
        want["kv_scale"] = "per_tensor"  # one scale per K and V tensor (Options.kv_scale)
    if page_size is not None:
        want["page_size"] = page_size
    accept = lambda module: module.HOOKS == features.hooks  # noqa: E731
    choice = best_choice(arch, FAMILY, want, backend=backend, accept=accept, phases=phases)
    if choice is None:
        raise AttngenInputError(_missing(features, arch, want, backend, phases))
    return choice


def remembered_choice(
    choices: dict[tuple[Any, ...], Choice],
    features: LayerFeatures,
    *,
    arch: str,
    dtype: torch.dtype,
    backend: str | None,
    phases: tuple[str, ...],
    page_size: int | None = None,
) -> Choice:
    """:func:`choose` for a layer whose K/V stay in the activation ``dtype`` (no fp8 cache:
    cache-free and cross-attention layers), remembered in ``choices`` per (features, dtype,
    arch, page size)."""
    key = (features, dtype, arch, page_size)
    if key not in choices:
        choices[key] = choose(
            features,
            arch=arch,
            dtype=dtype,
            kv_dtype=dtype,
            page_size=page_size,
            backend=backend,
            phases=phases,
        )
    return choices[key]


def best_choice(
    arch: str,
    family: str,
    want: dict[str, Any],
    *,
    backend: str | None = None,
    accept: Callable[[ModuleType], bool] = lambda module: True,
    page_order: tuple[int, ...] = PAGE_SIZE_ORDER,
    phases: tuple[str, ...] = NEEDED_PHASES,
) -> Choice | None:
    """The generated config of ``family`` on ``arch`` whose fields equal ``want``, in a
    module that generates ``phases`` (by default those generation needs) and that ``accept``
    takes: first by the arch's backend preference, then by ``page_order``, then by spec name.
    None if there is none."""
    order = [b.value for b in preference(arch)]
    found: list[tuple[tuple[int, int, str], Choice]] = []
    for spec, backend_name, module in generated_modules(arch, family):
        if backend is not None and backend_name != backend:
            continue
        if not set(phases) <= set(module.PHASES) or not accept(module):
            continue
        for uri in sorted(module.CONFIGS):
            config = module.CONFIGS[uri]
            if all(getattr(config, k, None) == v for k, v in want.items()):
                page = getattr(config, "page_size", None)
                rank = (
                    order.index(backend_name) if backend_name in order else len(order),
                    page_order.index(page) if page in page_order else len(page_order),
                    spec,
                )
                found.append((rank, Choice(arch, backend_name, spec, config, module)))
    return min(found, key=lambda item: item[0])[1] if found else None


@lru_cache(maxsize=None)
def generated_modules(arch: str, family: str) -> tuple[tuple[str, str, ModuleType], ...]:
    """Every importable generated kernels module of ``family`` on ``arch``:
    (spec, backend, module)."""
    modules = []
    for spec, places in sorted(available_specs(arch).items()):
        for backend_name, place_family in places:
            if place_family != family:
                continue
            path = f"{GENERATED_PACKAGE}.{arch}.{backend_name}.{family}.{spec}.kernels"
            try:
                modules.append((spec, backend_name, importlib.import_module(path)))
            except ImportError:  # a backend whose DSL is not installed here
                continue
    return tuple(modules)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _missing(
    features: LayerFeatures, arch: str, want: dict, backend: str | None, phases: tuple[str, ...]
) -> str:
    on = f" on backend {backend}" if backend else ""
    fields = " ".join(f"{k}={v}" for k, v in want.items())
    same_hooks = sorted(
        f"{spec} ({b})"
        for spec, b, module in generated_modules(arch, FAMILY)
        if module.HOOKS == features.hooks and set(phases) <= set(module.PHASES)
    )
    hint = (
        f"specs with these mask hooks: {', '.join(same_hooks)}"
        if same_hooks
        else "no generated spec has these mask hooks"
    )
    head = (
        f"no generated MHA config{on} for {arch} serves a layer with {features.describe()} "
        f"and {fields}; {hint}"
    )
    suggestion = spec_yaml(features, arch, want, backend, phases)
    refused = _validate_text(suggestion)
    if refused is not None:  # no spec can serve it yet: say why instead of one that fails
        return (
            f"{head}. No attngen lowering serves it yet (a spec for it fails validate: {refused})"
        )
    return (
        f"{head}. Add a spec that does, e.g. specs/mha/<name>.yaml:\n{suggestion}\nand run "
        "`make generate`"
    )


def _validate_text(yaml_text: str) -> str | None:
    """The validate error of a spec text (without its file:line), or None if it passes."""
    import tempfile
    from pathlib import Path

    from attngen.spec.errors import SpecError
    from attngen.spec.loader import load_spec
    from attngen.validate import validate

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mha_suggested.yaml"
        path.write_text(yaml_text.replace("mha_<name>", "mha_suggested") + "\n")
        try:
            validate(load_spec(path))
        except SpecError as err:
            return f"{err.field}: {err.message}" if err.field else err.message
    return None


def spec_yaml(
    features: LayerFeatures,
    arch: str,
    want: dict,
    backend: str | None,
    phases: tuple[str, ...] = NEEDED_PHASES,
) -> str:
    """A spec (YAML) that generates the config ``want`` for a layer with ``features``, with
    ``phases`` (a cache-free encoder spec, ``[prefill]``, has no ``kv_cache`` section)."""
    spelling = {torch_name: dtype.value for dtype, torch_name in TORCH_DTYPE_NAME.items()}
    lines = [
        "name: mha_<name>",
        "family: mha",
        f"description: {features.describe()}",
        f"phases: [{', '.join(phases)}]",
        f"dtype: {spelling[want['dtype']]}",
        "heads:",
        f"  head_dim: {features.head_dim}",
    ]
    if features.v_head_dim != features.head_dim:
        lines.append(f"  v_head_dim: {features.v_head_dim}")
    lines.append(f"  gqa_group: {features.gqa_group}")
    if set(phases) != {"prefill"}:  # the phases that read a KV cache
        lines += ["kv_cache:", f"  page_size: [{want.get('page_size', PAGE_SIZE_ORDER[0])}]"]
        if want["kv_dtype"] != want["dtype"]:
            lines += [f"  dtype: {spelling[want['kv_dtype']]}", f"  scale: {want['kv_scale']}"]
    if not features.causal:
        kind = MaskKind.NONE
    elif features.window_left is not None:
        kind = MaskKind.SLIDING_WINDOW
    else:
        kind = MaskKind.CAUSAL
    lines += ["mask:", f"  kind: {kind.value}"]
    if features.window_left is not None:
        lines.append(f"  window_left: {features.window_left}")
    if features.logit_softcap is not None:
        lines.append(f"  logit_softcap: {features.logit_softcap!r}")
    if features.sinks:
        lines.append("  sinks: true")
    lines += ["targets:", f"  {backend or 'triton'}: [{arch}]"]
    return "\n".join(lines)


def patch_attention(
    model: Any, classes: frozenset[str] | set[str] | tuple[str, ...], runtime: Any, name: str,
    family_forward: Callable[..., Any],
) -> int:  # fmt: skip
    """Give every module of ``model`` whose class name is in ``classes`` a forward that runs
    ``family_forward(module, runtime, hidden_states, position_embeddings, past_key_values)``
    while the model's attention implementation is ``name``, and the module's own forward
    otherwise (re-patching keeps the first original); returns how many were patched."""
    count = 0
    for module in model.modules():
        if type(module).__name__ not in classes:
            continue
        original = getattr(module, "_attngen_original_forward", None) or module.forward
        module._attngen_original_forward = original
        forward = _attention_forward(original, runtime, name, family_forward)
        module.forward = types.MethodType(forward, module)
        count += 1
    return count


def _attention_forward(
    original: Any, runtime: Any, name: str, family_forward: Callable[..., Any]
) -> Any:
    def forward(
        module: Any,
        hidden_states: Any,
        position_embeddings: Any,
        attention_mask: Any,
        past_key_values: Any = None,
        **kwargs: Any,
    ) -> Any:
        if module.config._attn_implementation != name:  # by keyword: modules order them
            return original(  # differently (DeepSeek-V2: mask, cache, then position_embeddings)
                hidden_states=hidden_states,
                position_embeddings=position_embeddings,
                attention_mask=attention_mask,
                past_key_values=past_key_values,
                **kwargs,
            )
        return family_forward(module, runtime, hidden_states, position_embeddings, past_key_values)

    return forward
