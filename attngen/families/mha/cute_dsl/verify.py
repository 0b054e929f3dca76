"""Checks on a CuTe DSL MHA plan before any emitter runs: a bad plan fails here, not in a
kernel compile."""

from __future__ import annotations

from attngen.families.mha.cute_dsl.config import DECODE_TILE_ROWS, PAGED_PHASES, MhaCuteConfig
from attngen.families.mha.cute_dsl.tiles import (
    FP8_DECODE_MAX_GROUP,
    SM90_SHARED_BYTES,
    SM100_TMEM_COLS,
    gqa_packs,
    sm90_decode_shared_bytes,
    sm100_fwd_shared_bytes,
    sm90_fwd_shared_bytes,
)
from attngen.ir import ModulePlan, check_plan

WGMMA_ROWS = 64  # rows per consumer warpgroup
TILE_N = (64, 128)  # keys per stage: the MMA's N (and the page, for extend over large pages)
PREFILL_TILE_N = (64, 80, 96, 112, 128)  # the cache-free prefill's: no pages to hold
PAGE_SIZES = (16, 32, 64, 128)  # extend: one TMA copy per page (a tile, part of one, or pages)
GATHER_PAGE_SIZES = (1, 2, 4, 8)  # extend: K/V rows gathered with cp.async


def tile_rows(c: MhaCuteConfig, phases: tuple[str, ...]) -> list[tuple[str, int]]:
    """(tuning key, query rows) of the forward tiles the module's phases run: the cache-free
    prefill's and the paged phases'."""
    rows = [("fwd_tile_m", c.fwd_tile_m)] if "prefill" in phases else []
    if any(p in phases for p in PAGED_PHASES if p != "decode"):
        rows.append(("fwd_paged_tile_m", c.fwd_paged_tile_m))
    return rows


