"""DSA's part of a spec: the ``dsa`` indexer section plus MLA's ``mla`` section.

DSA's caches come in 64-token pages: the indexer's key cache packs 64 keys per page (fp8
keys with their 64 scales, or keys in bf16 / fp16 / fp32), and the sparse MLA kernels
address the latent cache in the same pages.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from attngen.families.mla.spec import MlaDims, MlaShape, check_mask
from attngen.families.mla.spec import shapes as mla_shapes
from attngen.spec.errors import Location, SpecError
from attngen.spec.family import FamilySpec
from attngen.spec.enums import DType
from attngen.spec.fields import Field, Int, OneOf
from attngen.spec.model import Section, Spec

PAGE_SIZE = 64
# What the indexer scores in: DeepSeek-V3.2's fp8 (q and keys quantized, one scale per key)
# or the keys and q as they are in a 16- or 32-bit float (transformers' formula in the
# model's own dtype: no quantization, products in that precision).
INDEXER_DTYPES = (DType.FP8_E4M3, DType.BF16, DType.FP16, DType.FP32)


@dataclass(frozen=True)
class DsaIndexer(Section):
    """DeepSeek sparse attention's lightning indexer and top-k selection."""

    FIELDS = (
        Field(
            "index_heads",
            Int(1, 128, power_of_two=True),
            "indexer heads (DeepSeek-V3.2: 64)",
            required=True,
        ),
        Field(
            "index_head_dim",
            Int(32, 256, power_of_two=True),
            "indexer head dim (DeepSeek-V3.2: 128)",
            required=True,
        ),
        Field(
            "index_topk",
            Int(64, 8192, power_of_two=True),
            "kv tokens kept per query (DeepSeek-V3.2: 2048)",
            required=True,
            axis=True,
        ),
        Field(
            "index_dtype",
            OneOf(DType, INDEXER_DTYPES),
            "what the indexer scores in: fp8_e4m3 (DeepSeek-V3.2's; q and keys quantized, "
            "one scale per key) or the model's own bf16 / fp16 / fp32 (no quantization)",
            default=(DType.FP8_E4M3,),
            axis=True,
        ),
    )
    location: Location
    index_heads: int
    index_head_dim: int
    index_topk: tuple[int, ...]
    index_dtype: tuple[DType, ...]


@dataclass(frozen=True)
class DsaShape:
    mla: MlaShape
    index_heads: int
    index_head_dim: int
    index_topk: int
    index_dtype: DType = DType.FP8_E4M3

    @property
    def uri(self) -> str:
        # fp8 (the default) unnamed: DeepSeek-V3.2's variants keep their uris
        dtype = "" if self.index_dtype is DType.FP8_E4M3 else self.index_dtype.value
        ix = f"ix{self.index_heads}x{self.index_head_dim}{dtype}"
        return f"{self.mla.uri}_{ix}_top{self.index_topk}"


def shapes(spec: Spec) -> Iterator[DsaShape]:
    dsa = spec.section(DsaIndexer)
    axes = itertools.product(mla_shapes(spec), dsa.index_topk, dsa.index_dtype)
    for mla, topk, index_dtype in axes:
        yield DsaShape(mla, dsa.index_heads, dsa.index_head_dim, topk, index_dtype)


def check(spec: Spec) -> None:
    check_mask(spec, "dsa")
    kv = spec.kv_cache
    assert kv is not None  # DSA keeps a KV cache: the loader fills the section
    other = [p for p in kv.page_size if p != PAGE_SIZE]
    if other:
        given = f"{other[0]}" if kv.given("page_size") else f"{other[0]} (the default)"
        raise SpecError(
            kv.at("page_size"),
            "kv_cache.page_size",
            f"dsa needs {PAGE_SIZE}-token pages, not {given}: the indexer's key cache packs "
            f"{PAGE_SIZE} keys per page, and sparse MLA reads the latent "
            "cache in the same pages",
        )


SPEC = FamilySpec({"dsa": DsaIndexer, "mla": MlaDims}, shapes, check=check)
