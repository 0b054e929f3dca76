"""Errors that point at the spec text: ``path:line: field: message``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Location:
    """Where a spec object came from (repo-relative path and 1-based line)."""

    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


class SpecError(Exception):
    """A spec is malformed, impossible, or asks for what no target can do."""

    def __init__(self, location: Location, field: str, message: str) -> None:
        self.location = location
        self.field = field
        self.message = message
        super().__init__(f"{location}: {field}: {message}" if field else f"{location}: {message}")
