"""What the author still has to run before the change's matrix claims what it claimed: the
commands, each with why, from the review (variants new or with a changed kernel identity
and the evidence they lack) and the sources that changed."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from attngen.review.compare import Review
from attngen.review.variants import VariantKey, key, rows, target_order
from attngen.review.files import generated_packages
from attngen.review.sides import Sides

GPU_SUITE = (
    "ATTNGEN_COMMIT=$(git rev-parse HEAD) ATTNGEN_EVIDENCE_OUT={path} make test-gpu "
    'GPU_TESTS="{tests}"'
)


@dataclass(frozen=True)
class Command:
    command: str
    why: str


def commands(sides: Sides, review: Review) -> tuple[Command, ...]:
    out: list[Command] = []
    if review.errors:
        out.append(
            Command(
                "python -m attngen validate specs/",
                f"{len(review.errors)} spec(s) are refused; generate stops at the first",
            )
        )
    out += _regenerate(sides)
    # compile evidence is keyed by kernel identity alone; GPU evidence also by runtime
    out += _compile(sides, _touched(sides, review, ("new", "identity")))
    gpu = _gpu(sides, _touched(sides, review, ("new", "identity", "runtime")))
    out += gpu
    if gpu:
        out.append(Command("make generate", "the support matrix picks up the GPU evidence"))
    out += _bench(review)
    return tuple(out)


def _touched(sides: Sides, review: Review, kinds: tuple[str, ...]) -> list[dict]:
    """The working tree's variants of the given variant kinds (compare.variant_kinds)."""
    now = rows(sides.now)
    keys: list[VariantKey] = [k for kind in kinds for k in review.variants.get(kind, [])]
    return [now[k] for k in keys]


def _archs(rows: list[dict]) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["arch"]] = counts.get(r["arch"], 0) + 1
    order = sorted(counts, key=lambda a: target_order(f"- {a}"))
    return ", ".join(f"{a}: {counts[a]}" for a in order)


MANIFEST = "generated/MANIFEST.json"  # hashes every spec: a spec change rewrites it


def _regenerate(sides: Sides) -> list[Command]:
    """generated/ left behind the specs: packages missing or stale, or specs changed and
    the manifest did not (``make check`` is the full drift check)."""
    want = {r["package"] for r in sides.now["variants"]}
    have = generated_packages(list(sides.generated_now))
    missing, stale = sorted(want - have), sorted(have - want)
    parts = []
    if missing:
        parts.append(f"{len(missing)} package(s) missing, e.g. {missing[0]}")
    if stale:
        parts.append(f"{len(stale)} stale package(s), e.g. {stale[0]}")
    changed = {f.path for f in sides.files}
    if (
        any(p.startswith("specs/") for p in changed)
        and MANIFEST not in changed
        and MANIFEST in sides.generated_now
    ):
        parts.append(f"specs changed but {MANIFEST} did not")
    if not parts:
        return []
    return [Command("make generate", f"generated/ is not what the specs give: {'; '.join(parts)}")]


def _compile(sides: Sides, touched: list[dict]) -> list[Command]:
    bare = [r for r in touched if not r["compiles"]]
    if not bare:
        return []
    return [
        Command(
            "make evidence-compile",
            f"CPU; compile evidence for {len(bare)} new or changed variant(s) ({_archs(bare)}); "
            "it regenerates the docs",
        )
    ]


def _gpu(sides: Sides, touched: list[dict]) -> list[Command]:
    """One GPU suite run per arch that records GPU evidence (on either side), over the test
    folders that re-record what the change took: each family's own suite, and an
    integration's where that integration's runs recorded a variant's evidence before."""
    paths = {**sides.base["evidence"]["gpu"], **sides.now["evidence"]["gpu"]}
    before = rows(sides.base)
    out = []
    for arch in sorted(paths, key=lambda a: target_order(f"- {a}")):
        bare = [r for r in touched if r["arch"] == arch and not r["gpu"]]
        if not bare:
            continue
        families = Counter(r["family"] for r in bare)
        via = Counter(
            name
            for r in bare
            for name in set(r.get("via", [])) | set(before.get(key(r), {}).get("via", []))
        )
        tests = [f"tests/families/{f}/gpu" for f in sorted(families)]
        tests += [f"tests/integrations/{name}/gpu" for name in sorted(via)]
        counts = ", ".join(f"{f} {n}" for f, n in sorted(families.items()))
        counts += "".join(f"; {n} of them verified by {name}" for name, n in sorted(via.items()))
        out.append(
            Command(
                GPU_SUITE.format(path=paths[arch]["path"], tests=" ".join(tests)),
                f"on an {arch} GPU: GPU evidence for {len(bare)} new or changed variant(s) "
                f"({counts})",
            )
        )
    return out


def _bench(review: Review) -> list[Command]:
    code = sum(i.code for i in review.identities)
    runtime = sum(i.runtime for i in review.identities)
    if not code and not runtime:
        return []
    what = [
        f"{n} {how}"
        for n, how in ((code, "variants' kernel code"), (runtime, "variants' host code"))
        if n
    ]
    return [Command("make bench", f"on the GPU: {' and '.join(what)} changed; time it again")]
