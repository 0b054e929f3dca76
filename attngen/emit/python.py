"""Generated Python is formatted by the pinned formatter and must parse."""

from __future__ import annotations

import ast

import black

MODE = black.Mode(line_length=100, target_versions={black.TargetVersion.PY310})


def docstring_text(text: str) -> str:
    """``text`` (a spec string) as it may stand inside a triple-double-quoted docstring:
    backslashes and double quotes escaped, so whatever it holds stays inert text. Every spec
    string that lands in a generated docstring goes through here (the ``docstring`` filter)."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def comment_text(text: str) -> str:
    """``text`` as one ``#`` comment line: control characters (a newline would end the
    comment and start code) become escapes."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


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
