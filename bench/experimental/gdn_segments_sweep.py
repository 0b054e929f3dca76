"""Context parallelism's segments, forced, on the generated CuTe DSL GDN module
(experimental, 2026-12-06): for each case, the module's extend with its requests split as
the estimate would at up to s segments with no charge for the combine (s = 1: the plain
launch), and (``equal``) in s segments of equal length, timed by triton's do_bench (an L2
flush a call, so the host's issue time shows where it exceeds the flush), by CUDA events
over back-to-back calls, and its host time alone; each output against s = 1's. Also what
the library's estimate picks (``segment_splits``) at its defaults.

    python bench/experimental/gdn_segments_sweep.py --out results.json
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import bench.gdn as gdn_bench  # noqa: E402
from attngen.families.gdn.cute_dsl.host import segments  # noqa: E402
from bench.gdn import DIM, bench, config_for, diff, inputs  # noqa: E402

gdn_bench.torch = torch  # (bench/gdn.py imports torch in its main)

CASES = [(1, 32768, 16), (1, 32768, 8), (1, 16384, 16), (1, 8192, 16), (2, 16384, 16)]


def timed(fn, reps: int = 20) -> tuple[float, float]:
    """(ms a call by events over ``reps`` back-to-back calls, host ms a call)"""
    fn()
    torch.cuda.synchronize()
    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    t0 = time.perf_counter()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    host = (time.perf_counter() - t0) * 1e3 / reps
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps, host


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--segments", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6, 8])
    args = ap.parse_args()
    mod = importlib.import_module("generated.sm90.cute_dsl.gdn.gdn_gva1_extend.kernels")
    base = config_for(mod, 1)
    picked = segments.segment_splits
    rows = []
    for bs, length, heads in CASES:
        x = inputs(bs * length, heads, heads)
        i32 = dict(dtype=torch.int32, device="cuda")
        qsl = torch.arange(bs + 1, **i32) * length
        slots = torch.arange(1, bs + 1, **i32)
        no_init = torch.zeros(bs, **i32)
        ref = None
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        default = picked(
            [length] * bs, chunk=64, heads=heads, blocks=2, num_sms=sms,
            max_segments=base.segments_max, overhead_chunks=base.segments_overhead_chunks,
        )  # fmt: skip
        forced = [(s, False) for s in args.segments] + [(s, True) for s in args.segments if s > 1]
        for s, equal in forced:
            cfg = dataclasses.replace(base, segments_max=max(s, 1), segments_overhead_chunks=0)

            def force(lens, s=s, equal=equal, **kw):
                if not equal:
                    return picked(lens, **kw)
                chunks = [-(-n // 64) for n in lens]
                return tuple(segments.split(c, -(-c // s), -(-c // s)) for c in chunks)

            segments.segment_splits = force
            plan = mod.chunk_plan([length] * bs, 64, torch.device("cuda"))
            pool = torch.zeros(bs + 1, heads, DIM, DIM, dtype=torch.float32, device="cuda")
            out = torch.empty(bs * length, heads, DIM, dtype=torch.bfloat16, device="cuda")

            def run():
                mod.extend(
                    x["q"], x["k"], x["v"], x["a"], x["b"], A_log=x["A_log"],
                    dt_bias=x["dt_bias"], ssm_states=pool, cache_indices=slots,
                    has_initial_state=no_init, query_start_loc=qsl, out=out, plan=plan,
                    config=cfg, scale=DIM**-0.5,
                )  # fmt: skip

            run()
            torch.cuda.synchronize()
            if ref is None:
                ref = (out.clone(), pool.clone())
            row = {
                "case": f"{bs}x{length} H{heads}", "segments": s, "equal": equal,
                "splits": [list(x) for x in force([length] * bs, chunk=64, heads=heads,
                           blocks=2, num_sms=sms, max_segments=max(s, 1), overhead_chunks=0)],
                "default_splits": [list(x) for x in default],
                "out_diff_vs_plain": diff(out, ref[0]), "state_diff_vs_plain": diff(pool, ref[1]),
                "do_bench_ms": bench(run),
            }  # fmt: skip
            row["events_ms"], row["host_ms"] = timed(run)
            segments.segment_splits = picked
            rows.append(row)
            print(json.dumps(row), flush=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
