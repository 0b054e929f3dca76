"""MHA x CuTe DSL: the lowering of MHA variants to CuTe DSL kernels, registered on import.

- :mod:`.capability`: what this pair can run (``supports``);
- :mod:`.lower`: tiles per head dim and page size, the plan; :mod:`.verify`: checks on it;
- :mod:`.library` (with ``kernels/`` device code and ``host/`` launchers): the kernels every
  generated ``kernels.py`` binds; ``kernels.py.jinja``: that binding.

Nothing here imports torch or cutlass: the generator has neither.
"""

from __future__ import annotations

from attngen.evidence import kernel_identity
from attngen.families.mha.cute_dsl import capability, lower, verify
from attngen.families.mha.cute_dsl.config import TUNING_KEYS
from attngen.families.mha.cute_dsl.source import source_sha256
from attngen.ir import ModulePlan
from attngen.registry import register_lowering
from attngen.spec.enums import Arch, Backend, Family
from attngen.spec.fields import Int
from attngen.spec.model import Spec
from attngen.spec.variant import Variant
from attngen.verdict import Verdict

BINDING_TEMPLATE = "families/mha/cute_dsl/kernels.py.jinja"
LIBRARY_MODULE = "attngen.families.mha.cute_dsl.library"

# What each tile key a spec may tune takes (verify.py checks the combination).
TUNING_VALUES: dict[str, Int] = {
    "fwd_tile_m": Int(128, 128),
    "fwd_tile_n": Int(64, 128, power_of_two=True),
    "fwd_num_stages": Int(1, 4),
    "fwd_intra_wg_overlap": Int(0, 1),
}
assert set(TUNING_VALUES) == set(TUNING_KEYS)


class MhaCuteLowering:
    family = Family.MHA
    backend = Backend.CUTE_DSL
    tuning_keys = TUNING_VALUES

    def supports(self, variant: Variant, arch: Arch) -> Verdict:
        return capability.supports(variant, arch)

    def lower(self, spec: Spec, variants: tuple[Variant, ...], arch: Arch) -> ModulePlan:
        plan = lower.lower(spec, variants, arch)
        verify.verify_plan(plan)
        return plan

    def files(self, plan: ModulePlan) -> dict[str, str]:
        # imported here: generated kernels import this package at run time, without the
        # generator's dependencies (jinja2, black)
        from attngen.emit.modules import package_files

        return package_files(
            plan,
            BINDING_TEMPLATE,
            library_module=LIBRARY_MODULE,
            library_sha256=source_sha256(),
        )

    def identities(self, plan: ModulePlan) -> dict[str, str]:
        library_sha, traits = source_sha256(), lower.traits(plan)
        return {k.uri: kernel_identity(library_sha, traits, k.config) for k in plan.kernels}


register_lowering(MhaCuteLowering())
