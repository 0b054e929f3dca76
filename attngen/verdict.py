"""The vocabulary of capability answers: a :class:`Verdict` is SUPPORTED, NOT_LOWERED or
UNSUPPORTED, and a refusal always carries its reason. ``attngen.capabilities.supports``
returns them; the registered lowerings build them (``first_failure``). A refusal may name the
spec field it is about (``mask.kind``, ``kv_cache.dtype``, ``heads.head_dim``: section and key
as the YAML writes them), so a spec error points at that field's line, not the target's."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attngen.spec.variant import Variant


class Status(str, Enum):
    SUPPORTED = "supported"
    NOT_LOWERED = "not_lowered"
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class Verdict:
    status: Status
    reason: str = ""
    field: str | None = field(default=None, compare=False)  # the spec key it is about

    def __post_init__(self) -> None:
        if self.status is not Status.SUPPORTED and not self.reason:
            raise ValueError(f"a {self.status.value} verdict needs a reason")

    @property
    def ok(self) -> bool:
        return self.status is Status.SUPPORTED


SUPPORTED = Verdict(Status.SUPPORTED)


def not_lowered(reason: str, field: str | None = None) -> Verdict:
    return Verdict(Status.NOT_LOWERED, reason, field)


# (holds, reason) or (holds, reason, the spec field it is about)
Check = tuple[bool, str] | tuple[bool, str, str]


def first_failure(checks: Sequence[Check]) -> Verdict:
    """SUPPORTED, or NOT_LOWERED with the reason (and field) of the first check that fails."""
    for ok, reason, *about in checks:
        if not ok:
            return not_lowered(reason, about[0] if about else None)
    return SUPPORTED


def first_off(names: Sequence[str], got: Sequence[object], want: Sequence[object]) -> str:
    """The name of the first of ``names`` whose value in ``got`` is not the one in ``want``
    (the field a check on a tuple of dims is about); the first name when all agree."""
    return next((n for n, g, w in zip(names, got, want) if g != w), names[0])


def phases_and_dtype(variant: Variant, phases: Collection, dtypes: Collection) -> list[Check]:
    """The checks most lowerings open with: every phase of the variant is one they lower,
    and so is its activation dtype."""
    extra = set(variant.phases) - set(phases)
    return [
        (
            not extra,
            f"phase {', '.join(sorted(p.value for p in extra))} is not lowered yet",
            "phases",
        ),
        (
            variant.dtype in dtypes,
            f"activation dtype {variant.dtype.value} is not lowered",
            "dtype",
        ),
    ]
