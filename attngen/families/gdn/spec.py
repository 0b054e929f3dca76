"""GDN's part of a spec: the ``gdn`` section (state shape) and its shape.

GDN keeps a per-request recurrent state instead of a paged KV cache, and is causal by
construction: a spec of it takes no ``kv_cache`` section and no other mask.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from attngen.spec.enums import DType, MaskKind
from attngen.spec.errors import Location, SpecError
from attngen.spec.family import FamilySpec
from attngen.spec.fields import Field, Int, OneOf
from attngen.spec.model import Spec


@dataclass(frozen=True)
class GdnDims:
    """Gated delta rule linear attention: per-head recurrent state [key_dim, value_dim]."""

    FIELDS = (
        Field("key_dim", Int(16, 256, power_of_two=True), "k head dim", required=True, axis=True),
        Field("value_dim", Int(16, 256, power_of_two=True), "v head dim", required=True, axis=True),
        Field(
            "v_heads_per_k_head",
            Int(1, 16, power_of_two=True),
            "value heads per key head (Qwen3-Next: 2)",
            required=True,
            axis=True,
        ),
        Field(
            "state_dtype",
            OneOf(DType, (DType.FP32, DType.BF16)),
            "recurrent state dtype (default fp32)",
            default=(DType.FP32,),
            axis=True,
        ),
        Field(
            "chunk_size",
            Int(16, 128, power_of_two=True),
            "chunked-prefill chunk (default 64)",
            default=64,
        ),
    )
    location: Location
    key_dim: tuple[int, ...]
    value_dim: tuple[int, ...]
    v_heads_per_k_head: tuple[int, ...]
    state_dtype: tuple[DType, ...]
    chunk_size: int


@dataclass(frozen=True)
class GdnShape:
    key_dim: int
    value_dim: int
    v_heads_per_k_head: int
    state_dtype: DType
    chunk_size: int

    @property
    def uri(self) -> str:
        return (
            f"k{self.key_dim}_v{self.value_dim}_gv{self.v_heads_per_k_head}"
            f"_s{self.state_dtype.value}"
        )


def shapes(spec: Spec) -> Iterator[GdnShape]:
    gdn = spec.section(GdnDims)
    for k, v, g, s in itertools.product(
        gdn.key_dim, gdn.value_dim, gdn.v_heads_per_k_head, gdn.state_dtype
    ):
        yield GdnShape(k, v, g, s, gdn.chunk_size)


def check(spec: Spec) -> None:
    mask = spec.mask
    if mask.kind is not MaskKind.CAUSAL or mask.logit_softcap or mask.sinks:
        raise SpecError(
            mask.location,
            "mask",
            "gdn is causal linear attention: no other mask kind, softcap or sinks",
        )


SPEC = FamilySpec(
    {"gdn": GdnDims}, shapes, kv_cache="gdn keeps a recurrent state, not a KV cache", check=check
)
