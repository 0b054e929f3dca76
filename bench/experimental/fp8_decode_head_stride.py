#!/usr/bin/env python3
"""Does the fp8 decode's speedup over bf16 depend on the cache's row stride? The paged cache
is ``[pages, page_size, Hkv, D]``, so one kv head's rows in a page are D-byte (fp8) or
2D-byte (bf16) pieces strided by Hkv * D elements. Same GQA group (4), head dim 128 and
bytes per call at Hkv = 8, 2 and 1 (batch scaled up as Hkv falls); at Hkv = 1 a page's rows
of one head are contiguous. ``bench/cute_mha_check.py``'s ``bench_decode`` (bf16 and fp8
both in CUDA graphs, FA4 alongside). ``python3 bench/experimental/fp8_decode_head_stride.py
OUT.jsonl`` from the repository root (CuTe DSL and FA4 on the path)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import bench.cute_mha_check as c  # noqa: E402

CASES = [(64 * 8 // hkv, 4096, page, 4 * hkv, hkv) for page in (64, 128) for hkv in (8, 2, 1)]


def main(out_path: str) -> None:
    c.FP8_STAGES = (2,)  # the default ring only
    rows = []
    for batch, ctx, page, hq, hkv in CASES:
        row = c.bench_decode(batch, ctx, page, hq=hq, hkv=hkv, stages=(2,))
        row.update(hkv=hkv, hq=hq)
        rows.append(row)
    Path(out_path).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main(sys.argv[1])
