"""MLA's part of a spec: the ``mla`` section (latent and head dims) and its shape."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from attngen.spec.errors import Location, SpecError
from attngen.spec.family import FamilySpec
from attngen.spec.fields import Field, Int
from attngen.spec.model import Section, Spec


@dataclass(frozen=True)
class MlaDims(Section):
    """DeepSeek MLA: latent KV of kv_lora_rank plus a decoupled rope part."""

    FIELDS = (
        Field(
            "kv_lora_rank",
            Int(64, 1024, power_of_two=True),
            "latent dim (DeepSeek-V3: 512)",
            required=True,
        ),
        Field(
            "qk_rope_head_dim",
            Int(16, 128, power_of_two=True),
            "rope part of q/k (DeepSeek-V3: 64)",
            required=True,
        ),
        Field(
            "qk_nope_head_dim",
            Int(16, 256, power_of_two=True),
            "prefill nope part of q/k (DeepSeek-V3: 128)",
            required=True,
        ),
        Field(
            "v_head_dim",
            Int(16, 256, power_of_two=True),
            "prefill v head dim (DeepSeek-V3: 128)",
            required=True,
        ),
        Field(
            "num_heads",
            Int(1, 128, power_of_two=True),
            "q heads per rank (after tensor parallelism)",
            required=True,
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
class MlaShape:
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    num_heads: int

    @property
    def uri(self) -> str:
        return f"r{self.kv_lora_rank}_rope{self.qk_rope_head_dim}_h{self.num_heads}"


def shapes(spec: Spec) -> Iterator[MlaShape]:
    mla = spec.section(MlaDims)
    for heads in mla.num_heads:
        yield MlaShape(
            mla.kv_lora_rank, mla.qk_rope_head_dim, mla.qk_nope_head_dim, mla.v_head_dim, heads
        )


def check_mask(spec: Spec, family: str = "mla") -> None:
    """MLA attends causally (draft trees: a custom mask) with neither logit softcap nor
    attention sinks: DeepSeek's and Kimi's models have neither, and the kernels have no
    such hook, so a spec asking for one is refused rather than silently ignored."""
    mask = spec.mask
    given = [name for name, on in (("logit_softcap", mask.logit_softcap), ("sinks", mask.sinks))
             if on]  # fmt: skip
    if given:
        raise SpecError(
            mask.location,
            f"mask.{given[0]}",
            f"{family} has no logit softcap or attention sinks (DeepSeek and Kimi attention "
            "use neither); remove mask." + " and mask.".join(given),
        )


SPEC = FamilySpec({"mla": MlaDims}, shapes, check=check_mask)
