"""Spec -> variants: the cartesian product of its axes, in declared order."""

from __future__ import annotations

import itertools

from attngen.spec.enums import DType
from attngen.spec.model import Spec
from attngen.spec.variant import Variant


def expand(spec: Spec) -> tuple[Variant, ...]:
    """Every variant of ``spec``; uris are unique within a spec."""
    kv = spec.kv_cache
    page_sizes = kv.page_size if kv else (None,)
    kv_dtypes = kv.dtype if kv else (None,)
    topks = spec.speculative.topk if spec.speculative else (None,)
    from attngen import registry  # the family packages register on first use

    shapes = tuple(registry.family(spec.family).spec.shapes(spec))
    out = []
    for shape, dtype, page, kv_dtype, topk in itertools.product(
        shapes, spec.dtype, page_sizes, kv_dtypes, topks
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
