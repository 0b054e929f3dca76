"""Field kinds of the spec language: how one YAML value is checked and converted.

Every section of a spec is a frozen dataclass with a ``FIELDS`` table of :class:`Field`.
The loader pops exactly these keys (leftovers are errors) and the JSON Schema exporter
reads the same tables, so the schema cannot disagree with the loader.
"""

from __future__ import annotations

import difflib
import keyword
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
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
    """A finite number in ``minimum..maximum`` (bounds included): fields are read in fp32
    by the kernels, so a range keeps them far from fp32's overflow and underflow."""

    minimum: float
    maximum: float

    def describe(self) -> str:
        return f"a number from {self.minimum:g} to {self.maximum:g}"


@dataclass(frozen=True)
class Bool:
    def describe(self) -> str:
        return "true or false"


@dataclass(frozen=True)
class Text:
    identifier: bool = False
    max_length: int = 0  # characters; 0: no limit

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
    """Check one scalar node against ``kind`` and return the Python value.

    Plain (unquoted) scalars are read by the spec language's own rules, never YAML's:
    ``true``/``false``, decimal integers, decimal numbers (``1e3`` too) and text. A quoted
    value is always text, so ``'128'`` is not a number."""
    loc = node_location(path, node)
    if not isinstance(node, yaml.ScalarNode):
        raise SpecError(loc, name, f"expected {kind.describe()}, got a {node_kind(node)}")
    raw, plain = node.value, node.style is None
    if isinstance(kind, Bool):
        if not plain or raw not in BOOLS:
            raise SpecError(loc, name, f"expected true or false, got {_shown(raw)}")
        return BOOLS[raw]
    if isinstance(kind, Int):
        if not plain or not PLAIN_INT.match(raw):
            raise SpecError(loc, name, f"expected {kind.describe()}, got {_shown(raw)}")
        return _check_int(kind, raw, loc, name)
    if isinstance(kind, Float):
        return _check_float(kind, raw if plain else None, loc, name, raw)
    if isinstance(kind, Text):
        return _check_text(kind, node, loc, name)
    return _check_enum(kind, str(raw), loc, name)


BOOLS = {"true": True, "false": False}
# No sign but minus, no leading zeros: YAML 1.1 would read 0400 as octal, 2:08 as base 60.
PLAIN_INT = re.compile(r"(0|-?[1-9][0-9]*)\Z")
PLAIN_FLOAT = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?\Z")
NOT_FINITE = re.compile(r"([-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN))\Z")
MAX_DIGITS = 30  # longer integers are out of every range (and slow to convert)
MAX_SHOWN = 40  # characters of a value an error message repeats
YAML_STR = "tag:yaml.org,2002:str"


def _cut(raw: str) -> str:
    """``raw`` as an error message repeats it: cut short when long."""
    return raw if len(raw) <= MAX_SHOWN else raw[: MAX_SHOWN - 3] + "..."


def _shown(raw: str) -> str:
    return repr(_cut(raw))


def _check_float(kind: Float, plain: str | None, loc: Location, name: str, raw: str) -> float:
    """``plain`` is the scalar's text, or None when it was quoted."""
    if plain is not None and NOT_FINITE.match(plain):
        raise SpecError(loc, name, f"{plain} is not a finite number")
    if plain is None or not PLAIN_FLOAT.match(plain):
        raise SpecError(loc, name, f"expected {kind.describe()}, got {_shown(raw)}")
    value = float(plain)  # a string too large for a float reads as inf, never raises
    if not math.isfinite(value):
        raise SpecError(loc, name, f"{_cut(plain)} is not a finite number")
    if Decimal(plain) != Decimal(repr(value)):  # digits a float64 drops change the value
        raise SpecError(loc, name, f"{_cut(plain)} has more digits than a float64 holds "
                        f"(it reads as {value!r})")  # fmt: skip
    if not kind.minimum <= value <= kind.maximum:
        raise SpecError(loc, name, f"{_cut(plain)} is out of range: expected {kind.describe()}")
    return value


def _check_text(kind: Text, node: yaml.ScalarNode, loc: Location, name: str) -> str:
    value = node.value
    if node.style is None and node.tag != YAML_STR:
        # YAML reads this plain scalar as a number, date, bool...: quoting makes it text
        hint = "" if kind.identifier else " (quote it to make it text)"
        raise SpecError(loc, name, f"expected {kind.describe()}, got {_shown(value)}{hint}")
    if kind.identifier:
        _check_identifier(value, loc, name, kind)
    elif not value.strip():
        raise SpecError(loc, name, f"expected one line of text, got {value!r}")
    elif not value.isprintable():
        raise SpecError(loc, name, f"{value!r}: one line of printable text expected")
    elif kind.max_length and len(value) > kind.max_length:
        raise SpecError(loc, name, f"{len(value)} characters: at most {kind.max_length}")
    return value


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


def _check_int(kind: Int, raw: str, loc: Location, name: str) -> int:
    """``raw`` is a plain decimal integer (PLAIN_INT)."""
    if len(raw) > MAX_DIGITS:
        raise SpecError(loc, name, f"{_cut(raw)} is not allowed: expected {kind.describe()}")
    value = int(raw)
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
    hint = did_you_mean(raw, (m.value for m in kind.allowed))
    raise SpecError(loc, name, f"unknown value {_shown(raw)}: expected {kind.describe()}{hint}")


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean X?"`` when one choice is the closest to a misspelled ``word`` (case
    aside), else ``""``: no guess between two as close (``sm89``: sm80 or sm90?), and none
    for a word longer than any error repeats (no misspelling of a short name)."""
    best = closest(word, choices)
    return f"; did you mean {best}?" if best is not None else ""


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The one choice closest to ``word`` (see :func:`did_you_mean`), or None."""
    if len(word) > MAX_SHOWN:
        return None
    scores = sorted(
        (difflib.SequenceMatcher(None, word.lower(), c.lower()).ratio(), c) for c in choices
    )
    best = scores[-1] if scores else (0.0, "")
    unique = len(scores) == 1 or scores[-2][0] < best[0]
    return best[1] if best[0] >= CLOSE and unique else None


CLOSE = 0.6  # difflib's similarity cutoff (get_close_matches' default)


def node_kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "mapping"
    if isinstance(node, yaml.SequenceNode):
        return "list"
    return "scalar"
