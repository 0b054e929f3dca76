"""Ahead-of-time compile of every generated Triton kernel, checked against the evidence files.

Each arch's kernels are compiled to cubins (no GPU needed) by
``python -m attngen.backends.triton.aot`` in a subprocess: this process runs Triton in
interpreter mode, which cannot compile. The recorded registers / spills / shared memory must
equal ``evidence/compile/triton/<arch>.json`` byte for byte, so the docs' "compiles on sm_XX"
claims and resource numbers stay true of the tree.

Every row is checked against the tree by identity (kernel library source + variant config +
compiler version); by default the measurements are checked by compiling a deterministic
sample again (each generated module's every kernel, for one of its variants:
``aot_driver.sample_groups``) and any kernel the evidence lacks. ``ATTNGEN_AOT_FULL=1``
compiles every kernel, as ``make evidence-compile AOT_FLAGS=`` does.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from attngen.backends.triton import aot
from attngen import aot_driver
from attngen.testing.paths import REPO_ROOT as REPO

GENERATED = REPO / "generated"
EVIDENCE = REPO / "evidence" / "compile" / "triton"
REGENERATE = "run `make evidence-compile` and commit evidence/compile/"


def run_aot(
    arch: str, generated: Path, out: Path, cache: Path, *extra: str
) -> subprocess.CompletedProcess:
    """``python -m attngen.aot`` from the repo root, outside interpreter mode."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(cache)
    cmd = [sys.executable, "-m", "attngen.backends.triton.aot", "--arch", arch]
    cmd += ["--generated", str(generated)]
    cmd += ["--out", str(out), *extra]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)


