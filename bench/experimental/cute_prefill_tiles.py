#!/usr/bin/env python3
"""Tile sweep of the CuTe DSL sm90 cache-free prefill (hd128, 32 q / 8 kv heads, 16k tokens
a call) against FA4's varlen forward on the same inputs: keys per tile (``fwd_tile_n``) and
K/V ring depth (``fwd_num_stages``) on the generated configs of ``mha_gqa_prefill`` (causal)
and ``mha_gqa_noncausal``. Each output starts as NaN and must match FA4's within
4e-3 + 2e-2 max|FA4|. ``python3 bench/experimental/cute_prefill_tiles.py OUT.jsonl`` from
the repository root (FA4 on the path). ``OUT.jsonl '{"name": {config overrides}, ...}'``
sweeps those configs instead (e.g. the sm90 schedule keys ``fwd_wg_pingpong``), and
``--head-dim 64`` another head dim (the generated config of that head dim)."""

import dataclasses
import importlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from triton.testing import do_bench  # noqa: E402

TILES = ((128, 2), (176, 2), (192, 2), (160, 2), (128, 3), (112, 2))
SEQLENS = (1024, 4096, 8192, 16384)
TOKENS, HQ, HKV = 16384, 32, 8
D = 128  # --head-dim


def generated_config(name: str):
    mod = importlib.import_module(f"generated.sm90.cute_dsl.mha.{name}.kernels")
    cfgs = [c for c in mod.CONFIGS.values() if (c.head_dim, c.gqa_group) == (D, HQ // HKV)]
    if not cfgs:  # another head dim: the spec's config with it swapped in (same tiles)
        cfgs = [dataclasses.replace(c, head_dim=D, v_head_dim=D) for c in mod.CONFIGS.values()
                if c.gqa_group == HQ // HKV]  # fmt: skip
    return mod, max(cfgs, key=lambda c: c.page_size)


def main(out_path: str, variants: dict[str, dict[str, int]] | None = None) -> None:
    from flash_attn.cute import flash_attn_varlen_func

    torch.manual_seed(0)
    rows = []
    for causal, name in ((True, "mha_gqa_prefill"), (False, "mha_gqa_noncausal")):
        mod, base = generated_config(name)
        for seq in SEQLENS:
            batch = TOKENS // seq
            q = torch.randn(TOKENS, HQ, D, dtype=torch.bfloat16, device="cuda")
            k = torch.randn(TOKENS, HKV, D, dtype=torch.bfloat16, device="cuda")
            v = torch.randn(TOKENS, HKV, D, dtype=torch.bfloat16, device="cuda")
            cu = (torch.arange(batch + 1, device="cuda") * seq).to(torch.int32)
            flops = 4 * batch * HQ * seq * seq * D * (0.5 if causal else 1.0)

            def fa4():
                return flash_attn_varlen_func(
                    q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=seq,
                    max_seqlen_k=seq, softmax_scale=D**-0.5, causal=causal,
                )[0]  # fmt: skip

            ref = fa4().float()
            ms_fa4 = do_bench(fa4, warmup=25, rep=100, return_mode="median")
            tol = 4e-3 + 2e-2 * float(ref.abs().max())
            sweep = variants or {
                f"n{n}s{st}": dict(fwd_tile_n=n, fwd_num_stages=st) for n, st in TILES
            }
            for name, overrides in sweep.items():
                cfg = dataclasses.replace(base, **overrides)
                out = torch.full_like(q, float("nan"))

                def ours():
                    mod.prefill(q, k, v, cu, out, max_seq_len=seq, config=cfg,
                                sm_scale=D**-0.5)  # fmt: skip

                row = dict(causal=causal, seq=seq, head_dim=D, variant=name, **overrides,
                           fa4_tflops=round(flops / ms_fa4 / 1e9, 1))  # fmt: skip
                try:
                    ours()
                    torch.cuda.synchronize()
                    diff = float((out.float() - ref).abs().max())  # NaN stays NaN
                    row["ok"] = bool(diff <= tol)
                    row["max_abs_vs_fa4"] = diff
                    ms = do_bench(ours, warmup=25, rep=100, return_mode="median")
                    row["tflops"] = round(flops / ms / 1e9, 1)
                    row["ratio"] = round(ms_fa4 / ms, 3)
                except Exception as exc:  # noqa: BLE001
                    row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                print(json.dumps(row), flush=True)
                rows.append(row)
    Path(out_path).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--head-dim" in args:
        i = args.index("--head-dim")
        D = int(args[i + 1])
        del args[i : i + 2]
    main(args[0], json.loads(args[1]) if len(args) > 1 else None)
