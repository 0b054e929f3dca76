"""examples/gdn_qwen3_next.py, as the README shows it, on CPU (Triton's interpreter, fp16):
a prefill of two requests and a decode step through the generated backend, the pool's
padding slot untouched and both requests' slots written."""

from __future__ import annotations

import os
import subprocess
import sys

from attngen.testing.paths import REPO_ROOT


def test_gdn_example_runs_on_cpu() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, "examples/gdn_qwen3_next.py", "--device", "cpu", "--dtype", "fp16"]
    run = subprocess.run(
        [*cmd, "--lens", "3,2", "--steps", "1"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "prefill of [3, 2] tokens: out (5, 4096)" in run.stdout, run.stdout
    assert "decode step 1: out (2, 4096), finite True" in run.stdout, run.stdout
    assert "slot 0 untouched True" in run.stdout and "written [True, True]" in run.stdout
