#!/usr/bin/env python3
"""One GDN chunked prefill case of the generated sm90 kernels, run a few times, for ncu
(no peer, no timing): ``python3 bench/experimental/gdn_ncu.py BS LENGTH HEADS ['{overrides}']``
from the repo root, e.g. under
``ncu --set full -k regex:chunk_state_t_kernel --launch-skip 1 --launch-count 1 ...``.
Inputs and config as ``bench/gdn.py``'s prefill rows (GVA 1, ``gdn_gva1``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import gdn  # noqa: E402


def main(argv: list[str]) -> None:
    import torch

    bs, length, heads = (int(a) for a in argv[:3])
    overrides = json.loads(argv[3]) if len(argv) > 3 else None
    gdn.torch = torch
    mod = gdn.kernels_module("gdn_gva1")
    ours, _ = gdn.prefill_runner(mod, bs, length, heads, overrides)
    for _ in range(3):
        ours()
    torch.cuda.synchronize()
    print(f"gdn_ncu: {bs}x{length} H{heads} {overrides or {}}: 3 runs")


if __name__ == "__main__":
    main(sys.argv[1:])
