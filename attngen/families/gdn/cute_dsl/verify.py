"""Checks on a CuTe DSL GDN plan before any emitter runs."""

from __future__ import annotations

from attngen.families.gdn.cute_dsl.config import GdnCuteConfig
from attngen.ir import ModulePlan, check_plan

WARP_COUNTS = (1, 2, 4, 8, 16)


def config_problems(c: GdnCuteConfig) -> list[str]:
    problems = []
    if c.two_consumers_min_heads < 1:
        problems.append(f"two_consumers_min_heads={c.two_consumers_min_heads}: at least 1")
    if c.chunk_early_d not in (0, 1):
        problems.append(f"chunk_early_d={c.chunk_early_d}: 0 or 1")
    if c.segments_max < 1 or c.segments_overhead_chunks < 0:
        problems.append(
            f"segments_max={c.segments_max} (at least 1), segments_overhead_chunks="
            f"{c.segments_overhead_chunks} (at least 0)"
        )
    if c.segments_max > 1 and c.key_dim != c.value_dim:
        problems.append(f"segments_max={c.segments_max}: segments need key_dim = value_dim")
    for name in ("conv_block_c", "conv_block_t"):
        block = getattr(c, name)
        if block < 4 or block & (block - 1):
            problems.append(f"{name}={block} is not a power of two >= 4")
    if c.conv_num_warps not in WARP_COUNTS:
        problems.append(f"conv_num_warps={c.conv_num_warps} is not a warp count Triton accepts")
    return [f"{c.uri}: {p}" for p in problems]


def verify_plan(plan: ModulePlan) -> None:
    check_plan(plan, [p for k in plan.kernels for p in config_problems(k.config)])
