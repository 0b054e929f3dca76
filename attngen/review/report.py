"""The review as a reader gets it: text for a terminal, Markdown for a PR comment, JSON for
tools. One :class:`Report` holds every fact; the renderers only format it."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import asdict, dataclass

from attngen.emit import docs
from attngen.review.cells import NO_CELL, CellChange, why
from attngen.review.compare import Review, SpecChange, review
from attngen.review.files import (
    DiffSize,
    evidence_files,
    generated_sizes,
    source_changes,
)
from attngen.review.sides import FileChange, Sides
from attngen.review.todo import Command, commands

SYMBOLS = {
    "verified": docs.VERIFIED,
    "compiles": docs.COMPILES,
    "no_evidence": docs.NO_EVIDENCE,
    "not_lowered": docs.NOT_LOWERED,
    "unsupported": docs.UNSUPPORTED,
}
NOTE = re.compile(r" ?\[[^\]]*\]")
PARTIAL = re.compile(r" ?\((\d+) of (\d+) variants\)")
SHOWN = 6  # uris listed before "(+N more)" in text and Markdown


@dataclass(frozen=True)
class Report:
    base: str  # label
    base_commit: str
    notes: tuple[str, ...]
    review: Review
    commands: tuple[Command, ...]
    sizes: tuple[DiffSize, ...]
    sources: dict[str, tuple[FileChange, ...]]
    evidence: tuple[FileChange, ...]
    gpu_archs: tuple[str, ...]  # archs with GPU evidence on the working tree


def build(sides: Sides) -> Report:
    r = review(sides.base, sides.now)
    return Report(
        base=sides.base_rev,
        base_commit=sides.base_commit,
        notes=sides.notes,
        review=r,
        commands=commands(sides, r),
        sizes=generated_sizes(sides.files),
        sources=source_changes(sides.files),
        evidence=evidence_files(sides.files),
        gpu_archs=tuple(sides.now["evidence"]["gpu"]),
    )


# -- JSON ----


def to_json(report: Report) -> str:
    data = asdict(report)
    data["review"]["evidence_loss"] = [asdict(c) for c in report.review.evidence_loss]
    return json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


# -- shared pieces ----


def _uris(uris: tuple[str, ...]) -> str:
    more = f" (+{len(uris) - SHOWN} more)" if len(uris) > SHOWN else ""
    return ", ".join(uris[:SHOWN]) + more


def _grouped_targets(per: dict[str, tuple[str, ...]]) -> list[tuple[str, tuple[str, ...]]]:
    """Targets with the same uris on one line: [("<backend> <arch>, <arch>", uris)]."""
    groups: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for t, uris in per.items():
        groups[uris].append(t)
    out = []
    for uris, targets in groups.items():
        backends: dict[str, list[str]] = defaultdict(list)
        for t in targets:
            b, a = t.split(" ")
            backends[b].append(a)
        out.append(("; ".join(f"{b} {', '.join(a)}" for b, a in backends.items()), uris))
    return out


def mark(symbol: str, text: str) -> str:
    """✅ / 🔨 / ... with "partly" when only some of the cell's variants are verified."""
    partly = " partly" if PARTIAL.search(text) else ""
    return SYMBOLS.get(symbol, "·") + partly


def detail(text: str) -> str:
    """A cell's values (head dims, page sizes, ...) without symbol, notes and counts; none
    for a cell the other side lacks (a new or removed column or row)."""
    if text == NO_CELL:
        return ""
    body = text.split(" ", 1)[1] if " " in text else ""
    return PARTIAL.sub("", NOTE.sub("", body)).strip()


