"""The features the support matrix reports, each with a probe variant asking ``supports()``.

A column of the docs table is a :class:`Feature`: a predicate picking the spec variants
that exercise it (their evidence decides verified / compiles) and a probe variant, built
from a family's base variant, whose verdict explains the cell when nothing is lowered.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from attngen.capabilities import Status, supports
from attngen.spec.enums import Arch, Backend, DType, Family, MaskKind, Phase, ScaleGranularity
from attngen.spec.errors import Location
from attngen.spec.model import Mask, Spec, Speculative
from attngen.spec.variant import DsaShape, GdnShape, MhaShape, MlaShape, Variant

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


def _spec(family: Family, **kw: object) -> Spec:
    base = dict(
        location=PROBE,
        path="<probe>",
        name="probe",
        family=family,
        description="",
        phases=(Phase.EXTEND, Phase.DECODE),
        dtype=(DType.BF16,),
        heads=None,
        mla=None,
        gdn=None,
        dsa=None,
        kv_cache=None,
        speculative=None,
        targets=(),
        tuning=(),
        sha256="",
        mask=Mask(
            location=PROBE, kind=MaskKind.CAUSAL, window_left=None, logit_softcap=None, sinks=False
        ),
    )
    base.update(kw)
    return Spec(**base)  # type: ignore[arg-type]


def base_variant(family: Family) -> Variant:
    """The plainest variant of a family: bf16, page 1, causal, extend + decode."""
    mla = MlaShape(512, 64, 128, 128, 16)
    shapes = {
        Family.MHA: MhaShape(128, 128, 4),
        Family.MLA: mla,
        Family.GDN: GdnShape(128, 128, 1, DType.FP32, 64),
        Family.DSA: DsaShape(mla, 64, 128, 2048),
    }
    page = None if family is Family.GDN else 1
    kv = None if family is Family.GDN else DType.BF16
    return Variant(_spec(family), shapes[family], DType.BF16, page, kv, None, None)


def _with(v: Variant, **spec_kw: object) -> Variant:
    return dataclasses.replace(v, spec=dataclasses.replace(v.spec, **spec_kw))


def _mask(v: Variant, **kw: object) -> Variant:
    return _with(v, mask=dataclasses.replace(v.spec.mask, **kw))


def _speculative(v: Variant, topk: int) -> Variant:
    spec = Speculative(location=PROBE, topk=(topk,), num_draft_tokens=max(4, topk))
    kind = MaskKind.CUSTOM if topk > 1 else v.mask.kind
    out = _with(
        v, phases=(Phase.VERIFY,), speculative=spec, mask=dataclasses.replace(v.mask, kind=kind)
    )
    return dataclasses.replace(out, spec_topk=topk)


def _phase(phase: Phase) -> Callable[[Variant], Variant]:
    return lambda v: _with(v, phases=(phase,))


def _has_phase(phase: Phase) -> Callable[[Variant], bool]:
    return lambda v: phase in v.phases


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


def _topk(pred: Callable[[int], bool]) -> Callable[[Variant], bool]:
    return lambda v: v.spec_topk is not None and pred(v.spec_topk)


def _graph_checks(v: Variant) -> frozenset[str]:
    return frozenset({"cuda_graph"})


def _quantized_checks(v: Variant) -> frozenset[str]:
    """Phase numerics on dequantized values, and the error vs bf16 K/V within its bound."""
    return phase_checks(v) | {"quantized_vs_bf16"}


def _verify_checks(v: Variant) -> frozenset[str]:
    """Verify numerics and CUDA-graph capture/replay, and draft extend's where generated."""
    extra = {"draft_extend", "cuda_graph_draft_extend"} if Phase.DRAFT_EXTEND in v.phases else set()
    return frozenset({"verify", "cuda_graph_verify"} | extra)


def _gqa_detail(v: Variant) -> str:
    return str(v.shape.gqa_group)  # type: ignore[union-attr]


def _head_dim_detail(v: Variant) -> str:
    return str(v.shape.head_dim)  # type: ignore[union-attr]


def _common(family: Family) -> list[Feature]:
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
            _topk(lambda k: k == 1),
            lambda v: _speculative(v, 1),
            _verify_checks,
        ),
        Feature(
            "spec_topkn",
            "Spec topk>1",
            family,
            _topk(lambda k: k > 1),
            lambda v: _speculative(v, 4),
            _verify_checks,
        ),
    ]


