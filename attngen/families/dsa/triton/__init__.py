"""DSA x Triton: the lowering of DSA variants to Triton kernels, registered on import.

- :mod:`.capability`: what this pair can run (``supports``);
- :mod:`.lower`: tiles per head count and latent layout, the plan; :mod:`.verify`;
- :mod:`.library` (``kernels/`` device code, ``host/`` launchers and compile specs): the
  kernels every generated ``kernels.py`` binds; ``kernels.py.jinja``: that binding.
"""

from __future__ import annotations

from attngen.families.dsa.triton import capability, lower, verify
from attngen.families.dsa.triton.config import TUNING_KEYS
from attngen.library_lowering import LibraryLowering, phases_by_key, tuning_values
from attngen.registry import register_lowering
from attngen.spec.enums import Backend, Family
from attngen.spec.fields import Int

# What each tile key a spec may tune takes (config.TUNING_KEYS): Triton's warp counts, the
# pipeline depths it schedules, power-of-two split counts and tiles that tl.dot takes, and
# longer strips for the top-k pass step and the keys of one indexer program.
SPLITS = Int(1, 64, power_of_two=True)
TILE_ROWS = Int(16, 256, power_of_two=True)
STRIP = Int(16, 8192, power_of_two=True)


FLAG = Int(0, 1, choices=(0, 1))  # sparse_gluon: a switch (verify.py checks where it applies)


def _tile_values(key: str) -> Int:
    if key == "sparse_gluon":
        return FLAG
    if key in ("topk_block", "indexer_block_s"):
        return STRIP
    return SPLITS if key == "max_splits" else TILE_ROWS


TUNING_VALUES: dict[str, Int] = tuning_values(
    TUNING_KEYS, warps=Int(1, 16, choices=(1, 2, 4, 8, 16)), stages=Int(1, 8), other=_tile_values
)

# Which phases' kernels read each key: every phase runs the indexer, the top-k pass and the
# sparse MLA over the picked keys (one query row or several), so every key tunes them all.
TUNING_PHASES = phases_by_key(TUNING_KEYS, {capability.PHASES: TUNING_KEYS})

LOWERING = LibraryLowering(
    family=Family.DSA,
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
