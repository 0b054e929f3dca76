"""Checks on a Triton MLA plan before any emitter runs."""

from __future__ import annotations

from attngen.families.mla.triton.config import MlaTritonConfig
from attngen.ir import ModulePlan, check_plan, shared_memory_problems
from attngen.spec.enums import KV_ELEMENT_BYTES

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


def shared_floor(c: MlaTritonConfig, phases: tuple[str, ...]) -> list[tuple[str, int]]:
    """A floor under the shared memory of each kernel the phases launch: the absorbed
    kernel (every phase) keeps at least one tile of decode_block_n latent rows (lora +
    rope) once it pipelines (stages >= 2), the ragged prefill (extend) its K and V tiles of
    every buffered stage ((stages - 1) x ragged_block_n x (nope + rope + v)). Triton 3.6's
    allocations over the repo's configs (evidence/compile/triton, sm80 / sm90 / sm100) sit
    at 1.53-3.1x it for the absorbed kernels and 1.8-4.2x for the ragged ones."""
    elt = KV_ELEMENT_BYTES[c.kv_dtype]
    absorbed = min(c.decode_num_stages - 1, 1) * c.decode_block_n
    out = [
        (
            f"decode_block_n={c.decode_block_n} x decode_num_stages={c.decode_num_stages} "
            f"({c.kv_lora_rank} + {c.qk_rope_head_dim}-wide latent rows)",
            int(absorbed * (c.kv_lora_rank + c.qk_rope_head_dim) * elt),
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
    check_plan(plan, problems + shared_memory_problems(plan, shared_floor))
