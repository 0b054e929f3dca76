"""Checks on a Triton MLA plan before any emitter runs."""

from __future__ import annotations

from attngen.families.mla.triton.config import MlaTritonConfig
from attngen.ir import ModulePlan, check_plan, shared_memory_problems, unread_tuning_problems
from attngen.spec.enums import KV_ELEMENT_BYTES, Arch

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


def gluon_problems(c: MlaTritonConfig, arch: Arch) -> list[str]:
    """Where ``decode_gluon`` applies: sm90's warpgroup MMA kernels, at the fixed shapes the
    launcher checks again at run time (host/launch.py's ``_check_gluon``), so a spec tuning
    it elsewhere is refused here rather than by a compile or the first launch."""
    if not c.decode_gluon:
        return []
    if arch is not Arch.SM90:
        return [f"decode_gluon=1 runs sm90 warpgroup MMA kernels, not {arch.value}"]
    return c.gluon_shape_problems()


# Tile keys only one kind of absorbed kernel reads (host/launch.py: absorbed_options for the
# Triton kernel, gluon_kernel for the Gluon ones; draft-tree verify always runs the Triton
# kernel): each with whether a config's kernels read it, and who does.
READ_BY = {
    "decode_max_registers": (
        lambda c: bool(c.decode_gluon),
        "only the Gluon absorbed kernels (decode_gluon=1) take a register cap",
    ),
    "decode_value_reload": (
        lambda c: not c.decode_gluon or c.spec_topk > 1,
        "only the Triton absorbed kernel reads it (decode_gluon=0, or draft-tree verify)",
    ),
    "decode_num_stages": (
        lambda c: not c.decode_gluon or bool(c.decode_keys_major) or c.spec_topk > 1,
        "the head-major Gluon kernel (decode_gluon=1, decode_keys_major=0) pipelines itself",
    ),
}


def shared_floor(c: MlaTritonConfig, phases: tuple[str, ...]) -> list[tuple[str, int]]:
    """A floor under the shared memory of each kernel the phases launch. The absorbed kernel
    (every phase) reads its query (decode_block_h heads x (lora + rope) 16-bit values, also
    over quantized caches) from shared memory in every iteration, beside at least one tile
    of decode_block_n latent rows once it pipelines (stages >= 2); the ragged prefill
    (extend) keeps its K and V tiles of every buffered stage ((stages - 1) x ragged_block_n
    x (nope + rope + v)). Triton 3.6's allocations over the repo's configs
    (evidence/compile/triton, sm80 / sm90 / sm100) sit at 1.018-2.22x it for the absorbed
    kernels (the rest mostly P: decode_block_h x decode_block_n 16-bit values) and 1.8-4.2x
    for the ragged ones; 128 heads in one sm80 program (184 KB) are refused here, not by
    the compile."""
    q_bytes = c.decode_block_h * c.kv_width * KV_ELEMENT_BYTES[c.dtype]
    latent_rows = min(c.decode_num_stages - 1, 1) * c.decode_block_n
    out = [
        (
            f"decode_block_h={c.decode_block_h} heads of q + decode_block_n={c.decode_block_n} "
            f"x decode_num_stages={c.decode_num_stages} latent rows "
            f"({c.kv_lora_rank} + {c.qk_rope_head_dim} wide)",
            int(q_bytes + latent_rows * c.kv_width * KV_ELEMENT_BYTES[c.kv_dtype]),
        )
    ]
    if "extend" in phases:
        width = c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim
        out.append(
            (
                f"ragged_block_n={c.ragged_block_n} x ragged_num_stages={c.ragged_num_stages} "
                "(K and V tiles)",
                int(
                    (c.ragged_num_stages - 1) * c.ragged_block_n * width * KV_ELEMENT_BYTES[c.dtype]
                ),
            )
        )
    return out


def verify_plan(plan: ModulePlan) -> None:
    problems = [p for k in plan.kernels for p in config_problems(k.config)]
    problems += [
        f"{k.config.uri}: {p}" for k in plan.kernels for p in gluon_problems(k.config, plan.arch)
    ]
    problems += unread_tuning_problems(plan, READ_BY)
    check_plan(plan, problems + shared_memory_problems(plan, shared_floor))