def failure_text(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout (tail)\n{proc.stdout[-3000:]}\n--- stderr (tail)\n{proc.stderr[-6000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("arch", aot.ARCH_NAMES)
def test_generated_kernels_compile_and_match_evidence(arch: str, tmp_path: Path) -> None:
    if not aot.COMPILER.discover(arch, GENERATED):
        pytest.skip(f"no generated kernels under generated/{arch}/ yet")
    out = tmp_path / f"{arch}.json"
    evidence = EVIDENCE / f"{arch}.json"
    assert evidence.exists(), f"{evidence.relative_to(REPO)} is missing: {REGENERATE}"
    full = os.environ.get("ATTNGEN_AOT_FULL") == "1"
    extra = () if full else ("--reuse", str(evidence), "--sample")
    proc = run_aot(arch, GENERATED, out, tmp_path / "triton-cache", *extra)
    assert proc.returncode == 0, failure_text(proc)
    assert full or "compiling again a sample of" in proc.stdout, proc.stdout[-2000:]
    result = json.loads(out.read_text())
    spills = [r for r in result["kernels"] if r["spill_bytes"] > 0]
    assert not spills, f"kernels spill registers on {arch}: {spills}"
    # every (module, variant, kernel) of the tree is in the fresh result, with its identity
    assert aot.COMPILER.check_evidence(arch, GENERATED, out) == []
    recorded, fresh = evidence.read_text(), out.read_text()
    if recorded != fresh:
        diff = difflib.unified_diff(
            recorded.splitlines(), fresh.splitlines(), "checked-in", "fresh compile", lineterm=""
        )
        pytest.fail(
            f"evidence/compile/triton/{arch}.json is stale: {REGENERATE}\n"
            + "\n".join(list(diff)[:60])
        )


# -- the checker itself, on a throwaway tree (independent of what has been generated) ----------

TINY_KERNELS = """
import triton
import triton.language as tl

from types import SimpleNamespace

from attngen.families.mha.triton.config import CompileSpec, MhaTritonConfig

# the binding contract the checker reads (kernel identities): a library sha and traits
library = SimpleNamespace(source_sha256=lambda arch=None: "0" * 64)
LIBRARY_SHA256 = library.source_sha256()
TRAITS = "tiny"


@triton.jit
def scale(X, Y, n, factor, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n) * factor, mask=offs < n)


def _config(uri: str, block: int) -> MhaTritonConfig:
    return MhaTritonConfig(
        uri, 64, 64, 1, 1, "float16", "float16", "none", 0, 0, block, 16, 4, 2, 8, 4, 64, 64, 4, 2
    )


CONFIGS = {uri: _config(uri, block) for uri, block in (("tiny/a", 256), ("tiny/b", 256), ("tiny/c", 512))}


def compile_specs(config: MhaTritonConfig) -> list[CompileSpec]:
    signature = {"X": "*fp16", "Y": "*fp16", "n": "i32", "factor": "fp32"}
    return [
        CompileSpec("scale", scale, signature, {"BLOCK": config.decode_block_n}, num_warps=4),
        CompileSpec("scale_small", scale, signature, {"BLOCK": 128}, num_warps=1, num_stages=1),
    ]
"""


def write_tiny_tree(root: Path, arch: str) -> Path:
    """``<root>/aotgen_tiny/<arch>/triton/tiny/t1/kernels.py``: a package name no real
    module uses."""
    generated = root / "aotgen_tiny"
    module = generated / arch / "triton" / "tiny" / "t1" / "kernels.py"
    module.parent.mkdir(parents=True)
    module.write_text(textwrap.dedent(TINY_KERNELS))
    return generated


def test_parse_ptxas_log() -> None:
    log = (
        "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
        "ptxas info    : Function properties for k\n"
        "    64 bytes stack frame, 84 bytes spill stores, 68 bytes spill loads\n"
        "ptxas info    : Used 255 registers, used 1 barriers, 64 bytes cumulative stack size\n"
    )
    assert aot.parse_ptxas_log(log) == (255, 216)  # spill stores + loads + stack frame
    # a stack frame without spills (local arrays) is local memory in the loop all the same
    framed = log.replace(
        "84 bytes spill stores, 68 bytes spill loads", "0 bytes spill stores, 0 bytes spill loads"
    )
    assert aot.parse_ptxas_log(framed) == (255, 64)
    with pytest.raises(aot.AotError):
        aot.parse_ptxas_log("ptxas info    : 0 bytes gmem\n")


def test_both_specializations_recorded_the_worse(monkeypatch) -> None:
    """Pointers are aligned in both compiles, integers multiples of 16 in the second only
    (floats never); each measure of the row is the worse of the two."""
    from types import SimpleNamespace

    kernel = SimpleNamespace(arg_names=["X", "n", "m", "factor", "BLOCK"], __name__="kernel")
    sig = {"X": "*fp16", "n": "i32", "m": "i64", "factor": "fp32"}
    spec = SimpleNamespace(name="k", fn=kernel, signature=sig, constexprs={"BLOCK": 16})
    aligned = [["tt.divisibility", 16]]
    assert aot.divisibility(spec, "generic") == {(0,): aligned}
    assert aot.divisibility(spec, "ints16") == {(0,): aligned, (1,): aligned, (2,): aligned}
    measured = {"generic": (80, 0, 512), "ints16": (72, 16, 256)}
    monkeypatch.setattr(aot, "compile_once", lambda spec, cap, s: aot.Resources(*measured[s]))
    assert aot.compile_spec(spec, 90) == aot.Resources(80, 16, 512)


@pytest.mark.slow
def test_checker_on_a_tiny_tree(tmp_path: Path) -> None:
    generated = write_tiny_tree(tmp_path, "sm90")
    out = tmp_path / "sm90.json"
    proc = run_aot("sm90", generated, out, tmp_path / "triton-cache")
    assert proc.returncode == 0, failure_text(proc)
    # 6 rows (3 variants x 2 kernels) from 3 compiles: tiny/a and tiny/b share theirs
    assert proc.stdout.count("\n") == 3 and "[3/3] sm90 tiny t1" in proc.stdout, proc.stdout
    text = out.read_text()
    result = json.loads(text)
    assert text == aot_driver.dumps(result) and text.endswith("}\n") and str(tmp_path) not in text
    assert [(r["variant"], r["kernel"]) for r in result["kernels"]] == [
        (v, k) for v in ("tiny/a", "tiny/b", "tiny/c") for k in ("scale", "scale_small")
    ]
    assert all(r["registers"] > 0 and r["spill_bytes"] == 0 for r in result["kernels"])
    assert aot.COMPILER.check_evidence("sm90", generated, out) == []

    # --reuse: rows of the same identity and compiler are kept, the rest compile
    earlier = dict(result, kernels=[dict(r) for r in result["kernels"] if r["variant"] != "tiny/c"])
    earlier["kernels"][0]["registers"] = 7  # a kept row keeps its (here doctored) measurement
    reuse = tmp_path / "earlier.json"
    reuse.write_text(aot_driver.dumps(earlier))
    again = tmp_path / "again.json"
    proc = run_aot("sm90", generated, again, tmp_path / "triton-cache", "--reuse", str(reuse))
    assert proc.returncode == 0, failure_text(proc)
    # a/b share "scale" (kept); "scale_small" is shared with c, which must compile: both run
    assert "1 compile(s) reused" in proc.stdout and "[2/2] sm90 tiny t1" in proc.stdout
    rows = json.loads(again.read_text())["kernels"]
    assert rows[0]["registers"] == 7 and rows[1:] == result["kernels"][1:]
    reuse.write_text(
        aot_driver.dumps(dict(earlier, compiler="triton 0.0"))
    )  # another compiler: none
    proc = run_aot("sm90", generated, again, tmp_path / "triton-cache", "--reuse", str(reuse))
    assert proc.returncode == 0 and "[3/3]" in proc.stdout and "reused" not in proc.stdout
    assert again.read_text() == text

    # --sample: the first compile of each module and kernel name runs again (its doctored
    # row is measured afresh); tiny/c's "scale" is reused, doctored row and all
    doctored = dict(result, kernels=[dict(r) for r in result["kernels"]])
    doctored["kernels"][0]["registers"] = doctored["kernels"][4]["registers"] = 7
    reuse.write_text(aot_driver.dumps(doctored))
    args = ("--reuse", str(reuse), "--sample")
    proc = run_aot("sm90", generated, again, tmp_path / "triton-cache", *args)
    assert proc.returncode == 0, failure_text(proc)
    assert "compiling again a sample of 2 of 3" in proc.stdout and "[2/2]" in proc.stdout
    rows = json.loads(again.read_text())["kernels"]
    fresh = result["kernels"]
    assert rows[4]["registers"] == 7 and rows[:4] + rows[5:] == fresh[:4] + fresh[5:]

    stale = dict(result, kernels=[dict(r) for r in result["kernels"][1:]])
    stale["kernels"][0]["identity"] = "0" * 64
    stale["kernels"][1]["spill_bytes"] = 8
    stale["kernels"].append(
        dict(stale["kernels"][2], module="aotgen_tiny/sm90/triton/gone/x/kernels.py")
    )
    out.write_text(aot_driver.dumps(stale))
    problems = aot.COMPILER.check_evidence("sm90", generated, out)
    assert len(problems) == 4, problems
    assert problems[0].startswith("missing from evidence") and "stale" in problems[1]
    assert "not in the tree" in problems[2] and "spills 8 bytes" in problems[3]
