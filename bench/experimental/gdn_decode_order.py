"""The recurrent decode's pool-slot order, measured (experimental, 2026-12-07): the generated
``gdn_qwen3_next`` decode at B64 / B256 (16 k / 32 v heads, fp32 state) in CUDA graphs, with
its requests' pool slots

- ``shuffled``: a permutation of 1..B (bench/gdn.py's headline rows),
- ``shuffled_sorted``: the same slots, programs walking them in ascending slot order (the
  kernel reads row ``query_start_loc[b]`` and slot ``cache_indices[b]``, so passing
  ``argsort(slots)`` as the rows and the sorted slots needs no kernel change),
- ``sparse`` / ``sparse_sorted``: B of 4B pool slots, at random, unsorted and sorted,
- ``identity``: 1..B in order (fla's access pattern),

and fla's decode beside them, each timed twice, alternating. Outputs and states are
checked against the shuffled run's. One line of JSON a row.

    PYTHONPATH=<fla> FLA_FLASH_QLA=0 python bench/experimental/gdn_decode_order.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import bench.gdn as gdn_bench  # noqa: E402

gdn_bench.torch = torch  # (bench/gdn.py imports torch in its main)
from bench.gdn import DIM, config_for, diff, fla_decode_call, inputs, kernels_module  # noqa: E402
from bench.graph_timing import graph_ms  # noqa: E402


def orders(bs: int, gen: torch.Generator) -> dict[str, tuple[torch.Tensor, int]]:
    """name -> (slot per request, pool rows)"""
    perm = torch.randperm(bs, generator=gen) + 1
    sparse = torch.randperm(4 * bs, generator=gen)[:bs] + 1
    return {
        "shuffled": (perm, bs + 1),
        "shuffled_sorted": (perm, bs + 1),
        "sparse": (sparse, 4 * bs + 1),
        "sparse_sorted": (sparse, 4 * bs + 1),
        "identity": (torch.arange(1, bs + 1), bs + 1),
    }


def main() -> None:
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    mod = kernels_module("gdn_qwen3_next")
    gen = torch.Generator().manual_seed(0)
    for bs in (64, 256):
        h, hv = 16, 32
        cfg = config_for(mod, hv // h)
        x = inputs(bs, h, hv)
        gates = dict(A_log=x["A_log"], dt_bias=x["dt_bias"])
        state = torch.randn(bs, hv, DIM, DIM, dtype=torch.float32, device="cuda") * 0.05
        nbytes = 2 * bs * hv * DIM * DIM * 4
        runs, ref = {}, None
        for name, (slots, rows) in orders(bs, gen).items():
            pool = torch.zeros(rows, hv, DIM, DIM, dtype=torch.float32, device="cuda")
            pool[slots] = state
            start = pool.clone()
            if name.endswith("_sorted"):
                order = torch.argsort(slots)
                qsl = torch.cat([order, torch.tensor([bs])]).to(torch.int32).cuda()
                idx = slots[order].to(torch.int32).cuda()
            else:
                qsl = torch.arange(bs + 1, dtype=torch.int32, device="cuda")
                idx = slots.to(torch.int32).cuda()
            out = torch.empty(bs, hv, DIM, dtype=torch.bfloat16, device="cuda")

            def ours(pool=pool, idx=idx, qsl=qsl, out=out):
                mod.decode(
                    x["q"], x["k"], x["v"], x["a"], x["b"], **gates, ssm_states=pool,
                    cache_indices=idx, query_start_loc=qsl, out=out, config=cfg,
                    scale=DIM**-0.5,
                )  # fmt: skip

            ours()
            check = (out.clone(), pool[slots.cuda()].clone())
            if ref is None:
                ref = check
            pool.copy_(start)
            runs[name] = (ours, diff(check[0], ref[0]), diff(check[1], ref[1]))

        theirs = fla_decode_call(fused_recurrent_gated_delta_rule, x, state)
        fla_out, _ = theirs()
        times: dict[str, list[float]] = {name: [] for name in [*runs, "fla"]}
        for _ in range(2):
            for name, (fn, _, _) in runs.items():
                times[name].append(graph_ms(fn))
            times["fla"].append(graph_ms(theirs))
        fla_us = min(times["fla"]) * 1e3
        for name, ts in times.items():
            us = min(ts) * 1e3
            row = {"case": f"B{bs} H{h}/{hv}", "order": name, "graph_us": [t * 1e3 for t in ts]}
            row.update(tb_s=nbytes / us / 1e6, speedup_vs_fla=fla_us / us)
            if name in runs:
                row.update(out_diff=runs[name][1], state_diff=runs[name][2])
            print(json.dumps(row), flush=True)
        print(json.dumps({"case": f"B{bs}", "fla_out_diff": diff(fla_out[:, 0], ref[0])}))


if __name__ == "__main__":
    main()
