"""Distill a ``make bench`` result into speed evidence: evidence/speed/<arch>.json.

    .venv/bin/python bench/distill_speed.py bench/results/h200-<date>-<commit>.json

Keeps, for every benchmark case that timed two or more attngen backends on the same inputs,
each backend's median milliseconds and the variant it ran, when that backend passed the
case's numerical check (``vs_ref.ok`` and no mismatch against a peer). A result is an
attngen backend's when its ``spec`` reads ``<backend>/<spec name>``. The phase is the
result's own ``phase`` if the bench recorded one, else its section's (:data:`PHASES`: the
prefill section times the extend kernels over pages holding the whole sequence).
``attngen.speed`` reads the file; auto-selection and the support matrix use it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from attngen.arch import arch_for_device  # noqa: E402
from attngen.speed import parse_record, speed_path  # noqa: E402
from attngen.spec.enums import Backend  # noqa: E402

# bench section -> the phase its attngen calls run
PHASES = {"prefill": "extend", "decode": "decode", "verify": "verify"}
CASE_KEYS = ("page_size", "head_dim", "hq", "hkv", "batch")


def backend_result(result: object) -> tuple[str, str] | None:
    """(backend, "spec/uri") of an attngen backend's passing timed result, else None."""
    if not isinstance(result, dict) or "ms" not in result:
        return None
    backend, _, spec = str(result.get("spec", "")).partition("/")
    if backend not in {b.value for b in Backend} or not spec:
        return None
    if result.get("vs_ref", {}).get("ok") is False or result.get("mismatch"):
        return None
    return backend, f"{spec}/{result.get('uri', '?')}"


def comparisons(section: str, rows: list) -> list[dict]:
    out = []
    for row in rows:
        timed: dict[str, tuple[float, str]] = {}
        phases = set()
        for result in row.get("results", {}).values():
            found = backend_result(result)
            if found is None:
                continue
            if found[0] in timed:  # one backend twice in a case: ambiguous, leave it out
                timed = {}
                break
            timed[found[0]] = (float(result["ms"]), found[1])
            phases.add(result.get("phase", PHASES.get(section)))
        if len(timed) < 2 or len(phases) != 1 or None in phases:
            continue
        extra = " ".join(f"{k}={row[k]}" for k in CASE_KEYS if k in row)
        out.append(
            {
                "phase": phases.pop(),
                "case": f"{section} {row.get('case', '?')} {extra}".strip(),
                "ms": {b: round(ms, 5) for b, (ms, _) in sorted(timed.items())},
                "variants": {b: v for b, (_, v) in sorted(timed.items())},
            }
        )
    return out


def distill(bench_file: Path) -> dict:
    data = json.loads(bench_file.read_text())
    arch = arch_for_device(*data["capability"])
    if arch is None:
        raise SystemExit(f"{bench_file}: capability {data['capability']} is no attngen arch")
    found = []
    for section, rows in sorted(data.items()):
        if isinstance(rows, list) and rows and isinstance(rows[0], dict) and "results" in rows[0]:
            found += comparisons(section, rows)
    try:
        source = bench_file.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        source = bench_file.name
    return {
        "arch": arch.value,
        "device": data["gpu"],
        "commit": data["commit"],
        "date": data["date"],
        "source": source,
        "comparisons": found,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_json", type=Path)
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root to write into")
    opts = parser.parse_args()
    record = distill(opts.bench_json)
    rel = speed_path(record["arch"])
    parse_record(rel, record)  # what attngen.speed will read back
    out = opts.root / rel
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"{rel}: {len(record['comparisons'])} comparisons from {record['source']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
