"""The GPU benches on a machine without a GPU: each says why it cannot run and exits with
code 2 (``make bench`` lists it as not run), before touching a peer or writing a file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("script", ["run.py", "mla.py", "dsa.py", "gdn.py"])
def test_bench_without_cuda_is_not_run(script: str, tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the bench would run")
    out = tmp_path / "results"
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert "no CUDA device" in run.stdout, run.stdout + run.stderr
    assert not out.exists() or not any(out.iterdir()), "a bench that did not run wrote results"
