"""What a change does, from the two sides' snapshots: specs, variants per target, refused
variants, the support-matrix cells that move (:mod:`.cells`), the evidence that kernel and
host-code changes drop.

Pure functions over the snapshot data (:mod:`attngen.review.snapshot`); nothing here names a
family or a backend, they are values read from the snapshots.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from attngen.review.cells import CellChange, cell_changes
from attngen.review.variants import (
    VariantKey,
    change,
    evidence_of,
    rows,
    target,
    target_order,
)


@dataclass(frozen=True)
class Refusal:
    targets: tuple[str, ...]  # "backend arch"
    status: str  # not_lowered | unsupported
    reason: str
    uris: tuple[str, ...]


@dataclass(frozen=True)
class SpecChange:
    name: str
    path: str
    status: str  # added | changed | removed | relowered (same file, the code lowers it anew)
    fields: tuple[str, ...]  # top-level spec keys whose value changed
    error: str | None  # why the working tree's spec is refused (generate stops there)
    added: dict[str, tuple[str, ...]]  # "backend arch" -> uris
    removed: dict[str, tuple[str, ...]]
    refused: tuple[Refusal, ...]
    packages_added: tuple[str, ...]
    packages_removed: tuple[str, ...]
    # new variants (targets included) by evidence: GPU-verified, compiled only, none
    new_evidence: tuple[int, int, int] = (0, 0, 0)
    # other specs generating the same kernels (kernel identities) as the new variants: their
    # compile evidence counts for the new variants (GPU evidence also needs the package's)
    shared_with: tuple[str, ...] = ()


@dataclass(frozen=True)
class IdentityChanges:
    """Variants generated on both sides whose kernel or runtime identity differs, per target."""

    target: str  # "backend arch"
    code: int  # same config, different identity: library sources or module traits changed
    config: int  # the config itself changed (tiles, shapes)
    runtime: int  # kernels unchanged, the package's runtime identity changed (host code)
    gpu_lost: int  # had GPU checks at BASE, none now
    compile_lost: int  # compiled at BASE, not now
    packages: tuple[str, ...]


@dataclass(frozen=True)
class Review:
    specs: tuple[SpecChange, ...]
    errors: tuple[str, ...]  # specs of the working tree that fail (spec path: message)
    cells: tuple[CellChange, ...]
    identities: tuple[IdentityChanges, ...]
    variants: dict[str, list[VariantKey]] = field(default_factory=dict)  # new/changed/...

    @property
    def evidence_loss(self) -> tuple[CellChange, ...]:
        return tuple(c for c in self.cells if c.loss)


def review(base: dict, now: dict) -> Review:
    old_rows, new_rows = rows(base), rows(now)
    return Review(
        specs=spec_changes(base, now, old_rows, new_rows),
        errors=tuple(
            s["error"] for s in sorted(now["specs"].values(), key=_path) if s.get("error")
        ),
        cells=cell_changes(base, now, old_rows, new_rows),
        identities=identity_changes(old_rows, new_rows),
        variants=variant_kinds(old_rows, new_rows),
    )


def _path(spec: dict) -> str:
    return spec["path"]


# -- specs ----


def spec_changes(
    base: dict, now: dict, old_rows: dict[VariantKey, dict], new_rows: dict[VariantKey, dict]
) -> tuple[SpecChange, ...]:
    """Specs added, changed or removed, and unchanged specs whose variants the code now
    lowers differently ("relowered")."""
    old, new = base["specs"], now["specs"]
    out = []
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key), new.get(key)
        spec = after or before
        name = spec.get("name")
        mine_old = {k: r for k, r in old_rows.items() if k[0] == name}
        mine_new = {k: r for k, r in new_rows.items() if k[0] == name}
        if before is None:
            status = "added"
        elif after is None:
            status = "removed"
        elif not _same_spec(before, after):
            status = "changed"
        elif _relowered(before, after, mine_old, mine_new, base, now):
            status = "relowered"
        else:
            continue
        out.append(
            SpecChange(
                name=name or spec["path"],
                path=spec["path"],
                status=status,
                fields=_changed_fields(before, after),
                error=(after or {}).get("error"),
                added=_by_target(mine_new, mine_old),
                removed=_by_target(mine_old, mine_new),
                refused=_refusals(now, name) if after is not None else (),
                packages_added=_packages(mine_new, mine_old),
                packages_removed=_packages(mine_old, mine_new),
                new_evidence=_newevidence_of(mine_new, mine_old),
                shared_with=_shared(name, mine_new, mine_old, new_rows),
            )
        )
    return tuple(out)


def _relowered(
    before: dict, after: dict, mine_old: dict, mine_new: dict, base: dict, now: dict
) -> bool:
    name = after.get("name")
    return (
        before.get("error") != after.get("error")
        or set(mine_old) != set(mine_new)
        or _refused_of(base, name) != _refused_of(now, name)
    )


def _refused_of(snap: dict, spec: str | None) -> list[dict]:
    return [r for r in snap["refused"] if r["spec"] == spec]


def _newevidence_of(
    mine: dict[VariantKey, dict], other: dict[VariantKey, dict]
) -> tuple[int, int, int]:
    new = [r for k, r in mine.items() if k not in other]
    gpu = sum(bool(r["gpu"]) for r in new)
    compiled = sum(r["compiles"] and not r["gpu"] for r in new)
    return gpu, compiled, len(new) - gpu - compiled


def _shared(
    spec: str | None,
    mine: dict[VariantKey, dict],
    other: dict[VariantKey, dict],
    rows: dict[VariantKey, dict],
) -> tuple[str, ...]:
    ids = {r["identity"] for k, r in mine.items() if k not in other}
    return tuple(sorted({k[0] for k, r in rows.items() if r["identity"] in ids and k[0] != spec}))


def _same_spec(a: dict, b: dict) -> bool:
    """The same spec file (bytes and place)."""
    return (a.get("sha256"), a["path"]) == (b.get("sha256"), b["path"])


def _changed_fields(before: dict | None, after: dict | None) -> tuple[str, ...]:
    if before is None or after is None:
        return ()
    old, new = before.get("fields", {}), after.get("fields", {})
    keys = sorted(set(old) | set(new))
    changed = [k for k in keys if old.get(k) != new.get(k)]
    if before["path"] != after["path"]:
        changed.append("(file moved)")
    return tuple(changed)


def _by_target(
    mine: dict[VariantKey, dict], other: dict[VariantKey, dict]
) -> dict[str, tuple[str, ...]]:
    out: dict[str, list[str]] = defaultdict(list)
    for key, row in mine.items():
        if key not in other:
            out[target(row)].append(row["uri"])
    return {t: tuple(u) for t, u in sorted(out.items(), key=lambda kv: target_order(kv[0]))}


def _packages(mine: dict[VariantKey, dict], other: dict[VariantKey, dict]) -> tuple[str, ...]:
    theirs = {r["package"] for r in other.values()}
    return tuple(sorted({r["package"] for r in mine.values()} - theirs))


def _refusals(snap: dict, spec: str | None) -> tuple[Refusal, ...]:
    """The working tree's refused variants of a spec, grouped by reason."""
    groups: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
    for r in _refused_of(snap, spec):
        targets, uris = groups.setdefault((r["status"], r["reason"]), ([], []))
        if target(r) not in targets:
            targets.append(target(r))
        if r["uri"] not in uris:
            uris.append(r["uri"])
    return tuple(
        Refusal(tuple(sorted(t, key=target_order)), status, reason, tuple(u))
        for (status, reason), (t, u) in groups.items()
    )


