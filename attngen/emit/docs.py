"""The support matrix (Markdown and MDX), derived from supports() and recorded evidence.

No cell is typed by hand: each is the probe verdict of a feature (features.py) combined
with the GPU and compile evidence of the generated variants that exercise it.
"""

from __future__ import annotations

from dataclasses import dataclass

from attngen.capabilities import Status
from attngen.emit.header import Provenance
from attngen.evidence import CompileEvidence, GpuEvidence
from attngen.features import FEATURES, Feature, probe_verdict
from attngen.lower.ir import MhaKernelPlan, MhaModulePlan
from attngen.spec.enums import Arch, Backend, Family

VERIFIED, COMPILES, NO_EVIDENCE, NOT_LOWERED, UNSUPPORTED = "✅", "🔨", "❔", "⏳", "❌"
FAMILY_TITLES = {
    Family.MHA: "MHA backends",
    Family.MLA: "MLA backends",
    Family.GDN: "GDN (gated delta rule) backends",
    Family.DSA: "DSA (DeepSeek sparse attention) backends",
}


@dataclass(frozen=True)
class Lowered:
    """One generated variant with the file that carries it."""

    module: str  # repo-relative kernels.py
    sha256: str
    plan: MhaKernelPlan
    arch: Arch
    backend: Backend


@dataclass(frozen=True)
class Evidence:
    gpu: dict[Arch, GpuEvidence]
    compiled: dict[Arch, CompileEvidence]

    def verified(self, item: Lowered, checks: frozenset[str]) -> bool:
        ev = self.gpu.get(item.arch)
        return ev is not None and all(
            ev.has(item.module, item.sha256, item.plan.uri, c) for c in checks
        )

    def compiles(self, item: Lowered) -> bool:
        ev = self.compiled.get(item.arch)
        usage = ev.kernels(item.module, item.sha256, item.plan.uri) if ev else ()
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
    if verdict.status is Status.UNSUPPORTED:
        return f"{UNSUPPORTED} {notes.ref(verdict.reason)}"
    relevant = [x for x in lowered if feature.applies(x.plan.variant)]
    if not relevant:
        if verdict.status is Status.NOT_LOWERED:
            return f"{NOT_LOWERED} {notes.ref(verdict.reason)}"
        return f"{NO_EVIDENCE} {notes.ref('lowered, but no spec in specs/ generates it for this target')}"
    verified = [x for x in relevant if ev.verified(x, feature.checks(x.plan.variant))]
    detail = _detail(feature, verified or relevant)
    if len(verified) == len(relevant):
        return f"{VERIFIED}{detail}"
    if verified:
        return f"{VERIFIED}{detail} ({len(verified)} of {len(relevant)} variants)"
    if all(ev.compiles(x) for x in relevant):
        return f"{COMPILES}{detail}"
    return f"{NO_EVIDENCE} {notes.ref('lowered and generated, but no test evidence recorded yet')}"


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
    features = FEATURES[family]
    rows = []
    for backend in Backend:
        for arch in Arch:
            mine = [x for x in lowered if x.backend is backend and x.arch is arch]
            row = [f"attngen {backend.value} {arch.value}"]
            row += [cell(f, backend, arch, mine, ev, notes) for f in features]
            rows.append(row)
    return Table(FAMILY_TITLES[family], ["Backend"] + [f.label for f in features], rows)


def variant_table(plan: MhaModulePlan, items: list[Lowered], ev: Evidence) -> Table:
    """Per-variant evidence and resource use of one generated module."""
    rows = []
    for item in items:
        checks = {}
        for name in ("decode", "extend", "cuda_graph"):
            checks[name] = VERIFIED if ev.verified(item, frozenset({name})) else "—"
        usage = ev.compiled.get(item.arch)
        kernels = usage.kernels(item.module, item.sha256, item.plan.uri) if usage else ()
        resources = "; ".join(
            f"{k.kernel} {k.registers} regs {k.shared_bytes} B smem {k.spill_bytes} B spill"
            for k in kernels
        )
        rows.append(
            [
                f"`{item.plan.uri}`",
                checks["decode"],
                checks["extend"],
                checks["cuda_graph"],
                resources or "—",
            ]
        )
    title = f"`{plan.spec.name}` on {plan.backend.value} {plan.arch.value} ({plan.spec.path})"
    return Table(
        title,
        ["Variant", "decode", "extend", "CUDA graph", "compiled for " + plan.arch.value],
        rows,
    )


def evidence_lines(ev: Evidence) -> list[str]:
    lines = []
    for arch in Arch:
        gpu = ev.gpu.get(arch)
        if gpu:
            lines.append(
                f"GPU ({arch.value}): `{gpu.path}`, {gpu.device}, commit {gpu.commit[:12]}, {gpu.date}"
            )
        comp = ev.compiled.get(arch)
        if comp:
            lines.append(f"Compile ({arch.value}): `{comp.path}`, Triton {comp.triton}")
        if not gpu and not comp:
            lines.append(f"{arch.value}: no evidence recorded")
    return lines


@dataclass(frozen=True)
class DocsContext:
    provenance: Provenance
    family_tables: list[Table]
    variant_tables: list[Table]
    notes: list[str]
    evidence: list[str]
    symbols: dict[str, str]


def docs_context(
    plans: list[MhaModulePlan], lowered: list[Lowered], ev: Evidence, provenance: Provenance
) -> DocsContext:
    notes = Notes()
    tables = [
        family_table(f, [x for x in lowered if x.plan.variant.family is f], ev, notes)
        for f in Family
    ]
    variant_tables = [
        variant_table(p, [x for x in lowered if x.module.startswith(p.package + "/")], ev)
        for p in plans
    ]
    symbols = dict(
        verified=VERIFIED,
        compiles=COMPILES,
        no_evidence=NO_EVIDENCE,
        not_lowered=NOT_LOWERED,
        unsupported=UNSUPPORTED,
    )
    return DocsContext(provenance, tables, variant_tables, notes.items, evidence_lines(ev), symbols)
