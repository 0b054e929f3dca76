"""YAML spec files -> typed :class:`Spec` objects, with file:line on every error."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import yaml

from attngen.spec.enums import QUANTIZED_KV, Arch, Backend, Family, MaskKind, Phase
from attngen.spec.document import compose_spec
from attngen.spec.errors import Location, SpecError
from attngen.spec.fields import OneOf, convert_scalar, did_you_mean, node_location
from attngen.spec.family import FamilySpec
from attngen.spec.model import (
    SCALAR_KEYS,
    SECTIONS,
    TAIL_KEYS,
    KvCache,
    Mask,
    Spec,
    Speculative,
    Target,
    Tuning,
)
from attngen.spec.reader import REQUIRED, MapReader, default_section, is_null, read_section


def load_spec(path: Path, root: Path | None = None) -> Spec:
    """Parse one spec file; ``root`` makes the recorded path repo-relative."""
    rel = _relative(path, root)
    _check_file_name(rel)
    raw = _read(path, rel)
    node = compose_spec(raw, rel)
    return _read_spec(node, rel, hashlib.sha256(raw).hexdigest())


# A spec file is a few hundred bytes, and YAML composes about half a megabyte a second: a
# large file named by mistake (a log, a dump) is refused by its size, not read for minutes.
MAX_SPEC_BYTES = 1 << 20


def _read(path: Path, rel: str) -> bytes:
    with path.open("rb") as f:
        raw = f.read(MAX_SPEC_BYTES + 1)
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(
            Location(rel, 1), "", f"not a spec: over {MAX_SPEC_BYTES} bytes (specs are a few KB)"
        )
    return raw


# A spec's file name is printed in generated headers and as a Markdown / MDX heading of the
# support matrix: letters, digits, '_', '-' and '.', starting with a letter or digit.
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def _check_file_name(rel: str) -> None:
    """Every file generated from a spec names it (its header, in UTF-8; the docs, as a
    heading): a path with bytes that are not UTF-8 (Python keeps them as lone surrogates)
    cannot be written there, and a name with markup characters would be markup."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        shown = rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise SpecError(
            Location(shown, 1),
            "",
            "the file name is not UTF-8 (generated files name their spec): rename the file",
        ) from None
    name = rel.rsplit("/", 1)[-1]
    if not FILE_NAME.fullmatch(name) or any(c in rel for c in "`\n\r"):
        raise SpecError(
            Location(repr(rel)[1:-1], 1),
            "",
            "the file name may hold letters, digits, '_', '-' and '.' only, starting with a "
            "letter or digit (generated headers and the docs print it): rename the file",
        )


def _relative(path: Path, root: Path | None) -> str:
    if root is not None:
        try:
            return path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            pass
    return path.as_posix()


def family_specs() -> dict[Family, FamilySpec]:
    """Every registered family's part of the spec language."""
    from attngen import registry  # the family packages register on first use

    return {f: info.spec for f, info in registry.families().items()}


def spec_keys() -> tuple[str, ...]:
    """Every top-level key a spec may have, in the order the docs list them."""
    family_keys = dict.fromkeys(k for fs in family_specs().values() for k in fs.sections)
    return (*SCALAR_KEYS, *family_keys, *TAIL_KEYS)


def section_keys() -> dict[str, list[str]]:
    """Each key of a section -> where it is written (``kv_cache.page_size``; a family's
    sections say whose: ``x.num_heads in a and b specs``), for a key written at the
    top level."""
    owners: dict[str, dict[str, list[str]]] = {}  # key -> place -> families (none: all)
    for name, cls in SECTIONS.items():
        for f in cls.FIELDS:
            owners.setdefault(f.key, {}).setdefault(f"{name}.{f.key}", [])
    for family, fs in family_specs().items():
        for name, cls in fs.sections.items():
            for f in cls.FIELDS:
                owners.setdefault(f.key, {}).setdefault(f"{name}.{f.key}", []).append(family.value)
    return {
        key: [
            place + (f" in {_and(families)} specs" if families else "")
            for place, families in places.items()
        ]
        for key, places in owners.items()
    }


