"""Field kinds of the spec language: how one YAML value is checked and converted.

Every section of a spec is a frozen dataclass with a ``FIELDS`` table of :class:`Field`.
The loader pops exactly these keys (leftovers are errors) and the JSON Schema exporter
reads the same tables, so the schema cannot disagree with the loader.
"""

from __future__ import annotations

import keyword
import math

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

import yaml

from attngen.spec.errors import Location, SpecError

IDENT = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Int:
    minimum: int
    maximum: int
    power_of_two: bool = False
    choices: tuple[int, ...] = ()

    def describe(self) -> str:
        if self.choices:
            return "one of " + ", ".join(str(c) for c in self.choices)
        pow2 = " and a power of two" if self.power_of_two else ""
        return f"an integer in {self.minimum}..{self.maximum}{pow2}"


@dataclass(frozen=True)
class Float:
    minimum_exclusive: float

    def describe(self) -> str:
        return f"a number > {self.minimum_exclusive:g}"


@dataclass(frozen=True)
class Bool:
    def describe(self) -> str:
        return "true or false"


@dataclass(frozen=True)
class Text:
    identifier: bool = False

    def describe(self) -> str:
        return "an identifier ([a-z][a-z0-9_]*)" if self.identifier else "a string"


@dataclass(frozen=True)
class OneOf:
    enum: type[Enum]
    allowed: tuple[Enum, ...]

    def describe(self) -> str:
        return "one of " + ", ".join(m.value for m in self.allowed)


Kind = Int | Float | Bool | Text | OneOf


@dataclass(frozen=True)
class Field:
    """One key of a spec section."""

    key: str
    kind: Kind
    doc: str
    required: bool = False
    default: Any = None
    axis: bool = False  # a list of values expands into one variant per value
    many: bool = False  # a non-empty list of distinct values (a set, not an axis)


def node_location(path: str, node: yaml.Node) -> Location:
    return Location(path, node.start_mark.line + 1)


def convert_scalar(kind: Kind, node: yaml.Node, path: str, name: str) -> Any:
    """Check one scalar node against ``kind`` and return the Python value."""
    loc = node_location(path, node)
    if not isinstance(node, yaml.ScalarNode):
        raise SpecError(loc, name, f"expected {kind.describe()}, got a {_node_kind(node)}")
    value = yaml.safe_load(node.value) if node.style is None else node.value
    if isinstance(kind, Bool):
        if not isinstance(value, bool):
            raise SpecError(loc, name, f"expected true or false, got {node.value!r}")
        return value
    if isinstance(kind, Int):
        return _check_int(kind, value, loc, name, node.value)
    if isinstance(kind, Float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(loc, name, f"expected {kind.describe()}, got {node.value!r}")
        if not math.isfinite(value):
            raise SpecError(loc, name, f"{node.value} is not a finite number")
        if value <= kind.minimum_exclusive:
            raise SpecError(loc, name, f"{value:g} is out of range: expected {kind.describe()}")
        return float(value)
    if isinstance(kind, Text):
        if not isinstance(value, str):
            raise SpecError(loc, name, f"expected {kind.describe()}, got {node.value!r}")
        if kind.identifier:
            _check_identifier(value, loc, name, kind)
        elif not value.isprintable():
            raise SpecError(loc, name, f"{value!r}: one line of printable text expected")
        return value
    return _check_enum(kind, str(node.value), loc, name)


# A spec name becomes a Python package and a folder: a keyword cannot be imported, and a
# path component has at most 255 bytes on common file systems (this leaves room to spare).
MAX_IDENTIFIER = 64


def _check_identifier(value: str, loc: Location, name: str, kind: Text) -> None:
    if not IDENT.match(value):
        raise SpecError(loc, name, f"{value!r} is not {kind.describe()}")
    if keyword.iskeyword(value):
        raise SpecError(loc, name, f"{value!r} is a Python keyword (the generated package name)")
    if len(value) > MAX_IDENTIFIER:
        raise SpecError(loc, name, f"{len(value)} characters: at most {MAX_IDENTIFIER}")


def _check_int(kind: Int, value: Any, loc: Location, name: str, raw: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(loc, name, f"expected {kind.describe()}, got {raw!r}")
    in_range = kind.minimum <= value <= kind.maximum
    pow2_ok = not kind.power_of_two or value & (value - 1) == 0
    choice_ok = not kind.choices or value in kind.choices
    if not (in_range and pow2_ok and choice_ok):
        raise SpecError(loc, name, f"{value} is not allowed: expected {kind.describe()}")
    return value


def _check_enum(kind: OneOf, raw: str, loc: Location, name: str) -> Enum:
    for member in kind.allowed:
        if member.value == raw:
            return member
    raise SpecError(loc, name, f"unknown value {raw!r}: expected {kind.describe()}")


def _node_kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "mapping"
    if isinstance(node, yaml.SequenceNode):
        return "list"
    return "scalar"
