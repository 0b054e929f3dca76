"""MLA x Triton: the lowering of MLA variants to Triton kernels, registered on import.

- :mod:`.capability`: what this pair can run (``supports``);
- :mod:`.lower`: tiles per head count, latent dtype and arch, the plan; :mod:`.verify`;
- :mod:`.library` (``kernels/`` device code, ``host/`` launchers and compile specs): the
  kernels every generated ``kernels.py`` binds; ``kernels.py.jinja``: that binding.
"""

from __future__ import annotations

from attngen.evidence import kernel_identity
from attngen.families.mla.triton import capability, lower, verify
from attngen.families.mla.triton.config import TUNING_KEYS
from attngen.families.mla.triton.source import source_sha256
from attngen.ir import ModulePlan
from attngen.registry import register_lowering
from attngen.spec.enums import Arch, Backend, Family
from attngen.spec.fields import Int
from attngen.spec.model import Spec
from attngen.spec.variant import Variant
from attngen.verdict import Verdict

BINDING_TEMPLATE = "families/mla/triton/kernels.py.jinja"
LIBRARY_MODULE = "attngen.families.mla.triton.library"

WARPS = Int(1, 16, choices=(1, 2, 4, 8, 16))
STAGES = Int(1, 8)
SPLITS = Int(1, 64, power_of_two=True)
TILE_ROWS = Int(16, 256, power_of_two=True)
FLAG = Int(0, 1, choices=(0, 1))
CHOICES = {
    "decode_lora_parts": Int(1, 2, choices=(1, 2)),
    "decode_keys_major": FLAG,
    "decode_value_reload": FLAG,
    "decode_waves": Int(1, 64),
}


def _tuning_value(key: str) -> Int:
    if key in CHOICES:
        return CHOICES[key]
    if key.endswith("num_warps"):
        return WARPS
    if key.endswith("num_stages"):
        return STAGES
    return SPLITS if key == "max_splits" else TILE_ROWS


TUNING_VALUES: dict[str, Int] = {key: _tuning_value(key) for key in TUNING_KEYS}


class MlaTritonLowering:
    family = Family.MLA
    backend = Backend.TRITON
    tuning_keys = TUNING_VALUES

    def supports(self, variant: Variant, arch: Arch) -> Verdict:
        return capability.supports(variant, arch)

    def lower(self, spec: Spec, variants: tuple[Variant, ...], arch: Arch) -> ModulePlan:
        plan = lower.lower(spec, variants, arch)
        verify.verify_plan(plan)
        return plan

    def files(self, plan: ModulePlan) -> dict[str, str]:
        # imported here: generated kernels import this package at run time without the
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


register_lowering(MlaTritonLowering())
