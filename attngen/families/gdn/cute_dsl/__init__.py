"""GDN x CuTe DSL: the lowering of gated delta rule variants to CuTe DSL kernels (chunked
prefill / extend on sm90), registered on import.

- :mod:`.capability`: what this pair can run (``supports``);
- :mod:`.lower`: the chunk kernel's form rule and the plan; :mod:`.verify`: checks on it;
- :mod:`.library` (with ``kernels/`` device code and ``host/`` launchers): the kernels every
  generated ``kernels.py`` binds; ``kernels.py.jinja``: that binding.

Nothing here imports torch or cutlass: the generator has neither.
"""

from __future__ import annotations

from attngen.families.gdn.cute_dsl import capability, lower, verify
from attngen.families.gdn.cute_dsl.config import TUNING_KEYS
from attngen.library_lowering import LibraryLowering, phases_by_key
from attngen.registry import register_lowering
from attngen.spec.enums import Backend, Family
from attngen.spec.fields import Int

TUNING_VALUES: dict[str, Int] = {
    "two_consumers_min_heads": Int(1, 1 << 20),
    "chunk_early_d": Int(0, 1, choices=(0, 1)),
    "segments_max": Int(1, 64),
    "segments_overhead_chunks": Int(0, 1 << 16),
    "conv_block_c": Int(4, 256, power_of_two=True),
    "conv_block_t": Int(4, 256, power_of_two=True),
    "conv_num_warps": Int(1, 16, choices=(1, 2, 4, 8, 16)),
}
assert set(TUNING_VALUES) == set(TUNING_KEYS)
TUNING_PHASES = phases_by_key(TUNING_KEYS, {capability.PHASES: TUNING_KEYS})

LOWERING = LibraryLowering(
    family=Family.GDN,
    backend=Backend.CUTE_DSL,
    package_file=__file__,
    tuning_keys=TUNING_VALUES,
    tuning_phases=TUNING_PHASES,
    check=capability.supports,
    plan=lower.lower,
    verify=verify.verify_plan,
    traits=lower.traits,
)
register_lowering(LOWERING)
