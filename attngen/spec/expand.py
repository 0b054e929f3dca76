"""Spec -> variants: the cartesian product of its axes, in declared order."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import assert_never

from attngen.spec.enums import DType, Family
from attngen.spec.model import Spec
from attngen.spec.variant import DsaShape, GdnShape, MhaShape, MlaShape, Shape, Variant


def expand(spec: Spec) -> tuple[Variant, ...]:
    """Every variant of ``spec``; uris are unique within a spec."""
    kv = spec.kv_cache
    page_sizes = kv.page_size if kv else (None,)
    kv_dtypes = kv.dtype if kv else (None,)
    topks = spec.speculative.topk if spec.speculative else (None,)
    out = []
    for shape, dtype, page, kv_dtype, topk in itertools.product(
        _shapes(spec), spec.dtype, page_sizes, kv_dtypes, topks
    ):
        resolved = dtype if kv_dtype is DType.AUTO else kv_dtype
        scale = kv.scale if kv is not None else None
        drafts = spec.speculative.num_draft_tokens if spec.speculative else 0
        out.append(
            Variant(
                spec=spec,
                family=spec.family,
                shape=shape,
                phases=spec.phases,
                dtype=dtype,
                page_size=page,
                kv_dtype=resolved,
                kv_scale=scale,
                mask=spec.mask,
                spec_topk=topk,
                num_draft_tokens=drafts,
            )
        )
    return tuple(out)


def _shapes(spec: Spec) -> Iterator[Shape]:
    if spec.family is Family.MHA:
        heads = spec.heads
        v_dims = heads.v_head_dim or (None,)
        for d, dv, g in itertools.product(heads.head_dim, v_dims, heads.gqa_group):
            yield MhaShape(d, d if dv is None else dv, g)
    elif spec.family is Family.MLA:
        yield from _mla_shapes(spec)
    elif spec.family is Family.GDN:
        gdn = spec.gdn
        for k, v, g, s in itertools.product(
            gdn.key_dim, gdn.value_dim, gdn.v_heads_per_k_head, gdn.state_dtype
        ):
            yield GdnShape(k, v, g, s, gdn.chunk_size)
    elif spec.family is Family.DSA:
        dsa = spec.dsa
        for mla, topk in itertools.product(_mla_shapes(spec), dsa.index_topk):
            yield DsaShape(mla, dsa.index_heads, dsa.index_head_dim, topk)
    else:
        assert_never(spec.family)


def _mla_shapes(spec: Spec) -> Iterator[MlaShape]:
    mla = spec.mla
    for heads in mla.num_heads:
        yield MlaShape(
            mla.kv_lora_rank, mla.qk_rope_head_dim, mla.qk_nope_head_dim, mla.v_head_dim, heads
        )
