"""bench/experimental kernels stay compilable: each compiles for sm_90a on CPU without a
register spill (they are timed on the GPU by the bench, not lowered)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from attngen.testing.paths import REPO_ROOT


def _compile_script(script: str, tmp_path) -> str:
    """Run a bench/experimental script's CPU compile check; its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    proc = subprocess.run(
        [sys.executable, script],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


@pytest.mark.slow
def test_mla_prefill_tma_compiles_with_tma_copies_and_without_spills(tmp_path):
    out = _compile_script("bench/experimental/mla_prefill_tma.py", tmp_path)
    lines = [line for line in out.splitlines() if line.startswith("{'variant'")]
    assert len(lines) == 4, out
    assert all("'spills': 0," in line and "'tma': True" in line for line in lines), out
