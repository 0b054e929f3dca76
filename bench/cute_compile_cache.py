"""First-use cost of CuTe DSL MHA kernels with a cold and a warm on-disk compile cache.

Each measurement is a fresh process that imports a generated kernels module and gets one
kernel through the launchers' compile path (``host.compile.compiled_fwd`` on the
launchers' argument types): cold = compile and store, warm = load the stored entry. On a
machine without a GPU the arguments are fake tensors (``cute_dsl.testing.fake_launch``):
everything up to the launch runs, so the host-side cost is the real one.

    .venv/bin/python bench/cute_compile_cache.py [--arch sm90] [--spec mha_gqa_prefill] [-n 3]

Prints one row per kernel: cold and warm first-use seconds, and the import time of the
process (torch, cutlass, the generated module) that both pay.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = """
import json, sys, time
t0 = time.perf_counter()
sys.path.insert(0, {repo!r})
import importlib
from attngen.families.mha.cute_dsl.host.compile import compiled_fwd
from attngen.families.mha.cute_dsl.testing import fake_cuda, fake_launch
kernels = importlib.import_module({module!r})
config = kernels.CONFIGS[{uri!r}]
t1 = time.perf_counter()
with fake_cuda():
    arch, shape, args = fake_launch(config, kernels.TRAITS, {phase!r})
    t2 = time.perf_counter()
    compiled_fwd(arch, shape, args)
    t3 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "first_use_s": t3 - t2}}))
"""


def measure(module: str, uri: str, phase: str, cache: Path) -> dict[str, float]:
    script = CHILD.format(repo=str(REPO), module=module, uri=uri, phase=phase)
    env = {**os.environ, "ATTNGEN_CUTE_DSL_CACHE_DIR": str(cache)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm90")
    parser.add_argument("--spec", default="mha_gqa_prefill")
    parser.add_argument("-n", type=int, default=3, help="kernels to measure")
    opts = parser.parse_args()
    module = f"generated.{opts.arch}.cute_dsl.mha.{opts.spec}.kernels"
    sys.path.insert(0, str(REPO))
    kernels = __import__(module, fromlist=["CONFIGS"])
    phases = [p for p in ("prefill", "extend") if p in kernels.PHASES]
    jobs = [(uri, ph) for uri in sorted(kernels.CONFIGS) for ph in phases][: opts.n]
    print(f"{'kernel':44} {'cold s':>7} {'warm s':>7} {'import s':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for uri, phase in jobs:
            cold = measure(module, uri, phase, Path(tmp))
            warm = measure(module, uri, phase, Path(tmp))
            name = f"{uri} {phase}"
            print(
                f"{name:44} {cold['first_use_s']:7.3f} {warm['first_use_s']:7.4f}"
                f" {warm['import_s']:8.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
