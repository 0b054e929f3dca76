"""The pipeline: specs/ -> validate -> lower -> emit -> generated/ (or a drift report)."""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from attngen.emit.docs import Evidence, Lowered, docs_context
from attngen.emit.env import render
from attngen.emit.header import Provenance, regenerate_command
from attngen.emit.modules import namespace_files, sha256_text
from attngen.emit.schema import render_schema
from attngen.emit.writer import Drift, check_tree, write_tree, write_once
from attngen.evidence import load_compile, load_gpu, runtime_identity
from attngen.speed import load_speed
from attngen.ir import ModulePlan
from attngen.lower import lower_module, plan_files, plan_identities
from attngen.spec.enums import Arch, Family
from attngen.spec.errors import SpecError
from attngen.spec.loader import load_spec
from attngen.spec.model import Spec
from attngen.validate import validate

ALL_ARCHS = tuple(a.value for a in Arch)


@dataclass(frozen=True)
class Build:
    specs: tuple[Spec, ...]
    plans: tuple[ModulePlan, ...]
    files: dict[str, str]  # path relative to generated/ -> text


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class GenerateError(Exception):
    """Generation refused before touching generated/ (the message says why)."""


SPEC_SUFFIXES = (".yaml", ".yml")


def find_specs(path: str | Path) -> list[Path]:
    """The spec files of ``path`` (a file, or a folder searched recursively): the one
    discovery rule of validate and generate. Suffixes count in any case (``x.YAML``); hidden
    files and broken links (editor lock files) are passed over; a missing path, an empty
    one (it would mean the current folder), one that is neither a file nor a folder (a
    FIFO, a device) and a folder with no spec are errors."""
    if isinstance(path, str) and not path:
        raise GenerateError("an empty path names no spec file or folder")
    path = Path(path)
    if path.is_file():
        return [path]
    if path.exists() and not path.is_dir():
        raise GenerateError(f"{path}: not a regular file or a folder of spec files")
    if not path.is_dir():
        raise GenerateError(f"{path}: no such spec file or folder")
    found = sorted(
        p
        for p in path.rglob("*")
        if p.suffix.lower() in SPEC_SUFFIXES and p.is_file() and not p.name.startswith(".")
    )
    if not found:
        raise GenerateError(f"{path}: no spec files ({', '.join(SPEC_SUFFIXES)}) in this folder")
    return found


def misplaced(spec: Spec) -> str | None:
    """A warning when the spec sits in another family's folder (``specs/<family>/``): it
    still loads, but a reviewer looking for the family's specs would not find it there."""
    families = {f.value for f in Family}
    folders = [p for p in Path(spec.path).parent.parts if p in families]
    if folders and folders[-1] != spec.family.value:
        return (
            f"warning: {spec.path}: a {spec.family.value} spec in the folder of "
            f"{folders[-1]} specs (move it to a {spec.family.value}/ folder)"
        )
    return None


def load_all(specs_dir: str | Path, root: Path) -> list[Spec]:
    specs = [_load(p, root) for p in find_specs(specs_dir)]
    seen: dict[str, Spec] = {}
    for spec in specs:
        warning = misplaced(spec)
        if warning:
            log(warning)
        if spec.name in seen:
            raise SpecError(
                spec.location, "name", f"{spec.name!r} is already used by {seen[spec.name].path}"
            )
        seen[spec.name] = spec
    return specs


def _load(path: Path, root: Path) -> Spec:
    try:
        return load_spec(path, root)
    except OSError as err:
        raise GenerateError(f"{path}: cannot read: {err.strerror or err}") from None


def check_out_folder(out: Path, specs_dir: str | Path) -> None:
    """Refuse to write into ``out`` unless it is new, empty or a generated tree (it holds
    attngen's MANIFEST.json): writing removes every file there that generate does not
    write, so a wrong --out (the repository, a source folder, specs/ itself) would lose
    them all. Spec files inside ``out`` would be removed the same way."""
    if out.exists() and not out.is_dir():
        raise GenerateError(f"{out}: not a folder (--out names the generated tree)")
    manifest_file = out / "MANIFEST.json"
    if out.is_dir() and any(out.iterdir()) and not _is_manifest(manifest_file):
        raise GenerateError(
            f"{out}: neither empty nor a generated tree (no attngen MANIFEST.json): generate "
            "removes every file there that it does not write; nothing was written (name a new "
            "or empty folder, or generated/)"
        )
    if Path(specs_dir).resolve().is_relative_to(out.resolve()):
        raise GenerateError(
            f"{specs_dir}: the specs are inside the output folder {out}, where generate removes "
            "every file that it does not write: nothing was written"
        )


def _is_manifest(path: Path) -> bool:
    """A file that attngen's manifest() wrote (read as text: a merge conflict in it still
    counts)."""
    try:
        return path.is_file() and MANIFEST_MARK in path.read_text(errors="replace")
    except OSError:
        return False


def check_families_kept(specs: list[Spec], out: Path, archs: tuple[str, ...]) -> None:
    """Refuse a run that would delete every package of a family generated/ holds (a wrong
    --specs path, a half-copied tree): remove those packages by hand if that is meant."""
    have = {s.family.value for s in specs}
    held = {
        p.name
        for a in archs
        for p in (out / a).glob("*/*")
        if p.is_dir() and p.name != "__pycache__"
    }
    held = sorted(held - have)
    if held:
        raise GenerateError(
            f"{out} holds {', '.join(held)} packages but the specs have no {' or '.join(held)} "
            "spec: nothing was written (delete those packages by hand if that is meant)"
        )


