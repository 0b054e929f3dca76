"""Generated Python is formatted by the pinned formatter and must parse."""

from __future__ import annotations

import ast
import io
import tokenize

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
    """``text`` checked to parse, and in the formatter's style. The templates emit that style
    (double-quoted literals, black's line breaks), so the formatter, 90% of generation's
    time, runs only on a file with a line over the limit (a long spec-dependent line);
    tests/emit checks that formatting the generated files changes nothing."""
    try:
        ast.parse(text, filename=relpath)
    except SyntaxError as err:
        raise EmitError(
            f"{relpath}:{err.lineno}: generated code does not parse: {err.msg}"
        ) from err
    if _long_code_lines(text):
        return black.format_str(text, mode=MODE)
    return text


def _long_code_lines(text: str) -> bool:
    """Whether a line of code (not a comment line, not inside a multi-line string, which
    the formatter leaves alone) is over the line limit."""
    lines = text.splitlines()
    long = {i + 1 for i, line in enumerate(lines) if len(line) > MODE.line_length}
    if not long:
        return False
    in_strings: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
            in_strings.update(range(tok.start[0], tok.end[0] + 1))
    return any(n not in in_strings and not lines[n - 1].lstrip().startswith("#") for n in long)
