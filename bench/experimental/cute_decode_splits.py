"""Split-count sweep of the CuTe DSL sm90 decode, bf16 and fp8 e4m3 caches side by side.

The runtime picks a request's KV split count from the grid (``decode_split_cap``) and the
context (``MIN_SPLIT_TOKENS`` a split). Until 2026-12-06 the grid's rule was TARGET_WAVES
(about 4 waves of CTAs, either cache: ``runtime_splits``); since, the CuTe decode's counts
fill whole waves of the CTAs an SM holds (``rule_splits``, per cache). This times both
kernels in CUDA graphs at every split count of a list, on ``cute_mha_check.DECODE_BENCH``'s
shapes (or ``--case``'s), so the fp8 / bf16 sequences-per-second ratio can be read at
either rule's counts and at each cache's own best count.

``python3 bench/experimental/cute_decode_splits.py [--out DIR] [--splits 1,2,...]`` on the
GPU with nvidia-cutlass-dsl (the .gpuA/.gpuB/.gpuC wheels). Writes
``cute_decode_splits.json`` (rows rewritten after every case) and prints one line a case.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from attngen.families.mha.cute_dsl import library  # noqa: E402
from attngen.families.mha.runtime import (  # noqa: E402
    MIN_SPLIT_TOKENS,
    decode_num_splits,
    decode_split_cap,
)
from bench.cute_mha_check import (  # noqa: E402
    CAUSAL,
    DECODE_BENCH,
    decode_config,
    paged_cache,
    to_fp8,
)
from bench.graph_timing import graph_ms  # noqa: E402
from attngen.families.mha.cute_dsl.config import MhaCuteTraits  # noqa: E402
from attngen.families.mha.cute_dsl.host.compile import decode_shape  # noqa: E402
from attngen.families.mha.cute_dsl.kernels.decode_sm90 import resident_ctas  # noqa: E402

def sweep(batch: int, ctx: int, page: int, counts: list[int], d: int = 128, hq: int = 32,
          hkv: int = 8) -> dict:  # fmt: skip
    dt = torch.bfloat16
    cfg = decode_config("bfloat16", d, hq // hkv, page)
    cfg8 = decode_config("bfloat16", d, hq // hkv, page, fp8=True)
    traits = MhaCuteTraits(CAUSAL, ("decode",))
    k_cache, v_cache, table = paged_cache([ctx] * batch, page, d, hkv, dt)
    k8, ks = to_fp8(k_cache)
    v8, vs = to_fp8(v_cache)
    q = torch.randn(batch, hq, d, dtype=dt, device="cuda")
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    min_tokens = max(MIN_SPLIT_TOKENS, cfg.decode_block_n)

    def runtime(c, resident: int) -> int:  # the runtime's count for config c
        cap = decode_split_cap(programs_per_split=batch * hkv, num_sms=sms,
                               max_splits=c.max_splits, resident_ctas=resident)  # fmt: skip
        return int(decode_num_splits(seq_lens, cap=cap, min_split_tokens=min_tokens).max())

    old = runtime(cfg, 0)  # TARGET_WAVES (the rule of both caches until 2026-12-06)
    rule = {k: runtime(c, resident_ctas(decode_shape(c, traits))) for k, c in
            (("bf16_us", cfg), ("fp8_us", cfg8))}  # fmt: skip
    out = torch.empty_like(q)
    po = torch.empty(batch, hq, cfg.max_splits, d, device="cuda")
    pl = torch.empty(batch, hq, cfg.max_splits, device="cuda")
    scale = d**-0.5
    splits = torch.empty(batch, dtype=torch.int32, device="cuda")

    def bf16() -> None:
        library.decode(q, k_cache, v_cache, table, seq_lens, splits, out, po, pl, config=cfg,
                       traits=traits, sm_scale=scale)  # fmt: skip

    def fp8() -> None:
        library.decode(q, k8, v8, table, seq_lens, splits, out, po, pl, config=cfg8,
                       traits=traits, sm_scale=scale, k_scale=ks, v_scale=vs)  # fmt: skip

    row: dict = dict(case=f"decode hd{d} {hq}/{hkv} B{batch} ctx{ctx} page{page}",
                     sms=sms, runtime_splits=old, rule_splits=rule, bf16_us={}, fp8_us={})  # fmt: skip
    wanted = sorted({n for n in counts + [old, *rule.values()] if 1 <= n <= cfg.max_splits})
    for n in wanted:
        splits.fill_(n)
        row["bf16_us"][n] = round(graph_ms(bf16) * 1e3, 2)
        if page >= 16:  # the fp8 decode reads pages of 16+ tokens
            row["fp8_us"][n] = round(graph_ms(fp8) * 1e3, 2)
    b, f = row["bf16_us"], row["fp8_us"] or row["bf16_us"]
    best_b, best_f = min(b, key=b.get), min(f, key=f.get)
    row.update(
        best_bf16_splits=best_b,
        best_fp8_splits=best_f,
        speedup_at_runtime=round(b[old] / f[old], 3),
        speedup_at_rule=round(b[rule["bf16_us"]] / f[rule["fp8_us"]], 3),
        speedup_best_vs_best=round(b[best_b] / f[best_f], 3),
    )
    return row


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
    parser.add_argument("--splits", default="1,2,3,4,5,6,8,9,10,12,16")
    parser.add_argument(
        "--case",
        action="append",
        default=[],
        help="B,ctx,page[,head_dim[,q_heads,kv_heads]] (repeatable; default: DECODE_BENCH)",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    counts = [int(x) for x in args.splits.split(",")]
    print(torch.cuda.get_device_name(), flush=True)
    rows = []
    cases = [tuple(int(x) for x in c.split(",")) for c in args.case] or DECODE_BENCH
    for case in cases:
        rows.append(sweep(*case[:3], counts, *case[3:]))
        print(json.dumps(rows[-1]), flush=True)
        (args.out / "cute_decode_splits.json").write_text(
            json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows), indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