# -- variants and kernel identities ----


def variant_kinds(
    old_rows: dict[VariantKey, dict], new_rows: dict[VariantKey, dict]
) -> dict[str, list[VariantKey]]:
    """new / removed / identity (kernel) / runtime (runtime only) / evidence_added /
    evidence_removed (identities unchanged)."""
    out: dict[str, list[VariantKey]] = {
        k: []
        for k in ("new", "removed", "identity", "runtime", "evidence_added", "evidence_removed")
    }
    for key in sorted(set(old_rows) | set(new_rows)):
        old, new = old_rows.get(key), new_rows.get(key)
        if old is None:
            out["new"].append(key)
        elif new is None:
            out["removed"].append(key)
        elif change(old, new) is not None:
            out["runtime" if change(old, new) == "runtime_code" else "identity"].append(key)
        elif evidence_of(new) > evidence_of(old):
            out["evidence_added"].append(key)
        elif evidence_of(new) < evidence_of(old):
            out["evidence_removed"].append(key)
    return out


def identity_changes(
    old_rows: dict[VariantKey, dict], new_rows: dict[VariantKey, dict]
) -> tuple[IdentityChanges, ...]:
    per: dict[str, list[tuple[dict, dict, str]]] = defaultdict(list)
    for key, old in old_rows.items():
        new = new_rows.get(key)
        how = change(old, new) if new is not None else None
        if how is not None:
            per[target(new)].append((old, new, how))
    out = []
    for t in sorted(per, key=target_order):
        moved = per[t]
        out.append(
            IdentityChanges(
                target=t,
                code=sum(how == "kernel_code" for _, _, how in moved),
                config=sum(how == "config" for _, _, how in moved),
                runtime=sum(how == "runtime_code" for _, _, how in moved),
                gpu_lost=sum(bool(o["gpu"]) and not n["gpu"] for o, n, _ in moved),
                compile_lost=sum(o["compiles"] and not n["compiles"] for o, n, _ in moved),
                packages=tuple(sorted({n["package"] for _, n, _ in moved})),
            )
        )
    return tuple(out)