def config_problems(c: MhaCuteConfig, phases: tuple[str, ...]) -> list[str]:
    problems = []
    paged = any(p in phases for p in (*PAGED_PHASES, "decode"))
    for name, tile_m in tile_rows(c, phases):
        if tile_m not in (2 * WGMMA_ROWS, 3 * WGMMA_ROWS):
            problems.append(f"{name}={tile_m}: the kernel runs 2 or 3 consumer warpgroups")
        elif tile_m == 3 * WGMMA_ROWS and (c.arch != "sm90" or max(c.head_dim, c.v_head_dim) > 64):
            problems.append(f"{name}={tile_m} (three consumer warpgroups): sm90, head dims "
                            f"<= 64 (got {c.head_dim} / {c.v_head_dim} on {c.arch})")  # fmt: skip
    if c.fwd_tile_n not in TILE_N:
        problems.append(f"fwd_tile_n={c.fwd_tile_n} is not one of {TILE_N}")
    prefill = "prefill" in phases
    if prefill and c.fwd_prefill_tile_n not in PREFILL_TILE_N:
        problems.append(f"fwd_prefill_tile_n={c.fwd_prefill_tile_n} is not one of {PREFILL_TILE_N}")
    page_sizes = PAGE_SIZES + GATHER_PAGE_SIZES
    if paged and c.page_size not in page_sizes:
        problems.append(
            f"page_size={c.page_size} is not one of {page_sizes} (TMA per page, cp.async "
            "gathers below 16)"
        )
    elif paged and c.arch == "sm90" and c.fwd_tile_n % c.page_size:
        problems.append(
            f"fwd_tile_n={c.fwd_tile_n} is not a multiple of page_size={c.page_size} "
            "(sm90 reads whole pages into a tile)"
        )
    elif paged and c.page_size % c.fwd_tile_n and c.fwd_tile_n % c.page_size:
        problems.append(
            f"page_size={c.page_size} and fwd_tile_n={c.fwd_tile_n}: neither divides the other"
        )
    # keys per stage beside the query rows they share shared memory with: every phase's tile
    # (with the widest rows) and the cache-free prefill's own
    rows = max((tile_m for _, tile_m in tile_rows(c, phases)), default=2 * WGMMA_ROWS)
    key_tiles = [("fwd_tile_n", c.fwd_tile_n, rows)]
    if prefill:
        key_tiles.append(("fwd_prefill_tile_n", c.fwd_prefill_tile_n, c.fwd_tile_m))
    for name, tile_n, tile_m in key_tiles:
        if c.arch == "sm90":
            smem = sm90_fwd_shared_bytes(c.head_dim, c.v_head_dim, tile_n, c.fwd_num_stages, tile_m)
            if smem > SM90_SHARED_BYTES:
                problems.append(
                    f"{name}={tile_n} x fwd_num_stages={c.fwd_num_stages} at head dims "
                    f"{c.head_dim}/{c.v_head_dim}: {smem} B of shared memory, over sm90's "
                    f"{SM90_SHARED_BYTES}"
                )
        elif c.arch == "sm100" and tile_n != 64:
            problems.append(f"{name}={tile_n}: sm100 rows of S hold 64 keys (128 spill)")
    kv_bytes = 1 if c.kv_dtype.startswith("float8") else 2
    if c.arch == "sm100":
        stages = max(c.fwd_num_stages, c.decode_num_stages if "decode" in phases else 0)
        smem = sm100_fwd_shared_bytes(c.head_dim, c.v_head_dim, c.fwd_tile_n, stages, kv_bytes)
        if smem > SM90_SHARED_BYTES:  # Blackwell's per-CTA limit is Hopper's
            problems.append(
                f"{stages} stages of {c.fwd_tile_n}-key tiles at head dims {c.head_dim}/"
                f"{c.v_head_dim}: {smem} B of shared memory, over sm100's {SM90_SHARED_BYTES}"
            )
        if c.fwd_tile_n + c.v_head_dim > SM100_TMEM_COLS:
            problems.append(
                f"fwd_tile_n={c.fwd_tile_n} + v_head_dim={c.v_head_dim} fp32 columns exceed "
                f"the SM's {SM100_TMEM_COLS} of tensor memory"
            )
    for name, tile_m in tile_rows(c, phases):
        if c.fwd_pack_gqa and not gqa_packs(c.arch, c.gqa_group, tile_m):
            problems.append(f"fwd_pack_gqa: sm90, and a GQA group ({c.gqa_group}) dividing "
                            f"{name}={tile_m}")  # fmt: skip
    if c.fwd_staged_store and c.arch != "sm90":
        problems.append("fwd_staged_store is the sm90 forward's epilogue: sm90 only")
    if c.fwd_staged_store and c.v_head_dim > c.head_dim:
        problems.append(f"fwd_staged_store stages O's rows in the Q tile: v_head_dim "
                        f"{c.v_head_dim} must not exceed head_dim {c.head_dim}")  # fmt: skip
    if c.fwd_intra_wg_overlap and c.arch != "sm90":
        problems.append("fwd_intra_wg_overlap is a Hopper (wgmma) schedule: sm90 only")
    if ("verify" in phases or "draft_extend" in phases) and c.num_draft_tokens < 1:
        problems.append("verify / draft_extend need num_draft_tokens >= 1")
    if "decode" in phases:
        if c.arch not in ("sm90", "sm100"):
            problems.append(f"split-KV decode is not lowered for {c.arch}")
        if c.gqa_group > DECODE_TILE_ROWS:
            problems.append(f"gqa_group={c.gqa_group}: decode packs the group in one "
                            f"{DECODE_TILE_ROWS}-row tile")  # fmt: skip
        if not 1 <= c.max_splits <= 64:
            problems.append(f"max_splits={c.max_splits} is not in 1 .. 64")
        if not 1 <= c.decode_num_stages <= 4:
            problems.append(f"decode_num_stages={c.decode_num_stages} is not in 1 .. 4")
        smem = sm90_decode_shared_bytes(
            c.head_dim, c.v_head_dim, c.decode_block_n, c.decode_num_stages, kv_bytes
        )
        if c.arch == "sm90" and smem > SM90_SHARED_BYTES:
            problems.append(
                f"decode_num_stages={c.decode_num_stages} of {c.decode_block_n}-key tiles at "
                f"head dims {c.head_dim}/{c.v_head_dim}: {smem} B of shared memory, over "
                f"sm90's {SM90_SHARED_BYTES}"
            )
    if c.kv_dtype != c.dtype:
        fp8_ok = (
            c.kv_dtype == "float8_e4m3fn"
            and c.kv_scale == "per_tensor"
            and set(phases) <= {"decode"}
            and c.arch in ("sm90", "sm100")
            and c.page_size in PAGE_SIZES
        )
        if not fp8_ok:
            problems.append(
                f"kv_dtype={c.kv_dtype} ({c.kv_scale} scales): only float8_e4m3fn with "
                f"per_tensor scales, decode only, sm90 or sm100, pages of {PAGE_SIZES}"
            )
        if c.arch == "sm90" and c.gqa_group > FP8_DECODE_MAX_GROUP:
            problems.append(
                f"gqa_group={c.gqa_group} over an fp8 cache: sm90 decode puts two e4m3 parts "
                f"of each query head in its 64-row tile, {FP8_DECODE_MAX_GROUP} heads at most"
            )
    if not 1 <= c.fwd_num_stages <= 4:
        problems.append(f"fwd_num_stages={c.fwd_num_stages} is not in 1 .. 4")
    return [f"{c.uri}: {p}" for p in problems]


def verify_plan(plan: ModulePlan) -> None:
    phases = tuple(p.value for p in plan.spec.phases)
    problems = [p for k in plan.kernels for p in config_problems(k.config, phases)]
    check_plan(plan, problems)
