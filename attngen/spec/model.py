"""The typed spec: frozen dataclasses, one per YAML section, each with its FIELDS table.

A ``dict`` never travels past the loader: everything downstream reads these objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from attngen.spec.enums import Arch, Backend, DType, Family, MaskKind, Phase, ScaleGranularity
from attngen.spec.errors import Location
from attngen.spec.fields import Bool, Field, Float, Int, OneOf, Text

T = TypeVar("T")

ACT_DTYPES = (DType.BF16, DType.FP16)
KV_DTYPES = (
    DType.AUTO,
    DType.BF16,
    DType.FP16,
    DType.FP8_E4M3,
    DType.FP8_E5M2,
    DType.NVFP4,
    DType.MXFP4,
)


@dataclass(frozen=True)
class Section:
    """A typed spec section. Its ``location`` is the section's first line; ``at(key)`` is
    the line of one of its keys (where an error about that key should point)."""

    key_lines: tuple[tuple[str, Location], ...] = field(
        default=(), kw_only=True, compare=False, repr=False
    )

    def at(self, key: str) -> Location:
        for name, location in self.key_lines:
            if name == key:
                return location
        return self.location  # type: ignore[attr-defined]

    def given(self, key: str) -> bool:
        """Whether the spec writes ``key`` in this section (else the field has its default)."""
        return any(name == key for name, _ in self.key_lines)


@dataclass(frozen=True)
class KvCache(Section):
    """Paged KV cache: page size and storage dtype."""

    FIELDS = (
        Field(
            "page_size", Int(1, 128, power_of_two=True), "tokens per page", default=(1,), axis=True
        ),
        Field(
            "dtype",
            OneOf(DType, KV_DTYPES),
            "storage dtype (auto = activations')",
            default=(DType.AUTO,),
            axis=True,
        ),
        Field(
            "scale",
            OneOf(ScaleGranularity, tuple(ScaleGranularity)),
            "dequant scale granularity (fp8/fp4 only)",
        ),
    )
    location: Location
    page_size: tuple[int, ...]
    dtype: tuple[DType, ...]
    scale: ScaleGranularity | None


@dataclass(frozen=True)
class Mask(Section):
    """Which keys each query sees, and score modifiers."""

    FIELDS = (
        Field("kind", OneOf(MaskKind, tuple(MaskKind)), "mask kind", default=MaskKind.CAUSAL),
        Field("window_left", Int(1, 1 << 20), "sliding window: keys visible to the left"),
        Field("logit_softcap", Float(1e-6, 1e6), "softcap: scores become cap * tanh(score / cap)"),
        Field("sinks", Bool(), "per-head learned sink logit joins the softmax", default=False),
    )
    location: Location
    kind: MaskKind
    window_left: int | None
    logit_softcap: float | None
    sinks: bool


@dataclass(frozen=True)
class Speculative(Section):
    """Speculative decoding: topk 1 = chain of drafts, > 1 = tree."""

    FIELDS = (
        Field("topk", Int(1, 16), "draft branches per step", required=True, axis=True),
        Field("num_draft_tokens", Int(1, 64), "draft tokens verified per request", required=True),
    )
    location: Location
    topk: tuple[int, ...]
    num_draft_tokens: int


@dataclass(frozen=True)
class Target:
    """One backend and the archs it is generated for."""

    location: Location
    backend: Backend
    archs: tuple[Arch, ...]


@dataclass(frozen=True)
class Tuning:
    """Overrides of one backend's tile heuristics on one arch (``tuning.<backend>.<arch>``);
    the keys are the ones that backend's lowering of the family declares."""

    location: Location
    backend: Backend
    arch: Arch
    values: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Spec(Section):
    """One YAML spec file (its ``key_lines``: the top-level keys it writes)."""

    FIELDS = (
        Field("name", Text(identifier=True), "spec name (module name)", required=True),
        Field("family", OneOf(Family, tuple(Family)), "attention family", required=True),
        Field("description", Text(max_length=300), "one line for the docs", required=True),
        Field("phases", OneOf(Phase, tuple(Phase)), "phases to generate", required=True, many=True),
        Field(
            "dtype",
            OneOf(DType, ACT_DTYPES),
            "activation dtype (q, o)",
            default=(DType.BF16,),
            axis=True,
        ),
    )
    location: Location
    path: str
    name: str
    family: Family
    description: str
    phases: tuple[Phase, ...]
    dtype: tuple[DType, ...]
    sections: tuple[object, ...]  # the family's shape sections (its FamilySpec), read
    section_names: tuple[str, ...]  # their keys in the spec, in the same order
    kv_cache: KvCache | None
    mask: Mask
    speculative: Speculative | None
    targets: tuple[Target, ...]
    tuning: tuple[Tuning, ...]
    sha256: str  # of the spec file's bytes: provenance and cache keys

    def field_at(self, path: str) -> Location | None:
        """The line of spec field ``path`` (``phases``, ``mask.kind``, ``heads.head_dim``)
        when the spec writes it; None for a field left at its default."""
        head, _, key = path.partition(".")
        if not key:
            return self.at(head) if self.given(head) else None
        named = dict(zip(self.section_names, self.sections))
        named.update(kv_cache=self.kv_cache, mask=self.mask, speculative=self.speculative)
        section = named.get(head)
        if not isinstance(section, Section) or not section.given(key):
            return None
        return section.at(key)

    def section(self, cls: type[T]) -> T:
        """The family section of type ``cls`` (the family's FamilySpec declares it)."""
        for section in self.sections:
            if isinstance(section, cls):
                return section
        raise KeyError(f"spec {self.name} ({self.family.value}) has no {cls.__name__} section")

    def tuning_for(self, backend: Backend, arch: Arch) -> dict[str, int]:
        """The tile overrides this spec sets for one backend and arch."""
        return {
            k: v for t in self.tuning if (t.backend, t.arch) == (backend, arch) for k, v in t.values
        }


# The typed sections every family's spec may have, by key (the families add their shape
# sections through their FamilySpec): the loader reads them and the JSON schema describes them.
SECTIONS: dict[str, type] = {
    "kv_cache": KvCache,
    "mask": Mask,
    "speculative": Speculative,
}
# The top-level keys of any spec, in the order the docs list them (family sections go
# between the scalar fields and these sections).
SCALAR_KEYS: tuple[str, ...] = tuple(f.key for f in Spec.FIELDS)
TAIL_KEYS: tuple[str, ...] = (*SECTIONS, "targets", "tuning")
