#!/usr/bin/env python3
"""First-call times of the generated CuTe DSL GDN prefill (``gdn_gva1_extend`` on sm90): a
process's first ``extend`` compiles the prepare and chunk kernels, or loads them from the
on-disk compile cache (attngen.backends.cute_dsl.disk_cache). Run it twice with the same
``ATTNGEN_CUTE_DSL_CACHE_DIR`` (empty the first time): the first run is the cold figure,
the second the warm one; each prints a JSON line (first call, second call, in ms).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> int:
    import torch

    mod = importlib.import_module("generated.sm90.cute_dsl.gdn.gdn_gva1_extend.kernels")
    cfg = next(iter(mod.CONFIGS.values()))
    n, h, dim, dev = 4096, 16, 128, torch.device("cuda")
    bf16 = dict(dtype=torch.bfloat16, device=dev)
    q, k, v = (torch.randn(n, h, dim, **bf16) for _ in range(3))
    a, b = torch.randn(n, h, **bf16), torch.randn(n, h, **bf16)
    A_log = torch.rand(h, device=dev)
    dt_bias = torch.randn(h, device=dev)
    i32 = dict(dtype=torch.int32, device=dev)
    pool = torch.zeros(2, h, dim, dim, device=dev)
    out = torch.empty(n, h, dim, **bf16)
    args = dict(
        A_log=A_log, dt_bias=dt_bias, ssm_states=pool, cache_indices=torch.ones(1, **i32),
        has_initial_state=torch.zeros(1, **i32), query_start_loc=torch.tensor([0, n], **i32),
        out=out, plan=mod.chunk_plan([n], cfg.chunk_size, dev), config=cfg, scale=dim**-0.5,
    )  # fmt: skip
    times = []
    for _ in range(2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        mod.extend(q, k, v, a, b, **args)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    cache = os.environ.get("ATTNGEN_CUTE_DSL_CACHE_DIR", "default")
    print(json.dumps({"first_call_ms": times[0], "second_call_ms": times[1], "cache": cache}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
