"""THE capability model: ``supports(variant, backend, arch)``.

Validation, the lowering, the emitters, the docs and the tests all ask this one function,
so the support matrix cannot disagree with what is generated. A verdict is one of:

- SUPPORTED: attngen lowers this variant for this backend and arch;
- NOT_LOWERED: possible on that hardware and backend, but no lowering exists yet;
- UNSUPPORTED: the backend or hardware cannot do it (the reason says why).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from attngen.spec.enums import Arch, Backend, DType, Family, MaskKind, Phase
from attngen.spec.variant import MhaShape, Variant


class Status(str, Enum):
    SUPPORTED = "supported"
    NOT_LOWERED = "not_lowered"
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class Verdict:
    status: Status
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status is Status.SUPPORTED


SUPPORTED = Verdict(Status.SUPPORTED)

# What the Triton MHA lowering covers: every phase; causal / bidirectional / sliding-window
# masks, speculative draft chains and trees, logit softcap and attention sinks; bf16/fp16
# activations over a bf16/fp16, fp8 (e4m3, e5m2; per-tensor or per-head scales) or NVFP4
# (e2m1 + e4m3 block scales + a global scale) cache.
TRITON_MHA_PHASES = frozenset(Phase)
TRITON_MHA_HEAD_DIMS = frozenset({64, 80, 96, 128, 192, 256})  # padded to a power of two
TRITON_MHA_DTYPES = frozenset({DType.BF16, DType.FP16})
TRITON_MHA_MAX_GQA_GROUP = 64  # query-head rows per decode program stay <= 64
TRITON_MHA_MASKS = frozenset(
    {MaskKind.CAUSAL, MaskKind.NONE, MaskKind.SLIDING_WINDOW, MaskKind.CUSTOM}
)
TRITON_MHA_QUANT_KV = frozenset({DType.FP8_E4M3, DType.FP8_E5M2, DType.NVFP4})


def supports(variant: Variant, backend: Backend, arch: Arch) -> Verdict:
    """Can ``backend`` on ``arch`` run ``variant``? See the module docstring."""
    hardware = _hardware_limits(variant, backend, arch)
    if hardware is not None:
        return Verdict(Status.UNSUPPORTED, hardware)
    if backend is Backend.CUTE_DSL:
        return Verdict(Status.NOT_LOWERED, "no CuTe DSL lowering exists yet")
    if variant.family is not Family.MHA:
        return Verdict(Status.NOT_LOWERED, f"no Triton lowering for {variant.family.value} yet")
    return _triton_mha(variant)


def alternatives(variant: Variant) -> list[tuple[Backend, Arch]]:
    """Every (backend, arch) that is not UNSUPPORTED for ``variant``, in enum order."""
    return [
        (b, a)
        for b in Backend
        for a in Arch
        if supports(variant, b, a).status is not Status.UNSUPPORTED
    ]


def _hardware_limits(variant: Variant, backend: Backend, arch: Arch) -> str | None:
    """Reasons no lowering could ever fix."""
    if backend is Backend.CUTE_DSL and arch is Arch.SM80:
        return "attngen's CuTe DSL kernels are built on wgmma (sm90) and tcgen05 (sm100); sm80 has neither"
    if arch is Arch.SM80 and variant.kv_dtype is DType.FP8_E4M3:
        return "fp8 e4m3 conversion needs sm89+; sm80 has no e4m3 hardware type"
    if arch is Arch.SM80 and variant.family is Family.DSA:
        return "DSA's lightning indexer scores keys in fp8 e4m3, which sm80 lacks"
    return None


def _triton_mha(variant: Variant) -> Verdict:
    shape = variant.shape
    assert isinstance(shape, MhaShape)
    extra_phases = set(variant.phases) - TRITON_MHA_PHASES
    checks = [
        (
            not extra_phases,
            f"phase {', '.join(sorted(p.value for p in extra_phases))} is not lowered yet",
        ),
        (
            variant.dtype in TRITON_MHA_DTYPES,
            f"activation dtype {variant.dtype.value} is not lowered",
        ),
        (
            variant.kv_dtype is variant.dtype or variant.kv_dtype in TRITON_MHA_QUANT_KV,
            f"{_kv_name(variant)} KV cache is not lowered yet",
        ),
        (
            variant.kv_dtype is not DType.NVFP4
            or all(d & (d - 1) == 0 for d in (shape.head_dim, shape.v_head_dim)),
            "NVFP4 KV needs power-of-two head dims (its packed rows are not lane-padded)",
        ),
        (
            variant.mask.kind in TRITON_MHA_MASKS,
            f"mask {variant.mask.kind.value} is not lowered yet",
        ),
        (
            variant.mask.kind is not MaskKind.CUSTOM or (variant.spec_topk or 0) > 1,
            "custom masks are lowered for speculative draft trees (topk > 1) only",
        ),
        (
            (variant.spec_topk or 0) <= 1 or variant.mask.kind is not MaskKind.SLIDING_WINDOW,
            "draft trees with a sliding window are not lowered (tree rows sit at depths, "
            "not at consecutive positions)",
        ),
        (
            (variant.spec_topk or 0) <= 1 or variant.mask.kind is not MaskKind.NONE,
            "draft trees need a causal base mask",
        ),
        (shape.head_dim in TRITON_MHA_HEAD_DIMS, f"head_dim {shape.head_dim} is not lowered yet"),
        (
            shape.v_head_dim in TRITON_MHA_HEAD_DIMS,
            f"v_head_dim {shape.v_head_dim} is not lowered yet",
        ),
        (
            shape.gqa_group <= TRITON_MHA_MAX_GQA_GROUP,
            f"gqa_group {shape.gqa_group} > {TRITON_MHA_MAX_GQA_GROUP} is not lowered",
        ),
    ]
    for ok, reason in checks:
        if not ok:
            return Verdict(Status.NOT_LOWERED, reason)
    return SUPPORTED


def _kv_name(variant: Variant) -> str:
    return variant.kv_dtype.value if variant.kv_dtype is not None else "no"
