"""The spine never names a family or a backend: families and backends register themselves
(attngen.registry) and the spine asks the registry. Only the vocabulary table
(``attngen/spec/enums.py``) spells their names; ``attngen/families/`` and
``attngen/backends/`` are the packages that register; ``attngen/integrations/`` (serving
other software, e.g. transformers, with the families' public backends) is not spine either."""

from __future__ import annotations

import re

from attngen.testing.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "attngen"
REGISTERING = ("families", "backends")
CONSUMERS = ("integrations",)  # use the families' backends; the spine never imports them
VOCABULARY = PACKAGE / "spec" / "enums.py"
NAMED = re.compile(
    r"Family\.(MHA|MLA|GDN|DSA)\b|Backend\.(TRITON|CUTE_DSL)\b"
    r"|\b(import|from) (triton|cutlass)\b"
    r"|\b(families|backends)\.(mha|mla|gdn|dsa|triton|cute_dsl)\b"
    r"|[\"'](mha|mla|gdn|dsa|triton|cute_dsl)[\"']"
)


def spine_modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in REGISTERING + CONSUMERS or path == VOCABULARY:
            continue
        yield path


def test_spine_modules_name_no_family_or_backend() -> None:
    found = [
        f"{path.relative_to(REPO_ROOT)}:{n}: {line.strip()}"
        for path in spine_modules()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if NAMED.search(line)
    ]
    assert found == [], "spine code names a family or backend:\n" + "\n".join(found)


def test_the_check_sees_the_spine_and_catches_a_name() -> None:
    names = {p.relative_to(PACKAGE).as_posix() for p in spine_modules()}
    assert {"registry.py", "aot_driver.py", "generate.py", "runtime/backend_base.py"} <= names
    assert NAMED.search("if spec.family is Family.MLA:") and NAMED.search("import triton")
    assert not NAMED.search("family = registry.family(spec.family)")
