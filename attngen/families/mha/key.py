"""The identity of one MHA variant's kernels, as the runtime, the docs and the uri see it.

A backend instance is built for exactly one :class:`MhaKey`: the constructor's arguments
make one, every generated config has one, and two backends that share a KV pool must have
the same one (hybrids). The variant uri encodes the same fields plus the module's mask.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from attngen.spec.enums import KV_DTYPE_NAME, TORCH_DTYPE_NAME
from attngen.families.mha.spec import MhaShape
from attngen.spec.variant import Variant


@dataclass(frozen=True, order=True)
class MhaKey:
    head_dim: int  # qk head dim
    v_head_dim: int  # v / output head dim
    gqa_group: int  # query heads per kv head
    page_size: int  # tokens per KV-cache page
    dtype: str  # torch dtype name of q and o
    kv_dtype: str  # the cache's: a torch dtype name, or "nvfp4"
    kv_scale: str  # "none" | "per_tensor" | "per_head" | "per_block"
    spec_topk: int  # 0: no speculative verify; 1: draft chains; > 1: draft trees

    @classmethod
    def of(cls, config: object) -> MhaKey:
        """The key of anything that has the key's fields (a generated config)."""
        return cls(**{f.name: getattr(config, f.name) for f in fields(cls)})

    @classmethod
    def of_variant(cls, variant: Variant) -> MhaKey:
        shape = variant.shape
        assert isinstance(shape, MhaShape)
        assert variant.kv_dtype is not None and variant.page_size is not None
        return cls(
            head_dim=shape.head_dim,
            v_head_dim=shape.v_head_dim,
            gqa_group=shape.gqa_group,
            page_size=variant.page_size,
            dtype=TORCH_DTYPE_NAME[variant.dtype],
            kv_dtype=KV_DTYPE_NAME[variant.kv_dtype],
            kv_scale=variant.kv_scale.value if variant.kv_scale is not None else "none",
            spec_topk=variant.spec_topk or 0,
        )

    def describe(self) -> str:
        return " ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))

    def differences(self, other: MhaKey) -> list[str]:
        """``name=want (got)`` for each field where ``other`` differs."""
        return [
            f"{f.name}={getattr(self, f.name)} (got {getattr(other, f.name)})"
            for f in fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        ]
