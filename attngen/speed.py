"""Measured speed of attngen's backends, distilled from benchmark runs: which of several
backends that serve a phase on an arch is faster, on evidence.

``evidence/speed/<arch>.json`` (written by ``bench/distill_speed.py`` from a ``make bench``
result) holds comparisons: one per benchmark case, the median milliseconds of every attngen
backend that ran the case on the same inputs and passed its numerical check there::

    {"arch": "sm90", "device": "...", "commit": "...", "date": "...", "source": "bench/...",
     "comparisons": [{"phase": "extend", "case": "...",
                      "ms": {"<backend>": 0.41, ...}, "variants": {"<backend>": "spec/uri"}}]}

For two backends on an arch and phase, :meth:`SpeedEvidence.pair` is the geometric mean of
their time ratio over the cases both ran; :meth:`SpeedEvidence.fastest` names the candidate
measured faster than every other candidate (each pair measured), or None when the evidence
does not decide (then selection falls back to the backends' rank). Pure data: nothing here
names a backend or reads a device.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from attngen.spec.enums import Arch, Backend, Phase

SPEED_DIR = "evidence/speed"  # one file per arch below it


def speed_path(arch: str) -> str:
    return f"{SPEED_DIR}/{arch}.json"


@dataclass(frozen=True)
class Comparison:
    """One benchmark case timed on several backends with the same inputs."""

    phase: Phase
    case: str
    ms: Mapping[Backend, float]  # median time of each backend that ran and passed
    variants: Mapping[Backend, str]  # which generated variant ran ("spec/uri")


@dataclass(frozen=True)
class SpeedRecord:
    """One arch's distilled benchmark run."""

    path: str  # the evidence file, relative to the repository root
    arch: Arch
    device: str
    commit: str
    date: str
    source: str  # the benchmark result it was distilled from
    comparisons: tuple[Comparison, ...]


@dataclass(frozen=True)
class PairSpeed:
    """``faster`` took ``ratio`` (< 1) of ``slower``'s time, geometric mean over ``cases``."""

    faster: Backend
    slower: Backend
    ratio: float
    cases: int
    record: SpeedRecord

    def describe(self) -> str:
        return (
            f"{self.faster.value} measured faster than {self.slower.value}: "
            f"{self.ratio:.2f}x its time (geometric mean of {self.cases} "
            f"{'case' if self.cases == 1 else 'cases'}, {self.record.device}, bench of "
            f"{self.record.commit}, {self.record.path})"
        )


@dataclass(frozen=True)
class SpeedEvidence:
    """Every arch's distilled benchmark run (at most one per arch)."""

    records: Mapping[Arch, SpeedRecord]

    def pair(self, a: Backend, b: Backend, arch: Arch, phase: Phase) -> PairSpeed | None:
        """How ``a`` and ``b`` compare on ``arch``/``phase`` (None: never run side by side,
        or exactly as fast)."""
        record = self.records.get(arch)
        if record is None or a is b:
            return None
        logs = [
            math.log(c.ms[a] / c.ms[b])
            for c in record.comparisons
            if c.phase is phase and a in c.ms and b in c.ms
        ]
        if not logs:
            return None
        mean = sum(logs) / len(logs)
        if mean == 0:
            return None
        ratio = math.exp(-abs(mean))
        faster, slower = (a, b) if mean < 0 else (b, a)
        return PairSpeed(faster, slower, ratio, len(logs), record)

    def fastest(
        self, candidates: Iterable[Backend], arch: Arch, phase: Phase
    ) -> tuple[Backend, tuple[PairSpeed, ...]] | None:
        """The candidate measured faster than each other candidate, with those comparisons;
        None when some pair was not measured or no candidate beats all the others."""
        backends = list(dict.fromkeys(candidates))
        if len(backends) < 2:
            return None
        for best in backends:
            pairs = [self.pair(best, other, arch, phase) for other in backends if other is not best]
            if all(p is not None and p.faster is best for p in pairs):
                return best, tuple(p for p in pairs if p is not None)
        return None


NO_SPEED = SpeedEvidence({})


def load_speed(root: Path) -> SpeedEvidence:
    """Every ``evidence/speed/<arch>.json`` under ``root`` (none: no speed evidence)."""
    records = {}
    for path in sorted((root / SPEED_DIR).glob("*.json")):
        record = parse_record(path.relative_to(root).as_posix(), json.loads(path.read_text()))
        records[record.arch] = record
    return SpeedEvidence(records)


def parse_record(rel: str, data: Mapping) -> SpeedRecord:
    """A speed evidence file's contents; unknown backends or phases fail with the file."""
    try:
        comparisons = tuple(
            Comparison(
                phase=Phase(c["phase"]),
                case=str(c["case"]),
                ms={Backend(k): float(v) for k, v in sorted(c["ms"].items())},
                variants={Backend(k): str(v) for k, v in sorted(c.get("variants", {}).items())},
            )
            for c in data["comparisons"]
        )
        return SpeedRecord(
            rel,
            Arch(data["arch"]),
            str(data["device"]),
            str(data["commit"]),
            str(data["date"]),
            str(data["source"]),
            comparisons,
        )
    except (KeyError, ValueError, TypeError) as e:
        raise ValueError(f"{rel}: not a speed evidence file ({type(e).__name__}: {e})") from e
