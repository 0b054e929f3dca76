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
from attngen.spec.fields import Bool, Field, Int, OneOf
from attngen.spec.model import Section, Spec

DEFAULT_CHUNK = 64  # tokens per chunk of the chunked prefill when a spec names none


@dataclass(frozen=True)
class GdnDims(Section):
    """Gated delta rule linear attention: per-head recurrent state [key_dim, value_dim]."""

    FIELDS = (
        Field("key_dim", Int(16, 256, power_of_two=True), "k head dim", required=True, axis=True),
        Field("value_dim", Int(16, 256, power_of_two=True), "v head dim", required=True, axis=True),
        Field(
            "v_heads_per_k_head",
            Int(1, 16),
            "value heads per key head (Qwen3-Next: 2, Qwen3.5-27B: 3)",
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
            default=DEFAULT_CHUNK,
        ),
        Field(
            "conv_kernel",
            Int(2, 8),
            "width of the short causal conv over q|k|v, whose state keeps conv_kernel - 1 "
            "inputs per request (default 4, Qwen3-Next's)",
            default=4,
        ),
        Field(
            "qk_l2norm",
            Bool(),
            "q and k L2-normalised per head inside the kernels (default true, Qwen3-Next's)",
            default=True,
        ),
    )
    location: Location
    key_dim: tuple[int, ...]
    value_dim: tuple[int, ...]
    v_heads_per_k_head: tuple[int, ...]
    state_dtype: tuple[DType, ...]
    chunk_size: int
    conv_kernel: int
    qk_l2norm: bool


@dataclass(frozen=True)
class GdnShape:
    key_dim: int
    value_dim: int
    v_heads_per_k_head: int
    state_dtype: DType
    chunk_size: int
    conv_kernel: int = 4
    qk_l2norm: bool = True

    @property
    def uri(self) -> str:
        """Defaults (chunks of 64, conv width 4, in-kernel L2 norm) leave no mark in the uri."""
        parts = [
            f"k{self.key_dim}_v{self.value_dim}_gv{self.v_heads_per_k_head}"
            f"_s{self.state_dtype.value}"
        ]
        if self.chunk_size != DEFAULT_CHUNK:
            parts.append(f"c{self.chunk_size}")
        if self.conv_kernel != 4:
            parts.append(f"cw{self.conv_kernel}")
        if not self.qk_l2norm:
            parts.append("nol2")
        return "_".join(parts)


def shapes(spec: Spec) -> Iterator[GdnShape]:
    gdn = spec.section(GdnDims)
    for k, v, g, s in itertools.product(
        gdn.key_dim, gdn.value_dim, gdn.v_heads_per_k_head, gdn.state_dtype
    ):
        yield GdnShape(k, v, g, s, gdn.chunk_size, gdn.conv_kernel, gdn.qk_l2norm)


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


TORCH_DTYPES = {DType.BF16: "bfloat16", DType.FP16: "float16", DType.FP32: "float32"}


def config_identity(variant) -> dict[str, object]:
    """The identity fields every GDN backend's config carries (the runtime selects a config
    by them), from a variant of this family: its uri, shape, dtypes and speculative
    settings."""
    shape = variant.shape
    assert isinstance(shape, GdnShape)
    return dict(
        uri=variant.uri,
        key_dim=shape.key_dim,
        value_dim=shape.value_dim,
        v_heads_per_k_head=shape.v_heads_per_k_head,
        dtype=TORCH_DTYPES[variant.dtype],
        state_dtype=TORCH_DTYPES[shape.state_dtype],
        chunk_size=shape.chunk_size,
        conv_kernel=shape.conv_kernel,
        l2norm=shape.qk_l2norm,
        spec_topk=variant.spec_topk or 0,
        num_draft_tokens=variant.num_draft_tokens,
    )
