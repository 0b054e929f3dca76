"""The product axes as structure: families, backends, and the (family, backend) lowerings.

Three kinds of package register themselves here when :func:`load` imports them:

- a **family** (``attngen/families/<family>/``): its sections of the spec language, the
  docs columns it reports, its plainest variant, and the hardware its variants need whatever
  the backend (:class:`FamilyInfo`);
- a **backend** (``attngen/backends/<backend>/``): the archs its kernels can exist on and its
  ahead-of-time compile check (:class:`BackendInfo`);
- a **lowering** (``attngen/families/<family>/<backend>/``): what that pair can run and how
  to lower and emit it (:class:`Lowering`).

Spine code asks this module and never names a family or a backend. A pair with no lowering
is "not lowered" with a reason, which is how the support matrix shows it. Adding a family or
a backend adds a package; nothing here changes.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from attngen.arch import ArchFacts
from attngen.spec.family import FamilySpec
from attngen.spec.fields import Int
from attngen.spec.enums import Arch, Backend, Family, Phase

if TYPE_CHECKING:
    from attngen.features import Feature
    from attngen.ir import ModulePlan
    from attngen.spec.model import Spec
    from attngen.spec.variant import Variant
    from attngen.verdict import Verdict


@dataclass(frozen=True)
class FamilyInfo:
    """What a family is, whatever backend lowers it."""

    family: Family
    features: Callable[[], tuple[Feature, ...]]  # docs-table columns, in order
    base_variant: Callable[[], Variant]  # its plainest variant (probes start from it)
    spec: FamilySpec  # its sections of the spec language and how they expand
    # why a variant of it can never run on an arch, whatever the backend (None: it can)
    arch_limit: Callable[[Variant, ArchFacts], str | None] = lambda variant, facts: None
    title: str = ""  # docs-table title
    # hybrids: the keys a backend instance (and its pools) is built for, per module plan;
    # two specs sharing one can serve prefill and decode together
    layer_keys: Callable[[ModulePlan], set[Hashable]] = lambda plan: set()
    # a make_backend(...) example for a hybrid (prefill spec, decode spec, arch, layer key)
    hybrid_example: Callable[[str, str, Arch, Hashable], str] | None = None


@dataclass(frozen=True)
class BackendInfo:
    """What a kernel DSL can do on each arch, and how its kernels are checked without a GPU."""

    backend: Backend
    title: str  # how the docs and messages name it ("Triton", "CuTe DSL")
    arch_limit: Callable[[ArchFacts], str | None]  # why no kernel of it can exist on an arch
    # why its kernels cannot take CPU tensors of these dtypes ("bfloat16", ...) now, or None
    cpu_limit: Callable[[tuple[str, ...]], str | None]
    rank: int  # auto-selection order among the backends an arch can run: lower goes first
    aot_main: Callable[[list[str]], int] | None = None  # `python -m attngen.aot` for it


class Lowering(Protocol):
    """One (family, backend) pair: capability rules, lowering to IR and emission."""

    family: Family
    backend: Backend
    # what a spec's tuning.<backend>.<arch> may override, and the values each key takes
    tuning_keys: Mapping[str, Int]
    # which phases' kernels read each tuning key (a spec tuning a key none of its phases
    # reads is refused: the value would apply to nothing)
    tuning_phases: Mapping[str, frozenset[Phase]]

    def supports(self, variant: Variant, arch: Arch) -> Verdict:
        """SUPPORTED, or NOT_LOWERED with the reason (hardware limits are asked before)."""

    def lower(self, spec: Spec, variants: tuple[Variant, ...], arch: Arch) -> ModulePlan:
        """The checked plan of one spec's supported variants on one arch."""

    def files(self, plan: ModulePlan) -> dict[str, str]:
        """{path relative to generated/: text} of the plan's package."""

    def identities(self, plan: ModulePlan) -> dict[str, str]:
        """{variant uri: kernel identity}: equal to ``evidence.module_identity`` of the
        generated kernels module, computed without importing it."""


_FAMILIES: dict[Family, FamilyInfo] = {}
_BACKENDS: dict[Backend, BackendInfo] = {}
_LOWERINGS: dict[tuple[Family, Backend], Lowering] = {}
_PACKAGES = ("attngen.families", "attngen.backends")
_loaded = False


def register_family(info: FamilyInfo) -> None:
    _add(_FAMILIES, info.family, info, "family")


def register_backend(info: BackendInfo) -> None:
    _add(_BACKENDS, info.backend, info, "backend")


def register_lowering(lowering: Lowering) -> None:
    _add(_LOWERINGS, (lowering.family, lowering.backend), lowering, "lowering")


def _add(table: dict, key: object, value: object, what: str) -> None:
    if key in table and table[key] is not value:
        raise RuntimeError(f"registry: a second {what} registers {key}")
    table[key] = value


def load() -> None:
    """Import every package under attngen/families and attngen/backends (each registers)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for root in _PACKAGES:
        _import_tree(importlib.import_module(root))


def _import_tree(package: object) -> None:
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):  # type: ignore[attr-defined]
        if info.ispkg:
            _import_tree(importlib.import_module(info.name))


def family(f: Family) -> FamilyInfo:
    load()
    if f not in _FAMILIES:
        raise KeyError(f"no family package registers {f.value} (attngen/families/{f.value}/)")
    return _FAMILIES[f]


def backend(b: Backend) -> BackendInfo:
    load()
    if b not in _BACKENDS:
        raise KeyError(f"no backend package registers {b.value} (attngen/backends/{b.value}/)")
    return _BACKENDS[b]


def lowering(f: Family, b: Backend) -> Lowering | None:
    """The registered lowering of the pair, or None (the pair is "not lowered")."""
    load()
    return _LOWERINGS.get((f, b))


def lowerings() -> Mapping[tuple[Family, Backend], Lowering]:
    load()
    return dict(_LOWERINGS)


def families() -> Mapping[Family, FamilyInfo]:
    """In the vocabulary's order (``Family``), whatever order their packages were imported
    in: messages and docs list them."""
    load()
    return {f: _FAMILIES[f] for f in Family if f in _FAMILIES}


def backends() -> Mapping[Backend, BackendInfo]:
    """In the vocabulary's order (``Backend``), whatever order their packages were imported
    in."""
    load()
    return {b: _BACKENDS[b] for b in Backend if b in _BACKENDS}
