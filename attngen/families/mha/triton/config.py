"""Triton MHA: per-variant launch configurations and per-module traits.

A generated ``kernels.py`` holds ``CONFIGS: dict[str, MhaTritonConfig]``: one entry per
variant (keyed by the variant's uri), filled in by the lowering's tile heuristics for one
arch. The runtime and the kernel launchers read tiles and shapes from here; nothing about a
variant is re-derived at run time.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from attngen.families.mha.key import MhaKey
from attngen.hooks import MaskHooks


@dataclass(frozen=True)
class MhaTritonConfig:
    """Shapes and tiles of one MHA variant's Triton kernels on one arch.

    The first fields are the variant's identity (:class:`~attngen.families.mha.key.MhaKey`,
    ``key``); the rest are tiles a spec's ``tuning.triton.<arch>`` may override.
    """

    uri: str
    head_dim: int  # qk head dim
    v_head_dim: int  # v / output head dim
    gqa_group: int  # query heads per kv head
    page_size: int  # tokens per KV-cache page (1 = token-granular)
    dtype: str  # torch dtype name of q and o: "bfloat16" | "float16"
    kv_dtype: str  # KV cache: dtype's name, "float8_e4m3fn" | "float8_e5m2", or "nvfp4"
    kv_scale: str  # K/V dequant scales: "none" | "per_tensor" | "per_head" | "per_block"
    spec_topk: int  # speculative verify: 0 none, 1 draft chain (causal), > 1 draft tree
    num_draft_tokens: int  # verify rows per request (0 without speculative decoding)
    # -- decode (split-KV, then combine) ----
    decode_block_n: int  # KV tokens per inner iteration
    decode_block_h: int  # query-head rows per program (gqa_group padded to >= 16)
    decode_num_warps: int
    decode_num_stages: int
    max_splits: int  # upper bound of KV splits per request (grid dim)
    combine_num_warps: int
    # -- extend (ragged queries over the paged prefix and the new tokens) ----
    extend_block_m: int
    extend_block_n: int
    extend_num_warps: int
    extend_num_stages: int
    # -- verify (extend tiles with the GQA group packed into the rows; 0: no verify) ----
    verify_block_m: int = 0  # rows: num_draft_tokens x gqa_group, padded (16 .. 64)
    verify_block_n: int = 0
    verify_num_warps: int = 0

    @property
    def key(self) -> MhaKey:
        return MhaKey.of(self)


# What a spec's tuning.triton.<arch> may set: the tiles, not the identity (nor the query-head
# rows of decode, which follow the GQA group).
IDENTITY_FIELDS = ("uri", "num_draft_tokens", "decode_block_h", *(f.name for f in fields(MhaKey)))
TUNING_KEYS = tuple(f.name for f in fields(MhaTritonConfig) if f.name not in IDENTITY_FIELDS)


@dataclass(frozen=True)
class CompileSpec:
    """Everything ``triton.compile`` needs to build one kernel ahead of time (no GPU).

    ``signature`` maps every non-constexpr argument name to its Triton type string
    ("*bf16", "*fp32", "i32", ...); ``constexprs`` maps the constexpr names to values.
    """

    name: str  # e.g. "decode_split", "decode_combine", "extend"
    fn: Any  # the @triton.jit function
    signature: dict[str, str] = field(default_factory=dict)
    constexprs: dict[str, Any] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 2


@dataclass(frozen=True)
class MhaTraits:
    """What one generated kernels module fixes for all its configs.

    The Triton MHA library (attngen/families/mha/triton/library.py) takes these on every
    launch; a spec's generated kernels.py binds its own.
    """

    mask: MaskHooks  # translated into constexprs by host/options.py
    phases: tuple[str, ...]  # phases the spec generates
    fp4_scales_as_bytes: bool = False  # sm80: no fp8e4nv pointers, NVFP4 scales as bytes
