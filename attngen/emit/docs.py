"""The support matrix (Markdown and MDX), derived from supports() and recorded evidence.

No cell is typed by hand: each is the probe verdict of a feature (features.py) combined
with the GPU and compile evidence of the generated variants that exercise it. The
"Backend selection" section is rendered from ``attngen.selection`` (preference order and
what ``select_backend`` resolves each family's base variant to), and its hybrid example
from the generated specs that can form a hybrid.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from attngen import registry
from attngen.capabilities import Status
from attngen.emit.header import Provenance
from attngen.evidence import COMPILE_DIR, GPU_CHECKS, CompileEvidence, GpuEvidence, compile_file
from attngen.features import Feature
from attngen.probes import base_variant, family_features, probe_verdict
from attngen.ir import KernelPlan, ModulePlan
from attngen.hooks import SAME_ATTENTION_FIELDS
from attngen.selection import (
    SELECTION_PHASES,
    Selection,
    preference,
    select_backend,
)
from attngen.spec.enums import Arch, Backend, Family, Phase
from attngen.speed import NO_SPEED, SpeedEvidence

VERIFIED, COMPILES, NO_EVIDENCE, NOT_LOWERED, UNSUPPORTED = "✅", "🔨", "❔", "⏳", "❌"


@dataclass(frozen=True)
class Lowered:
    """One generated variant: its kernel identity (what compile evidence is keyed by), the
    runtime identity of its package (GPU evidence needs both) and its package."""

    identity: str
    runtime: str
    package: str  # repo-relative generated package
    plan: KernelPlan
    arch: Arch
    backend: Backend


@dataclass(frozen=True)
class Evidence:
    gpu: dict[Arch, GpuEvidence]
    compiled: dict[Arch, CompileEvidence]
    speed: SpeedEvidence = NO_SPEED  # measured backend speed (auto-selection reads it)

    def verified(self, item: Lowered, checks: frozenset[str]) -> bool:
        ev = self.gpu.get(item.arch)
        return ev is not None and all(ev.has(item.identity, item.runtime, c) for c in checks)

    def compiles(self, item: Lowered) -> bool:
        ev = self.compiled.get(item.arch)
        usage = ev.kernels(item.identity) if ev else ()
        return bool(usage) and all(u.spill_bytes == 0 for u in usage)


class Notes:
    """Numbered footnotes, deduplicated by text."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def ref(self, text: str) -> str:
        if text not in self.items:
            self.items.append(text)
        return f"({self.items.index(text) + 1})"


def cell(
    feature: Feature,
    backend: Backend,
    arch: Arch,
    lowered: list[Lowered],
    ev: Evidence,
    notes: Notes,
) -> str:
    verdict = probe_verdict(feature, backend, arch)
    relevant = [x for x in lowered if feature.applies(x.plan.variant)]
    if verdict.status is Status.UNSUPPORTED:
        if not relevant:
            return f"{UNSUPPORTED} {notes.ref(verdict.reason)}"
        # some variants of the feature run here, the probe's does not: say both
        return f"{_evidence_cell(feature, relevant, ev, notes)} {notes.ref(verdict.reason)}"
    if not relevant:
        if verdict.status is Status.NOT_LOWERED:
            return f"{NOT_LOWERED} {notes.ref(verdict.reason)}"
        return f"{NO_EVIDENCE} {notes.ref('lowered, but no spec in specs/ generates it for this target')}"
    return _evidence_cell(feature, relevant, ev, notes)


def _evidence_cell(feature: Feature, relevant: list[Lowered], ev: Evidence, notes: Notes) -> str:
    """Verified / compiles / no evidence for the variants that exercise ``feature``."""
    verified = [x for x in relevant if ev.verified(x, feature.checks(x.plan.variant))]
    detail = _detail(feature, verified or relevant)
    if len(verified) == len(relevant):
        return f"{VERIFIED}{detail}"
    if verified:
        return f"{VERIFIED}{detail} ({len(verified)} of {len(relevant)} variants)"
    if all(ev.compiles(x) for x in relevant):
        return f"{COMPILES}{detail}"
    return f"{NO_EVIDENCE} {notes.ref('lowered and generated, but no test evidence recorded yet')}"


