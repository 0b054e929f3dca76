"""Generated Python is formatted by the pinned formatter and must parse."""

from __future__ import annotations

import ast

import black

MODE = black.Mode(line_length=100, target_versions={black.TargetVersion.PY310})


class EmitError(Exception):
    """An emitter produced text that is not valid for its file type."""


def format_python(text: str, relpath: str) -> str:
    try:
        ast.parse(text, filename=relpath)
    except SyntaxError as err:
        raise EmitError(
            f"{relpath}:{err.lineno}: generated code does not parse: {err.msg}"
        ) from err
    return black.format_str(text, mode=MODE)
