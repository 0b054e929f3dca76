"""GPU-suite setup: the ``evidence`` fixture that records which checks passed.

A test calls ``evidence.record(kernels_module, variant_uri, check)`` only after its
assertions passed. At the end of the session, when ``ATTNGEN_EVIDENCE_OUT`` is set, the
records are written there as JSON (what the support matrix reads to mark a cell verified):

    {"arch", "device", "commit", "date", "torch", "triton",
     "results": [{"identity", "runtime", "module", "variant", "check", "passed": true,
                  "detail"}, ...]}

``identity`` is the variant's kernel identity (attngen.evidence.kernel_identity: library
sources, module traits, config) and ``runtime`` the package's runtime identity (the host
code the check ran: attngen.evidence.runtime_identity), so evidence goes stale when either
changes and survives a move; ``module`` says which generated file the check ran through.
Results are sorted and de-duplicated; ``python tests/gpu_evidence.py merge`` folds a run
into the recorded file. Under pytest-xdist each worker ships its records to the controller,
which writes the one file. Nothing is written when no check passed. With
``ATTNGEN_EVIDENCE_SPOOL=<dir>`` every record is also appended to ``<dir>/<pid>.jsonl`` as it
passes and merged into the file at the end, so a run cut short keeps what passed (after a
run that was killed outright, ``python tests/gpu_evidence.py`` with the same variables
writes the file from the spool).
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

import pytest

from attngen.evidence import (
    GPU_CHECKS,
    bound_library_sha256,
    module_identity,
    package_runtime_identity,
)
from attngen.testing.paths import REPO_ROOT

CHECKS = GPU_CHECKS
WORKER_KEY = "attngen_evidence"


@dataclass(frozen=True, order=True)
class Result:
    identity: str  # the variant's kernel identity
    runtime: str  # the package's runtime identity (host code the check ran)
    module: str  # kernels.py, relative to the repository root
    variant: str
    check: str
    passed: bool = True
    detail: str = ""  # a measured figure worth keeping (e.g. fp8's error vs bf16)


class Evidence:
    """The passed checks of this process."""

    def __init__(self) -> None:
        self.results: set[Result] = set()

    def record(
        self, kernels_module: ModuleType, variant_uri: str, check: str, **detail: object
    ) -> None:
        if check not in CHECKS:
            raise ValueError(f"check: expected one of {CHECKS}, got {check!r}")
        if variant_uri not in kernels_module.CONFIGS:
            raise ValueError(f"variant {variant_uri!r} is not in {kernels_module.__name__}")
        if kernels_module.LIBRARY_SHA256 != bound_library_sha256(kernels_module):
            raise ValueError(
                f"{kernels_module.__name__} was generated against another kernel library: "
                "run make generate before recording evidence"
            )
        identity = module_identity(kernels_module, variant_uri)
        note = " ".join(f"{k}={v}" for k, v in sorted(detail.items()))
        path = Path(kernels_module.__file__).resolve()
        runtime = package_runtime_identity(REPO_ROOT, path.parent)
        module = path.relative_to(REPO_ROOT).as_posix()
        result = Result(identity, runtime, module, variant_uri, check, True, note)
        self.results.add(result)
        spool = os.environ.get("ATTNGEN_EVIDENCE_SPOOL")
        if spool:  # kept as it passes: a run cut short (timeout, a crash) loses nothing
            Path(spool).mkdir(parents=True, exist_ok=True)
            with open(Path(spool) / f"{os.getpid()}.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(asdict(result)) + "\n")

    def to_json(self) -> list[dict]:
        return [asdict(r) for r in sorted(self.results)]

    def merge_json(self, records: list[dict]) -> None:
        self.results.update(Result(**r) for r in records)


EVIDENCE = Evidence()


@pytest.fixture(scope="session")
def evidence() -> Evidence:
    return EVIDENCE


def _document() -> dict:
    import torch
    import triton

    major, minor = torch.cuda.get_device_capability()
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    document = {
        "arch": f"sm{major}{minor}",
        "device": torch.cuda.get_device_name(),
        "commit": os.environ.get("ATTNGEN_COMMIT", "unknown"),
        "date": os.environ.get("ATTNGEN_DATE", today),
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    return document | {"results": EVIDENCE.to_json()}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:  # xdist controller: a worker finished
    records = getattr(node, "workeroutput", {}).get(WORKER_KEY)
    if records:
        EVIDENCE.merge_json(json.loads(records))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):  # xdist worker: hand records to the controller
        session.config.workeroutput[WORKER_KEY] = json.dumps(EVIDENCE.to_json())
        return
    write_document()


def read_spool(spool: str | None) -> None:
    """Merge the records spooled by every process of the run (``ATTNGEN_EVIDENCE_SPOOL``)."""
    for path in sorted(Path(spool).glob("*.jsonl")) if spool else ():
        lines = path.read_text(encoding="utf-8").splitlines()
        EVIDENCE.merge_json([json.loads(line) for line in lines if line.strip()])


def write_document() -> None:
    read_spool(os.environ.get("ATTNGEN_EVIDENCE_SPOOL"))
    out = os.environ.get("ATTNGEN_EVIDENCE_OUT")
    if not out or not EVIDENCE.results:
        return
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_document(), indent=2) + "\n", encoding="utf-8")


def merge_files(target: Path, runs: list[Path]) -> str:
    """Fold GPU-run files (``ATTNGEN_EVIDENCE_OUT`` of partial runs: one family, one ``-k``)
    into the recorded ``target``: a run's records replace the target's records of the same
    (module, variant, check), the rest stay (each counts only while its identities hold);
    the header becomes the last run's and the replaced headers go to ``earlier_runs``."""
    old = json.loads(target.read_text(encoding="utf-8"))
    news = [json.loads(p.read_text(encoding="utf-8")) for p in runs]
    for path, new in zip(runs, news):
        if new["arch"] != old["arch"]:
            raise ValueError(f"{path}: arch {new['arch']!r} is not {target}'s {old['arch']!r}")
    fresh = [Result(**r) for new in news for r in new["results"]]
    rerun = {(r.module, r.variant, r.check) for r in fresh}
    kept = {
        Result(**r) for r in old["results"] if (r["module"], r["variant"], r["check"]) not in rerun
    }
    header_keys = [k for k in old if k not in ("earlier_runs", "results")]
    header = {k: news[-1].get(k, old.get(k)) for k in header_keys}
    earlier = list(old.get("earlier_runs", [])) + [{k: old[k] for k in header_keys}]
    earlier += [{k: new.get(k) for k in header_keys} for new in news[:-1]]
    runs_before: list[dict] = []
    for run in earlier:
        if run != header and run not in runs_before:
            runs_before.append(run)
    merged = sorted(kept | set(fresh))
    document = header | {"earlier_runs": runs_before, "results": [asdict(r) for r in merged]}
    target.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    failed = sum(not r.passed for r in fresh)
    return f"{target}: kept {len(kept)}, {len(fresh)} from the runs, {len(merged)}; {failed} failed"


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["merge"] and len(sys.argv) > 3:
        # python tests/gpu_evidence.py merge evidence/gpu/sm90.json RUN.json [RUN.json ...]
        print(merge_files(Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]]))
    elif len(sys.argv) == 1:  # after a run that was killed: write its spooled records
        write_document()
    else:
        sys.exit("usage: gpu_evidence.py [merge TARGET RUN.json [RUN.json ...]]")