def _evidence_links(arch: Arch, backend: Backend, ev: Evidence) -> str:
    """Links from a backend x arch row to the evidence files its cells rest on (from
    generated/docs/): the arch's GPU record and that backend's compile record."""
    links = []
    if arch in ev.gpu:
        links.append(f"[GPU](../../{ev.gpu[arch].path})")
    if arch in ev.compiled:
        own = f"{COMPILE_DIR}/{compile_file(backend.value, arch.value)}"
        links += [f"[compile](../../{path})" for path in ev.compiled[arch].paths if path == own]
    return f" ({', '.join(links)})" if links else ""


def _detail(feature: Feature, items: list[Lowered]) -> str:
    if feature.detail is None:
        return ""
    values = sorted({feature.detail(x.plan.variant) for x in items}, key=_natural)
    return " " + ", ".join(values)


def _natural(text: str) -> tuple[int, str]:
    return (int(text), text) if text.isdigit() else (1 << 30, text)


@dataclass(frozen=True)
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]


def family_table(family: Family, lowered: list[Lowered], ev: Evidence, notes: Notes) -> Table:
    features = family_features(family)
    rows = []
    for backend in Backend:
        for arch in Arch:
            mine = [x for x in lowered if x.backend is backend and x.arch is arch]
            row = [
                f"attngen {backend.value} {arch.value}"
                f"{_evidence_links(arch, backend, ev) if mine else ''}"
            ]
            row += [cell(f, backend, arch, mine, ev, notes) for f in features]
            rows.append(row)
    title = registry.family(family).title
    return Table(title, ["Backend"] + [f.label for f in features], rows)


def plan_checks(plan: ModulePlan) -> list[str]:
    """The GPU checks the family's docs columns ask of a module's variants, in table order."""
    features = family_features(plan.family)
    wanted = {
        c
        for k in plan.kernels
        for f in features
        if f.applies(k.variant)
        for c in f.checks(k.variant)
    }
    return [c for c in GPU_CHECKS if c in wanted]


def variant_table(plan: ModulePlan, items: list[Lowered], ev: Evidence) -> Table:
    """Per-variant evidence and resource use of one generated module."""
    checks = plan_checks(plan)
    gpu = ev.gpu.get(plan.arch)
    rows = []
    for item in items:
        row = [f"`{item.plan.uri}`"]
        for name in checks:
            if not ev.verified(item, frozenset({name})):
                row.append("—")
                continue
            detail = gpu.detail(item.identity, name) if gpu else ""
            row.append(f"{VERIFIED} {detail}" if detail else VERIFIED)
        usage = ev.compiled.get(item.arch)
        kernels = usage.kernels(item.identity) if usage else ()
        resources = "; ".join(
            f"{k.kernel} {k.registers} regs {k.shared_bytes} B smem {k.spill_bytes} B spill"
            for k in kernels
        )
        rows.append(row + [resources or "—"])
    title = f"`{plan.spec.name}` on {plan.backend.value} {plan.arch.value} (`{plan.spec.path}`)"
    header = ["Variant"] + [c.replace("_", " ") for c in checks]
    return Table(title, header + ["compiled for " + plan.arch.value], rows)


def evidence_lines(ev: Evidence) -> list[str]:
    lines = []
    for arch in Arch:
        gpu = ev.gpu.get(arch)
        if gpu:
            kept = f" (records kept from {', '.join(gpu.earlier)})" if gpu.earlier else ""
            lines.append(
                f"GPU ({arch.value}): `{gpu.path}`, {gpu.device}, commit {gpu.commit[:12]}, "
                f"{gpu.date}{kept}"
            )
        comp = ev.compiled.get(arch)
        if comp:
            for path, compiler in zip(comp.paths, comp.compilers):
                lines.append(f"Compile ({arch.value}): `{path}`, {compiler}")
        if not gpu and not comp:
            lines.append(f"{arch.value}: no evidence recorded")
    return lines


