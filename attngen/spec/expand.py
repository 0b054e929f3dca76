"""Spec -> variants: the cartesian product of its axes, in declared order."""

from __future__ import annotations

import itertools
import math

from attngen.spec.enums import QUANTIZED_KV, DType
from attngen.spec.errors import SpecError
from attngen.spec.model import SECTIONS, Spec
from attngen.spec.variant import Variant

# The most variants one spec may name. Every value of an axis is checked on its own when
# the spec is read; this refuses a product too large to build (the largest spec in specs/
# names 72 variants; `generate` already warns above 256, generate.MANY_VARIANTS).
MAX_VARIANTS = 4096


def axes(spec: Spec) -> list[tuple[str, int]]:
    """Every axis field of the spec (``section.key``) and how many values it lists, in
    declared order; the variant count is their product."""
    from attngen import registry  # the family packages register on first use

    family_keys = registry.family(spec.family).spec.sections
    sections = [
        ("", spec),
        *zip(family_keys, spec.sections),
        *((key, getattr(spec, key)) for key in SECTIONS),
    ]
    out = []
    for prefix, section in sections:
        if section is None:
            continue
        for field in type(section).FIELDS:  # type: ignore[attr-defined]
            values = getattr(section, field.key)
            if field.axis and values is not None:
                out.append((f"{prefix}.{field.key}" if prefix else field.key, len(values)))
    return out


def check_count(spec: Spec) -> int:
    """The number of variants ``spec`` names; refuses more than MAX_VARIANTS before any
    variant is built."""
    counts = axes(spec)
    total = math.prod(n for _, n in counts)
    if total > MAX_VARIANTS:
        listed = " x ".join(f"{key} {n}" for key, n in counts if n > 1)
        raise SpecError(
            spec.location,
            "axes",
            f"{total} variants ({listed}): at most {MAX_VARIANTS} per spec; list fewer "
            "values per axis or split the spec",
        )
    return total


def expand(spec: Spec) -> tuple[Variant, ...]:
    """Every variant of ``spec``; uris are unique within a spec."""
    check_count(spec)
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
        # the scale is the quantized dtypes' ([bf16, fp8_e4m3]: the bf16 cache has none)
        scale = kv.scale if kv is not None and resolved in QUANTIZED_KV else None
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
