#!/usr/bin/env python3
"""attngen's GDN recurrent decode and fla-core's fused recurrent kernel on the same inputs
(``bench/gdn.py``'s decode rows: B requests, 16 k / 32 v heads, K = V = 128, fp32 states;
attngen updates pool slots in place, fla reads one state buffer and writes another), each
launched three times, for ncu side by side (no timing):
``ncu --section SpeedOfLight --section Occupancy --section WarpStateStats -k regex:recurrent
python3 bench/experimental/gdn_decode_ncu.py 256`` from the repo root, fla on the path.
A second argument, JSON config overrides of attngen's kernel (e.g. '{"decode_tiles": 2}')."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import gdn  # noqa: E402


def main(argv: list[str]) -> None:
    import dataclasses

    import torch
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    gdn.torch = torch
    bs, h, hv, d = int(argv[0]), 16, 32, gdn.DIM
    overrides = json.loads(argv[1]) if len(argv) > 1 else {}
    mod = gdn.kernels_module("gdn_qwen3_next")
    cfg = dataclasses.replace(gdn.config_for(mod, hv // h), **overrides)
    x = gdn.inputs(bs, h, hv)
    state = torch.randn(bs, hv, d, d, dtype=torch.float32, device="cuda") * 0.05
    slots = (torch.randperm(bs, device="cuda") + 1).to(torch.int32)
    pool = torch.zeros(bs + 1, hv, d, d, dtype=torch.float32, device="cuda")
    pool[slots.long()] = state
    qsl = torch.arange(bs + 1, dtype=torch.int32, device="cuda")
    out = torch.empty(bs, hv, d, dtype=torch.bfloat16, device="cuda")
    gates = dict(A_log=x["A_log"], dt_bias=x["dt_bias"])
    for _ in range(3):
        mod.decode(x["q"], x["k"], x["v"], x["a"], x["b"], **gates, ssm_states=pool,
                   cache_indices=slots, query_start_loc=qsl, out=out, config=cfg,
                   scale=d**-0.5)  # fmt: skip
    theirs = gdn.fla_decode_call(fused_recurrent_gated_delta_rule, x, state)
    for _ in range(3):
        theirs()
    torch.cuda.synchronize()
    print(f"gdn_decode_ncu: B{bs} H{h}/{hv} {overrides}: 3 + 3 launches")


if __name__ == "__main__":
    main(sys.argv[1:])
