"""The support matrix (Markdown and MDX), derived from supports() and recorded evidence.

No cell is typed by hand: each is the probe verdict of a feature (features.py) combined
with the GPU and compile evidence of the generated variants that exercise it. The
"Backend selection" section is rendered from ``attngen.selection`` (preference order and
what ``select_backend`` resolves each family's base variant to), and its hybrid example
from the generated specs that can form a hybrid.
"""

from __future__ import annotations

from dataclasses import dataclass

from attngen.capabilities import Status
from attngen.emit.header import Provenance
from attngen.evidence import CompileEvidence, GpuEvidence
from attngen.features import FEATURES, Feature, base_variant, probe_verdict
from attngen.lower.ir import MhaKernelPlan, MhaModulePlan
from attngen.selection import (
    HYBRID_MASK_FIELDS,
    SELECTION_PHASES,
    Selection,
    preference,
    select_backend,
)
from attngen.spec.enums import TORCH_DTYPE_NAME, Arch, Backend, DType, Family, Phase
from attngen.spec.variant import MhaShape

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


def _evidence_links(arch: Arch, ev: Evidence) -> str:
    """Links from a table row to the evidence files its cells rest on (from generated/docs/)."""
    links = []
    if arch in ev.gpu:
        links.append(f"[GPU](../../{ev.gpu[arch].path})")
    if arch in ev.compiled:
        links.append(f"[compile](../../{ev.compiled[arch].path})")
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
    features = FEATURES[family]
    rows = []
    for backend in Backend:
        for arch in Arch:
            mine = [x for x in lowered if x.backend is backend and x.arch is arch]
            row = [
                f"attngen {backend.value} {arch.value}{_evidence_links(arch, ev) if mine else ''}"
            ]
            row += [cell(f, backend, arch, mine, ev, notes) for f in features]
            rows.append(row)
    return Table(FAMILY_TITLES[family], ["Backend"] + [f.label for f in features], rows)


# GPU checks in the order the per-variant tables show them, with the phase that needs each
CHECK_COLUMNS = (
    ("prefill", Phase.PREFILL),
    ("extend", Phase.EXTEND),
    ("decode", Phase.DECODE),
    ("cuda_graph", Phase.DECODE),
    ("verify", Phase.VERIFY),
    ("cuda_graph_verify", Phase.VERIFY),
    ("draft_extend", Phase.DRAFT_EXTEND),
    ("cuda_graph_draft_extend", Phase.DRAFT_EXTEND),
)


def plan_checks(plan: MhaModulePlan) -> list[str]:
    """The GPU checks that apply to a module's variants, in table order."""
    checks = [name for name, phase in CHECK_COLUMNS if phase in plan.spec.phases]
    quantized = any(k.variant.kv_dtype not in (DType.BF16, DType.FP16) for k in plan.kernels)
    return checks + (["quantized_vs_bf16"] if quantized else []) + ["mqa"]


def variant_table(plan: MhaModulePlan, items: list[Lowered], ev: Evidence) -> Table:
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
            detail = gpu.detail(item.module, item.sha256, item.plan.uri, name) if gpu else ""
            row.append(f"{VERIFIED} {detail}" if detail else VERIFIED)
        usage = ev.compiled.get(item.arch)
        kernels = usage.kernels(item.module, item.sha256, item.plan.uri) if usage else ()
        resources = "; ".join(
            f"{k.kernel} {k.registers} regs {k.shared_bytes} B smem {k.spill_bytes} B spill"
            for k in kernels
        )
        rows.append(row + [resources or "—"])
    title = f"`{plan.spec.name}` on {plan.backend.value} {plan.arch.value} ({plan.spec.path})"
    header = ["Variant"] + [c.replace("_", " ") for c in checks]
    return Table(title, header + ["compiled for " + plan.arch.value], rows)


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
    notes: list[tuple[str, str]]  # (letter, why)
    hybrid_example: str  # Python source of a make_backend(...) call
    hybrid_pairs: list[str]  # "`prefill` + `decode` (archs)"


def selection_docs(
    plans: list[MhaModulePlan], lowered: list[Lowered], ev: Evidence
) -> SelectionDocs:
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
                sel = select_backend(probe, arch, phase)
                row.append(_selection_cell(sel, family, lowered, ev, notes))
            rows.append(row)
    resolved = Table(
        "What auto-selection resolves to today",
        ["Family", "Probe variant", "Phase"] + [a.value for a in Arch],
        rows,
    )
    letters = [(_letter(i), text) for i, text in enumerate(notes.items)]
    pairs = hybrid_pairs(plans)
    return SelectionDocs(pref, resolved, letters, hybrid_example(plans, pairs), _pair_lines(pairs))


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


