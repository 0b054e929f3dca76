"""GDN x Triton: the lowering of gated delta rule variants to Triton kernels, registered
on import.

- :mod:`.capability`: what this pair can run (``supports``);
- :mod:`.lower`: tiles, graph buffers and the plan; :mod:`.verify`: checks on it;
- :mod:`.library` (with ``kernels/`` device code and ``host/`` launchers): the kernels every
  generated ``kernels.py`` binds; ``kernels.py.jinja``: that binding.
"""

from __future__ import annotations

from attngen.families.gdn.triton import capability, lower, verify
from attngen.families.gdn.triton.config import TUNING_KEYS
from attngen.library_lowering import LibraryLowering, tuning_values
from attngen.registry import register_lowering
from attngen.spec.enums import Backend, Family
from attngen.spec.fields import Int

# What each tile key a spec may tune takes (config.TUNING_KEYS); blocks and tiles otherwise.
OTHER_VALUES: dict[str, Int] = {
    "decode_tiles": Int(1, 16, power_of_two=True),
    "state_min_programs": Int(1, 4096),
    "chunk_state_bits": Int(16, 32, choices=(16, 32)),
}
TUNING_VALUES: dict[str, Int] = tuning_values(
    TUNING_KEYS,
    warps=Int(1, 16, choices=(1, 2, 4, 8, 16)),
    stages=Int(1, 8),
    other=lambda key: OTHER_VALUES.get(key, Int(4, 256, power_of_two=True)),
)

LOWERING = LibraryLowering(
    family=Family.GDN,
    backend=Backend.TRITON,
    package_file=__file__,
    tuning_keys=TUNING_VALUES,
    check=lambda variant, arch: capability.supports(variant),
    plan=lower.lower,
    verify=verify.verify_plan,
    traits=lower.traits,
)
register_lowering(LOWERING)
