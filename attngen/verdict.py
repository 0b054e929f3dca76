"""The vocabulary of capability answers: a :class:`Verdict` is SUPPORTED, NOT_LOWERED or
UNSUPPORTED, and a refusal always carries its reason. ``attngen.capabilities.supports``
returns them; the registered lowerings build them (``first_failure``)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Status(str, Enum):
    SUPPORTED = "supported"
    NOT_LOWERED = "not_lowered"
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class Verdict:
    status: Status
    reason: str = ""

    def __post_init__(self) -> None:
        if self.status is not Status.SUPPORTED and not self.reason:
            raise ValueError(f"a {self.status.value} verdict needs a reason")

    @property
    def ok(self) -> bool:
        return self.status is Status.SUPPORTED


SUPPORTED = Verdict(Status.SUPPORTED)


def not_lowered(reason: str) -> Verdict:
    return Verdict(Status.NOT_LOWERED, reason)


def first_failure(checks: list[tuple[bool, str]]) -> Verdict:
    """SUPPORTED, or NOT_LOWERED with the reason of the first check that fails."""
    for ok, reason in checks:
        if not ok:
            return not_lowered(reason)
    return SUPPORTED
