"""Pop fields out of YAML mapping nodes; whatever is left over is an error."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import yaml

from attngen.spec.errors import Location, SpecError
from attngen.spec.fields import Field, closest, convert_scalar, node_kind, node_location

T = TypeVar("T")
MERGE_TAG = "tag:yaml.org,2002:merge"  # `<<: *anchor`
REQUIRED = ("required field is missing", "required field has no value")  # MapReader.missing


class MapReader:
    """A YAML mapping being consumed key by key. ``prefix`` names it in errors."""

    def __init__(self, node: yaml.Node, path: str, prefix: str) -> None:
        if not isinstance(node, yaml.MappingNode):
            raise SpecError(node_location(path, node), prefix or "spec", "expected a mapping")
        self.node = node
        self.path = path
        self.prefix = prefix
        self.entries: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        self.empty: dict[str, Location] = {}  # keys popped that were written with no value
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise SpecError(
                    node_location(path, key_node),
                    prefix or "spec",
                    f"keys must be plain names, got a {node_kind(key_node)}",
                )
            key = str(key_node.value)
            if key_node.tag == MERGE_TAG:
                raise SpecError(
                    node_location(path, key_node),
                    self.name(key),
                    "YAML merge keys are not supported: write the keys out",
                )
            if key in self.entries:
                raise SpecError(node_location(path, key_node), self.name(key), "duplicate key")
            self.entries[key] = (key_node, value_node)

    def key_lines(self) -> tuple[tuple[str, Location], ...]:
        """Each key still in the mapping and its line (``Section.key_lines``)."""
        return tuple((k, node_location(self.path, key)) for k, (key, _) in self.entries.items())

    def name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    @property
    def location(self):
        return node_location(self.path, self.node)

    def pop_node(self, key: str) -> yaml.Node | None:
        entry = self.entries.pop(key, None)
        if entry is None or is_null(entry[1]):
            if entry is not None:
                self.empty[key] = node_location(self.path, entry[0])
            return None
        return entry[1]

    def missing(self, key: str, left_out: str, no_value: str) -> SpecError:
        """The error for a required ``key`` that pop_node gave as None: ``left_out`` at the
        mapping, or ``no_value`` at the key's own line when it is written with no value."""
        if key in self.empty:
            return SpecError(self.empty[key], self.name(key), no_value)
        return SpecError(self.location, self.name(key), left_out)

    def pop(self, field: Field) -> Any:
        node = self.pop_node(field.key)
        name = self.name(field.key)
        if node is None:
            if field.required:
                raise self.missing(field.key, *REQUIRED)
            return field.default
        if field.axis or field.many:
            return self._pop_list(field, node, name)
        return convert_scalar(field.kind, node, self.path, name)

    def _pop_list(self, field: Field, node: yaml.Node, name: str) -> tuple[Any, ...]:
        items = node.value if isinstance(node, yaml.SequenceNode) else None
        if items is None:
            if field.many:
                raise SpecError(node_location(self.path, node), name, "expected a list")
            return (convert_scalar(field.kind, node, self.path, name),)
        if not items:
            raise SpecError(node_location(self.path, node), name, "an empty list selects nothing")
        values: list[Any] = []
        for item in items:
            value = convert_scalar(field.kind, item, self.path, name)
            if value in values:
                raise SpecError(
                    node_location(self.path, item), name, f"{item.value} is listed twice"
                )
            values.append(value)
        return tuple(values)

    def check_known(
        self, allowed: Sequence[str], nested: Mapping[str, Sequence[str]] | None = None
    ) -> None:
        """Name the first key (in file order) that is not ``allowed``, before any field is
        read: a misspelled key is reported as itself, not as the right one missing. A key
        that is (or is closest to) a key of a section is pointed there: ``nested`` maps such
        keys to where they are written (``page_size`` -> ``kv_cache.page_size``)."""
        unknown = [k for k in self.entries if k not in allowed]
        if not unknown:
            return
        key = min(unknown, key=lambda k: self.entries[k][0].start_mark.line)
        nested = nested or {}
        if key in nested:
            hint = f"; it is written as {' or '.join(nested[key])}"
        else:
            best = closest(key, [*allowed, *nested])
            shown = " or ".join(nested[best]) if best in nested else best
            hint = f"; did you mean {shown}?" if best is not None else ""
        raise SpecError(
            node_location(self.path, self.entries[key][0]),
            self.name(key),
            f"unknown key (allowed: {', '.join(allowed)}){hint}",
        )


def read_section(cls: type[T], node: yaml.Node, path: str, prefix: str) -> T:
    """Build the frozen dataclass ``cls`` from its ``FIELDS`` table."""
    reader = MapReader(node, path, prefix)
    reader.check_known([f.key for f in cls.FIELDS])  # type: ignore[attr-defined]
    lines = reader.key_lines()
    values = {f.key: reader.pop(f) for f in cls.FIELDS}  # type: ignore[attr-defined]
    return cls(location=reader.location, key_lines=lines, **values)  # type: ignore[call-arg]


def default_section(cls: type[T], location: Location) -> T:
    """``cls`` as a spec that leaves the section out gets it: every field at its default."""
    missing = [f.key for f in cls.FIELDS if f.required]  # type: ignore[attr-defined]
    if missing:
        raise ValueError(f"{cls.__name__} has required fields {missing}: no default section")
    values = {f.key: f.default for f in cls.FIELDS}  # type: ignore[attr-defined]
    return cls(location=location, **values)  # type: ignore[call-arg]


def is_null(node: yaml.Node) -> bool:
    """An empty value, ``~`` or ``null``: the key is read as left out."""
    return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"
