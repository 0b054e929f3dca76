"""A spec file's bytes -> its one YAML node tree, or a ``path:line`` error.

Specs are plain data: one UTF-8 YAML document of mappings, lists and untagged scalars.
Scalars stay text here; :mod:`attngen.spec.fields` converts each one by the spec
language's own rules, never by YAML's (no octal, base 60, timestamps or custom tags).
"""

from __future__ import annotations

import yaml

from attngen.spec.errors import Location, SpecError
from attngen.spec.fields import node_location

ONE_DOCUMENT = "expected a single document in the stream"  # PyYAML's context text
YAML_TAGS = "tag:yaml.org,2002:"  # what `!!` stands for


class _TaggedLoader(yaml.SafeLoader):
    """A safe composer that remembers the tag each node was written with (if any), so the
    spec reader can refuse it: YAML drops that fact once it has resolved the node."""

    def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
        event = self.peek_event()
        node = super().compose_node(parent, index)
        if not isinstance(event, yaml.AliasEvent) and event.tag is not None:
            node.written_tag = event.tag
        return node


def compose_spec(raw: bytes, path: str) -> yaml.Node:
    """The node tree of a spec file's bytes; ``path`` is what errors show."""
    text = _decode(raw, path)
    try:
        node = yaml.compose(text, Loader=_TaggedLoader)
    except RecursionError:
        raise SpecError(Location(path, 1), "", "not a spec: YAML nested too deeply") from None
    except yaml.reader.ReaderError as err:
        line = text[: err.position].count("\n") + 1
        code = ord(err.character) if isinstance(err.character, str) else err.character
        raise SpecError(
            Location(path, line), "", f"not valid YAML: character #x{code:04x}: {err.reason}"
        ) from None
    except yaml.MarkedYAMLError as err:
        raise _yaml_error(err, path) from None
    except yaml.YAMLError as err:  # no position to report
        raise SpecError(Location(path, 1), "", f"not valid YAML: {err}") from None
    if node is None:
        raise SpecError(Location(path, 1), "", "empty spec file")
    _refuse_tags(node, path, "", set())
    return node


def _decode(raw: bytes, path: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise SpecError(
            Location(path, line), "", f"not UTF-8 text (byte {err.start}: {raw[err.start]:#04x})"
        ) from None


def _yaml_error(err: yaml.MarkedYAMLError, path: str) -> SpecError:
    mark = err.problem_mark or err.context_mark
    where = Location(path, mark.line + 1 if mark else 1)
    if err.context == ONE_DOCUMENT:
        return SpecError(where, "", "a spec file holds one YAML document: a second starts here")
    return SpecError(where, "", f"not valid YAML: {err.problem}")


def _refuse_tags(node: yaml.Node, path: str, name: str, seen: set[int]) -> None:
    """Refuse the first node written with a tag (``!!str 128``, ``!foo x``, ``! x``):
    a tag changes how YAML reads a value, and a spec's values are read one way only."""
    if id(node) in seen:  # an alias of a node already checked (or of its own parent)
        return
    seen.add(id(node))
    tag = getattr(node, "written_tag", None)
    if tag is not None:
        shown = "!!" + tag[len(YAML_TAGS) :] if tag.startswith(YAML_TAGS) else tag
        raise SpecError(
            node_location(path, node),
            name or "spec",
            f"YAML tags are not allowed, got {shown}: a spec is plain data (drop the tag)",
        )
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            _refuse_tags(key_node, path, name, seen)
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
            _refuse_tags(value_node, path, f"{name}.{key}" if name else key, seen)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_tags(item, path, name, seen)
