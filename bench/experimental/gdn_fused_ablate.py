#!/usr/bin/env python3
"""Where the fused GDN kernel's time goes: ``gdn_fused_sm90.py`` timed alone (after one
launch of what its form reads: prepare, gdn_prep_sm90 or the gates) with parts of its chunk
step left out (``GdnFusedSm90.PARTS``: the results are then wrong, only the times mean
something), at bench/gdn.py's prefill cases.

``python3 bench/experimental/gdn_fused_ablate.py [--variant FORM] [--skip ...] [--out DIR]
[--ncu [--ncu-case BxLxH]]`` on the GPU (CuTe DSL wheels installed); ``--ncu``: one launch of
the whole kernel (default 8x4k H32) and nothing else after its inputs', for ``ncu -k
regex:GdnFused``. Writes ``gdn_fused_ablate.json`` under ``--out``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.experimental import gdn_fused_check as chk  # noqa: E402
from bench.experimental import gdn_fused_sm90 as fused  # noqa: E402

ALL = fused.GdnFusedSm90.PARTS
VARIANTS = (
    (),
    *((p,) for p in ALL),
    ("p", "split"),
    tuple(p for p in ALL if p != "state"),  # the state products' chain alone
    ALL,  # the loop's skeleton: barriers, exps of the gate loads' absence, pool I/O
)


def setup(bs: int, length: int, heads: int, variant: str = "c1"):
    """The fused kernel's arguments on bench/gdn.py's inputs, after one launch of what the
    form reads (prepare, gdn_prep_sm90 or the gates)."""
    batch = chk.uniform_batch(bs, length, heads)
    prepared = chk.prepared_for(
        variant, batch["x"], batch["plan"], batch["qsl"], batch["cfg"], fused.KD**-0.5
    )
    return chk.fused_args(
        batch["x"], prepared, batch["pool"], batch["slots"], batch["no_init"], batch["qsl"],
        batch["out"],
    )  # fmt: skip


def main() -> int:
    import triton

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--ncu", action="store_true")
    parser.add_argument(
        "--ncu-case", default="8x4096x32", help="the --ncu launch's batch x length x heads"
    )
    parser.add_argument("--variant", default="c1", choices=tuple(chk.VARIANTS))
    parser.add_argument(
        "--skip", nargs="+", default=None,
        help="the sets of parts to leave out, comma-separated ('-': none); default: VARIANTS",
    )  # fmt: skip
    args = parser.parse_args()
    skips = VARIANTS
    if args.skip is not None:
        skips = [tuple(p for p in sk.split(",") if p not in ("", "-")) for sk in args.skip]
        assert all(set(sk) <= set(ALL) for sk in skips), skips
    if args.ncu:
        bs, length, heads = (int(x) for x in args.ncu_case.split("x"))
        cargs = setup(bs, length, heads, args.variant)
        kernel = chk.compiled(1, cargs, (), args.variant)
        kernel(*cargs)
        torch.cuda.synchronize()
        return 0
    rows = []
    for bs, length, heads in chk.BENCH:
        cargs = setup(bs, length, heads, args.variant)
        chunks = length // fused.C
        for skip in skips:
            kernel = chk.compiled(1, cargs, skip, args.variant)
            ms = triton.testing.do_bench(lambda: kernel(*cargs), warmup=10, rep=60)
            row = {
                "case": f"{bs}x{length} H{heads}", "variant": args.variant, "skip": list(skip),
                "ms": ms,
                "us_per_chunk": 1e3 * ms / chunks,
            }  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        report = {"device": torch.cuda.get_device_name(), "rows": rows}
        (out / "gdn_fused_ablate.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
