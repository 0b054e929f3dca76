"""Checks on a Triton DSA plan before any emitter runs."""

from __future__ import annotations

from attngen.families.dsa.triton.config import DsaTritonConfig
from attngen.ir import ModulePlan, check_plan

POW2_TILES = (
    "sparse_block_h",
    "sparse_block_n",
    "max_splits",
    "indexer_block_n",
    "indexer_block_s",
    "topk_block",
)
WARP_COUNTS = (1, 2, 4, 8, 16)


def gluon_problems(c: DsaTritonConfig, arch: str) -> list[str]:
    """Where ``sparse_gluon`` applies: sm90's warpgroup MMA and the config's own shape rules
    (``DsaTritonConfig.gluon_shape_problems``, which the launcher checks again at run time)."""
    if not c.sparse_gluon:
        return []
    problems = c.gluon_shape_problems()
    if arch != "sm90":
        problems.insert(0, f"sparse_gluon=1 runs sm90 warpgroup MMA kernels, not {arch}")
    return problems


def config_problems(c: DsaTritonConfig, arch: str = "sm90") -> list[str]:
    problems = [
        f"{name}={getattr(c, name)} is not a power of two"
        for name in POW2_TILES
        if getattr(c, name) < 1 or getattr(c, name) & (getattr(c, name) - 1)
    ]
    if min(c.sparse_block_h, c.sparse_block_n, c.indexer_block_n) < 16:
        problems.append("tl.dot needs tiles of at least 16")
    if c.page_size % c.indexer_block_n or c.indexer_block_s % c.indexer_block_n:
        problems.append("indexer_block_n must divide page_size and indexer_block_s")
    if c.index_topk % c.sparse_block_n:
        problems.append("sparse_block_n must divide index_topk")
    for name in ("sparse_num_warps", "combine_num_warps", "indexer_num_warps", "topk_num_warps"):
        if getattr(c, name) not in WARP_COUNTS:
            problems.append(f"{name}={getattr(c, name)} is not a warp count Triton accepts")
    problems += gluon_problems(c, arch)
    return [f"{c.uri}: {p}" for p in problems]


def verify_plan(plan: ModulePlan) -> None:
    problems = [p for k in plan.kernels for p in config_problems(k.config, plan.arch.value)]
    check_plan(plan, problems)
