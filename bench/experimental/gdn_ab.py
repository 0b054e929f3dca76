#!/usr/bin/env python3
"""A/B of the GDN Triton library in one tree (``ab_trees.sh``): the tree's generated sm90
GDN kernels next to ``fla-core==0.6.0`` on ``bench/gdn.py``'s prefill and decode cases, one
row per case and variant (the tree's configs with that variant's overrides). Prefill rows
carry both sides' errors against the float64 recurrence (``gdn.oracle_errors``), so a
patch that trades precision for speed shows both; decode rows carry the CUDA-graph ratio.

``python3 bench/experimental/gdn_ab.py OUT.jsonl ['{"name": {overrides}}'] [--only prefill]``
from a tree's root (fla importable, ``FLA_FLASH_QLA=0``); through ``ab_trees.sh`` with
``AB_SCRIPT=bench/experimental/gdn_ab.py``, one process a tree. fla is timed once per case
within a process, so its figures repeat across a tree's variants."""

import functools
import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from bench import gdn  # noqa: E402

KEEP = ("case", "speedup", "graph_speedup", "attngen_ms", "fla_ms", "attngen_us", "fla_us",
        "out_err_vs_f64", "state_err_vs_f64", "out_diff_vs_fla", "kernels_us")  # fmt: skip


def rows(variants: dict[str, dict[str, int]], only: set[str]):
    """(variant, row) for every case of ``only`` and every variant."""
    os.environ.setdefault("FLA_FLASH_QLA", "0")
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

    gdn.torch = torch
    prefill_mod, decode_mod = gdn.kernels_module("gdn_gva1"), gdn.kernels_module("gdn_qwen3_next")
    for name, tiles in variants.items():
        for bs, length, heads in gdn.PREFILL_CASES if "prefill" in only else ():
            yield name, functools.partial(
                gdn.prefill_case, prefill_mod, chunk_gated_delta_rule, bs, length, heads,
                tiles or None, oracle=True,
            )  # fmt: skip
        for bs, h, hv in gdn.DECODE_CASES if "decode" in only else ():
            yield name, functools.partial(
                gdn.decode_case, decode_mod, fused_recurrent_gated_delta_rule, bs, h, hv,
                tiles or None,
            )  # fmt: skip


def main(out_path: str, variants: dict[str, dict[str, int]], only: set[str]) -> int:
    torch.manual_seed(0)
    failed = 0
    with open(out_path, "w") as out:
        for name, case in rows(variants, only):
            try:
                full = case()
                row = {"variant": name, **{k: full[k] for k in KEEP if k in full}}
            except Exception:  # a failing variant is a row; the next one runs
                row, failed = {"variant": name, "error": traceback.format_exc()[-800:]}, 1
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(json.dumps(row), flush=True)
    return failed


if __name__ == "__main__":
    args = sys.argv[1:]
    only = {"prefill", "decode"}
    if "--only" in args:
        i = args.index("--only")
        only = {args[i + 1]}
        del args[i : i + 2]
    variants = json.loads(args[1]) if len(args) > 1 else {"base": {}}
    sys.exit(main(args[0], variants, only))
