"""MHA's part of a spec: the ``heads`` section and the shape it expands into."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from attngen.spec.enums import MaskKind
from attngen.spec.errors import Location, SpecError
from attngen.spec.family import FamilySpec
from attngen.spec.fields import Field, Int
from attngen.spec.model import Section, Spec

if TYPE_CHECKING:
    from attngen.spec.variant import Variant


@dataclass(frozen=True)
class MhaHeads(Section):
    """MHA/GQA/MQA head shapes."""

    FIELDS = (
        # any size the language can say; which ones a backend lowers is supports()' answer
        Field("head_dim", Int(1, 512), "q/k head dim", required=True, axis=True),
        Field("v_head_dim", Int(1, 512), "v head dim (default: head_dim)", axis=True),
        Field(
            "gqa_group",
            Int(1, 128),
            "query heads per kv head (default 1: MHA)",
            default=(1,),
            axis=True,
        ),
    )
    location: Location
    head_dim: tuple[int, ...]
    v_head_dim: tuple[int, ...] | None
    gqa_group: tuple[int, ...]


@dataclass(frozen=True)
class MhaShape:
    head_dim: int
    v_head_dim: int
    gqa_group: int

    @property
    def uri(self) -> str:
        dv = "" if self.v_head_dim == self.head_dim else f"v{self.v_head_dim}"
        return f"d{self.head_dim}{dv}_g{self.gqa_group}"


def shapes(spec: Spec) -> Iterator[MhaShape]:
    heads = spec.section(MhaHeads)
    v_dims = heads.v_head_dim or (None,)
    for d, dv, g in itertools.product(heads.head_dim, v_dims, heads.gqa_group):
        yield MhaShape(d, d if dv is None else dv, g)


def check(spec: Spec) -> None:
    """Speculative decoding verifies drafts of an autoregressive model: each draft sees the
    prefix and the drafts before it, never later ones. A bidirectional base mask (an
    encoder) has no such order, so speculative settings with ``mask.kind: none`` are refused
    here instead of building drafts that see each other."""
    if spec.speculative is not None and spec.mask.kind is MaskKind.NONE:
        raise SpecError(
            spec.speculative.location,
            "speculative",
            "speculative decoding needs a causal (or sliding-window) base mask; mask.kind is "
            "none (bidirectional: drafts would see later drafts)",
        )


def draft_tree_rules(variant: Variant) -> list[tuple[bool, str, str]]:
    """What every MHA backend's ``supports()`` asks of a variant's speculative settings and
    custom mask (a custom mask is the speculative tree's), as (holds, reason, field)."""
    topk = variant.spec_topk or 0
    kind = variant.mask.kind
    return [
        (
            kind is not MaskKind.CUSTOM or topk > 1,
            "custom masks are lowered for speculative draft trees (topk > 1) only",
            "mask.kind",
        ),
        (
            topk <= 1 or kind is not MaskKind.SLIDING_WINDOW,
            "draft trees with a sliding window are not lowered (tree rows sit at depths, "
            "not at consecutive positions)",
            "speculative.topk",
        ),
        (
            topk <= 1 or kind is not MaskKind.NONE,
            "draft trees need a causal base mask",
            "mask.kind",
        ),
    ]


SPEC = FamilySpec({"heads": MhaHeads}, shapes, check=check)
