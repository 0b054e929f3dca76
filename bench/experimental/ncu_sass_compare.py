#!/usr/bin/env python3
"""Compare two kernels' per-SASS-instruction ncu counters (``ncu -i REP --page source
--print-source sass --csv``, plain or .gz), e.g. FA4's and attngen's prefill from
``experimental/ncu_cute_prefill.sh --source``: executed instructions by opcode (the largest
differences first), stall reasons as shares of each kernel's warp samples, and each
kernel's most sampled instructions with their top stall reason.

``python3 bench/experimental/ncu_sass_compare.py A.csv[.gz] B.csv[.gz] [--top N]``

What it showed on 2026-12-04 (``results/ncu-cute-prefill-20261204-aeb8bec``): attngen's
prefill ran 5.7% more instructions than FA4's, its most sampled instruction was the wait
for P V (13%), placed by ptxas before the softmax, and its quad max compiled to
compare-and-select; the mask-free loop of 8f316e0 followed."""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Instr:
    address: str
    source: str
    opcode: str  # without predicate and modifiers: "HGMMA", "FMNMX", ...
    executed: int  # warp-level instructions executed
    samples: int  # warp stall samples (all)
    stalls: dict[str, int]  # stall reason -> samples


def load(path: Path) -> list[Instr]:
    """The instructions of one kernel's per-SASS CSV (its first row names the kernel)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    header = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    names = rows[header]
    col = {n: i for i, n in enumerate(names)}
    reasons = [n for n in names if n.startswith("stall_") and "Not Issued" not in n]
    out = []
    for r in rows[header + 1 :]:
        if len(r) < len(names):
            continue
        src = r[col["Source"]].strip()
        op = re.sub(r"^@!?U?P\w+\s+", "", src).split(" ")[0].split(".")[0]
        num = lambda name: int(r[col[name]] or 0)  # noqa: E731
        out.append(Instr(r[col["Address"]], src, op, num("Instructions Executed"),
                         num("Warp Stall Sampling (All Samples)"),
                         {s: num(s) for s in reasons}))  # fmt: skip
    if not out:
        raise SystemExit(f"{path}: no instruction rows (is it a --page source --csv export?)")
    return out


def by_opcode(instrs: list[Instr]) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for i in instrs:
        counts[i.opcode] += i.executed
    return counts


def stall_shares(instrs: list[Instr]) -> dict[str, float]:
    totals: collections.Counter = collections.Counter()
    for i in instrs:
        totals.update(i.stalls)
    whole = sum(totals.values()) or 1
    return {k: v / whole for k, v in totals.most_common()}


def report(a: list[Instr], b: list[Instr], names: tuple[str, str], top: int) -> str:
    lines = []
    ca, cb = by_opcode(a), by_opcode(b)
    ta, tb = sum(ca.values()), sum(cb.values())
    lines.append(f"executed instructions: {names[0]} {ta:,}, {names[1]} {tb:,} "
                 f"({(tb - ta) / ta:+.1%})")  # fmt: skip
    lines.append(f"{'opcode':14s} {names[0]:>14s} {names[1]:>14s} {'difference':>14s}")
    for op in sorted(set(ca) | set(cb), key=lambda o: -abs(cb[o] - ca[o]))[:top]:
        lines.append(f"{op:14s} {ca[op]:14,} {cb[op]:14,} {cb[op] - ca[op]:+14,}")
    for name, instrs in zip(names, (a, b)):
        shares = stall_shares(instrs)
        lines.append(f"\n{name}: stall reasons " + ", ".join(
            f"{k.removeprefix('stall_')} {v:.1%}" for k, v in list(shares.items())[:8]))  # fmt: skip
        whole = sum(i.samples for i in instrs) or 1
        for i in sorted(instrs, key=lambda i: -i.samples)[:top]:
            reason = max(i.stalls.items(), key=lambda kv: kv[1])[0].removeprefix("stall_")
            lines.append(f"  {i.address[-5:]} {i.samples / whole:5.1%} executed {i.executed:>10,} "
                         f"{reason:14s} {i.source[:64]}")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    names = (args.a.name.split("-sass")[0], args.b.name.split("-sass")[0])
    print(report(load(args.a), load(args.b), names, args.top))


if __name__ == "__main__":
    main()