# (head_dim, v_head_dim, gqa_group, page_size, dtype, kv_dtype, kv_scale): what one backend
# instance is built for; two backends sharing a KV pool must agree on all of it.
ConfigKey = tuple[int, int, int, int, DType, DType, str]


def _config_keys(plan: MhaModulePlan) -> set[ConfigKey]:
    keys = set()
    for k in plan.kernels:
        v, shape = k.variant, k.variant.shape
        assert isinstance(shape, MhaShape)
        kv_dtype = v.kv_dtype if v.kv_dtype is not None else v.dtype
        scale = v.kv_scale.value if v.kv_scale is not None and kv_dtype is not v.dtype else ""
        keys.add(
            (
                shape.head_dim,
                shape.v_head_dim,
                shape.gqa_group,
                v.page_size,
                v.dtype,
                kv_dtype,
                scale,
            )
        )
    return keys


@dataclass(frozen=True)
class HybridPair:
    prefill: str
    decode: str
    archs: tuple[Arch, ...]
    shared: tuple[ConfigKey, ...]  # configs both specs generate, sorted


def hybrid_pairs(plans: list[MhaModulePlan]) -> list[HybridPair]:
    """Pairs of different generated specs that ``HybridAttnBackend`` accepts together.

    Same backend and arch, an extend spec and a decode spec, at least one config (head dim,
    v head dim, GQA group, page size, dtype, KV-cache dtype and scales) in common and
    agreeing mask fields.
    """
    found: dict[tuple[str, str], tuple[list[Arch], set[ConfigKey]]] = {}
    for p in plans:
        for d in plans:
            if p.spec.name == d.spec.name or (p.backend, p.arch) != (d.backend, d.arch):
                continue
            if Phase.EXTEND not in p.spec.phases or Phase.DECODE not in d.spec.phases:
                continue
            if any(getattr(p.mask, f) != getattr(d.mask, f) for f in HYBRID_MASK_FIELDS):
                continue
            shared = _config_keys(p) & _config_keys(d)
            if shared:
                archs, keys = found.setdefault((p.spec.name, d.spec.name), ([], set()))
                archs.append(p.arch)
                keys |= shared
    return [
        HybridPair(pre, dec, tuple(a for a in Arch if a in archs), tuple(sorted(keys, key=str)))
        for (pre, dec), (archs, keys) in sorted(found.items())
    ]


def _pair_lines(pairs: list[HybridPair]) -> list[str]:
    return [
        f"`{p.prefill}` (prefill) + `{p.decode}` (decode) on {', '.join(a.value for a in p.archs)}"
        for p in pairs
    ]


def hybrid_example(plans: list[MhaModulePlan], pairs: list[HybridPair]) -> str:
    """A ``make_backend`` call for the first generated pair (or a placeholder if none)."""
    pair = next((p for p in pairs if Arch.SM90 in p.archs), pairs[0] if pairs else None)
    if pair is None:
        arch, decode, prefill = Arch.SM90.value, "<decode spec>", "<prefill spec>"
        head_dim, v_head_dim, group, page_size, dtype, kv_dtype = (
            128,
            128,
            4,
            16,
            DType.BF16,
            DType.BF16,
        )
    else:
        arch = (Arch.SM90 if Arch.SM90 in pair.archs else pair.archs[0]).value
        decode, prefill = pair.decode, pair.prefill
        head_dim, v_head_dim, group, page_size, dtype, kv_dtype, _ = pair.shared[0]
    num_kv_heads = 8
    lines = [
        "from attngen.runtime.select import make_backend",
        "",
        "backend = make_backend(",
        f'    "{arch}",',
        f'    "{decode}",  # the decode backend (and any phase not overridden)',
        f'    prefill_spec="{prefill}",  # extend-like modes go here',
        f"    num_q_heads={num_kv_heads * group},",
        f"    num_kv_heads={num_kv_heads},",
        f"    head_dim={head_dim},",
    ]
    if v_head_dim != head_dim:
        lines.append(f"    v_head_dim={v_head_dim},")
    lines += [
        f"    page_size={page_size},",
        f"    dtype=torch.{TORCH_DTYPE_NAME[dtype]},",
    ]
    if kv_dtype is not dtype:
        lines.append(f"    kv_cache_dtype=torch.{TORCH_DTYPE_NAME[kv_dtype]},")
    lines += [
        '    device="cuda",',
        "    req_to_token_pool=req_to_token_pool,  # both backends share the pools",
        "    kv_pool=kv_pool,",
        ")",
        "backend.init_forward_metadata(forward_batch)  # EXTEND -> prefill, DECODE -> decode",
    ]
    return "\n".join(lines)


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
    return DocsContext(
        provenance,
        tables,
        variant_tables,
        notes.items,
        evidence_lines(ev),
        symbols,
        selection_docs(plans, lowered, ev),
    )
