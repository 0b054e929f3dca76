"""MLA x Triton: the lowering of MLA variants to Triton kernels, registered on import.

- :mod:`.capability`: what this pair can run (``supports``);
- :mod:`.lower`: tiles per head count, latent dtype and arch, the plan; :mod:`.verify`;
- :mod:`.library` (``kernels/`` device code, ``host/`` launchers and compile specs): the
  kernels every generated ``kernels.py`` binds; ``kernels.py.jinja``: that binding.
"""

from __future__ import annotations

from attngen.families.mla.triton import capability, lower, verify
from attngen.families.mla.triton.config import TUNING_KEYS
from attngen.library_lowering import LibraryLowering, phases_by_key, tuning_values
from attngen.registry import register_lowering
from attngen.spec.enums import Backend, Family, Phase
from attngen.spec.fields import Int

# What each tile key a spec may tune takes (config.TUNING_KEYS): Triton's warp counts, the
# pipeline depths it schedules, power-of-two split counts and tiles that tl.dot takes, and
# the absorbed kernel's variant switches, split waves and register cap.
SPLITS = Int(1, 64, power_of_two=True)
TILE_ROWS = Int(16, 256, power_of_two=True)
FLAG = Int(0, 1, choices=(0, 1))
CHOICES = {
    "decode_lora_parts": Int(1, 2, choices=(1, 2)),
    "decode_keys_major": FLAG,
    "decode_value_reload": FLAG,
    "decode_waves": Int(1, 64),
    "decode_gluon": FLAG,
    # ptxas's register cap: 0 (none) or 24 .. 255 in steps of 8
    "decode_max_registers": Int(0, 255, choices=(0, *range(24, 256, 8))),
    "max_splits": SPLITS,
}
TUNING_VALUES: dict[str, Int] = tuning_values(
    TUNING_KEYS,
    warps=Int(1, 16, choices=(1, 2, 4, 8, 16)),
    stages=Int(1, 8),
    other=lambda key: CHOICES.get(key, TILE_ROWS),
)

# Which phases' kernels read each key: the absorbed kernel (and its combine) serves every
# phase, its query rows one token (decode) or several (extend, verify, draft extend); the
# ragged prefill kernel runs extend's new tokens.
TUNING_PHASES = phases_by_key(
    TUNING_KEYS,
    {
        frozenset({Phase.EXTEND}): tuple(k for k in TUNING_KEYS if k.startswith("ragged_")),
        capability.PHASES: tuple(k for k in TUNING_KEYS if not k.startswith("ragged_")),
    },
)

LOWERING = LibraryLowering(
    family=Family.MLA,
    backend=Backend.TRITON,
    package_file=__file__,
    tuning_keys=TUNING_VALUES,
    tuning_phases=TUNING_PHASES,
    check=capability.supports,
    plan=lower.lower,
    verify=verify.verify_plan,
    traits=lower.traits,
)
register_lowering(LOWERING)
