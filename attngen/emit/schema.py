"""JSON Schema of the spec format, read off the same FIELDS tables the loader uses."""

from __future__ import annotations

import json
from typing import Any

from attngen.spec.enums import Arch, Backend
from attngen.spec.fields import Bool, Field, Float, Int, OneOf, Text
from attngen.spec.loader import TUNING_KEYS
from attngen.spec.model import (
    DsaIndexer,
    GdnDims,
    KvCache,
    Mask,
    MhaHeads,
    MlaDims,
    Spec,
    Speculative,
)

SECTIONS = {
    "heads": MhaHeads,
    "mla": MlaDims,
    "gdn": GdnDims,
    "dsa": DsaIndexer,
    "kv_cache": KvCache,
    "mask": Mask,
    "speculative": Speculative,
}


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
        return {"type": "number", "exclusiveMinimum": kind.minimum_exclusive}
    if isinstance(kind, Bool):
        return {"type": "boolean"}
    if isinstance(kind, Text):
        return (
            {"type": "string", "pattern": "^[a-z][a-z0-9_]*$"}
            if kind.identifier
            else {"type": "string"}
        )
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
    tile = {"type": "integer", "minimum": 1, "maximum": 1024}
    schema["properties"]["tuning"] = {
        "type": "object",
        "description": "per-arch tile overrides",
        "additionalProperties": False,
        "properties": {
            a.value: {
                "type": "object",
                "additionalProperties": False,
                "properties": {k: tile for k in TUNING_KEYS},
            }
            for a in Arch
        },
    }
    schema["required"] = sorted(set(schema["required"]) | {"targets"})
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "attngen-spec",
        **schema,
    }


def render_schema() -> str:
    return json.dumps(spec_schema(), indent=1, sort_keys=True, ensure_ascii=False) + "\n"
