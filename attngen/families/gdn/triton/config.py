"""Triton GDN: per-variant launch configurations and per-module traits.

A generated ``kernels.py`` holds ``CONFIGS: dict[str, GdnTritonConfig]``, one entry per
variant (keyed by its uri), filled in by the lowering for one arch; the runtime and the
launchers read shapes and tiles from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class GdnTritonConfig:
    """Shapes and tiles of one GDN variant's Triton kernels on one arch.

    The first fields are the variant's identity; the rest are tiles a spec's
    ``tuning.triton.<arch>`` may override.
    """

    uri: str
    key_dim: int  # K: q/k head dim
    value_dim: int  # V: v / output head dim
    v_heads_per_k_head: int  # GVA: value heads per key head
    dtype: str  # torch dtype name of q/k/v/a/b and the output: "bfloat16" | "float16"
    state_dtype: str  # temporal state pool dtype: "float32"
    chunk_size: int  # tokens per chunk of the chunked prefill
    conv_kernel: int  # causal conv width (conv state keeps conv_kernel - 1 inputs)
    l2norm: bool  # q/k L2-normalised in the kernels
    spec_topk: int  # speculative verify: 0 none, 1 draft chains, > 1 draft trees
    num_draft_tokens: int  # verify rows per request (0 without speculative decoding)
    # -- recurrent decode / verify: one program per (request, value head, value block) ----
    decode_block_v: int
    decode_tiles: int  # value blocks per program, walked in a pipelined loop
    decode_num_warps: int
    # -- chunked prefill: prepare and W / U (per chunk), state (per request, value block; sequential
    # over the chunks), output (per chunk, value block) ----
    prepare_num_warps: int
    wu_num_warps: int
    state_block_v: int  # the smallest value block of the state kernel
    state_block_v_max: int  # the largest: the launcher takes the largest that still gives
    state_min_programs: int  # at least this many programs (the request x head x block grid)
    state_num_warps: int  # at blocks up to 32 values; doubled per doubling beyond
    state_num_stages: int  # at the smallest block; wider blocks take two
    output_block_v: int
    output_num_warps: int
    chunk_state_bits: int  # the per-chunk states (H): 16 (the activation dtype) or 32 (fp32)
    # 1: the state kernel on the transposed state in registers (chunk_state_t_kernel: wgmma
    # register operands and TMA loads, sm90; 64-value blocks) for batches whose request x
    # head x 64-value grid has at least state_t_min_programs programs; 0: chunk_state_kernel
    state_transposed: int
    state_t_min_programs: int
    # -- causal conv ----
    conv_block_c: int
    conv_block_t: int
    conv_num_warps: int


IDENTITY_FIELDS = (
    "uri",
    "key_dim",
    "value_dim",
    "v_heads_per_k_head",
    "dtype",
    "state_dtype",
    "chunk_size",
    "conv_kernel",
    "l2norm",
    "spec_topk",
    "num_draft_tokens",
)
TUNING_KEYS = tuple(f.name for f in fields(GdnTritonConfig) if f.name not in IDENTITY_FIELDS)


@dataclass(frozen=True)
class CompileSpec:
    """Everything ``triton.compile`` needs to build one kernel ahead of time (no GPU)."""

    name: str
    fn: Any
    signature: dict[str, str] = field(default_factory=dict)
    constexprs: dict[str, Any] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 2


@dataclass(frozen=True)
class GdnTraits:
    """What one generated kernels module fixes for all its configs."""

    phases: tuple[str, ...]  # phases the spec generates
