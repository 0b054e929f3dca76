"""The lowering every (family, backend) package is: a kernel library of real Python source
beside a ``kernels.py.jinja`` that binds one spec's configs to it.

A package registers ``LibraryLowering(...)`` with its own capability rule, planner, plan
checks and traits; the generated package's files, the library's sha256 and the kernel
identities are the same steps for every pair, written once here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attngen.arch import facts
from attngen.evidence import kernel_identity, library_sha256
from attngen.hooks import MaskHooks
from attngen.ir import GraphBuffer, KernelPlan, MetadataPlan, ModulePlan
from attngen.probes import feature_lines
from attngen.spec.enums import Arch, Backend, Family, Phase
from attngen.spec.fields import Int
from attngen.spec.model import Spec
from attngen.spec.variant import Variant
from attngen.verdict import Verdict

PACKAGE_ROOT = Path(__file__).resolve().parent  # templates are named relative to attngen/


@dataclass(frozen=True)
class LibraryLowering:
    """One (family, backend) lowering, given by its package's pieces."""

    family: Family
    backend: Backend
    package_file: str  # the registering package's ``__file__``: library and template beside it
    tuning_keys: Mapping[str, Int]  # what tuning.<backend>.<arch> may set, and its values
    # {tuning key: the phases whose kernels read it}; every tuning key has an entry
    tuning_phases: Mapping[str, frozenset[Phase]]
    check: Callable[[Variant, Arch], Verdict]  # SUPPORTED or NOT_LOWERED with the reason
    plan: Callable[[Spec, tuple[Variant, ...], Arch], ModulePlan]
    verify: Callable[[ModulePlan], None]  # raises on a plan the library cannot run
    traits: Callable[[ModulePlan], Any]  # what, beyond a config, the identity covers

    @property
    def package_dir(self) -> Path:
        return Path(self.package_file).resolve().parent

    @property
    def library_module(self) -> str:
        rel = self.package_dir.relative_to(PACKAGE_ROOT.parent)
        return ".".join(rel.parts) + ".library"

    @property
    def template(self) -> str:
        return (self.package_dir / "kernels.py.jinja").relative_to(PACKAGE_ROOT).as_posix()

    def supports(self, variant: Variant, arch: Arch) -> Verdict:
        return self.check(variant, arch)

    def lower(self, spec: Spec, variants: tuple[Variant, ...], arch: Arch) -> ModulePlan:
        plan = self.plan(spec, variants, arch)
        self.verify(plan)
        return plan

    def files(self, plan: ModulePlan) -> dict[str, str]:
        # imported here: generated kernels import their package at run time without the
        # generator's dependencies (jinja2, black); the generator imports neither torch nor
        # the backend's compiler, so the library's sha comes from its files
        from attngen.emit.modules import package_files

        return package_files(
            plan,
            self.template,
            library_module=self.library_module,
            library_sha256=library_sha256(self.package_dir, arch=plan.arch.value),
        )

    def identities(self, plan: ModulePlan) -> dict[str, str]:
        library_sha = library_sha256(self.package_dir, arch=plan.arch.value)
        traits = self.traits(plan)
        return {k.uri: kernel_identity(library_sha, traits, k.config) for k in plan.kernels}


def tuning_values(
    keys: tuple[str, ...] | frozenset[str],
    *,
    warps: Int,
    stages: Int,
    other: Callable[[str], Int],
) -> dict[str, Int]:
    """{key: values}: ``*num_warps`` keys take ``warps``, ``*num_stages`` keys ``stages``,
    the rest what ``other(key)`` says."""

    def value(key: str) -> Int:
        if key.endswith("num_warps"):
            return warps
        return stages if key.endswith("num_stages") else other(key)

    return {key: value(key) for key in keys}


def phases_by_key(
    keys: tuple[str, ...] | frozenset[str] | Mapping[str, object],
    groups: Mapping[frozenset[Phase], tuple[str, ...]],
) -> dict[str, frozenset[Phase]]:
    """{key: the phases whose kernels read it} from ``{phases: keys}``: a lowering's
    ``tuning_phases``. Every tuning key in exactly one group (checked on import)."""
    table: dict[str, frozenset[Phase]] = {}
    for phases, names in groups.items():
        for name in names:
            if name in table or name not in keys:
                raise ValueError(f"tuning key {name!r}: listed twice or not a tuning key")
            table[name] = phases
    missing = [k for k in keys if k not in table]
    if missing:
        raise ValueError(f"tuning keys with no phases: {', '.join(missing)}")
    return table


def plan_module(
    spec: Spec,
    variants: tuple[Variant, ...],
    arch: Arch,
    backend: Backend,
    *,
    kernel_config: Callable[[Variant, Arch, Mapping[str, int]], Any],
    seq_len_fill: int,
    graph_buffers: tuple[GraphBuffer, ...],
    runtime_class: str,
    plan_type: type[ModulePlan] = ModulePlan,
    **fields: Any,
) -> ModulePlan:
    """The plan every lowering builds: one config per variant (the spec's tuning for this
    backend and arch applied), the mask's hooks, the arch's SM count and the CUDA-graph
    buffers for the metadata builder, the docs' feature lines; ``fields`` go to a
    ``plan_type`` that adds its own."""
    overrides = spec.tuning_for(backend, arch)
    return plan_type(
        spec=spec,
        backend=backend,
        arch=arch,
        hooks=MaskHooks.from_mask(spec.mask),
        kernels=tuple(KernelPlan(v, kernel_config(v, arch, overrides)) for v in variants),
        metadata=MetadataPlan(facts(arch).num_sms, seq_len_fill, graph_buffers),
        runtime_class=runtime_class,
        feature_lines=feature_lines(variants, spec.family, backend, arch),
        **fields,
    )
