"""Lowering of MHA variants to Triton kernel plans: tile heuristics per head dim and arch.

The numbers are starting points measured to compile without register spills on sm_90a
and sm_100a (see evidence/compile/); a spec's ``tuning`` section overrides them per arch.
"""

from __future__ import annotations

import dataclasses

from attngen.runtime.configs import MhaTritonConfig
from attngen.spec.enums import TORCH_DTYPE_NAME, Arch
from attngen.spec.model import Spec
from attngen.spec.variant import MhaShape, Variant

MAX_SPLITS = 16  # decode KV splits per request: enough to fill 132 SMs at batch 1 x 8 kv heads


def next_power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()


def decode_tiles(head_dim: int, gqa_group: int, arch: Arch) -> dict[str, int]:
    """Split-KV decode: one program per (request, kv head, split)."""
    return {
        "decode_block_n": 32 if head_dim > 128 else 64,
        "decode_block_h": max(16, next_power_of_two(gqa_group)),
        "decode_num_warps": 4,
        "decode_num_stages": 2,
        "max_splits": MAX_SPLITS,
        "combine_num_warps": 4 if head_dim <= 128 else 8,
    }


def extend_tiles(head_dim: int, arch: Arch) -> dict[str, int]:
    """Extend: one program per (block of new tokens, q head, request)."""
    if head_dim > 128:
        return {
            "extend_block_m": 64,
            "extend_block_n": 32,
            "extend_num_warps": 8,
            "extend_num_stages": 2,
        }
    if head_dim > 64:
        return {
            "extend_block_m": 128,
            "extend_block_n": 64,
            "extend_num_warps": 8,
            "extend_num_stages": 2,
        }
    return {
        "extend_block_m": 64,
        "extend_block_n": 64,
        "extend_num_warps": 4,
        "extend_num_stages": 2,
    }


def kernel_config(variant: Variant, arch: Arch, spec: Spec) -> MhaTritonConfig:
    shape = variant.shape
    assert isinstance(shape, MhaShape)
    config = MhaTritonConfig(
        uri=variant.uri,
        head_dim=shape.head_dim,
        v_head_dim=shape.v_head_dim,
        gqa_group=shape.gqa_group,
        page_size=variant.page_size or 1,
        dtype=TORCH_DTYPE_NAME[variant.dtype],
        **decode_tiles(shape.head_dim, shape.gqa_group, arch),
        **extend_tiles(shape.head_dim, arch),
    )
    overrides = {k: v for t in spec.tuning if t.arch is arch for k, v in t.values}
    return dataclasses.replace(config, **overrides) if overrides else config
