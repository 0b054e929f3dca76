#!/usr/bin/env python3
"""ncu target for the CuTe DSL sm90 paged decode, hd128 32 q / 8 kv heads, B64 ctx4096,
page 64 (``bench/cute_mha_check.py``'s inputs): three calls on a bf16 cache, then three on
the same K/V in fp8 e4m3. Profile with e.g.
``ncu -k regex:MhaDecodeSm90 --launch-skip 2 --launch-count 1 python3 bench/experimental/ncu_cute_fp8_decode.py``
(the fp8 kernel: ``--launch-skip 5``) from the repository root. An argument N sets the fp8
kernel's K/V ring depth (``decode_num_stages``; default: the config's)."""

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import bench.cute_mha_check as c  # noqa: E402
from attngen.families.mha.cute_dsl import library  # noqa: E402
from attngen.families.mha.cute_dsl.config import MhaCuteTraits  # noqa: E402
from attngen.families.mha.runtime import MIN_SPLIT_TOKENS, decode_num_splits  # noqa: E402


def main(fp8_stages: int = 0, batch: int = 64, ctx: int = 4096, page: int = 64, d: int = 128,
         hq: int = 32, hkv: int = 8) -> None:  # fmt: skip
    dt = torch.bfloat16
    traits = MhaCuteTraits(c.CAUSAL, ("decode",))
    k_cache, v_cache, table = c.paged_cache([ctx] * batch, page, d, hkv, dt)
    q = torch.randn(batch, hq, d, dtype=dt, device="cuda")
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    k8, ks = c.to_fp8(k_cache)
    v8, vs = c.to_fp8(v_cache)
    for fp8 in (False, True):
        cfg = c.decode_config("bfloat16", d, hq // hkv, page, fp8=fp8)
        if fp8 and fp8_stages:
            cfg = dataclasses.replace(cfg, decode_num_stages=fp8_stages)
        splits = decode_num_splits(seq_lens, cap=2, min_split_tokens=MIN_SPLIT_TOKENS)
        po = torch.empty(batch, hq, cfg.max_splits, d, device="cuda")
        pl = torch.empty(batch, hq, cfg.max_splits, device="cuda")
        k, v, scales = (k8, v8, dict(k_scale=ks, v_scale=vs)) if fp8 else (k_cache, v_cache, {})
        for _ in range(3):
            library.decode(q, k, v, table, seq_lens, splits, out, po, pl, config=cfg,
                           traits=traits, sm_scale=d**-0.5, **scales)  # fmt: skip
        torch.cuda.synchronize()
        print("fp8" if fp8 else "bf16", "splits", int(splits.max()), "ok", flush=True)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))
