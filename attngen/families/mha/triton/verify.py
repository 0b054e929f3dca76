"""Checks on a Triton MHA plan before any emitter runs: a bad plan fails here, not in a kernel."""

from __future__ import annotations

from attngen.families.mha.triton.config import MhaTritonConfig
from attngen.ir import ModulePlan, check_plan

POW2_TILES = ("decode_block_n", "decode_block_h", "extend_block_m", "extend_block_n", "max_splits")
WARP_COUNTS = (1, 2, 4, 8, 16)


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def config_problems(c: MhaTritonConfig) -> list[str]:
    problems = [
        f"{name}={getattr(c, name)} is not a power of two"
        for name in POW2_TILES
        if not _is_pow2(getattr(c, name))
    ]
    if c.decode_block_h < max(16, c.gqa_group):
        problems.append(f"decode_block_h={c.decode_block_h} < max(16, gqa_group={c.gqa_group})")
    if min(c.decode_block_n, c.extend_block_n, c.extend_block_m) < 16:
        problems.append("tl.dot needs tiles of at least 16")
    for name in ("decode_num_warps", "combine_num_warps", "extend_num_warps"):
        if getattr(c, name) not in WARP_COUNTS:
            problems.append(f"{name}={getattr(c, name)} is not a warp count Triton accepts")
    return [f"{c.uri}: {p}" for p in problems]


def verify_plan(plan: ModulePlan) -> None:
    problems = [p for k in plan.kernels for p in config_problems(k.config)]
    check_plan(plan, problems)
