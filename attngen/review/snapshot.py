"""One side of a review: the model of a tree (specs, lowered variants with their kernel
identities and evidence, refused variants, support-matrix cells), as plain JSON data.

This file is run by :mod:`attngen.review.sides` in a fresh interpreter whose ``attngen`` is
the tree's own code: the working tree's for the new side, BASE's (``git archive``) for the
old one, so a kernel identity is what that revision's code makes of it. Runtime identities
(what GPU evidence also needs) hash the generated packages: they are read from the tree's
generated/, and rendered only for packages it does not hold yet. It therefore
imports only the spine (spec, capabilities, lower, probes, evidence, emit.docs) and nothing
of attngen.review, which BASE may not have. Nothing is emitted or written.

Run: ``python snapshot.py CODE_ROOT DATA_ROOT`` prints the snapshot of DATA_ROOT (specs/,
evidence/, generated/) computed by the attngen package under CODE_ROOT.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

NOTE_REF = re.compile(r" ?\((\d+)\)")


def snapshot(root: Path) -> dict:
    """The model of the tree at ``root`` (see the module docstring)."""
    from attngen.emit.docs import Evidence
    from attngen.evidence import load_compile, load_gpu
    from attngen.spec.enums import Arch

    specs, refused, plans = _lower(root)
    errors: list[str] = []
    gpu, compiled = {}, {}
    for arch in Arch:
        for table, loader in ((gpu, load_gpu), (compiled, load_compile)):
            try:
                found = loader(root, arch.value)
            except ValueError as err:  # an evidence file in an older format
                errors.append(str(err))
                found = None
            if found is not None:
                table[arch] = found
    ev = Evidence(gpu=gpu, compiled=compiled)
    lowered, spec_of = _lowered(plans, root)
    variants = [_variant_row(x, spec_of[x.package], ev) for x in lowered]
    return {
        "specs": specs,
        "variants": variants,
        "refused": refused,
        "cells": _cells(lowered, spec_of, ev),
        "evidence": _evidence_files(ev),
        "errors": errors,
    }


def _lower(root: Path) -> tuple[dict, list[dict], list]:
    """Each spec loaded, validated and lowered on each of its targets, one at a time: a spec
    that fails is recorded with its error (generate would stop there) and the rest go on."""
    specs: dict[str, dict] = {}
    refused: list[dict] = []
    plans: list = []
    for path in _spec_files(root / "specs"):
        spec, entry = _load(path, root, specs)
        if spec is None:
            continue
        variants = _validate(spec, entry)
        refused += _refused(spec, variants)
        if entry["error"] is None:
            plans += _plans(spec, variants)
    return specs, refused, plans


def _spec_files(folder: Path) -> list[Path]:
    """generate's discovery rule (older revisions lack ``find_specs``: their rule was the
    .yaml files of the folder)."""
    try:
        from attngen.generate import find_specs
    except ImportError:
        return sorted(folder.rglob("*.yaml"))
    try:
        return find_specs(folder)
    except Exception:  # no specs folder, or an empty one: nothing to model
        return []


def _load(path: Path, root: Path, specs: dict[str, dict]):
    """(Spec or None, its entry in ``specs``): keyed by name, or ``<path>`` when the file
    does not load or repeats a name."""
    from attngen.spec.errors import SpecError
    from attngen.spec.loader import load_spec

    rel = path.relative_to(root).as_posix()
    entry = {"path": rel, "fields": _yaml_fields(path), "error": None, "name": None}
    try:
        spec = load_spec(path, root)
    except SpecError as err:
        specs[f"<{rel}>"] = {**entry, "error": str(err)}
        return None, entry
    entry.update(name=spec.name, family=spec.family.value, sha256=spec.sha256)
    entry["targets"] = [[t.backend.value, a.value] for t in spec.targets for a in t.archs]
    if spec.name in specs:
        entry["error"] = f"{rel}: name: {spec.name!r} is already used by {specs[spec.name]['path']}"
        specs[f"<{rel}>"] = entry
        return None, entry
    specs[spec.name] = entry
    return spec, entry


def _validate(spec, entry: dict) -> tuple:
    """The spec's variants; validate's refusal goes into the entry (and the variants are
    still expanded, so each target's verdicts can be listed)."""
    from attngen.spec.errors import SpecError
    from attngen.spec.expand import expand
    from attngen.validate import validate

    try:
        variants = validate(spec)
    except SpecError as err:
        entry["error"] = str(err)
        try:
            variants = expand(spec)
        except SpecError:
            variants = ()
    entry["variants"] = [v.uri for v in variants]
    return variants


def _refused(spec, variants: tuple) -> list[dict]:
    """Every (variant, target) of the spec that supports() does not say SUPPORTED for."""
    from attngen.capabilities import supports

    out = []
    for target in spec.targets:
        for arch in target.archs:
            for v in variants:
                verdict = supports(v, target.backend, arch)
                if not verdict.ok:
                    out.append(
                        dict(
                            spec=spec.name,
                            uri=v.uri,
                            backend=target.backend.value,
                            arch=arch.value,
                            status=verdict.status.value,
                            reason=verdict.reason,
                        )
                    )
    return out


def _plans(spec, variants: tuple) -> list:
    from attngen.lower import lower_module

    plans = [lower_module(spec, variants, t.backend, a) for t in spec.targets for a in t.archs]
    return [p for p in plans if p is not None]


def _variant_row(item, spec: str, ev) -> dict:
    """One lowered variant: where it is generated, its identities and the evidence it has."""
    from attngen.evidence import GPU_CHECKS

    return dict(
        spec=spec,
        uri=item.plan.uri,
        backend=item.backend.value,
        arch=item.arch.value,
        family=item.plan.variant.family.value,
        package=item.package,
        identity=item.identity,
        runtime=getattr(item, "runtime", ""),
        # the config alone (tiles, shapes): tells a config change from a code change
        config=hashlib.sha256(repr(item.plan.config).encode()).hexdigest(),
        gpu=[c for c in GPU_CHECKS if ev.verified(item, frozenset({c}))],
        compiles=ev.compiles(item),
        via=_via(item, ev, GPU_CHECKS),
    )


def _via(item, ev, checks) -> list[str]:
    """The integrations whose GPU runs recorded evidence of ``item`` (a detail
    ``via=<integration>-<model>``, e.g. ``via=transformers-llama``): their suites, not the
    family's, re-record it."""
    gpu = ev.gpu.get(item.arch)
    if gpu is None or not hasattr(gpu, "detail"):
        return []
    found = set()
    for check in checks:
        detail = gpu.detail(item.identity, check)
        for word in detail.split():
            if word.startswith("via="):
                found.add(word.removeprefix("via=").split("-", 1)[0])
    return sorted(found)


def _lowered(plans: list, root: Path) -> tuple[list, dict[str, str]]:
    """docs.Lowered items (kernel identity from the pair's lowering, runtime identity of the
    package), and package -> spec name."""
    from dataclasses import fields

    from attngen.emit.docs import Lowered
    from attngen.lower import plan_identities

    has_runtime = "runtime" in {f.name for f in fields(Lowered)}  # older revisions: no
    out = []
    for plan in plans:
        ids = plan_identities(plan)
        extra = {"runtime": _runtime(root, plan)} if has_runtime else {}
        out += [
            Lowered(
                identity=ids[k.uri],
                package=plan.package,
                plan=k,
                arch=plan.arch,
                backend=plan.backend,
                **extra,
            )
            for k in plan.kernels
        ]
    return out, {plan.package: plan.spec.name for plan in plans}


def _runtime(root: Path, plan) -> str:
    """The runtime identity of a plan's package, as the docs compute it: from the package
    in generated/ (the tree under review), rendered only when it is not there yet."""
    from attngen.evidence import package_runtime_identity
    from attngen.generate import plan_runtime_identity
    from attngen.lower import plan_files

    folder = root / plan.package
    if any(folder.glob("*.py")):
        return package_runtime_identity(root, folder)
    return plan_runtime_identity(root, plan, plan_files(plan))


def _cells(lowered: list, spec_of: dict[str, str], ev) -> list[dict]:
    """Every support-matrix cell, as the docs render it (docs.cell), with its footnotes
    resolved and the variants that decide it."""
    from attngen import registry
    from attngen.emit import docs
    from attngen.probes import family_features
    from attngen.spec.enums import Arch, Backend, Family

    names = {
        docs.VERIFIED: "verified",
        docs.COMPILES: "compiles",
        docs.NO_EVIDENCE: "no_evidence",
        docs.NOT_LOWERED: "not_lowered",
        docs.UNSUPPORTED: "unsupported",
    }
    out = []
    for family in Family:
        title = registry.family(family).title or family.value
        for backend in Backend:
            for arch in Arch:
                mine = [
                    x
                    for x in lowered
                    if x.backend is backend and x.arch is arch and x.plan.variant.family is family
                ]
                for feature in family_features(family):
                    notes = docs.Notes()
                    text = docs.cell(feature, backend, arch, mine, ev, notes)
                    relevant = [x for x in mine if feature.applies(x.plan.variant)]
                    checks = [feature.checks(x.plan.variant) for x in relevant]
                    out.append(
                        dict(
                            family=family.value,
                            table=title,
                            backend=backend.value,
                            arch=arch.value,
                            column=feature.label,
                            symbol=names.get(text.split(" ", 1)[0], "?"),
                            text=_resolve_notes(text, notes.items),
                            items=[[spec_of[x.package], x.plan.uri] for x in relevant],
                            verified=sum(ev.verified(x, c) for x, c in zip(relevant, checks)),
                        )
                    )
    return out


def _resolve_notes(text: str, notes: list[str]) -> str:
    """``❔ (1)`` -> ``❔ [lowered and generated, but no test evidence recorded yet]``."""
    return NOTE_REF.sub(lambda m: f" [{notes[int(m.group(1)) - 1]}]", text)


def _evidence_files(ev) -> dict:
    gpu = {
        a.value: dict(path=e.path, device=e.device, commit=e.commit, date=e.date)
        for a, e in ev.gpu.items()
    }
    compiled = {a.value: list(e.paths) for a, e in ev.compiled.items()}
    return {"gpu": gpu, "compile": compiled}


def _yaml_fields(path: Path) -> dict[str, str]:
    """Top-level spec keys -> canonical JSON of their values (what changed in a spec)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): json.dumps(v, sort_keys=True, default=str) for k, v in data.items()}


def main(argv: list[str]) -> int:
    code_root, data_root = (Path(a).resolve() for a in argv)
    sys.path.insert(0, str(code_root))
    import attngen

    where = Path(attngen.__file__).resolve().parent.parent
    if where != code_root:
        print(f"snapshot: imported attngen from {where}, not {code_root}", file=sys.stderr)
        return 2
    json.dump(snapshot(data_root), sys.stdout, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
