"""Checks on a Triton GDN plan before any emitter runs."""

from __future__ import annotations

from attngen.families.gdn.triton.config import GdnTritonConfig
from attngen.ir import ModulePlan, check_plan
from attngen.spec.enums import Arch

WARP_COUNTS = (1, 2, 4, 8, 16)


def config_problems(c: GdnTritonConfig) -> list[str]:
    problems = []
    # the chunk kernels' value blocks are tl.dot operands (>= 16); the decode's is not (>= 8)
    blocks = (("decode_block_v", 8), ("state_block_v", 16), ("output_block_v", 16))
    for name, least in blocks:
        block = getattr(c, name)
        if block < least or block & (block - 1) or c.value_dim % block:
            problems.append(f"{name}={block}: a power of two >= {least} dividing {c.value_dim}")
    tiles = c.decode_tiles
    if tiles < 1 or tiles & (tiles - 1) or c.value_dim % (c.decode_block_v * tiles):
        problems.append(f"decode_tiles={tiles}: a power of two, tiles of {c.value_dim} rows")
    for name in ("conv_block_c", "conv_block_t"):
        block = getattr(c, name)
        if block < 4 or block & (block - 1):
            problems.append(f"{name}={block} is not a power of two >= 4")
    if c.conv_kernel != 4:
        problems.append(f"conv_kernel={c.conv_kernel}: the conv kernels are width 4")
    top = c.state_block_v_max
    if top < c.state_block_v or top & (top - 1) or c.value_dim % top:
        problems.append(f"state_block_v_max={top}: a power of two >= state_block_v, <= V")
    # the config's stages apply to the smallest block (host/options.state_options); three
    # stages of W, KT and U fit sm_90a's shared memory at 16 values only (32: 234504 B)
    stages = c.state_num_stages
    if stages not in (2, 3) or (stages == 3 and c.state_block_v > 16):
        problems.append(f"state_num_stages={stages}: 2, or 3 with state_block_v 16")
    if c.state_min_programs < 1:
        problems.append(f"state_min_programs={c.state_min_programs}: at least 1")
    if c.chunk_size not in (16, 32, 64):
        problems.append(f"chunk_size={c.chunk_size}: the triangular inverse takes 16, 32, 64")
    if c.chunk_state_bits not in (16, 32):
        problems.append(f"chunk_state_bits={c.chunk_state_bits}: 16 or 32")
    if c.state_transposed not in (0, 1):
        problems.append(f"state_transposed={c.state_transposed}: 0 or 1")
    if c.state_t_min_programs < 1:
        problems.append(f"state_t_min_programs={c.state_t_min_programs}: at least 1")
    warps = ("decode_num_warps", "prepare_num_warps", "wu_num_warps", "state_num_warps")
    warps += ("output_num_warps",)
    for name in (*warps, "conv_num_warps"):
        if getattr(c, name) not in WARP_COUNTS:
            problems.append(f"{name}={getattr(c, name)} is not a warp count Triton accepts")
    return [f"{c.uri}: {p}" for p in problems]


def miscompiled(c: GdnTritonConfig) -> list[str]:
    """Tile choices Triton 3.6 compiles wrong for sm_90a (compute-sanitizer on the H200:
    out-of-range shared addresses in the state kernel's KT u product)."""
    if c.state_block_v == 16 and c.state_num_warps >= 8 and c.state_num_stages < 3:
        return [
            f"{c.uri}: the state kernel at 16 values on {c.state_num_warps} warps and "
            f"{c.state_num_stages} stages is miscompiled by Triton on sm_90a (out-of-range "
            "shared addresses): take 4 warps or 3 stages"
        ]
    return []


# No shared-memory floor here (MHA, MLA and DSA have one): the rules above bound the only
# kernel with buffered stages, the state kernel (W and K^T [chunk, K] fp32 and U [chunk, block]
# per stage), at chunk 64, K 128 to (3 - 1) x 68 KB = 136 KB at 16 values and 1 x 96 KB at
# 128, under every arch's opt-in limit (sm80: 163 KB); what Triton allocates on top is the
# AOT compile check's (evidence/compile/triton: 216 KB at 16 values on sm_90a).


def arch_problems(c: GdnTritonConfig, arch: Arch) -> list[str]:
    """What only sm90 runs: the transposed-state kernel (wgmma register operands, TMA
    descriptors; sm_80 has neither, and on sm_100a it is neither compiled nor run here)."""
    if c.state_transposed and arch is not Arch.SM90:
        return [f"{c.uri}: state_transposed=1: the transposed-state kernel is sm90's"]
    return []


def verify_plan(plan: ModulePlan) -> None:
    problems = [p for k in plan.kernels for p in config_problems(k.config)]
    problems += [p for k in plan.kernels for p in arch_problems(k.config, plan.arch)]
    if plan.arch is Arch.SM90:
        problems += [p for k in plan.kernels for p in miscompiled(k.config)]
    check_plan(plan, problems)
