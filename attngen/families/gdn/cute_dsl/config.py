"""CuTe DSL GDN: per-variant launch configurations and per-module traits.

A generated ``kernels.py`` holds ``CONFIGS: dict[str, GdnCuteConfig]``, one entry per
variant (keyed by its uri), filled in by the lowering for one arch. The identity fields
carry the Triton config's names (the runtime selects a config by them); the conv fields
are read by name by the width-4 causal conv, which this library takes from the Triton GDN
library (host/launch.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class GdnCuteConfig:
    """Shapes and tiles of one GDN variant's CuTe DSL kernels on one arch."""

    uri: str
    key_dim: int  # K: q/k head dim
    value_dim: int  # V: v / output head dim
    v_heads_per_k_head: int  # GVA: value heads per key head
    dtype: str  # torch dtype name of q/k/v/a/b and the output: "bfloat16"
    state_dtype: str  # temporal state pool dtype: "float32"
    chunk_size: int  # tokens per chunk
    conv_kernel: int  # causal conv width
    l2norm: bool  # q/k L2-normalised in the kernels
    spec_topk: int  # 0: this library runs no speculative verify
    num_draft_tokens: int
    arch: str  # "sm90": which chunk kernel
    # -- the chunk kernel's form per batch: batches of at least this many (request, value
    # head) pairs take two consumer warpgroups a CTA (a head's 128 value rows, one producer:
    # half the bytes a head moves), fewer take one (64 rows, twice the CTAs, S^T Q^T off the
    # chunk's chain) ----
    two_consumers_min_heads: int
    # 1: the one-consumer form waits for S^T K^T alone, so S^T Q^T runs under d's epilogue
    # and u's product (H100: 0.55 against 0.62 ms at 4 x 8k x 16 heads, equal at 1 x 32k)
    chunk_early_d: int
    # -- context parallelism (host/segments.py) for batches the one-consumer form runs:
    # a long request in up to this many segments (1: never), where the estimate of the two
    # passes, plus this many chunk steps for the combine and the second launch, beats the
    # plain launch ----
    segments_max: int
    segments_overhead_chunks: int
    # -- the causal conv (the Triton GDN library's kernel) ----
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
    "arch",
)
TUNING_KEYS = tuple(f.name for f in fields(GdnCuteConfig) if f.name not in IDENTITY_FIELDS)


@dataclass(frozen=True)
class GdnCuteTraits:
    """What one generated kernels module fixes for all its configs."""

    phases: tuple[str, ...]  # phases the spec generates
