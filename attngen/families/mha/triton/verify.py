"""Checks on a Triton MHA plan before any emitter runs: a bad plan fails here, not in a kernel."""

from __future__ import annotations

from attngen.families.mha.triton.config import MhaTritonConfig
from attngen.ir import ModulePlan, check_plan, shared_memory_problems
from attngen.spec.enums import KV_ELEMENT_BYTES

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


def shared_floor(c: MhaTritonConfig, phases: tuple[str, ...]) -> list[tuple[str, int]]:
    """A floor under the shared memory each kernel the phases launch takes: the K and V
    tiles of every pipeline stage but the one in registers ((stages - 1) x block_n x (D +
    Dv) elements; split-KV decode keeps one such tile whatever its stages). Triton 3.6's
    allocations over the repo's configs (evidence/compile/triton) sit at 2-8x it for extend
    and 1.19-3.5x for decode and verify on sm80 / sm90 / sm100, so a tile over the arch's
    limit by this floor cannot compile; one under it may still (the AOT check decides)."""
    row = (c.head_dim + c.v_head_dim) * KV_ELEMENT_BYTES[c.kv_dtype]  # one key's K and V
    tiles = []  # (tile key, keys, stages key, stages, stages buffered in shared memory)
    if "decode" in phases:
        st = c.decode_num_stages
        tiles.append(("decode_block_n", c.decode_block_n, "decode_num_stages", st, min(st - 1, 1)))
    if {"prefill", "extend", "draft_extend"} & set(phases):
        st = c.extend_num_stages
        tiles.append(("extend_block_n", c.extend_block_n, "extend_num_stages", st, st - 1))
    if "verify" in phases and c.verify_block_n:
        st = c.extend_num_stages
        tiles.append(("verify_block_n", c.verify_block_n, "extend_num_stages", st, st - 1))
    dims = f"{c.head_dim}/{c.v_head_dim}"
    return [
        (f"{key}={n} x {skey}={st} (K and V tiles at head dims {dims})", int(kept * n * row))
        for key, n, skey, st, kept in tiles
    ]


def verify_plan(plan: ModulePlan) -> None:
    problems = [p for k in plan.kernels for p in config_problems(k.config)]
    check_plan(plan, problems + shared_memory_problems(plan, shared_floor))