# -- backend selection and hybrids ----


class LetterNotes(Notes):
    """Footnotes (a), (b), ... so they do not collide with the matrix's numbered notes."""

    def ref(self, text: str) -> str:
        super().ref(text)
        return f"({_letter(self.items.index(text))})"


def _letter(i: int) -> str:
    return chr(ord("a") + i) if i < 26 else f"a{i}"


@dataclass(frozen=True)
class SelectionDocs:
    preference: Table  # arch -> preference order
    resolved: Table  # family x phase -> what each arch resolves to
    speed: Table  # measured backend pairs per arch and phase (evidence/speed)
    notes: list[tuple[str, str]]  # (letter, why)
    hybrid_example: str  # Python source of a make_backend(...) call
    hybrid_pairs: list[str]  # "`prefill` + `decode` (archs)"


def selection_docs(plans: list[ModulePlan], lowered: list[Lowered], ev: Evidence) -> SelectionDocs:
    pref_rows = [
        [arch.value, " → ".join(f"`{b.value}`" for b in preference(arch))] for arch in Arch
    ]
    pref = Table("Preference order", ["Arch", "Preference (best first)"], pref_rows)
    notes = LetterNotes()
    rows = []
    for family in Family:
        probe = base_variant(family)
        for phase in SELECTION_PHASES:
            row = [family.value.upper(), f"`{probe.uri}`", phase.value]
            for arch in Arch:
                sel = select_backend(probe, arch, phase, speed=ev.speed)
                row.append(_selection_cell(sel, family, lowered, ev, notes))
            rows.append(row)
    resolved = Table(
        "What auto-selection resolves to today",
        ["Family", "Probe variant", "Phase"] + [a.value for a in Arch],
        rows,
    )
    letters = [(_letter(i), text) for i, text in enumerate(notes.items)]
    pairs = hybrid_pairs(plans)
    speed = speed_table(ev.speed)
    return SelectionDocs(pref, resolved, speed, letters, hybrid_example(pairs), _pair_lines(pairs))


def speed_table(speed: SpeedEvidence) -> Table:
    """Every pair of backends a benchmark ran side by side, per arch and phase."""
    rows = []
    for arch, record in sorted(speed.records.items(), key=lambda kv: list(Arch).index(kv[0])):
        phases = sorted({c.phase for c in record.comparisons}, key=list(Phase).index)
        for phase in phases:
            backends = sorted({b for c in record.comparisons if c.phase is phase for b in c.ms})
            for i, a in enumerate(backends):
                for b in backends[i + 1 :]:
                    pair = speed.pair(a, b, arch, phase)
                    if pair is None:
                        continue
                    bench = f"{record.device}, bench of {record.commit} (`{record.path}`)"
                    rows.append(
                        [arch.value, phase.value, f"`{pair.faster.value}`",
                         f"`{pair.slower.value}`", f"{pair.ratio:.2f}x", str(pair.cases), bench]
                    )  # fmt: skip
    header = ["Arch", "Phase", "Faster", "Slower", "Time ratio", "Cases", "Measured on"]
    return Table("Measured speed", header, rows)


def _selection_cell(
    sel: Selection, family: Family, lowered: list[Lowered], ev: Evidence, notes: LetterNotes
) -> str:
    why = notes.ref(sel.reason)
    if sel.backend is None:
        symbol = NOT_LOWERED if sel.status is Status.NOT_LOWERED else UNSUPPORTED
        return f"none {symbol} {why}"
    mine = [
        x
        for x in lowered
        if x.backend is sel.backend
        and x.arch is sel.arch
        and x.plan.variant.family is family
        and sel.phase in x.plan.variant.phases
    ]
    return f"`{sel.backend.value}` {why}{_evidence_summary(mine, sel.phase, ev)}"


