"""`python tests/gpu_evidence.py merge TARGET RUN...`: partial GPU runs folded into the
recorded file. A run's records replace the target's of the same (module, variant, check);
the others stay; the header is the newest run's and the older headers are kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_evidence import merge_files

HEAD = {"arch": "sm90", "device": "NVIDIA H200", "torch": "2.11", "triton": "3.6.0"}


def record(module: str, variant: str, check: str, identity: str, detail: str = "") -> dict:
    return dict(identity=identity, runtime="r", module=module, variant=variant, check=check,
                passed=True, detail=detail)  # fmt: skip


def write(path: Path, commit: str, results: list[dict], **head: str) -> Path:
    path.write_text(json.dumps(HEAD | head | {"commit": commit, "date": "d", "results": results}))
    return path


def test_a_run_replaces_its_checks_and_keeps_the_rest(tmp_path: Path) -> None:
    target = write(tmp_path / "sm90.json", "old", [
        record("m/a.py", "v1", "decode", "i-old"),
        record("m/a.py", "v1", "extend", "i-old"),
        record("m/b.py", "v2", "decode", "i-b"),
    ])  # fmt: skip
    run_a = write(tmp_path / "a.json", "new1", [record("m/a.py", "v1", "decode", "i-new")])
    run_b = write(tmp_path / "b.json", "new2", [record("m/c.py", "v3", "verify", "i-c")],
                  device="NVIDIA H100 80GB HBM3")  # fmt: skip
    message = merge_files(target, [run_a, run_b])
    assert "kept 2, 2 from the runs, 4; 0 failed" in message
    merged = json.loads(target.read_text())
    rows = {(r["module"], r["variant"], r["check"]): r["identity"] for r in merged["results"]}
    assert rows == {
        ("m/a.py", "v1", "decode"): "i-new",  # replaced, not kept beside the old record
        ("m/a.py", "v1", "extend"): "i-old",
        ("m/b.py", "v2", "decode"): "i-b",
        ("m/c.py", "v3", "verify"): "i-c",
    }
    assert merged["commit"] == "new2" and merged["device"] == "NVIDIA H100 80GB HBM3"
    assert [r["commit"] for r in merged["earlier_runs"]] == ["old", "new1"]
    assert merged["results"] == sorted(merged["results"], key=lambda r: tuple(r.values()))
    assert target.read_text().endswith("}\n")


def test_a_run_of_another_arch_is_refused(tmp_path: Path) -> None:
    target = write(tmp_path / "sm90.json", "old", [record("m/a.py", "v1", "decode", "i")])
    other = write(tmp_path / "x.json", "new", [], arch="sm100")
    before = target.read_text()
    with pytest.raises(ValueError, match="arch 'sm100' is not"):
        merge_files(target, [other])
    assert target.read_text() == before
