"""Checks on a Triton MLA plan before any emitter runs."""

from __future__ import annotations

from attngen.families.mla.triton.config import MlaTritonConfig
from attngen.ir import ModulePlan, check_plan

POW2_TILES = ("decode_block_h", "decode_block_n", "max_splits", "ragged_block_m", "ragged_block_n")
WARP_COUNTS = (1, 2, 4, 8, 16)


def config_problems(c: MlaTritonConfig) -> list[str]:
    problems = [
        f"{name}={getattr(c, name)} is not a power of two"
        for name in POW2_TILES
        if getattr(c, name) < 1 or getattr(c, name) & (getattr(c, name) - 1)
    ]
    if min(c.decode_block_h, c.decode_block_n, c.ragged_block_m, c.ragged_block_n) < 16:
        problems.append("tl.dot needs tiles of at least 16")
    if c.decode_lora_parts not in (1, 2):
        problems.append(f"decode_lora_parts={c.decode_lora_parts} is not 1 or 2")
    for name in ("decode_keys_major", "decode_value_reload"):
        if getattr(c, name) not in (0, 1):
            problems.append(f"{name}={getattr(c, name)} is not 0 or 1")
    for name in ("decode_num_warps", "combine_num_warps", "ragged_num_warps"):
        if getattr(c, name) not in WARP_COUNTS:
            problems.append(f"{name}={getattr(c, name)} is not a warp count Triton accepts")
    return [f"{c.uri}: {p}" for p in problems]


def verify_plan(plan: ModulePlan) -> None:
    problems = [p for k in plan.kernels for p in config_problems(k.config)]
    check_plan(plan, problems)
