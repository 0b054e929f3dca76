"""Support-matrix cells that change between the sides, and why: the variants deciding a
cell on either side, sorted by how they moved (new, kernel or runtime identity changed,
evidence added or removed, gone)."""

from __future__ import annotations

from dataclasses import dataclass

from attngen.review.variants import VariantKey, change, evidence_of, has_evidence

# How much a cell claims, for "falls back": full verified > partly verified > compiles >
# no evidence > not lowered / not supported.
RANK = {"verified": 4, "compiles": 2, "no_evidence": 1, "not_lowered": 0, "unsupported": 0}
EVIDENCE_SYMBOLS = frozenset({"verified", "compiles"})
NO_CELL = "(no cell)"  # the text of a cell one side of the review lacks


@dataclass(frozen=True)
class CellChange:
    table: str
    backend: str
    arch: str
    column: str
    before: str
    after: str
    before_symbol: str
    after_symbol: str
    loss: bool  # a verified / compiles cell now claims less
    moves: dict[str, tuple[VariantKey, ...]]  # MOVES kind -> the variants that moved so
    why: tuple[str, ...]  # the moves as sentences


def _cell_key(c: dict) -> tuple[str, str, str, str]:
    return c["family"], c["backend"], c["arch"], c["column"]


def cell_changes(
    base: dict, now: dict, old_rows: dict[VariantKey, dict], new_rows: dict[VariantKey, dict]
) -> tuple[CellChange, ...]:
    old = {_cell_key(c): c for c in base["cells"]}
    out = []
    for cell in now["cells"]:
        before = old.pop(_cell_key(cell), None)
        if before is not None and before["text"] == cell["text"]:
            continue
        out.append(_cell_change(before, cell, old_rows, new_rows))
    out += [_cell_change(c, None, old_rows, new_rows) for c in old.values()]
    return tuple(out)


def level(cell: dict | None) -> int:
    if cell is None:
        return 0
    rank = RANK.get(cell["symbol"], 0)
    if cell["symbol"] == "verified" and cell["verified"] < len(cell["items"]):
        rank -= 1  # verified for some of its variants only
    return rank


def _cell_change(
    before: dict | None,
    after: dict | None,
    old_rows: dict[VariantKey, dict],
    new_rows: dict[VariantKey, dict],
) -> CellChange:
    some = after or before
    assert some is not None
    loss = (
        before is not None and before["symbol"] in EVIDENCE_SYMBOLS and level(after) < level(before)
    )
    return CellChange(
        table=some["table"],
        backend=some["backend"],
        arch=some["arch"],
        column=some["column"],
        before=before["text"] if before else NO_CELL,
        after=after["text"] if after else NO_CELL,
        before_symbol=before["symbol"] if before else "",
        after_symbol=after["symbol"] if after else "",
        loss=loss,
        moves=(moves := cell_moves(before, after, old_rows, new_rows)),
        why=why(moves),
    )


def _keys(cell: dict | None) -> set[VariantKey]:
    if cell is None:
        return set()
    return {(spec, cell["backend"], cell["arch"], uri) for spec, uri in cell["items"]}


# Why a cell moved: kinds of variant movement, each with how a reader is told about it.
MOVES: dict[str, tuple[str, str]] = {
    "new_without_evidence": ("new variant", "without evidence"),
    "new_compiled": ("new variant", "with compile evidence only"),
    "new_verified": ("new variant", "with GPU evidence"),
    "kernel_code": ("variant", "changed kernel identity: kernel code changed"),
    "config": ("variant", "changed kernel identity: its config changed"),
    "runtime_code": ("variant", "changed runtime identity: host code of the package changed"),
    "evidence_added": ("variant", "gained evidence"),
    "evidence_removed": ("variant", "lost evidence (evidence file changed)"),
    "gone": ("variant", "no longer generated"),
}
NO_MOVE = "the capability model or the docs wording changed (no variant moved)"
NAMED = 3  # variants named in a reason before only their specs are
SPECS_NAMED = 4


def cell_moves(
    before: dict | None,
    after: dict | None,
    old_rows: dict[VariantKey, dict],
    new_rows: dict[VariantKey, dict],
) -> dict[str, tuple[VariantKey, ...]]:
    """The variants deciding a cell on either side, by how they moved (MOVES)."""
    old_keys, new_keys = _keys(before), _keys(after)
    added = sorted(new_keys - old_keys)
    both = sorted(old_keys & new_keys)
    how = {k: change(old_rows[k], new_rows[k]) for k in both}
    same = [k for k in both if how[k] is None]
    moves = {
        "new_without_evidence": [k for k in added if not has_evidence(new_rows[k])],
        "new_compiled": [k for k in added if new_rows[k]["compiles"] and not new_rows[k]["gpu"]],
        "new_verified": [k for k in added if new_rows[k]["gpu"]],
        "kernel_code": [k for k in both if how[k] == "kernel_code"],
        "config": [k for k in both if how[k] == "config"],
        "runtime_code": [k for k in both if how[k] == "runtime_code"],
        "evidence_added": [k for k in same if evidence_of(new_rows[k]) > evidence_of(old_rows[k])],
        "evidence_removed": [
            k for k in same if evidence_of(new_rows[k]) < evidence_of(old_rows[k])
        ],
        "gone": sorted(old_keys - new_keys),
    }
    return {kind: tuple(keys) for kind, keys in moves.items() if keys}


def why(moves: dict[str, tuple[VariantKey, ...]]) -> tuple[str, ...]:
    """ "2 new variants without evidence (spec_a d64_..., spec_a d128_...)"; past NAMED
    variants only their specs are named."""
    out = []
    for kind, keys in moves.items():
        noun, what = MOVES[kind]
        s = "" if len(keys) == 1 else "s"
        if len(keys) <= NAMED:
            named = [f"{spec} {uri}" for spec, _, _, uri in keys]
        else:
            specs = sorted({k[0] for k in keys})
            more = len(specs) - SPECS_NAMED
            named = specs[:SPECS_NAMED] + ([f"{more} more specs"] if more > 0 else [])
        out.append(f"{len(keys)} {noun}{s} {what} ({', '.join(named)})")
    return tuple(out) or (NO_MOVE,)
