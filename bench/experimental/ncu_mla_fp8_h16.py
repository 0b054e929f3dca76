#!/usr/bin/env python3
"""ncu target for the MLA h_q 16 fp8 decode study (bench/results/ncu-mla-fp8-h16-20261202.txt):
B128 x 8k, page 64, three calls each of the bf16 library kernel, the fp8 library kernel and
bench/experimental/mla_keys_fp8_regs.py, on bench/mla.py's inputs. Profile with e.g.
``ncu -k regex:absorbed_keys_fp8 --launch-skip 2 --launch-count 1 python3 bench/experimental/ncu_mla_fp8_h16.py`` from the repository root."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import attngen.families.mla.triton.host.launch as launch  # noqa: E402
import bench.mla as m  # noqa: E402
from bench.experimental.mla_keys_fp8_regs import mla_keys_fp8_regs_kernel  # noqa: E402


def main() -> None:
    mods = m.modules()
    library = launch.absorbed_keys_fp8_kernel
    for kv, kernel in (("bf16", None), ("fp8", None), ("fp8", mla_keys_fp8_regs_kernel)):
        case = m.Case(torch, 16, 128, 8192, kv)
        mod, cfg = mods[kv], m.base_config(mods, 16, kv)
        splits, count = m.split_tensor(torch, cfg, case, "auto")
        launch.absorbed_keys_fp8_kernel = kernel or library
        fn, out = m.attngen_call(mod, cfg, case, splits)
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        print(kv, "registers" if kernel else "library", "ok", flush=True)
        launch.absorbed_keys_fp8_kernel = library
        del case


if __name__ == "__main__":
    main()
