"""Triton DSA: the per-variant launch configuration a generated ``kernels.py`` holds.

``CONFIGS: dict[str, DsaTritonConfig]``: one entry per variant (keyed by its uri), filled
in by the lowering for one arch; the runtime and the launchers read shapes and tiles from
it and re-derive nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from attngen.families.mla.triton.config import CompileSpec

__all__ = ["CompileSpec", "DsaKey", "DsaTraits", "DsaTritonConfig"]


@dataclass(frozen=True)
class DsaKey:
    """What a DSA backend instance is built for (the runtime selects a config by it)."""

    num_heads: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    index_heads: int
    index_head_dim: int
    index_topk: int
    index_dtype: str  # what the indexer scores in: "float8_e4m3fn" | "bfloat16" | ...
    page_size: int
    dtype: str
    kv_dtype: str  # the activations' dtype name, or "float8_e4m3fn": the 656-byte rows
    spec_topk: int

    @staticmethod
    def of(config: Any) -> DsaKey:
        return DsaKey(**{f.name: getattr(config, f.name) for f in fields(DsaKey)})

    def describe(self) -> str:
        return " ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))


@dataclass(frozen=True)
class DsaTritonConfig:
    """Shapes and tiles of one DSA variant's Triton kernels on one arch."""

    uri: str
    num_heads: int  # query heads per rank
    kv_lora_rank: int  # latent width: 512
    qk_rope_head_dim: int  # rope key width: 64
    index_heads: int  # indexer heads: 64
    index_head_dim: int  # indexer head dim: 128
    index_topk: int  # keys kept per query token: 2048
    # indexer q and keys: "float8_e4m3fn" (quantized, one fp32 scale per key, DeepSeek-V3.2)
    # or "bfloat16" / "float16" / "float32" (as the model computes them, no scales)
    index_dtype: str
    page_size: int  # tokens per page of both caches: 64
    dtype: str  # torch dtype name of q and out: "bfloat16" | "float16"
    kv_dtype: str  # latent cache: the activations' dtype name, or "float8_e4m3fn" (656 B)
    spec_topk: int  # speculative verify: 0 none, 1 draft chains
    num_draft_tokens: int  # verify rows per request (0 without speculative decoding)
    # -- sparse MLA over the selected slots: optional split of the top-k, then combine ----
    sparse_block_h: int  # query heads per program
    sparse_block_n: int  # selected slots per inner iteration
    sparse_num_warps: int
    sparse_num_stages: int
    max_splits: int  # most top-k splits per row (the runtime picks a power of two <= it)
    combine_num_warps: int
    # -- indexer scores and top-k ----
    indexer_block_n: int  # keys per tensor-core tile (divides page_size)
    indexer_block_s: int  # keys per program
    indexer_num_warps: int
    topk_block: int  # scores per pass step
    topk_num_warps: int
    # 1: the sparse attention runs the sm90 Gluon kernel (kernels/sparse_wg.py: 64 heads x
    # 64 slots on 8 warps, its own layouts)
    sparse_gluon: int = 0

    @property
    def key(self) -> DsaKey:
        return DsaKey.of(self)

    @property
    def fp8_cache(self) -> bool:
        return self.kv_dtype == "float8_e4m3fn"

    @property
    def fp8_index(self) -> bool:
        """The indexer's keys are e4m3 codes with a scale each (else plain floats)."""
        return self.index_dtype == "float8_e4m3fn"

    def gluon_shape_problems(self) -> list[str]:
        """What keeps the Gluon sparse kernels (``sparse_gluon``) from running this config
        on sm90: their fixed tile (64 heads x 64 slots on 8 warps) and, over fp8 rows, bf16
        activations (the rope product is bf16). The plan check and the launcher both ask."""
        problems = []
        tile = (self.sparse_block_h, self.sparse_block_n, self.sparse_num_warps)
        if tile != (64, 64, 8):
            problems.append(
                f"sparse_gluon=1 needs sparse_block_h 64, sparse_block_n 64 and 8 warps, got {tile}"
            )
        if self.fp8_cache and self.dtype != "bfloat16":
            problems.append(
                f"sparse_gluon=1 over fp8 rows needs bf16 activations, got {self.dtype}"
            )
        return problems

    @property
    def kv_width(self) -> int:
        """Last dim of a latent cache row: 576 elements, or 656 bytes (fp8 layout)."""
        lora, rope = self.kv_lora_rank, self.qk_rope_head_dim
        return lora + 4 * (lora // 128) + 2 * rope if self.fp8_cache else lora + rope


IDENTITY_FIELDS = ("uri", "num_draft_tokens", *(f.name for f in fields(DsaKey)))
TUNING_KEYS = tuple(f.name for f in fields(DsaTritonConfig) if f.name not in IDENTITY_FIELDS)


@dataclass(frozen=True)
class DsaTraits:
    """What one generated kernels module fixes for all its configs."""

    phases: tuple[str, ...]  # phases the spec generates
