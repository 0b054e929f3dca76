"""The features the support matrix reports, each with a probe variant asking ``supports()``.

A column of the docs table is a :class:`Feature`: a predicate picking the spec variants
that exercise it (their evidence decides verified / compiles) and a probe variant, built
from a family's base variant, whose verdict explains the cell when nothing is lowered.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from attngen.spec.enums import DType, Family, MaskKind, Phase, ScaleGranularity
from attngen.spec.errors import Location
from attngen.spec.model import Mask
from attngen.spec.reader import default_section
from attngen.spec.variant import Shape, Variant

PROBE = Location("<probe>", 0)


@dataclass(frozen=True)
class Feature:
    key: str
    label: str  # column header (the reference doc's wording where it has one)
    family: Family
    applies: Callable[[Variant], bool]  # spec variants that exercise the feature
    probe: Callable[[Variant], Variant]  # base variant -> a variant exercising it
    checks: Callable[[Variant], frozenset[str]]  # GPU checks that must have passed
    detail: Callable[[Variant], str] | None = None  # shown next to verified cells


def phase_checks(v: Variant) -> frozenset[str]:
    """GPU checks named after the phases: decode, extend, verify, draft_extend, prefill."""
    return frozenset(p.value for p in v.phases)


def probe_mask() -> Mask:
    """The mask a spec without a mask section gets (the loader's default)."""
    return default_section(Mask, PROBE)


def plain_variant(family: Family, shape: Shape, *, paged: bool = True) -> Variant:
    """A family's plainest variant: bf16, page 1 and a bf16 cache (``paged``), the default
    (causal) mask, extend + decode, no speculative decoding. Probes start from it."""
    return Variant(
        spec=None,
        family=family,
        shape=shape,
        phases=(Phase.EXTEND, Phase.DECODE),
        dtype=DType.BF16,
        page_size=1 if paged else None,
        kv_dtype=DType.BF16 if paged else None,
        kv_scale=None,
        mask=probe_mask(),
        spec_topk=None,
    )


def with_mask(v: Variant, **kw: object) -> Variant:
    return dataclasses.replace(v, mask=dataclasses.replace(v.mask, **kw))


def speculative(v: Variant, topk: int) -> Variant:
    """``v`` verifying ``max(4, topk)`` drafts: a chain (topk 1) or a tree (custom mask)."""
    kind = MaskKind.CUSTOM if topk > 1 else v.mask.kind
    return dataclasses.replace(
        with_mask(v, kind=kind),
        phases=(Phase.VERIFY,),
        spec_topk=topk,
        num_draft_tokens=max(4, topk),
    )


def only_phase(phase: Phase) -> Callable[[Variant], Variant]:
    return lambda v: dataclasses.replace(v, phases=(phase,))


def has_phase(phase: Phase) -> Callable[[Variant], bool]:
    return lambda v: phase in v.phases


def shape_column(key: str, label: str, family: Family, detail: Callable[[Variant], str]) -> Feature:
    """A column of one shape value (GQA group, head dims, heads): every variant counts, with
    its phase checks; the cell lists the values verified."""
    return Feature(key, label, family, lambda v: True, lambda v: v, phase_checks, detail)


def decode_graph_column(family: Family) -> Feature:
    """attngen's CUDA graph (decode) column: every decode variant needs its recorded graph
    replays (check ``cuda_graph``)."""
    return Feature(
        "cuda_graph",
        "CUDA graph (decode)",
        family,
        has_phase(Phase.DECODE),
        only_phase(Phase.DECODE),
        lambda v: frozenset({"cuda_graph"}),
    )


def _page_detail(v: Variant) -> str:
    return str(v.page_size)


def _kv(dtype: DType, scale: ScaleGranularity) -> Callable[[Variant], Variant]:
    return lambda v: dataclasses.replace(v, kv_dtype=dtype, kv_scale=scale)


def _is_fp8(v: Variant) -> bool:
    return v.kv_dtype in (DType.FP8_E4M3, DType.FP8_E5M2)


def _kv_detail(v: Variant) -> str:
    """e.g. "e4m3 per_tensor": the cache format and its scales."""
    name = v.kv_dtype.value.removeprefix("fp8_") if v.kv_dtype else "?"
    return f"{name} {v.kv_scale.value}" if v.kv_scale else name


def _is_fp4(v: Variant) -> bool:
    return v.kv_dtype in (DType.NVFP4, DType.MXFP4)


def topk_is(pred: Callable[[int], bool]) -> Callable[[Variant], bool]:
    return lambda v: v.spec_topk is not None and pred(v.spec_topk)


def _quantized_checks(v: Variant) -> frozenset[str]:
    """Phase numerics on dequantized values, and the error vs bf16 K/V within its bound."""
    return phase_checks(v) | {"quantized_vs_bf16"}


def _verify_checks(v: Variant) -> frozenset[str]:
    """Verify numerics and CUDA-graph capture/replay, and draft extend's where generated."""
    extra = {"draft_extend", "cuda_graph_draft_extend"} if Phase.DRAFT_EXTEND in v.phases else set()
    return frozenset({"verify", "cuda_graph_verify"} | extra)


def kv_cache_columns(family: Family) -> list[Feature]:
    """Columns every KV-cache family shares with the reference doc."""
    return [
        Feature(
            "page_native",
            "Page Size > 1 (native)",
            family,
            lambda v: (v.page_size or 1) > 1,
            lambda v: dataclasses.replace(v, page_size=64),
            phase_checks,
            _page_detail,
        ),
        Feature(
            "fp8_kv",
            "FP8 KV Cache",
            family,
            _is_fp8,
            _kv(DType.FP8_E4M3, ScaleGranularity.PER_TENSOR),
            _quantized_checks,
            _kv_detail,
        ),
        Feature(
            "fp4_kv",
            "FP4 KV Cache",
            family,
            _is_fp4,
            _kv(DType.NVFP4, ScaleGranularity.PER_BLOCK),
            _quantized_checks,
        ),
        Feature(
            "spec_topk1",
            "Spec topk=1",
            family,
            topk_is(lambda k: k == 1),
            lambda v: speculative(v, 1),
            _verify_checks,
        ),
        Feature(
            "spec_topkn",
            "Spec topk>1",
            family,
            topk_is(lambda k: k > 1),
            lambda v: speculative(v, 4),
            _verify_checks,
        ),
    ]