def cell_groups(cells: tuple[CellChange, ...]) -> list[tuple[str, str, str, list[str]]]:
    """(table · target, before → after, why, columns): the cells of a row that moved alike
    (same symbols, same kinds of move) together, their reasons over all their variants."""
    groups: dict[tuple[str, str, tuple[str, ...]], list[CellChange]] = defaultdict(list)
    for c in cells:
        move = f"{mark(c.before_symbol, c.before)} → {mark(c.after_symbol, c.after)}"
        groups[(f"{c.table} · {c.backend} {c.arch}", move, tuple(c.moves))].append(c)
    out = []
    for (where, move, _), members in groups.items():
        moves: dict[str, set] = defaultdict(set)
        for c in members:
            for kind, keys in c.moves.items():
                moves[kind].update(keys)
        reasons = why({k: tuple(sorted(v)) for k, v in moves.items()})
        out.append((where, move, "; ".join(reasons), [_column(c) for c in members]))
    return out


def _column(c: CellChange) -> str:
    old, new = detail(c.before), detail(c.after)
    if old == new:
        return c.column
    if old and new:
        return f"{c.column} ({old} → {new})"
    if c.before == NO_CELL and new:  # a new column or row: what it shows
        return f"{c.column} (→ {new})"
    return c.column


def _spec_counts(specs: tuple[SpecChange, ...]) -> str:
    n = {s: sum(c.status == s for c in specs) for s in ("added", "changed", "removed", "relowered")}
    relowered = f", {n['relowered']} relowered" if n["relowered"] else ""
    return f"{n['added']} added, {n['changed']} changed, {n['removed']} removed{relowered}"


def _size_line(s: DiffSize) -> str:
    parts = [
        f"{n} {what}"
        for n, what in ((s.added, "added"), (s.modified, "modified"), (s.deleted, "deleted"))
        if n
    ]
    return (
        f"{s.kind}: {s.files} files ({', '.join(parts)}), +{s.lines_added} -{s.lines_removed} lines"
    )


def _identity_line(i) -> str:
    what = [
        f"{n} {how}"
        for n, how in (
            (i.code, "kernel identities by kernel code"),
            (i.config, "kernel identities by config"),
            (i.runtime, "runtime identities only (host code)"),
        )
        if n
    ]
    return (
        f"{i.target}: {i.code + i.config + i.runtime} variants changed ({', '.join(what)}) in "
        f"{len(i.packages)} package(s); evidence dropped: {i.gpu_lost} GPU-verified, "
        f"{i.compile_lost} compiled"
    )


def spec_lines(s: SpecChange) -> list[str]:
    """A spec's facts as plain lines (the two renderers indent or bullet them)."""
    lines = []
    if s.fields:
        lines.append(f"fields changed: {', '.join(s.fields)}")
    elif s.status == "changed" and not s.error:
        lines.append("no field changed (comments or formatting)")
    if s.status == "relowered":
        lines.append("spec file unchanged: the code lowers it differently")
    if s.error:
        lines.append(f"REFUSED (generate stops here): {s.error}")
    for targets, uris in _grouped_targets(s.added):
        lines.append(f"added on {targets}: {len(uris)} variant(s): {_uris(uris)}")
    if s.added:
        gpu, compiled, none = s.new_evidence
        shared = (
            f"; kernels also generated by {', '.join(s.shared_with)}: their compile evidence "
            "counts (kernel identity), GPU evidence also needs this package's runtime identity"
            if s.shared_with
            else ""
        )
        lines.append(
            f"new variants' evidence: {gpu} GPU-verified, {compiled} compiled only, "
            f"{none} none{shared}"
        )
    for targets, uris in _grouped_targets(s.removed):
        lines.append(f"removed from {targets}: {len(uris)} variant(s): {_uris(uris)}")
    for r in s.refused:
        status = r.status.replace("_", " ")
        lines.append(
            f"refused on {', '.join(r.targets)} ({len(r.uris)} variant(s), {status}): {r.reason}"
            f" [{_uris(r.uris)}]"
        )
    if s.packages_added:
        lines.append(f"packages added: {', '.join(s.packages_added)}")
    if s.packages_removed:
        lines.append(f"packages removed: {', '.join(s.packages_removed)}")
    if s.status == "changed" and not (s.added or s.removed or s.error):
        lines.append("no variant added or removed")
    return lines


