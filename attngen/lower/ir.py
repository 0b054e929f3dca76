"""The IR between specs and emitters: what to generate for one spec x backend x arch.

Plans hold final values (tiles, names, buffer shapes); emitters only format them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from attngen.runtime.configs import MhaMask, MhaTritonConfig
from attngen.spec.enums import Arch, Backend
from attngen.spec.model import Spec
from attngen.spec.variant import Variant


@dataclass(frozen=True)
class MhaKernelPlan:
    """One variant's kernels: decode (split-KV + combine) and extend, with their tiles."""

    variant: Variant
    config: MhaTritonConfig

    @property
    def uri(self) -> str:
        return self.config.uri

    @property
    def fields(self) -> list[tuple[str, str]]:
        """(name, Python literal) of every config field, in declaration order."""
        return [(f.name, repr(getattr(self.config, f.name))) for f in fields(self.config)]


@dataclass(frozen=True)
class GraphBuffer:
    """One static buffer a CUDA-graph capture needs (shape in symbolic dims)."""

    name: str
    dtype: str  # torch dtype name
    shape: tuple[str, ...]  # dims named: max_bs, max_pages, num_q_heads, max_splits, v_head_dim
    fill: int  # initial value, safe for padded rows
    doc: str

    @property
    def shape_literal(self) -> str:
        """The shape as a Python tuple expression over the dim names."""
        return f"({self.shape[0]},)" if len(self.shape) == 1 else f"({', '.join(self.shape)})"


@dataclass(frozen=True)
class MetadataPlan:
    """What the CUDA-graph metadata builder of one module allocates and fills."""

    num_sms: int
    seq_len_fill_value: int
    buffers: tuple[GraphBuffer, ...]


@dataclass(frozen=True)
class MhaModulePlan:
    """Everything generated for one spec on one backend and arch."""

    spec: Spec
    backend: Backend
    arch: Arch
    mask: MhaMask
    kernels: tuple[MhaKernelPlan, ...]
    metadata: MetadataPlan
    feature_lines: tuple[str, ...]

    @property
    def phases_literal(self) -> str:
        """Phases the generated backend serves, in spec order, as a Python tuple literal."""
        names = [f'"{p.value}"' for p in self.spec.phases]
        return f"({names[0]},)" if len(names) == 1 else f"({', '.join(names)})"

    @property
    def causal(self) -> bool:
        return self.mask.causal

    @property
    def fp4_scales_as_bytes(self) -> bool:
        """Triton has no fp8e4nv pointers on sm80: NVFP4 block scales go in as raw bytes."""
        return self.arch is Arch.SM80

    @property
    def configs(self) -> tuple[MhaKernelPlan, ...]:
        return self.kernels

    @property
    def package(self) -> str:
        """Repo-relative directory of the generated package."""
        return f"generated/{self.arch.value}/{self.spec.family.value}/{self.spec.name}"

    @property
    def class_name(self) -> str:
        return "".join(part.capitalize() for part in self.spec.name.split("_")) + "Backend"
