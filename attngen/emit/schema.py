"""JSON Schema of the spec format, read off the same FIELDS tables the loader uses."""

from __future__ import annotations

import json
from typing import Any

from attngen import registry
from attngen.spec.enums import Arch, Backend, Family
from attngen.spec.fields import Bool, Field, Float, Int, OneOf, Text
from attngen.spec.model import SECTIONS, Spec


def _kind_schema(kind: Any) -> dict[str, Any]:
    if isinstance(kind, Int):
        if kind.choices:
            return {"type": "integer", "enum": list(kind.choices)}
        out: dict[str, Any] = {"type": "integer", "minimum": kind.minimum, "maximum": kind.maximum}
        if kind.power_of_two:
            out["enum"] = [
                1 << i for i in range(kind.maximum.bit_length()) if kind.minimum <= 1 << i
            ]
        return out
    if isinstance(kind, Float):
        return {"type": "number", "minimum": kind.minimum, "maximum": kind.maximum}
    if isinstance(kind, Bool):
        return {"type": "boolean"}
    if isinstance(kind, Text):
        out = {"type": "string"}
        if kind.identifier:
            out["pattern"] = "^[a-z][a-z0-9_]*$"
        if kind.max_length:
            out["maxLength"] = kind.max_length
        return out
    assert isinstance(kind, OneOf)
    return {"type": "string", "enum": [m.value for m in kind.allowed]}


def _field_schema(field: Field) -> dict[str, Any]:
    one = _kind_schema(field.kind)
    if field.many:
        schema: dict[str, Any] = {"type": "array", "items": one, "minItems": 1, "uniqueItems": True}
    elif field.axis:
        schema = {
            "oneOf": [one, {"type": "array", "items": one, "minItems": 1, "uniqueItems": True}]
        }
    else:
        schema = one
    schema["description"] = field.doc + (
        " (axis: a list expands into variants)" if field.axis else ""
    )
    return schema


def _section_schema(fields: tuple[Field, ...], doc: str) -> dict[str, Any]:
    return {
        "type": "object",
        "description": doc,
        "additionalProperties": False,
        "properties": {f.key: _field_schema(f) for f in fields},
        "required": [f.key for f in fields if f.required],
    }


def spec_schema() -> dict[str, Any]:
    schema = _section_schema(Spec.FIELDS, "An attngen attention-variant spec")
    families = sorted(registry.families().items(), key=lambda kv: list(Family).index(kv[0]))
    for family, info in families:
        for key, cls in info.spec.sections.items():
            users = [f.value for f, i in families if key in i.spec.sections]
            doc = f"{(cls.__doc__ or '').strip()} Required for, and only for, family {' and '.join(users)}."
            schema["properties"].setdefault(key, _section_schema(cls.FIELDS, doc))
    for key, cls in SECTIONS.items():
        schema["properties"][key] = _section_schema(cls.FIELDS, (cls.__doc__ or "").strip())
    archs = {"type": "string", "enum": [a.value for a in Arch]}
    schema["properties"]["targets"] = {
        "type": "object",
        "description": "backend -> archs to generate for",
        "additionalProperties": False,
        "minProperties": 1,
        "properties": {
            b.value: {
                "oneOf": [
                    archs,
                    {"type": "array", "items": archs, "minItems": 1, "uniqueItems": True},
                ]
            }
            for b in Backend
        },
    }
    schema["properties"]["tuning"] = _tuning_schema()
    schema["required"] = sorted(set(schema["required"]) | {"targets"})
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "attngen-spec",
        **schema,
    }


def _tuning_schema() -> dict[str, Any]:
    """tuning.<backend>.<arch>.<key>: the keys any registered lowering of that backend takes
    (the loader checks them against the spec's family)."""
    keys: dict[Backend, dict[str, Any]] = {}
    for (_, backend), lowering in sorted(registry.lowerings().items(), key=lambda kv: str(kv[0])):
        for key, kind in lowering.tuning_keys.items():
            keys.setdefault(backend, {}).setdefault(key, _kind_schema(kind))
    per_arch = {
        b: {
            "type": "object",
            "additionalProperties": False,
            "properties": dict(sorted(names.items())),
        }
        for b, names in keys.items()
    }
    return {
        "type": "object",
        "description": "tile overrides per backend and arch: tuning.<backend>.<arch>.<key>",
        "additionalProperties": False,
        "properties": {
            b.value: {
                "type": "object",
                "additionalProperties": False,
                "properties": {a.value: per_arch[b] for a in Arch},
            }
            for b in sorted(per_arch, key=list(Backend).index)
        },
    }


def render_schema() -> str:
    return json.dumps(spec_schema(), indent=1, sort_keys=True, ensure_ascii=False) + "\n"
