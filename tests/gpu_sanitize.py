"""Run a small GPU suite under compute-sanitizer and record the result in evidence/.

    python3 tests/gpu_sanitize.py --out evidence/gpu/sanitizer-sm90.json --commit SHA

memcheck (out-of-bounds and misaligned accesses, leaks of device allocations' bounds) runs
the selection ``MEMCHECK``: decode, extend, verify (chains and trees), prefill, draft extend
and the CUDA-graph replays of a few specs, fp8 and NVFP4 caches included; racecheck (shared
memory hazards) runs one decode and one extend. Each run's command, error count and exit
code go to the JSON; the exit code is non-zero if any run found an error or failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path

SUITE = "tests/families/mha/gpu/test_mha_backend_gpu.py"
MEMCHECK = (
    "(mha_gqa_paged-d128_g4_ps16_bf16_causal) or (mha_spec_tree-d64_g8_ps1_bf16_custom_topk4) "
    "or (mha_spec_chain-d128_g4_ps64_bf16_causal_topk1) "
    "or (mha_fp8_kv-d128_g4_ps1_bf16_kvfp8_e4m3_causal) "
    "or (mha_nvfp4_kv-d128_g8_ps16_bf16_kvnvfp4_causal) or (mha_bidirectional-d128_g1_ps16_bf16_none)"
)
RACECHECK = "mha_gqa_paged-d128_g4_ps16_bf16_causal and (test_decode or test_extend)"
# memcheck ends with "ERROR SUMMARY: N errors", racecheck with
# "RACECHECK SUMMARY: H hazards displayed (N errors, W warnings)"
ERRORS = re.compile(
    r"ERROR SUMMARY: (\d+) error|RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) error"
)


def run(tool: str, selection: str, log_dir: Path) -> dict:
    command = [
        "compute-sanitizer",
        f"--tool={tool}",
        "--error-exitcode=3",
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        SUITE,
        "-k",
        selection,
    ]
    env = {**os.environ, "ATTNGEN_GPU": "1", "PYTHONUNBUFFERED": "1"}
    print(f"== {tool}: {selection}", flush=True)
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    log = done.stdout + done.stderr
    (log_dir / f"sanitizer-{tool}.log").write_text(log)
    shown = command[:3] + ["python3"] + command[4:-1] + [repr(selection)]
    result = summarize(tool, " ".join(shown), done.returncode, log)
    print(json.dumps(result), flush=True)
    return result


def summarize(tool: str, command: str, exit_code: int, log: str) -> dict:
    """One run's record: its error count from the sanitizer's summary line."""
    counts = [int(a or b) for a, b in ERRORS.findall(log)]
    passed = re.search(r"(\d+) passed", log)
    return {
        "tool": tool,
        "command": command,
        "exit_code": exit_code,
        "errors": sum(counts),
        "sanitizer_summaries": len(counts),
        "tests_passed": int(passed.group(1)) if passed else 0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--commit", required=True)
    parser.add_argument("--log-dir", type=Path, default=Path("."))
    args = parser.parse_args()
    import torch

    runs = [run("memcheck", MEMCHECK, args.log_dir), run("racecheck", RACECHECK, args.log_dir)]
    record = {
        "commit": args.commit,
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(),
        "suite": SUITE,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    ok = all(
        r["exit_code"] == 0
        and r["errors"] == 0
        and r["sanitizer_summaries"] == 1
        and r["tests_passed"] > 0
        for r in runs
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
