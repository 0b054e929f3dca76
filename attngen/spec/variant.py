"""One concrete point of a spec's axes: what a kernel is generated for.

A variant's ``uri`` is derived from its fields in declared order and is its identity
everywhere: registry keys, config names, doc rows and evidence records.
"""

from __future__ import annotations

from dataclasses import dataclass

from attngen.spec.enums import DType, Family, MaskKind, Phase, ScaleGranularity
from attngen.spec.family import Shape
from attngen.spec.model import Mask, Spec


@dataclass(frozen=True)
class Variant:
    """A spec with every axis fixed, self-contained: what a kernel is generated for.

    ``spec`` is the spec it came from (None for the probes the docs and selection build);
    everything a capability rule, a lowering or a docs column reads is a field here, so a
    probe is a ``dataclasses.replace`` of one, never a fabricated Spec.
    """

    spec: Spec | None
    family: Family
    shape: Shape
    phases: tuple[Phase, ...]
    dtype: DType  # activations (q, o)
    page_size: int | None  # None for families without a KV cache (gdn)
    kv_dtype: DType | None  # resolved: never AUTO
    kv_scale: ScaleGranularity | None
    mask: Mask
    spec_topk: int | None  # speculative draft branches (None: no speculative decoding)
    num_draft_tokens: int = 0  # verify rows per request (0 without speculative decoding)

    @property
    def spec_name(self) -> str:
        return self.spec.name if self.spec is not None else "<probe>"

    @property
    def uri(self) -> str:
        parts = [self.shape.uri]
        if self.page_size is not None:
            parts.append(f"ps{self.page_size}")
        parts.append(self.dtype.value)
        if self.kv_dtype is not None and self.kv_dtype is not self.dtype:
            parts.append(f"kv{self.kv_dtype.value}")
        parts.append(_mask_uri(self.mask))
        if self.spec_topk is not None:
            parts.append(f"topk{self.spec_topk}")
        return "_".join(parts)

    @property
    def qualified_uri(self) -> str:
        return f"{self.spec_name}/{self.uri}"


def _mask_uri(mask: Mask) -> str:
    parts = [
        mask.kind.value if mask.kind is not MaskKind.SLIDING_WINDOW else f"swa{mask.window_left}"
    ]
    if mask.logit_softcap is not None:
        parts.append(f"cap{_number(mask.logit_softcap)}")
    if mask.sinks:
        parts.append("sinks")
    return "_".join(parts)


def _number(value: float) -> str:
    """``value`` as a uri spells it: its shortest exact form without a trailing ``.0``
    (``30``, ``0.5``, ``1e-05``); ``:g`` would round 30.00001 to ``30``."""
    return repr(value).removesuffix(".0")