def _and(words: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return " and ".join(w for w in (", ".join(words[:-1]), words[-1]) if w)


def _read_spec(node: yaml.Node, path: str, sha: str) -> Spec:
    reader = MapReader(node, path, "")
    reader.check_known(spec_keys(), section_keys())
    lines = reader.key_lines()
    top = {f.key: reader.pop(f) for f in Spec.FIELDS}
    family: Family = top["family"]
    fspec = family_specs()[family]
    sections = _read_family_sections(reader, family, fspec)
    kv_node = reader.pop_node("kv_cache")
    mask_node = reader.pop_node("mask")
    spec_node = reader.pop_node("speculative")
    targets_node = reader.pop_node("targets")
    tuning_node = reader.pop_node("tuning")
    if targets_node is None:
        raise reader.missing("targets", *REQUIRED)
    spec = Spec(
        location=reader.location,
        path=path,
        sha256=sha,
        kv_cache=_read_kv_cache(kv_node, fspec, path, reader.location),
        mask=_read_mask(mask_node, path, reader.location),
        speculative=(
            read_section(Speculative, spec_node, path, "speculative") if spec_node else None
        ),
        targets=_read_targets(targets_node, path),
        tuning=_read_tuning(tuning_node, path, family),
        sections=sections,
        section_names=tuple(fspec.sections),
        key_lines=lines,
        **top,
    )
    _check_spec(spec)
    fspec.check(spec)
    return spec


def _read_family_sections(
    reader: MapReader, family: Family, fspec: FamilySpec
) -> tuple[object, ...]:
    """The family's own sections (each required), refusing any other family's."""
    wanted = tuple(fspec.sections)
    others = [k for fs in family_specs().values() for k in fs.sections if k not in wanted]
    for key in dict.fromkeys(others):
        if key in reader.entries:
            raise SpecError(
                node_location(reader.path, reader.entries[key][0]),
                key,
                f"not used by family {family.value} (it takes: {', '.join(wanted)})",
            )
    nodes = {key: reader.pop_node(key) for key in wanted}
    for key, node in nodes.items():
        if node is None:
            required = f"required for family {family.value}"
            raise reader.missing(key, required, f"{required}, but has no value")
    return tuple(
        read_section(cls, nodes[key], reader.path, key) for key, cls in fspec.sections.items()
    )


def _read_kv_cache(
    node: yaml.Node | None, fspec: FamilySpec, path: str, loc: Location
) -> KvCache | None:
    if fspec.kv_cache is not None:
        if node is not None:
            raise SpecError(node_location(path, node), "kv_cache", fspec.kv_cache)
        return None
    if node is None:
        return default_section(KvCache, loc)
    kv = read_section(KvCache, node, path, "kv_cache")
    quantized = [d for d in kv.dtype if d in QUANTIZED_KV]
    if quantized and kv.scale is None:
        raise SpecError(
            kv.at("dtype"),
            "kv_cache.scale",
            f"required when kv_cache.dtype includes {quantized[0].value}",
        )
    if not quantized and kv.scale is not None:
        raise SpecError(kv.at("scale"), "kv_cache.scale", "only applies to fp8/fp4 KV cache dtypes")
    for dtype in quantized:
        if kv.scale not in QUANTIZED_KV[dtype]:
            allowed = " or ".join(s.value for s in QUANTIZED_KV[dtype])
            raise SpecError(
                kv.at("scale"),
                "kv_cache.scale",
                f"{dtype.value} takes {allowed} scales, not {kv.scale.value}",
            )
    return kv


def _read_mask(node: yaml.Node | None, path: str, loc: Location) -> Mask:
    if node is None:
        return default_section(Mask, loc)
    mask = read_section(Mask, node, path, "mask")
    if (mask.kind is MaskKind.SLIDING_WINDOW) != (mask.window_left is not None):
        raise SpecError(
            mask.at("window_left" if mask.window_left is not None else "kind"),
            "mask.window_left",
            "required when mask.kind is sliding_window, and only then",
        )
    return mask


def _read_targets(node: yaml.Node, path: str) -> tuple[Target, ...]:
    reader = MapReader(node, path, "targets")
    backend_kind = OneOf(Backend, tuple(Backend))
    arch_kind = OneOf(Arch, tuple(Arch))
    targets = []
    for key_node, value_node in node.value:
        name = f"targets.{key_node.value}"
        backend = convert_scalar(backend_kind, key_node, path, "targets")
        items = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
        missing = is_null(value_node)
        if missing or not items:
            what = "missing" if missing else "empty"
            raise SpecError(
                node_location(path, value_node),
                name,
                f"the arch list is {what}: expected a list of {', '.join(a.value for a in Arch)}",
            )
        archs: list[Arch] = []
        for item in items:
            arch = convert_scalar(arch_kind, item, path, name)
            if arch in archs:
                raise SpecError(node_location(path, item), name, f"{arch.value} is listed twice")
            archs.append(arch)
        location = node_location(path, key_node)
        targets.append(Target(location=location, backend=backend, archs=tuple(archs)))
    if not targets:
        raise SpecError(reader.location, "targets", "at least one backend is needed")
    return tuple(targets)


def _read_tuning(node: yaml.Node | None, path: str, family: Family) -> tuple[Tuning, ...]:
    """``tuning.<backend>.<arch>.<key>: value``; keys from that backend's lowering."""
    if node is None:
        return ()
    MapReader(node, path, "tuning")  # shape and duplicate-key checks
    _refuse_empty(node, path, "tuning", "a backend")
    backend_kind = OneOf(Backend, tuple(Backend))
    out = []
    for key_node, value_node in node.value:
        backend = convert_scalar(backend_kind, key_node, path, "tuning")
        out += _read_backend_tuning(value_node, path, family, backend)
    return tuple(out)


def _refuse_empty(node: yaml.Node, path: str, name: str, what: str) -> None:
    """A tuning level that names nothing tunes nothing: refused, not read as a no-op."""
    if not node.value:
        raise SpecError(node_location(path, node), name, f"empty: name {what}, or remove it")


def _read_backend_tuning(
    node: yaml.Node, path: str, family: Family, backend: Backend
) -> list[Tuning]:
    from attngen import registry  # the lowerings register on first use

    lowering = registry.lowering(family, backend)
    prefix = f"tuning.{backend.value}"
    if lowering is None:
        raise SpecError(
            node_location(path, node),
            prefix,
            f"no {backend.value} lowering of {family.value} to tune",
        )
    MapReader(node, path, prefix)
    _refuse_empty(node, path, prefix, "an arch")
    arch_kind = OneOf(Arch, tuple(Arch))
    out = []
    for key_node, value_node in node.value:
        arch = convert_scalar(arch_kind, key_node, path, prefix)
        reader = MapReader(value_node, path, f"{prefix}.{arch.value}")
        _refuse_empty(value_node, path, f"{prefix}.{arch.value}", "a tuning key")
        values = []
        for key in list(reader.entries):
            name = f"{prefix}.{arch.value}.{key}"
            key_loc = node_location(path, reader.entries[key][0])
            if key not in lowering.tuning_keys:
                allowed = ", ".join(lowering.tuning_keys)
                hint = did_you_mean(key, lowering.tuning_keys)
                raise SpecError(key_loc, name, f"unknown tile key (allowed: {allowed}){hint}")
            value_kind = lowering.tuning_keys[key]
            value_node = reader.pop_node(key)
            if value_node is None:
                raise SpecError(key_loc, name, f"no value: expected {value_kind.describe()}")
            values.append((key, convert_scalar(value_kind, value_node, path, name)))
        loc = node_location(path, key_node)
        out.append(Tuning(location=loc, backend=backend, arch=arch, values=tuple(sorted(values))))
    return out


def _check_spec(spec: Spec) -> None:
    """Cross-field rules that no single section can check."""
    spec_phases = {Phase.VERIFY, Phase.DRAFT_EXTEND}
    wants_spec = bool(spec_phases & set(spec.phases))
    if wants_spec and spec.speculative is None:
        raise SpecError(
            spec.location, "speculative", "required when phases include verify or draft_extend"
        )
    if spec.speculative is not None and not wants_spec:
        raise SpecError(
            spec.speculative.location, "speculative", "needs phase verify or draft_extend"
        )
    if spec.speculative is not None:
        spec_sec = spec.speculative
        if spec_sec.num_draft_tokens < max(spec_sec.topk):
            raise SpecError(
                spec_sec.at("num_draft_tokens"), "speculative.num_draft_tokens", "must be >= topk"
            )
    if spec.mask.kind is MaskKind.CUSTOM and (
        spec.speculative is None or max(spec.speculative.topk) == 1
    ):
        raise SpecError(
            spec.mask.at("kind"), "mask.kind", "custom masks come from speculative trees (topk > 1)"
        )
    targets = {(t.backend, a) for t in spec.targets for a in t.archs}
    for tuning in spec.tuning:
        if (tuning.backend, tuning.arch) not in targets:
            raise SpecError(
                tuning.location,
                f"tuning.{tuning.backend.value}.{tuning.arch.value}",
                f"{tuning.backend.value} {tuning.arch.value} is not among the targets",
            )
