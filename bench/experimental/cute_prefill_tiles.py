#!/usr/bin/env python3
"""Tile sweep of the CuTe DSL sm90 cache-free prefill (hd128, 32 q / 8 kv heads, 16k tokens
a call) against FA4's varlen forward on the same inputs: keys per tile (``fwd_tile_n``) and
K/V ring depth (``fwd_num_stages``) on the generated configs of ``mha_gqa_prefill`` (causal)
and ``mha_gqa_noncausal``. Each output starts as NaN and must match FA4's within
4e-3 + 2e-2 max|FA4|. FA4 and the variants are timed in interleaved rounds
(``bench/paired_timing.py``): ``ratio`` is the median over rounds of FA4's time / the
variant's in the same round, ``ratio_iqr`` its interquartile range.

``python3 bench/experimental/cute_prefill_tiles.py OUT.jsonl`` from the repository root
(FA4 on the path); ``OUT.jsonl '{"name": {config overrides}, ...}'`` sweeps those configs
instead (any tuning key of the config, or of a patch under test such as
``experimental/cute_sm90_pingpong.patch``'s ``fwd_wg_pingpong``), ``--head-dim 64``
another head dim and ``--heads 28/4`` other head counts (the generated config with that
head dim or GQA group swapped in, packed or not as the lowering would choose)."""

import dataclasses
import functools
import importlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from bench.paired_timing import paired_ms  # noqa: E402

TILES = ((128, 2), (176, 2), (192, 2), (160, 2), (128, 3), (112, 2))
SEQLENS = (1024, 4096, 8192, 16384)
TOKENS, HQ, HKV = 16384, 32, 8
ROUNDS, CALLS = 15, 5  # paired timing: rounds of each kernel, back-to-back calls a sample
D = 128  # --head-dim


def generated_config(name: str):
    mod = importlib.import_module(f"generated.sm90.cute_dsl.mha.{name}.kernels")
    cfgs = [c for c in mod.CONFIGS.values() if (c.head_dim, c.gqa_group) == (D, HQ // HKV)]
    if not cfgs:  # another head dim or group: the spec's config with them swapped in
        from attngen.families.mha.cute_dsl.lower import MAX_DIM_3WG, pack_gqa
        from attngen.spec.enums import Arch

        group = HQ // HKV
        same_dim = [c for c in mod.CONFIGS.values() if c.head_dim == D]
        swap = dict(head_dim=D, v_head_dim=D, gqa_group=group,
                    fwd_pack_gqa=int(pack_gqa(group, Arch.SM90)))  # fmt: skip
        if not same_dim and D > MAX_DIM_3WG:  # a 192-row tile of a small head dim
            swap["fwd_tile_m"] = 128
        cfgs = [dataclasses.replace(c, **swap) for c in same_dim or mod.CONFIGS.values()]
    return mod, max(cfgs, key=lambda c: c.page_size)


def checked_against_fa4(fa4, ref, flops: float, base, sweep: dict, launch, case: dict):
    """One row a variant of ``sweep`` ({name: config overrides of ``base``}), ``case``'s
    fields first: ``launch(config, out)`` writes a NaN-filled bf16 ``out`` shaped like FA4's
    ``ref``; each variant runs once and its output is checked against ``ref`` within 4e-3 +
    2e-2 max|ref| (``ok``, ``max_abs_vs_fa4``, or ``error``), then FA4 and the variants that
    ran are timed in paired rounds (``fa4_tflops``, ``tflops``, ``ratio`` = FA4's time / the
    variant's, ``ratio_iqr``). Each row is also printed, a JSON line."""
    calls = {}
    for variant, overrides in sweep.items():
        out = torch.full_like(ref, float("nan"), dtype=torch.bfloat16)
        fn = functools.partial(launch, dataclasses.replace(base, **overrides), out)
        calls[variant] = (dict(case, variant=variant, **overrides), fn, out)
    tol = 4e-3 + 2e-2 * float(ref.abs().max())
    timed = {"fa4": fa4}
    for variant, (row, fn, out) in calls.items():
        try:
            fn()
            torch.cuda.synchronize()
            diff = float((out.float() - ref).abs().max())  # NaN stays NaN
            row["ok"] = bool(diff <= tol)
            row["max_abs_vs_fa4"] = diff
            timed[variant] = fn
        except Exception as exc:  # noqa: BLE001
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
    paired = paired_ms(timed, rounds=ROUNDS, calls=CALLS)
    fa4_ms = paired.median_ms("fa4")
    for variant, (row, _, _) in calls.items():
        row["fa4_tflops"] = round(flops / fa4_ms / 1e9, 1)
        if variant in timed:
            med, q1, q3 = paired.ratio("fa4", variant)  # FA4's time / this one's
            row["tflops"] = round(flops / paired.median_ms(variant) / 1e9, 1)
            row["ratio"], row["ratio_iqr"] = round(med, 3), [round(q1, 3), round(q3, 3)]
    rows = [row for row, _, _ in calls.values()]
    for row in rows:
        print(json.dumps(row), flush=True)
    return rows


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
            sweep = variants or {
                f"n{n}s{st}": dict(fwd_tile_n=n, fwd_num_stages=st) for n, st in TILES
            }

            def launch(cfg, out):
                mod.prefill(q, k, v, cu, out, max_seq_len=seq, config=cfg, sm_scale=D**-0.5)

            case = dict(causal=causal, seq=seq, head_dim=D)
            rows += checked_against_fa4(fa4, ref, flops, base, sweep, launch, case)
    Path(out_path).write_text("".join(json.dumps(r) + "\n" for r in rows))


def take(args: list[str], flag: str) -> str | None:
    """The value after ``flag`` in ``args`` (both removed), or None."""
    if flag not in args:
        return None
    i = args.index(flag)
    if i + 1 == len(args):
        raise SystemExit(f"{flag}: expected a value after it")
    value = args[i + 1]
    del args[i : i + 2]
    return value


def take_shape(args: list[str]) -> None:
    """``--head-dim D`` and ``--heads HQ/HKV`` (q heads / kv heads, e.g. 28/4: Qwen2.5-7B's
    group of 7) taken from ``args`` into this module's shape."""
    global D, HQ, HKV
    if (d := take(args, "--head-dim")) is not None:
        D = int(d)
    if (heads := take(args, "--heads")) is not None:
        HQ, HKV = (int(x) for x in heads.split("/"))


if __name__ == "__main__":
    args = sys.argv[1:]
    take_shape(args)
    main(args[0], json.loads(args[1]) if len(args) > 1 else None)