# A spec whose axes multiply into more variants than this gets a warning: every variant
# is a kernel config to generate, compile (evidence) and test on the GPU.
MANY_VARIANTS = 256


def warn_many_variants(spec: Spec, count: int) -> None:
    """The warning of validate and generate for a spec of more than MANY_VARIANTS variants."""
    if count > MANY_VARIANTS:
        log(
            f"warning: {spec.path}: {count} variants (over {MANY_VARIANTS}): each is a kernel "
            "config to generate, compile and verify; list fewer values per axis or split the "
            "spec"
        )


def lower_all(specs: list[Spec], verbose: bool) -> list[ModulePlan]:
    plans = []
    for i, spec in enumerate(specs, 1):
        variants = validate(spec)
        warn_many_variants(spec, len(variants))
        made = []
        for target in spec.targets:
            for arch in target.archs:
                plan = lower_module(spec, variants, target.backend, arch)
                if plan is not None:
                    plans.append(plan)
                    made.append(f"{target.backend.value}/{arch.value}")
        if verbose:
            # validate refused a spec that no target lowers: made is never empty
            log(f"[{i}/{len(specs)}] {spec.path}: {len(variants)} variants -> {', '.join(made)}")
    return plans


def build(root: Path, specs_dir: str | Path, verbose: bool = True) -> Build:
    specs = load_all(specs_dir, root)
    plans = lower_all(specs, verbose)
    digest = hashlib.sha256("".join(s.sha256 for s in specs).encode()).hexdigest()
    files: dict[str, str] = {}
    owners: dict[str, str] = {}
    for n, plan in enumerate(plans, 1):
        if verbose:
            log(f"  emit [{n}/{len(plans)}] {plan.package} ({len(plan.kernels)} variants)")
        write_once(
            files,
            owners,
            plan_files(plan),
            f"{plan.spec.path} ({plan.backend.value} {plan.arch.value})",
        )
    write_once(files, owners, namespace_files(plans, ALL_ARCHS, digest), "namespace packages")
    write_once(files, owners, {"schema/attngen-spec.schema.json": render_schema()}, "schema")
    write_once(files, owners, docs_files(root, plans, files, digest), "support matrix")
    files["MANIFEST.json"] = manifest(files, digest)
    return Build(tuple(specs), tuple(plans), files)


def plan_runtime_identity(root: Path, plan: ModulePlan, files: dict[str, str]) -> str:
    """The runtime identity of a plan's package as generated (``files``: path relative to
    generated/ -> text); equal to ``package_runtime_identity`` of the package on disk."""
    rel = plan.package.removeprefix("generated/") + "/"
    package = {
        path[len(rel) :]: text
        for path, text in files.items()
        if path.startswith(rel) and path.endswith(".py") and "/" not in path[len(rel) :]
    }
    return runtime_identity(root, plan.family.value, package)


def docs_files(
    root: Path, plans: list[ModulePlan], files: dict[str, str], digest: str
) -> dict[str, str]:
    lowered = []
    for plan in plans:
        ids = plan_identities(plan)
        runtime = plan_runtime_identity(root, plan, files)
        lowered += [
            Lowered(ids[k.uri], runtime, plan.package, k, plan.arch, plan.backend)
            for k in plan.kernels
        ]
    ev = Evidence(
        gpu={a: e for a in Arch if (e := load_gpu(root, a.value)) is not None},
        compiled={a: e for a in Arch if (e := load_compile(root, a.value)) is not None},
        speed=load_speed(root),
    )
    out = {}
    for ext in ("md", "mdx"):
        template = f"docs/support_matrix.{ext}.jinja"
        prov = Provenance(
            ("specs/", "evidence/"), f"templates/{template}", digest, regenerate_command("all")
        )
        ctx = docs_context(plans, lowered, ev, prov)
        out[f"docs/support_matrix.{ext}"] = render(template, ctx=ctx)
    return out


MANIFEST_MARK = "@generated by attngen"  # the first line of every Provenance


def tree_label(root: Path, out: Path) -> str:
    """How messages name the output tree: ``generated/`` for the repository's own, else
    the folder as given."""
    return "generated/" if out.resolve() == (root / "generated").resolve() else f"{out}/"


def manifest(files: dict[str, str], digest: str) -> str:
    body = {
        "_generated": Provenance(
            ("specs/",), "attngen/generate.py", digest, regenerate_command("all")
        ).lines(),
        "files": {f"generated/{rel}": sha256_text(text) for rel, text in sorted(files.items())},
    }
    return json.dumps(body, indent=1, sort_keys=True) + "\n"


def generate(
    root: Path, specs_dir: str | Path, out: Path, archs: tuple[str, ...], check: bool
) -> Drift:
    if not check:
        check_out_folder(out, specs_dir)
    result = build(root, specs_dir)
    check_families_kept(list(result.specs), out, archs)
    if check:  # the drift check covers every arch: the build produced them all anyway
        return check_tree(out, result.files, ALL_ARCHS)
    drift = write_tree(out, result.files, archs)
    changed = len(drift.missing) + len(drift.changed)
    stale, total = len(drift.stale) + len(drift.stale_dirs), len(result.files)
    tree = tree_label(root, out)
    links = f", {len(drift.links)} links replaced" if drift.links else ""
    log(f"{tree}: {changed} files written, {stale} stale removed{links}, {total} in total")
    return drift
