"""What an MLA backend instance is built for: :class:`MlaKey`, the identity fields of a
Triton config (the runtime selects a generated config by it)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class MlaKey:
    num_heads: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    page_size: int
    dtype: str
    kv_dtype: str
    spec_topk: int

    @staticmethod
    def of(config: Any) -> MlaKey:
        return MlaKey(**{f.name: getattr(config, f.name) for f in fields(MlaKey)})

    def describe(self) -> str:
        return " ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))