def code_lines(report: Report) -> list[str]:
    lines = []
    for group, files in report.sources.items():
        names = ", ".join(f"{f.path} ({f.status}, +{f.added} -{f.removed})" for f in files[:SHOWN])
        more = f" (+{len(files) - SHOWN} more)" if len(files) > SHOWN else ""
        lines.append(f"{group}: {names}{more}")
    lines += [_identity_line(i) for i in report.review.identities]
    return lines or ["no attngen/ source changed; no kernel or runtime identity changed"]


def evidence_lines(report: Report) -> list[str]:
    lines = [f"{f.path} ({f.status}, +{f.added} -{f.removed})" for f in report.evidence]
    return lines or ["no evidence file changed"]


def summary(report: Report) -> str:
    r = report.review
    loss = len(r.evidence_loss)
    return (
        f"specs {_spec_counts(r.specs)}; {len(r.cells)} matrix cells change"
        f" ({loss} fall back from verified/compiles)"
        + (f"; {len(r.errors)} spec(s) REFUSED" if r.errors else "")
    )


# -- text ----


def to_text(report: Report) -> str:
    r = report.review
    out = [f"attngen review: {report.base} ({report.base_commit[:12]}) -> working tree"]
    out += [f"note: {n}" for n in report.notes]
    out.append(summary(report))
    for e in r.errors:
        out.append(f"REFUSED: {e}")
    out.append("")
    out.append(f"Specs: {_spec_counts(r.specs)}")
    for s in r.specs:
        out.append(f"  {s.status:<10}{s.name} ({s.path})")
        out += [f"      {line}" for line in spec_lines(s)]
    out.append("")
    out.append(f"Support matrix: {len(r.cells)} cells change")
    for where, move, reason, cols in cell_groups(r.cells):
        out.append(f"  {where}: {move} in {len(cols)} column(s): {', '.join(cols)}")
        out.append(f"      why: {reason}")
    out.append("")
    out.append("Kernel code:")
    out += [f"  {line}" for line in code_lines(report)]
    out.append("Evidence:")
    out += [f"  {line}" for line in evidence_lines(report)]
    out.append("")
    out.append("To run:" if report.commands else "To run: nothing (no evidence to restore)")
    for c in report.commands:
        out += [f"  {c.command}", f"      # {c.why}"]
    out.append("")
    out.append("Generated diff (skip what you need not read):")
    out += [f"  {_size_line(s)}" for s in report.sizes] or ["  generated/ unchanged"]
    return "\n".join(out) + "\n"


# -- Markdown ----


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def to_markdown(report: Report) -> str:
    r = report.review
    out = [f"### attngen review: `{report.base}` ({report.base_commit[:12]}) → working tree", ""]
    out += [f"> note: {n}" for n in report.notes]
    out += [f"**{summary(report)}**", ""]
    out += [f"- :x: **refused**: `{e}`" for e in r.errors]
    out += ["#### Specs", ""]
    for s in r.specs:
        out.append(f"- **{s.status}** `{s.name}` (`{s.path}`)")
        out += [f"  - {_md(line)}" for line in spec_lines(s)]
    if not r.specs:
        out.append("- no spec changed")
    out += ["", "#### Support matrix", ""]
    if r.cells:
        out += ["| Row | Change | Columns | Why |", "|---|---|---|---|"]
        for where, move, reason, cols in cell_groups(r.cells):
            out.append(f"| {_md(where)} | {move} | {_md(', '.join(cols))} | {_md(reason)} |")
    else:
        out.append("No cell changes.")
    out += ["", "#### Kernel code", ""]
    out += [f"- {_md(line)}" for line in code_lines(report)]
    out += ["", "#### Evidence", ""]
    out += [f"- {line}" for line in evidence_lines(report)]
    out += ["", "#### To run", ""]
    if report.commands:
        out.append("```bash")
        for c in report.commands:
            out += [f"# {c.why}", c.command]
        out.append("```")
    else:
        out.append("Nothing: no evidence to restore.")
    out += ["", "#### Generated diff", ""]
    out += [f"- {_size_line(s)}" for s in report.sizes] or ["- generated/ unchanged"]
    return "\n".join(out) + "\n"


RENDERERS = {"text": to_text, "md": to_markdown, "json": to_json}
