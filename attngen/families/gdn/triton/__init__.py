"""GDN x Triton: the lowering of gated delta rule variants to Triton kernels, registered
on import.

- :mod:`.capability`: what this pair can run (``supports``);
- :mod:`.lower`: tiles, graph buffers and the plan; :mod:`.verify`: checks on it;
- :mod:`.library` (with ``kernels/`` device code and ``host/`` launchers): the kernels every
  generated ``kernels.py`` binds; ``kernels.py.jinja``: that binding.
"""

from __future__ import annotations

from attngen.evidence import kernel_identity
from attngen.families.gdn.triton import capability, lower, verify
from attngen.families.gdn.triton.config import TUNING_KEYS
from attngen.families.gdn.triton.source import source_sha256
from attngen.ir import ModulePlan
from attngen.registry import register_lowering
from attngen.spec.enums import Arch, Backend, Family
from attngen.spec.fields import Int
from attngen.spec.model import Spec
from attngen.spec.variant import Variant
from attngen.verdict import Verdict

BINDING_TEMPLATE = "families/gdn/triton/kernels.py.jinja"
LIBRARY_MODULE = "attngen.families.gdn.triton.library"
WARPS = Int(1, 16, choices=(1, 2, 4, 8, 16))
TILE = Int(4, 256, power_of_two=True)
STAGES = Int(1, 8)


def _tuning_value(key: str) -> Int:
    if key.endswith("num_warps"):
        return WARPS
    return STAGES if key.endswith("num_stages") else TILE


TUNING_VALUES: dict[str, Int] = {key: _tuning_value(key) for key in TUNING_KEYS}


class GdnTritonLowering:
    family = Family.GDN
    backend = Backend.TRITON
    tuning_keys = TUNING_VALUES

    def supports(self, variant: Variant, arch: Arch) -> Verdict:
        return capability.supports(variant)

    def lower(self, spec: Spec, variants: tuple[Variant, ...], arch: Arch) -> ModulePlan:
        plan = lower.lower(spec, variants, arch)
        verify.verify_plan(plan)
        return plan

    def files(self, plan: ModulePlan) -> dict[str, str]:
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


register_lowering(GdnTritonLowering())
