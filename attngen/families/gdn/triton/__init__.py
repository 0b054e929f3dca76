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
from attngen.library_lowering import LibraryLowering, phases_by_key, tuning_values
from attngen.registry import register_lowering
from attngen.spec.enums import Backend, Family, Phase
from attngen.spec.fields import Int

# What each tile key a spec may tune takes (config.TUNING_KEYS); blocks and tiles otherwise.
OTHER_VALUES: dict[str, Int] = {
    "decode_tiles": Int(1, 16, power_of_two=True),
    "state_min_programs": Int(1, 4096),
    "chunk_state_bits": Int(16, 32, choices=(16, 32)),
    "state_transposed": Int(0, 1, choices=(0, 1)),
    "state_t_min_programs": Int(1, 4096),
}
TUNING_VALUES: dict[str, Int] = tuning_values(
    TUNING_KEYS,
    warps=Int(1, 16, choices=(1, 2, 4, 8, 16)),
    stages=Int(1, 8),
    other=lambda key: OTHER_VALUES.get(key, Int(4, 256, power_of_two=True)),
)

# Which phases' kernels read each key: the recurrent step (decode, and verify's per-draft
# steps), the chunked kernels and the conv's token tiles (extend), the conv's channel blocks
# (every phase).
TUNING_PHASES = phases_by_key(
    TUNING_KEYS,
    {
        frozenset({Phase.DECODE, Phase.VERIFY}): (
            "decode_block_v",
            "decode_tiles",
            "decode_num_warps",
        ),
        frozenset({Phase.EXTEND}): (
            "prepare_num_warps",
            "wu_num_warps",
            "state_block_v",
            "state_block_v_max",
            "state_min_programs",
            "state_num_warps",
            "state_num_stages",
            "output_block_v",
            "output_num_warps",
            "chunk_state_bits",
            "state_transposed",
            "state_t_min_programs",
            "conv_block_t",
        ),
        capability.PHASES: ("conv_block_c", "conv_num_warps"),
    },
)

LOWERING = LibraryLowering(
    family=Family.GDN,
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