def _mha() -> list[Feature]:
    fam = Family.MHA
    return _common(fam) + [
        Feature(
            "sliding_window",
            "Sliding Window",
            fam,
            lambda v: v.mask.kind is MaskKind.SLIDING_WINDOW,
            lambda v: _mask(v, kind=MaskKind.SLIDING_WINDOW, window_left=4096),
            phase_checks,
        ),
        Feature(
            "multimodal",
            "MultiModal (bidirectional prefill)",
            fam,
            lambda v: v.mask.kind is MaskKind.NONE and Phase.PREFILL in v.phases,
            lambda v: _mask(_phase(Phase.PREFILL)(v), kind=MaskKind.NONE),
            phase_checks,
        ),
        Feature(
            "softcap",
            "Logit softcap",
            fam,
            lambda v: v.mask.logit_softcap is not None,
            lambda v: _mask(v, logit_softcap=50.0),
            phase_checks,
        ),
        Feature(
            "sinks",
            "Attention sinks",
            fam,
            lambda v: v.mask.sinks,
            lambda v: _mask(v, sinks=True),
            phase_checks,
        ),
        Feature(
            "non_causal",
            "Non-causal extend",
            fam,
            lambda v: v.mask.kind is MaskKind.NONE and Phase.EXTEND in v.phases,
            lambda v: _mask(_phase(Phase.EXTEND)(v), kind=MaskKind.NONE),
            phase_checks,
        ),
        Feature(
            "decode", "Decode", fam, _has_phase(Phase.DECODE), _phase(Phase.DECODE), phase_checks
        ),
        Feature(
            "extend",
            "Extend (cached prefix)",
            fam,
            _has_phase(Phase.EXTEND),
            _phase(Phase.EXTEND),
            phase_checks,
        ),
        Feature("gqa", "GQA group", fam, lambda v: True, lambda v: v, phase_checks, _gqa_detail),
        Feature(
            "mqa",
            "MQA (one kv head)",
            fam,
            lambda v: bool({Phase.DECODE, Phase.EXTEND, Phase.PREFILL} & set(v.phases)),
            lambda v: v,
            lambda v: frozenset({"mqa"}),
        ),
        Feature(
            "head_dim",
            "Head dims",
            fam,
            lambda v: True,
            lambda v: v,
            phase_checks,
            _head_dim_detail,
        ),
        Feature(
            "cuda_graph",
            "CUDA graph (decode)",
            fam,
            _has_phase(Phase.DECODE),
            _phase(Phase.DECODE),
            _graph_checks,
        ),
    ]


def _mla_like(family: Family) -> list[Feature]:
    return _common(family) + [
        Feature(
            "decode", "Decode", family, _has_phase(Phase.DECODE), _phase(Phase.DECODE), phase_checks
        ),
        Feature(
            "extend",
            "Chunked Prefix Cache (extend)",
            family,
            _has_phase(Phase.EXTEND),
            _phase(Phase.EXTEND),
            phase_checks,
        ),
    ]


def _gdn() -> list[Feature]:
    fam = Family.GDN
    return [
        Feature(
            "decode", "Decode", fam, _has_phase(Phase.DECODE), _phase(Phase.DECODE), phase_checks
        ),
        Feature(
            "extend",
            "Prefill / Extend",
            fam,
            _has_phase(Phase.EXTEND),
            _phase(Phase.EXTEND),
            phase_checks,
        ),
        Feature(
            "spec_topk1",
            "Spec Decoding (Target Verify)",
            fam,
            _topk(lambda k: k >= 1),
            lambda v: _speculative(v, 1),
            phase_checks,
        ),
    ]


FEATURES: dict[Family, tuple[Feature, ...]] = {
    Family.MHA: tuple(_mha()),
    Family.MLA: tuple(_mla_like(Family.MLA)),
    Family.GDN: tuple(_gdn()),
    Family.DSA: tuple(_mla_like(Family.DSA)),
}


def probe_verdict(feature: Feature, backend: Backend, arch: Arch):
    return supports(feature.probe(base_variant(feature.family)), backend, arch)


def feature_lines(family: Family, backend: Backend, arch: Arch) -> tuple[str, ...]:
    """Header lines of a generated module: what this target lowers and what it does not."""
    lines = [f"Target: {family.value} on {backend.value} {arch.value}."]
    for feature in FEATURES[family]:
        verdict = probe_verdict(feature, backend, arch)
        if verdict.status is Status.SUPPORTED:
            lines.append(f"  lowered:       {feature.label}")
        elif verdict.status is Status.NOT_LOWERED:
            lines.append(f"  not lowered:   {feature.label} ({verdict.reason})")
        else:
            lines.append(f"  not supported: {feature.label} ({verdict.reason})")
    return tuple(lines)
