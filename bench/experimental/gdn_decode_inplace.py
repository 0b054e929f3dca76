"""Does writing the state in place cost the recurrent decode its last percent against fla?
(experimental, 2026-12-07). At B64 / B256 (16 k / 32 v heads, K = V = 128, fp32 state, pool
slots 1..B in order), in CUDA graphs, alternating, three rounds:

- ``ours_in_place``: the generated ``gdn_qwen3_next`` decode (reads and writes the pool rows),
- ``ours_out_of_place``: the same library kernel launched as a one-draft verify (reads the
  pool rows, writes the new states to a separate contiguous buffer; no other change),
- ``fla``: fla 0.6.0's ``fused_recurrent_gated_delta_rule`` as bench/gdn.py calls it
  (initial states in, final states to a new tensor),
- ``fla_in_place``: fla's same Triton kernel launched with the final-state pointer equal to
  the initial-state one, so it too writes in place.

Outputs and states are checked against ``ours_in_place``. One line of JSON a row.

    PYTHONPATH=<fla> FLA_FLASH_QLA=0 python bench/experimental/gdn_decode_inplace.py
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import bench.gdn as gdn_bench  # noqa: E402

gdn_bench.torch = torch  # (bench/gdn.py imports torch in its main)
from bench.gdn import DIM, config_for, diff, fla_decode_call, inputs, kernels_module  # noqa: E402
from bench.graph_timing import graph_ms  # noqa: E402


def fla_in_place(kernel, x: dict, state: torch.Tensor, out: torch.Tensor):
    """fla's recurrent kernel with ``ht = h0 = state`` ([B, HV, V, K], contiguous)."""
    import triton

    bs, h, _ = x["q"].shape
    hv = x["v"].shape[1]
    bv = 8

    def run():
        kernel[(triton.cdiv(DIM, bv) * bs * hv,)](
            q=x["q"], k=x["k"], v=x["v"], g=x["a"], gk=None, gv=None, beta=x["b"],
            A_log=x["A_log"], dt_bias=x["dt_bias"], o=out, h0=state, ht=state,
            cu_seqlens=None, scale=DIM**-0.5, T=1, H=h, HV=hv, K=DIM, V=DIM, BK=DIM, BV=bv,
            IS_BETA_HEADWISE=True, USE_QK_L2NORM_IN_KERNEL=True, APPLY_BETA_SIGMOID=True,
            ALLOW_NEG_EIGVAL=False, STATE_V_FIRST=True, num_warps=1, num_stages=3,
        )  # fmt: skip

    return run


def main() -> None:
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    from fla.ops.gated_delta_rule.fused_recurrent import (
        fused_recurrent_gated_delta_rule_fwd_kernel,
    )

    mod = kernels_module("gdn_qwen3_next")
    for bs in (64, 256):
        h, hv = 16, 32
        cfg = config_for(mod, hv // h)
        one_draft = dataclasses.replace(cfg, num_draft_tokens=1)
        x = inputs(bs, h, hv)
        gates = dict(A_log=x["A_log"], dt_bias=x["dt_bias"])
        state = torch.randn(bs, hv, DIM, DIM, dtype=torch.float32, device="cuda") * 0.05
        nbytes = 2 * bs * hv * DIM * DIM * 4
        pool = torch.zeros(bs + 1, hv, DIM, DIM, dtype=torch.float32, device="cuda")
        pool[1:] = state
        idx = torch.arange(1, bs + 1, dtype=torch.int32, device="cuda")
        qsl = torch.arange(bs + 1, dtype=torch.int32, device="cuda")
        common = dict(**gates, cache_indices=idx, query_start_loc=qsl, scale=DIM**-0.5)
        outs = {n: torch.empty(bs, hv, DIM, dtype=torch.bfloat16, device="cuda") for n in "abd"}
        steps = torch.empty(bs, 1, hv, DIM, DIM, dtype=torch.float32, device="cuda")
        fla_state = state.clone()

        def ours_in_place():
            mod.decode(x["q"], x["k"], x["v"], x["a"], x["b"], ssm_states=pool,
                       out=outs["a"], config=cfg, **common)  # fmt: skip

        def ours_out_of_place():
            mod.target_verify(x["q"], x["k"], x["v"], x["a"], x["b"], ssm_states=pool,
                              out=outs["b"], steps=steps, parents=None, config=one_draft,
                              **common)  # fmt: skip

        theirs = fla_decode_call(fused_recurrent_gated_delta_rule, x, state)
        theirs_in_place = fla_in_place(fused_recurrent_gated_delta_rule_fwd_kernel, x,
                                       fla_state, outs["d"])  # fmt: skip

        # -- numerics: one call each from the same states ----
        ours_out_of_place()
        ours_in_place()
        fla_out, fla_final = theirs()
        theirs_in_place()
        new = pool[1:].clone()
        checks = {
            "ours_out_of_place": (diff(outs["b"], outs["a"]), diff(steps[:, 0], new)),
            "fla": (diff(fla_out[:, 0], outs["a"]), diff(fla_final, new)),
            "fla_in_place": (diff(outs["d"], outs["a"]), diff(fla_state, new)),
        }
        runs = {
            "ours_in_place": ours_in_place,
            "ours_out_of_place": ours_out_of_place,
            "fla": theirs,
            "fla_in_place": theirs_in_place,
        }
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(3):
            for name, fn in runs.items():
                times[name].append(graph_ms(fn) * 1e3)
        fla_us = min(times["fla"])
        for name, ts in times.items():
            us = min(ts)
            row = {"case": f"B{bs} H{h}/{hv}", "form": name, "graph_us": ts}
            row.update(tb_s=nbytes / us / 1e6, speedup_vs_fla=fla_us / us)
            if name in checks:
                row.update(out_diff=checks[name][0], state_diff=checks[name][1])
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
