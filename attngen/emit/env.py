"""The one Jinja environment every emitter renders through (strict, deterministic)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import jinja2

from attngen.emit.python import docstring_text

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # attngen/
TEMPLATE_DIR = PACKAGE_DIR / "templates"  # the spine's templates (wrappers, docs)


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """StrictUndefined so a missing name fails the build; no autoescape (code, not HTML).

    Names resolve under attngen/templates/ first, then under attngen/ itself, so a family x
    backend package keeps its binding templates beside its code
    ("families/mha/triton/kernels.py.jinja")."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(TEMPLATE_DIR), str(PACKAGE_DIR)], encoding="utf-8"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
        newline_sequence="\n",
    )
    env.filters["docstring"] = docstring_text  # every spec string inside a docstring
    return env


def render(template: str, **context: object) -> str:
    """Render ``templates/<template>`` with ``context``; raises on any undefined name."""
    return environment().get_template(template).render(**context)
