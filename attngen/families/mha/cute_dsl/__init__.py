"""MHA x CuTe DSL: the lowering of MHA variants to CuTe DSL kernels, registered on import.

- :mod:`.capability`: what this pair can run (``supports``);
- :mod:`.lower`: tiles per head dim and page size, the plan; :mod:`.verify`: checks on it;
- :mod:`.library` (with ``kernels/`` device code and ``host/`` launchers): the kernels every
  generated ``kernels.py`` binds; ``kernels.py.jinja``: that binding.

Nothing here imports torch or cutlass: the generator has neither.
"""

from __future__ import annotations

from attngen.families.mha.cute_dsl import capability, lower, verify
from attngen.families.mha.cute_dsl.config import TUNING_KEYS
from attngen.library_lowering import LibraryLowering, phases_by_key
from attngen.registry import register_lowering
from attngen.spec.enums import Backend, Family, Phase
from attngen.spec.fields import Int

# What each tile key a spec may tune takes (verify.py checks the combination).
TUNING_VALUES: dict[str, Int] = {
    "fwd_tile_m": Int(128, 192),
    "fwd_paged_tile_m": Int(128, 192),
    "fwd_tile_n": Int(64, 128, power_of_two=True),
    "fwd_prefill_tile_n": Int(64, 128, choices=(64, 80, 96, 112, 128)),
    "fwd_num_stages": Int(1, 4),
    "fwd_intra_wg_overlap": Int(0, 1),
    "fwd_pack_gqa": Int(0, 1),
    "fwd_staged_store": Int(0, 1),
    "max_splits": Int(1, 64),
    "decode_num_stages": Int(1, 4),
}
assert set(TUNING_VALUES) == set(TUNING_KEYS)

# Which phases' kernels read each key: the forward kernel runs every phase but decode, whose
# split kernel reads only the key tile (host/compile.py's specializations).
TUNING_PHASES = phases_by_key(
    TUNING_KEYS,
    {
        frozenset({Phase.PREFILL}): ("fwd_tile_m", "fwd_prefill_tile_n"),
        capability.PHASES - {Phase.DECODE, Phase.PREFILL}: ("fwd_paged_tile_m",),
        capability.PHASES
        - {Phase.DECODE}: (
            "fwd_num_stages",
            "fwd_intra_wg_overlap",
            "fwd_pack_gqa",
            "fwd_staged_store",
        ),
        capability.PHASES: ("fwd_tile_n",),
        frozenset({Phase.DECODE}): ("max_splits", "decode_num_stages"),
    },
)

LOWERING = LibraryLowering(
    family=Family.MHA,
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
