"""The typed spec: frozen dataclasses, one per YAML section, each with its FIELDS table.

A ``dict`` never travels past the loader: everything downstream reads these objects.
"""

from __future__ import annotations

from dataclasses import dataclass

from attngen.spec.enums import Arch, Backend, DType, Family, MaskKind, Phase, ScaleGranularity
from attngen.spec.errors import Location
from attngen.spec.fields import Bool, Field, Float, Int, OneOf, Text

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
class MhaHeads:
    """MHA/GQA/MQA head shapes."""

    FIELDS = (
        # any size the language can say; which ones a backend lowers is supports()' answer
        Field("head_dim", Int(1, 512), "q/k head dim", required=True, axis=True),
        Field(
            "v_head_dim",
            Int(1, 512),
            "v head dim (default: head_dim)",
            axis=True,
        ),
        Field("gqa_group", Int(1, 128), "query heads per kv head", default=(1,), axis=True),
    )
    location: Location
    head_dim: tuple[int, ...]
    v_head_dim: tuple[int, ...] | None
    gqa_group: tuple[int, ...]


@dataclass(frozen=True)
class MlaDims:
    """DeepSeek MLA: latent KV of kv_lora_rank plus a decoupled rope part."""

    FIELDS = (
        Field("kv_lora_rank", Int(64, 1024, power_of_two=True), "latent dim", default=512),
        Field("qk_rope_head_dim", Int(16, 128, power_of_two=True), "rope part", default=64),
        Field(
            "qk_nope_head_dim", Int(16, 256, power_of_two=True), "prefill nope part", default=128
        ),
        Field("v_head_dim", Int(16, 256, power_of_two=True), "prefill v head dim", default=128),
        Field(
            "num_heads",
            Int(1, 128, power_of_two=True),
            "q heads per rank",
            default=(128,),
            axis=True,
        ),
    )
    location: Location
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    num_heads: tuple[int, ...]


@dataclass(frozen=True)
class GdnDims:
    """Gated delta rule linear attention: per-head recurrent state [key_dim, value_dim]."""

    FIELDS = (
        Field("key_dim", Int(16, 256, power_of_two=True), "k head dim", default=(128,), axis=True),
        Field(
            "value_dim", Int(16, 256, power_of_two=True), "v head dim", default=(128,), axis=True
        ),
        Field(
            "v_heads_per_k_head",
            Int(1, 16, power_of_two=True),
            "grouped value heads",
            default=(1,),
            axis=True,
        ),
        Field(
            "state_dtype",
            OneOf(DType, (DType.FP32, DType.BF16)),
            "recurrent state dtype",
            default=(DType.FP32,),
            axis=True,
        ),
        Field("chunk_size", Int(16, 128, power_of_two=True), "chunked-prefill chunk", default=64),
    )
    location: Location
    key_dim: tuple[int, ...]
    value_dim: tuple[int, ...]
    v_heads_per_k_head: tuple[int, ...]
    state_dtype: tuple[DType, ...]
    chunk_size: int


@dataclass(frozen=True)
class DsaIndexer:
    """DeepSeek sparse attention's lightning indexer and top-k selection."""

    FIELDS = (
        Field("index_heads", Int(1, 128, power_of_two=True), "indexer heads", default=64),
        Field("index_head_dim", Int(32, 256, power_of_two=True), "indexer head dim", default=128),
        Field(
            "index_topk",
            Int(64, 8192, power_of_two=True),
            "kv tokens kept per query",
            default=(2048,),
            axis=True,
        ),
    )
    location: Location
    index_heads: int
    index_head_dim: int
    index_topk: tuple[int, ...]


@dataclass(frozen=True)
class KvCache:
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
class Mask:
    """Which keys each query sees, and score modifiers."""

    FIELDS = (
        Field("kind", OneOf(MaskKind, tuple(MaskKind)), "mask kind", default=MaskKind.CAUSAL),
        Field("window_left", Int(1, 1 << 20), "sliding window: keys visible to the left"),
        Field("logit_softcap", Float(0.0), "softcap: scores become cap * tanh(score / cap)"),
        Field("sinks", Bool(), "per-head learned sink logit joins the softmax", default=False),
    )
    location: Location
    kind: MaskKind
    window_left: int | None
    logit_softcap: float | None
    sinks: bool


@dataclass(frozen=True)
class Speculative:
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
class Spec:
    """One YAML spec file."""

    FIELDS = (
        Field("name", Text(identifier=True), "spec name (module name)", required=True),
        Field("family", OneOf(Family, tuple(Family)), "attention family", required=True),
        Field("description", Text(), "one line for the docs", required=True),
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
    heads: MhaHeads | None
    mla: MlaDims | None
    gdn: GdnDims | None
    dsa: DsaIndexer | None
    kv_cache: KvCache | None
    mask: Mask
    speculative: Speculative | None
    targets: tuple[Target, ...]
    tuning: tuple[Tuning, ...]
    sha256: str  # of the spec file's bytes: provenance and cache keys

    def tuning_for(self, backend: Backend, arch: Arch) -> dict[str, int]:
        """The tile overrides this spec sets for one backend and arch."""
        return {
            k: v for t in self.tuning if (t.backend, t.arch) == (backend, arch) for k, v in t.values
        }


# Typed sections of a spec, by key: the loader reads them and the JSON schema describes them.
SECTIONS: dict[str, type] = {
    "heads": MhaHeads,
    "mla": MlaDims,
    "gdn": GdnDims,
    "dsa": DsaIndexer,
    "kv_cache": KvCache,
    "mask": Mask,
    "speculative": Speculative,
}
# Every top-level key a spec may have, in the order the docs list them.
SPEC_KEYS: tuple[str, ...] = (*(f.key for f in Spec.FIELDS), *SECTIONS, "targets", "tuning")
