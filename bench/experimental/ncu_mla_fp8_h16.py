#!/usr/bin/env python3
"""ncu target for the MLA h_q 16 decode: B128 x 8k, page 64, three calls each of the bf16 and
fp8 library kernels on bench/mla.py's inputs. Profile with e.g.
``ncu -k regex:absorbed_keys --launch-skip 2 --launch-count 1 python3 bench/experimental/ncu_mla_fp8_h16.py``
from the repository root."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import bench.mla as m  # noqa: E402


def main() -> None:
    mods = m.modules()
    for kv in ("bf16", "fp8"):
        case = m.Case(torch, 16, 128, 8192, kv)
        mod, cfg = mods[kv], m.base_config(mods, 16, kv)
        splits, _ = m.split_tensor(torch, cfg, case, "auto")
        fn, _ = m.attngen_call(mod, cfg, case, splits)
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        print(kv, "ok", flush=True)
        del case


if __name__ == "__main__":
    main()
