#!/usr/bin/env python3
"""The CuTe DSL sm90 extend over a paged prefix of small pages (page 1: K/V rows gathered
by cp.async, ``mha_gqa_prefill_page1``; page 16: a TMA copy per page, 8 a key tile,
``mha_gqa_prefill_small_pages``; hd128, 32 q / 8 kv heads, causal) against FA4's varlen
forward with a page table on the same shuffled cache, as ``bench/run.py --only extend``
times it, in paired rounds (``bench/paired_timing.py``). Each output starts as NaN and must
match FA4's within 4e-3 + 2e-2 max|FA4|.

``python3 bench/experimental/cute_extend_gather.py OUT.jsonl ['{"name": {overrides}}']``
from a tree's root (FA4 on the path); through ``ab_trees.sh`` with
``AB_SCRIPT=bench/experimental/cute_extend_gather.py``, one process a tree."""

import importlib
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from bench.experimental.cute_prefill_tiles import checked_against_fa4  # noqa: E402

CASES = ((16, 2048, 512), (8, 4096, 1024), (4, 8192, 2048))  # batch, prefix, new
SPECS = {1: "mha_gqa_prefill_page1", 16: "mha_gqa_prefill_small_pages"}  # page size: spec
HQ, HKV, D = 32, 8, 128


def main(out_path: str, variants: dict[str, dict[str, int]] | None = None) -> None:
    from flash_attn.cute import flash_attn_varlen_func

    torch.manual_seed(0)
    rows = []
    for page_size, spec in SPECS.items():
        mod = importlib.import_module(f"generated.sm90.cute_dsl.mha.{spec}.kernels")
        base = next(
            c for c in mod.CONFIGS.values()
            if (c.head_dim, c.gqa_group, c.page_size) == (D, HQ // HKV, page_size)
        )  # fmt: skip
        for batch, prefix, new in CASES:
            total = prefix + new
            pages_per_seq = math.ceil(total / page_size)
            num_pages = batch * pages_per_seq
            k_cache = torch.randn(num_pages, page_size, HKV, D, dtype=torch.bfloat16, device="cuda")
            v_cache = torch.randn_like(k_cache)
            g = torch.Generator().manual_seed(prefix + page_size)
            perm = torch.randperm(num_pages, generator=g)
            page_table = perm.to("cuda", torch.int32).view(batch, pages_per_seq)
            q = torch.randn(batch * new, HQ, D, dtype=torch.bfloat16, device="cuda")
            prefix_lens = torch.full((batch,), prefix, dtype=torch.int32, device="cuda")
            seqused = torch.full((batch,), total, dtype=torch.int32, device="cuda")
            qo_indptr = (torch.arange(batch + 1, device="cuda") * new).to(torch.int32)
            flops = 2 * batch * HQ * (new * prefix + new * new / 2) * (2 * D)

            def fa4():
                return flash_attn_varlen_func(
                    q.view(batch, new, HQ, D), k_cache, v_cache, page_table=page_table,
                    seqused_k=seqused, softmax_scale=D**-0.5, causal=True,
                )[0]  # fmt: skip

            case = dict(case=f"B{batch} P{prefix}+S{new}", page_size=page_size)
            try:
                ref = fa4().float().reshape(batch * new, HQ, D)
            except Exception as exc:  # noqa: BLE001  (FA4 may refuse a page size)
                print(json.dumps(dict(case, fa4_error=f"{type(exc).__name__}: {exc}"[:300])))
                continue

            def launch(cfg, out):
                mod.extend(q, k_cache, v_cache, page_table, qo_indptr, prefix_lens, out,
                           max_extend_len=new, config=cfg, sm_scale=D**-0.5)  # fmt: skip

            sweep = variants or {"base": {}}
            rows += checked_against_fa4(fa4, ref, flops, base, sweep, launch, case)
    Path(out_path).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], json.loads(args[1]) if len(args) > 1 else None)
