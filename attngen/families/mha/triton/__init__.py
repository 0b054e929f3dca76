"""MHA x Triton: the lowering of MHA variants to Triton kernels, registered on import.

- :mod:`.capability`: what this pair can run (``supports``);
- :mod:`.lower`: tiles per arch and head dim, the plan; :mod:`.verify`: checks on it;
- :mod:`.library` (with ``kernels/`` device code and ``host/`` launchers): the kernels every
  generated ``kernels.py`` binds; ``kernels.py.jinja``: that binding.
"""

from __future__ import annotations

from attngen.families.mha.triton import capability, lower, verify
from attngen.families.mha.triton.config import TUNING_KEYS
from attngen.library_lowering import LibraryLowering, phases_by_key, tuning_values
from attngen.registry import register_lowering
from attngen.spec.enums import Backend, Family, Phase
from attngen.spec.fields import Int

# What each tile key a spec may tune takes (config.TUNING_KEYS): Triton's warp counts, the
# pipeline depths it schedules, power-of-two split counts and tiles that tl.dot takes.
SPLITS = Int(1, 64, power_of_two=True)
TILE_ROWS = Int(16, 256, power_of_two=True)
TUNING_VALUES: dict[str, Int] = tuning_values(
    TUNING_KEYS,
    warps=Int(1, 16, choices=(1, 2, 4, 8, 16)),
    stages=Int(1, 8),
    other=lambda key: SPLITS if key == "max_splits" else TILE_ROWS,
)

# Which phases' kernels read each key: split-KV decode and its combine; the extend kernel
# (prefill, extend, draft extend); verify's GQA-packed tiles, which take extend's stages.
EXTEND_PHASES = frozenset({Phase.PREFILL, Phase.EXTEND, Phase.DRAFT_EXTEND})
TUNING_PHASES = phases_by_key(
    TUNING_KEYS,
    {
        frozenset({Phase.DECODE}): (
            "decode_block_n",
            "decode_num_warps",
            "decode_num_stages",
            "max_splits",
            "combine_num_warps",
        ),
        EXTEND_PHASES: ("extend_block_m", "extend_block_n", "extend_num_warps"),
        EXTEND_PHASES | {Phase.VERIFY}: ("extend_num_stages",),
        frozenset({Phase.VERIFY}): ("verify_block_m", "verify_block_n", "verify_num_warps"),
    },
)

LOWERING = LibraryLowering(
    family=Family.MHA,
    backend=Backend.TRITON,
    package_file=__file__,
    tuning_keys=TUNING_VALUES,
    tuning_phases=TUNING_PHASES,
    check=lambda variant, arch: capability.supports(variant),
    plan=lower.lower,
    verify=verify.verify_plan,
    traits=lower.traits,
)
register_lowering(LOWERING)
