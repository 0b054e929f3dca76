#!/usr/bin/env python3
"""ncu target for the cache-free prefill, 16k tokens a call (the inputs of
``experimental/cute_prefill_tiles.py``): three calls of FA4's varlen forward, then three of
attngen's CuTe DSL sm90 prefill (the generated config of ``mha_gqa_prefill``, or of
``mha_gqa_noncausal`` with ``--noncausal``; ``--spec NAME`` another spec's, ``--head-dim D``
and ``--heads HQ/HKV`` another shape, hd128 32 q / 8 kv heads by default; ``--set
'{"field": value}'`` config overrides). Profile one launch of each, e.g. ``ncu --set full -k
regex:flash_fwd --launch-skip 2 --launch-count 1 python3
bench/experimental/ncu_cute_prefill.py 8192`` and the same with ``-k regex:MhaFwdSm90``,
from the repository root (FA4 on the path)."""

import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from bench.experimental import cute_prefill_tiles as tiles  # noqa: E402


def main(seq: int, causal: bool, spec: str | None, overrides: dict) -> None:
    from flash_attn.cute import flash_attn_varlen_func

    torch.manual_seed(0)
    d, hq, hkv = tiles.D, tiles.HQ, tiles.HKV
    mod, cfg = tiles.generated_config(
        spec or ("mha_gqa_prefill" if causal else "mha_gqa_noncausal")
    )
    cfg = dataclasses.replace(cfg, **overrides)
    q, k, v = (torch.randn(tiles.TOKENS, h, d, dtype=torch.bfloat16, device="cuda")
               for h in (hq, hkv, hkv))  # fmt: skip
    cu = (torch.arange(tiles.TOKENS // seq + 1, device="cuda") * seq).to(torch.int32)
    out = torch.empty_like(q)
    for _ in range(3):
        ref = flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                     max_seqlen_q=seq, max_seqlen_k=seq,
                                     softmax_scale=d**-0.5, causal=causal)[0]  # fmt: skip
    for _ in range(3):
        mod.prefill(q, k, v, cu, out, max_seq_len=seq, config=cfg, sm_scale=d**-0.5)
    torch.cuda.synchronize()
    err = float((out.float() - ref.float()).abs().max())
    print(f"seq {seq} causal {causal} d {d} heads {hq}/{hkv} tile {cfg.fwd_tile_m}x"
          f"{cfg.fwd_tile_n} pack_gqa {cfg.fwd_pack_gqa}: max |ours - FA4| {err:.2e}")  # fmt: skip


if __name__ == "__main__":
    argv = sys.argv[1:]
    tiles.take_shape(argv)
    spec, extra = tiles.take(argv, "--spec"), json.loads(tiles.take(argv, "--set") or "{}")
    main(int(argv[0]), "--noncausal" not in argv, spec, extra)
