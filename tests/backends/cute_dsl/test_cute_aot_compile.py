"""Ahead-of-time compile of every generated CuTe DSL kernel, checked against the evidence files.

``python -m attngen.backends.cute_dsl.aot`` compiles each arch's kernels to cubins on this CPU
(CuTe DSL carries NVVM and ptxas) in a subprocess; the result must show no spills, every
instruction the kernels are designed around (wgmma and TMA on sm_90a) and equal
``evidence/compile/cute_dsl/<arch>.json`` byte for byte, so the docs' "compiles" claims and
resource numbers stay true of the tree.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attngen.backends.cute_dsl import aot
from attngen.testing.paths import REPO_ROOT as REPO

GENERATED = REPO / "generated"
EVIDENCE = REPO / "evidence" / "compile" / "cute_dsl"
REGENERATE = "run `make evidence-compile` and commit evidence/compile/"


def run_aot(arch: str, generated: Path, out: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "attngen.backends.cute_dsl.aot", "--arch", arch]
    cmd += ["--generated", str(generated), "--out", str(out)]
    env = dict(os.environ, CUTE_DSL_NO_CACHE="1")  # compile for real, not from a cache
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)


def failure_text(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout (tail)\n{proc.stdout[-3000:]}\n--- stderr (tail)\n{proc.stderr[-6000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("arch", aot.ARCH_NAMES)
def test_generated_kernels_compile_and_match_evidence(arch: str, tmp_path: Path) -> None:
    if not aot.COMPILER.discover(arch, GENERATED):
        pytest.skip(f"no generated cute_dsl kernels under generated/{arch}/ yet")
    out = tmp_path / f"{arch}.json"
    proc = run_aot(arch, GENERATED, out)
    assert proc.returncode == 0, failure_text(proc)
    result = json.loads(out.read_text())
    assert aot.COMPILER.resource_problems(result) == []
    assert all(row["instructions"] for row in result["kernels"])  # each was looked for
    assert aot.COMPILER.check_evidence(arch, GENERATED, out) == []
    evidence = EVIDENCE / f"{arch}.json"
    assert evidence.exists(), f"{evidence.relative_to(REPO)} is missing: {REGENERATE}"
    recorded, fresh = evidence.read_text(), out.read_text()
    if recorded != fresh:
        diff = difflib.unified_diff(
            recorded.splitlines(), fresh.splitlines(), "checked-in", "fresh compile", lineterm=""
        )
        pytest.fail(
            f"evidence/compile/cute_dsl/{arch}.json is stale: {REGENERATE}\n"
            + "\n".join(list(diff)[:60])
        )


def test_missing_instructions_spills_and_smem_are_problems() -> None:
    row = dict(module="m", variant="v", kernel="k", registers=168, spill_bytes=0)
    good = dict(row, shared_bytes=1024, instructions={"HGMMA": 16, "UTMALDG": 3})
    assert aot.COMPILER.resource_problems({"arch": "sm90", "kernels": [good]}) == []
    bad = [
        dict(good, instructions={"HGMMA": 0, "UTMALDG": 3}),
        dict(good, spill_bytes=8),
        dict(good, shared_bytes=300_000),
    ]
    problems = aot.COMPILER.resource_problems({"arch": "sm90", "kernels": bad})
    assert len(problems) == 3
    assert "no HGMMA" in problems[0] and "spills 8" in problems[1] and "300000 B" in problems[2]


def test_stack_frame_counts_as_spill(monkeypatch) -> None:
    """Registers spilled under setmaxnreg land in the stack frame (STL / LDL on [R1+...]),
    which cuobjdump reports as STACK with LOCAL at 0: both count, so a kernel whose
    producer spills at its register share fails the check."""
    usage = (
        " Function kernel_x:\n"
        "  REG:168 STACK:160 SHARED:1024 LOCAL:8 CONSTANT[0]:1230 TEXTURE:0 SURFACE:0\n"
    )

    def fake_run(cmd, **kwargs):
        out = usage if "--dump-resource-usage" in cmd else "STL [R1+0x54], R2"
        return subprocess.CompletedProcess(cmd, 0, stdout=out, stderr="")

    monkeypatch.setattr(aot.subprocess, "run", fake_run)
    registers, spills, sass = aot.cubin_resources(b"\x7fELF")
    assert (registers, spills) == (168, 168) and "STL" in sass
