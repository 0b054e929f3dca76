"""Checks on the IR before any emitter runs: a bad plan fails here, not in a kernel."""

from __future__ import annotations

from attngen.lower.ir import MhaKernelPlan, MhaModulePlan


class PlanError(Exception):
    """The lowering produced a plan the kernels cannot run."""


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def verify_kernel(plan: MhaKernelPlan) -> list[str]:
    c = plan.config
    problems = []
    for name in (
        "decode_block_n",
        "decode_block_h",
        "extend_block_m",
        "extend_block_n",
        "max_splits",
    ):
        if not _is_pow2(getattr(c, name)):
            problems.append(f"{name}={getattr(c, name)} is not a power of two")
    if c.decode_block_h < max(16, c.gqa_group):
        problems.append(f"decode_block_h={c.decode_block_h} < max(16, gqa_group={c.gqa_group})")
    if min(c.decode_block_n, c.extend_block_n, c.extend_block_m) < 16:
        problems.append("tl.dot needs tiles of at least 16")
    for name in ("decode_num_warps", "combine_num_warps", "extend_num_warps"):
        if getattr(c, name) not in (1, 2, 4, 8, 16):
            problems.append(f"{name}={getattr(c, name)} is not a warp count Triton accepts")
    return [f"{c.uri}: {p}" for p in problems]


def verify_module(plan: MhaModulePlan) -> None:
    problems = [p for k in plan.kernels for p in verify_kernel(k)]
    uris = [k.uri for k in plan.kernels]
    if len(set(uris)) != len(uris):
        problems.append(f"{plan.spec.name}: duplicate variant uris")
    if problems:
        raise PlanError(f"{plan.spec.path} ({plan.arch.value}): " + "; ".join(problems))
