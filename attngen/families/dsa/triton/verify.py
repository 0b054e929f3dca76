"""Checks on a Triton DSA plan before any emitter runs."""

from __future__ import annotations

from attngen.families.dsa.triton.config import DsaTritonConfig
from attngen.ir import ModulePlan, check_plan, shared_memory_problems, unread_tuning_problems

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


def shared_floor(c: DsaTritonConfig, phases: tuple[str, ...]) -> list[tuple[str, int]]:
    """A floor under the sparse kernel's shared memory (every phase launches it): the
    latent rows of one tile of selected slots per buffered stage (at least one: the
    product's operand), as the cache stores them (576 bf16/fp16 values or 656 bytes). Triton
    3.6's allocations over the repo's configs (evidence/compile/triton, sm90 / sm100) sit at
    1.49-9.8x it; a sparse_block_n of 256 over bf16 rows (295 KB) is refused here, not by
    the first launch."""
    row_bytes = c.kv_width * (1 if c.fp8_cache else 2)
    stages = max(c.sparse_num_stages - 1, 1)
    what = (
        f"sparse_block_n={c.sparse_block_n} x sparse_num_stages={c.sparse_num_stages} "
        f"({row_bytes}-byte latent rows)"
    )
    return [(what, stages * c.sparse_block_n * row_bytes)]


# Tile keys only one kind of sparse kernel reads: the Gluon one (sparse_gluon=1) pipelines
# itself (host/launch.py's sparse_wg_options take no num_stages).
READ_BY = {
    "sparse_num_stages": (
        lambda c: not c.sparse_gluon,
        "the Gluon sparse kernel (sparse_gluon=1) pipelines itself",
    ),
}


def verify_plan(plan: ModulePlan) -> None:
    problems = [p for k in plan.kernels for p in config_problems(k.config, plan.arch.value)]
    problems += unread_tuning_problems(plan, READ_BY)
    check_plan(plan, problems + shared_memory_problems(plan, shared_floor))