def _evidence_summary(items: list[Lowered], phase: Phase, ev: Evidence) -> str:
    """How the generated variants that would run this phase stand on evidence."""
    if not items:
        return ""
    verified = sum(ev.verified(x, frozenset({phase.value})) for x in items)
    if verified:
        return f": {VERIFIED} {verified} of {len(items)} generated variants"
    if all(ev.compiles(x) for x in items):
        return f": {COMPILES} {len(items)} generated variants"
    return f": {NO_EVIDENCE} {len(items)} generated variants, no evidence"


@dataclass(frozen=True)
class HybridPair:
    prefill: str
    decode: str
    family: Family
    archs: tuple[Arch, ...]
    shared: tuple[Hashable, ...]  # layer keys both specs generate, sorted


DOCS_PAIR_FIELDS = ("causal", *SAME_ATTENTION_FIELDS)


def hybrid_pairs(plans: list[ModulePlan]) -> list[HybridPair]:
    """Pairs of different generated specs that ``HybridAttnBackend`` accepts together.

    Same family, backend and arch, an extend spec and a decode spec, at least one layer key
    in common (the family's: what a backend instance and its KV pool are built for) and
    hooks that compute the same attention (causal included).
    """
    found: dict[tuple[str, str], tuple[Family, list[Arch], set[Hashable]]] = {}
    for p in plans:
        for d in plans:
            if p.spec.name == d.spec.name or (p.family, p.backend, p.arch) != (
                d.family,
                d.backend,
                d.arch,
            ):
                continue
            if Phase.EXTEND not in p.spec.phases or Phase.DECODE not in d.spec.phases:
                continue
            # the same attention, causal included: a decoder's prefill is causal (the runtime
            # lets causal differ, since decode alone does not see it; an example must not)
            if any(getattr(p.hooks, f) != getattr(d.hooks, f) for f in DOCS_PAIR_FIELDS):
                continue
            layer_keys = registry.family(p.family).layer_keys
            shared = layer_keys(p) & layer_keys(d)
            if shared:
                _, archs, keys = found.setdefault((p.spec.name, d.spec.name), (p.family, [], set()))
                archs.append(p.arch)
                keys |= shared
    return [
        HybridPair(pre, dec, fam, tuple(a for a in Arch if a in archs), tuple(sorted(keys)))
        for (pre, dec), (fam, archs, keys) in sorted(found.items())
    ]


def _pair_lines(pairs: list[HybridPair]) -> list[str]:
    return [
        f"`{p.prefill}` (prefill) + `{p.decode}` (decode) on {', '.join(a.value for a in p.archs)}"
        for p in pairs
    ]


def hybrid_example(pairs: list[HybridPair]) -> str:
    """A ``make_backend`` call for the first generated pair (sm90 first), by its family."""
    pair = next((p for p in pairs if Arch.SM90 in p.archs), pairs[0] if pairs else None)
    if pair is None:
        return "# no two generated specs form a hybrid today"
    arch = Arch.SM90 if Arch.SM90 in pair.archs else pair.archs[0]
    return registry.family(pair.family).hybrid_example(
        pair.prefill, pair.decode, arch, pair.shared[0]
    )


@dataclass(frozen=True)
class DocsContext:
    provenance: Provenance
    family_tables: list[Table]
    variant_tables: list[Table]
    notes: list[str]
    evidence: list[str]
    symbols: dict[str, str]
    selection: SelectionDocs


def docs_context(
    plans: list[ModulePlan], lowered: list[Lowered], ev: Evidence, provenance: Provenance
) -> DocsContext:
    notes = Notes()
    tables = [
        family_table(f, [x for x in lowered if x.plan.variant.family is f], ev, notes)
        for f in Family
    ]
    variant_tables = [
        variant_table(p, [x for x in lowered if x.package == p.package], ev) for p in plans
    ]
    symbols = dict(
        verified=VERIFIED,
        compiles=COMPILES,
        no_evidence=NO_EVIDENCE,
        not_lowered=NOT_LOWERED,
        unsupported=UNSUPPORTED,
    )
    return DocsContext(
        provenance,
        tables,
        variant_tables,
        notes.items,
        evidence_lines(ev),
        symbols,
        selection_docs(plans, lowered, ev),
    )
