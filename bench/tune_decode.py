#!/usr/bin/env python3
"""Decode tile sweep for quantized caches (a tuning aid, not a benchmark of record):
times attngen decode at B64 ctx4096, page 64, d128, GQA 4 for bf16 / fp8 e4m3 / NVFP4
caches over decode_block_n x num_stages, and prints ms per setting."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import run as bench  # noqa: E402

bench.torch = torch
B, CTX, PS = 64, 4096, 64
SPECS = {"bfloat16": "mha_gqa_paged", "float8_e4m3fn": "mha_fp8_kv", "nvfp4": "mha_nvfp4_kv"}


def main() -> None:
    kv = (bench.rand(B * CTX, bench.HKV, bench.D), bench.rand(B * CTX, bench.HKV, bench.D))
    q = bench.rand(B, bench.HQ, bench.D)
    table = bench.shuffled_page_table(B, CTX // PS, B * CTX // PS, seed=1)
    seq_lens = torch.full((B,), CTX, dtype=torch.int32, device="cuda")
    for kv_name, spec in SPECS.items():
        mod = importlib.import_module(f"generated.sm90.triton.mha.{spec}.kernels")
        [base] = [
            c
            for c in mod.CONFIGS.values()
            if (c.head_dim, c.gqa_group, c.page_size, c.kv_dtype, c.dtype)
            == (128, 4, PS, kv_name, "bfloat16")
        ]
        if kv_name == "bfloat16":
            k, v = (x.view(-1, PS, bench.HKV, bench.D) for x in kv)
            scales = {}
        else:
            k, v, scales, _ = bench.quantized_cache(kv_name, *kv)
        splits, _ = bench.decode_splits(mod, base, seq_lens, 132)
        for block_n in (32, 64, 128):
            for stages in (2, 3, 4):
                cfg = dataclasses.replace(base, decode_block_n=block_n, decode_num_stages=stages)
                out = torch.empty_like(q)
                po = torch.empty(B, bench.HQ, cfg.max_splits, bench.D, device="cuda")
                pl = torch.empty(B, bench.HQ, cfg.max_splits, device="cuda")
                fn = lambda: mod.decode(
                    q,
                    k,
                    v,
                    table,
                    seq_lens,
                    splits,
                    out,
                    po,
                    pl,  # noqa
                    config=cfg,
                    sm_scale=0.088,
                    **scales,
                )
                try:
                    ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
                    print(
                        f"{kv_name:14} block_n {block_n:3} stages {stages}: {ms:.3f} ms", flush=True
                    )
                except Exception as e:  # noqa: BLE001
                    print(f"{kv_name:14} block_n {block_n:3} stages {stages}: {type(e).__name__}")


if __name__ == "__main__":
    main()
