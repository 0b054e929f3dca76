"""What a family adds to the spec language: its shape sections and how they expand.

Each family package declares one :class:`FamilySpec` (through its ``FamilyInfo``); the
loader, the expander and the JSON schema read it. The spec layer itself names no family.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from attngen.spec.model import Spec


class Shape(Protocol):
    """A family's fixed shape of one variant (head dims, ranks, ...): frozen and hashable."""

    @property
    def uri(self) -> str:
        """The shape's part of the variant uri."""
        ...


def no_check(spec: Spec) -> None:
    return None


@dataclass(frozen=True)
class FamilySpec:
    """A family's part of a spec.

    ``sections`` maps each top-level key the family reads to its typed section (a frozen
    ``attngen.spec.model.Section`` dataclass with a ``FIELDS`` table and a docstring); every one is required in that
    family's specs and refused in the others'. ``shapes`` expands the read sections into
    the family's shape axis. ``kv_cache`` is None when the family keeps a paged KV cache
    (the ``kv_cache`` section applies), else the reason it has none. ``check`` raises
    ``SpecError`` for the family's cross-field rules.
    """

    sections: Mapping[str, type]
    shapes: Callable[[Spec], Iterable[Shape]]
    kv_cache: str | None = None
    check: Callable[[Spec], None] = field(default=no_check)
