#!/usr/bin/env python3
"""GPU benchmark of attngen's MLA Triton kernels against FlashMLA, in one process.

Absorbed decode (one query per request, page 64, bf16 q): attngen ``absorbed`` (splits from
PagedMlaBackend's heuristic) vs FlashMLA ``flash_mla_with_kvcache`` on the same latent
cache, B64 ctx4096 and B128 ctx8192 at h_q 128 and 16, bf16, fp8 e4m3 and NVFP4 latent (NVFP4: attngen only; FlashMLA's
fp8 path takes an fp8 q; attngen keeps q bf16, so the fp8 rows compare speed only).
TFLOP/s = 2 B H ctx (576 + 512) / time; TB/s = B ctx 576 bytes-per-element / time.
Ragged prefill 192/128 with LSE (causal, 16k tokens of S = 4096): attngen's TFLOP/s,
FLOPs = 2 B H S^2 (192 + 128) / 2. Outputs of attngen and FlashMLA are compared.

Run on the H200 from the repo root, FlashMLA packed by ../shared/gpu/pack-flashmla.sh DIR:
``python3 bench/mla.py --flashmla DIR --out bench/results``.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import glob
import json
import os
import site
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CASES = ((64, 4096), (128, 8192))
HEADS = (128, 16)
PAGE = 64
SCALE = 192**-0.5


def load_flashmla(path: str | None):
    if not path:
        return None, "no --flashmla"
    try:
        for base in site.getsitepackages():
            libs = glob.glob(f"{base}/nvidia/cu13/lib/libnvrtc.so.13*")
            if libs:
                ctypes.CDLL(libs[0], mode=ctypes.RTLD_GLOBAL)
                break
        sys.path.insert(0, path)
        from sgl_kernel import flash_mla

        return flash_mla, ""
    except Exception as e:  # noqa: BLE001  (a missing peer is reported, not fatal)
        return None, f"{type(e).__name__}: {e}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flashmla")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--sweep", action="store_true", help="decode tiles at B64 ctx4096 too")
    args = ap.parse_args()
    import torch
    import triton
    from triton.testing import do_bench

    from attngen.families.mha.runtime import decode_num_splits, decode_split_cap
    from generated.sm90.triton.mla.mla_deepseek_v3 import kernels as k16
    from attngen.runtime.nvfp4 import nvfp4_global_scale, quantize_nvfp4
    from generated.sm90.triton.mla.mla_deepseek_v3_fp8 import kernels as k8
    from generated.sm90.triton.mla.mla_deepseek_v3_nvfp4 import kernels as k4

    fm, fm_err = load_flashmla(args.flashmla)
    rows, dev = [], "cuda"
    for heads in HEADS:
        for b, ctx in CASES:
            pages = b * ctx // PAGE
            perm = torch.randperm(pages, device=dev).to(torch.int32) + 1
            table = perm.view(b, ctx // PAGE).contiguous()
            lens = torch.full((b,), ctx, dtype=torch.int32, device=dev)
            q = torch.randn(b, heads, 576, device=dev, dtype=torch.bfloat16)
            cache16 = torch.randn(pages + 1, PAGE, 1, 576, device=dev, dtype=torch.bfloat16)
            for kv in ("bf16", "fp8", "nvfp4"):
                mod = {"bf16": k16, "fp8": k8, "nvfp4": k4}[kv]
                suffix = {"bf16": "", "fp8": "_kvfp8_e4m3", "nvfp4": "_kvnvfp4"}[kv]
                cfg = mod.CONFIGS[f"r512_rope64_h{heads}_ps{PAGE}_bf16{suffix}_causal"]
                block_scales = None
                if kv == "bf16":
                    cache, scale = cache16, None
                elif kv == "fp8":
                    cache = (cache16 * 4).to(torch.float8_e4m3fn)
                    scale = torch.tensor([0.25], device=dev)
                else:
                    scale = nvfp4_global_scale(cache16)
                    cache, block_scales = quantize_nvfp4(cache16, scale)
                blocks = triton.cdiv(heads, cfg.decode_block_h)
                cap = decode_split_cap(
                    programs_per_split=b * blocks, num_sms=132, max_splits=cfg.max_splits
                )
                splits = decode_num_splits(lens, cap=cap, min_split_tokens=256)
                po, pl = mod.absorbed_workspace(cfg, rows=b, device=dev)
                out = torch.empty(b, heads, 512, device=dev, dtype=torch.bfloat16)

                def ours():
                    mod.absorbed(
                        q,
                        None,
                        cache,
                        table,
                        lens,
                        splits,
                        out,
                        po,
                        pl,
                        config=cfg,
                        sm_scale=SCALE,
                        kv_scale=scale,
                        kv_block_scales=block_scales,
                        trusted_metadata=True,
                    )

                try:
                    ours()
                    t_ours = do_bench(ours, warmup=50, rep=200)
                except Exception as e:  # noqa: BLE001  (reported in the row, not fatal)
                    rows.append(
                        dict(
                            part="decode",
                            heads=heads,
                            batch=b,
                            ctx=ctx,
                            kv=kv,
                            attngen_error=f"{type(e).__name__}: {str(e)[:200]}",
                        )
                    )
                    print(json.dumps(rows[-1]), flush=True)
                    continue
                row = dict(
                    part="decode",
                    heads=heads,
                    batch=b,
                    ctx=ctx,
                    kv=kv,
                    page=PAGE,
                    splits=cap,
                    attngen_ms=t_ours,
                )
                flops = 2 * b * heads * ctx * (576 + 512)
                nbytes = b * ctx * 576 * cache.element_size()
                row["attngen_tflops"] = flops / t_ours / 1e9
                row["attngen_tbs"] = nbytes / t_ours / 1e9
                if kv == "nvfp4":
                    row["flashmla_error"] = "no NVFP4 path"
                elif fm is not None:
                    try:
                        row.update(
                            _flashmla(
                                fm, q, cache, table, lens, heads, kv, out, do_bench, flops, nbytes
                            )
                        )
                    except Exception as e:  # noqa: BLE001
                        row["flashmla_error"] = f"{type(e).__name__}: {str(e)[:200]}"
                else:
                    row["flashmla_error"] = fm_err
                rows.append(row)
                print(json.dumps(row), flush=True)
    rows += _prefill(torch, do_bench, k16)
    if args.sweep:
        rows += _sweep(torch, triton, do_bench, k16, k8)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%MZ")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=triton.__version__,
        commit=os.environ.get("ATTNGEN_COMMIT", ""),
        rows=rows,
    )
    (out_dir / f"mla-h200-{stamp}.json").write_text(json.dumps(result, indent=1))
    print(
        f"{'part':8}{'H':>5}{'B':>5}{'ctx':>6}{'kv':>5}{'ours ms':>9}{'TF/s':>7}{'TB/s':>6}"
        f"{'FMLA ms':>9}{'ratio':>7}"
    )
    for r in rows:
        if "attngen_error" in r:
            print(
                f"{r['part']} h{r['heads']} B{r['batch']} ctx{r['ctx']} {r['kv']}: "
                f"{r['attngen_error']}"
            )
            continue
        if r["part"] == "sweep":
            print(
                f"sweep {r['heads']} {r['kv']} tile {r['tile']}: {r['attngen_ms']:.3f} ms "
                f"{r['attngen_tflops']:.0f} TF/s {r['attngen_tbs']:.2f} TB/s"
            )
            continue
        print(
            f"{r['part']:8}{r['heads']:5}{r['batch']:5}{r['ctx']:6}{r.get('kv', ''):>5}"
            f"{r['attngen_ms']:9.3f}{r.get('attngen_tflops', 0):7.0f}"
            f"{r.get('attngen_tbs', 0):6.2f}{r.get('flashmla_ms', float('nan')):9.3f}"
            f"{r.get('flashmla_ms', float('nan')) / r['attngen_ms']:7.2f}"
        )


def _flashmla(fm, q, cache, table, lens, heads, kv, ours_out, do_bench, flops, nbytes):
    import torch

    b = q.shape[0]
    q4 = q.view(b, 1, heads, 576)
    if kv == "fp8":
        meta, splits = fm.get_mla_metadata(lens, heads, 1, is_fp8_kvcache=True)
        one = torch.ones(1, device=q.device)
        q8 = q4.to(torch.float8_e4m3fn)

        def peer():
            return fm.flash_mla_with_kvcache(
                q8,
                cache,
                table,
                lens,
                512,
                meta,
                splits,
                softmax_scale=SCALE,
                causal=False,
                descale_q=one,
                descale_k=one * 0.25,
                is_fp8_kvcache=True,
            )

    else:
        meta, splits = fm.get_mla_metadata(lens, heads, 1)

        def peer():
            return fm.flash_mla_with_kvcache(
                q4, cache, table, lens, 512, meta, splits, softmax_scale=SCALE, causal=False
            )

    o, _ = peer()
    diff = (o.view(b, heads, 512).float() - ours_out.float()).abs().max().item()
    t = do_bench(peer, warmup=50, rep=200)
    return dict(
        flashmla_ms=t,
        flashmla_tflops=flops / t / 1e9,
        flashmla_tbs=nbytes / t / 1e9,
        max_diff_vs_flashmla=diff,
    )


# (heads, kv, BLOCK_H, BLOCK_N, warps, stages): the generated tiles and alternatives that
# compile spill-free on sm_90a (shared memory <= 227 KB)
SWEEP = (
    (128, "bf16", 64, 32, 8, 2),
    (128, "bf16", 64, 64, 8, 2),
    (128, "bf16", 32, 64, 8, 2),
    (16, "bf16", 16, 64, 4, 2),
    (16, "bf16", 16, 64, 4, 3),
    (16, "bf16", 16, 32, 4, 2),
    (16, "fp8", 16, 32, 8, 2),
    (16, "fp8", 16, 64, 8, 2),
    (128, "fp8", 32, 32, 8, 2),
)


def _sweep(torch, triton, do_bench, k16, k8):
    import dataclasses

    from attngen.families.mha.runtime import decode_num_splits, decode_split_cap

    rows, dev, b, ctx = [], "cuda", 64, 4096
    pages = b * ctx // PAGE
    table = (torch.randperm(pages, device=dev).to(torch.int32) + 1).view(b, -1).contiguous()
    lens = torch.full((b,), ctx, dtype=torch.int32, device=dev)
    cache16 = torch.randn(pages + 1, PAGE, 1, 576, device=dev, dtype=torch.bfloat16)
    cache8 = (cache16 * 4).to(torch.float8_e4m3fn)
    for heads, kv, bh, bn, warps, stages in SWEEP:
        mod = k16 if kv == "bf16" else k8
        uri = f"r512_rope64_h{heads}_ps{PAGE}_bf16" + ("_kvfp8_e4m3" if kv == "fp8" else "")
        cfg = dataclasses.replace(
            mod.CONFIGS[uri + "_causal"],
            decode_block_h=bh,
            decode_block_n=bn,
            decode_num_warps=warps,
            decode_num_stages=stages,
        )
        cache = cache16 if kv == "bf16" else cache8
        scale = torch.tensor([0.25], device=dev) if kv == "fp8" else None
        q = torch.randn(b, heads, 576, device=dev, dtype=torch.bfloat16)
        cap = decode_split_cap(
            programs_per_split=b * triton.cdiv(heads, bh), num_sms=132, max_splits=cfg.max_splits
        )
        splits = decode_num_splits(lens, cap=cap, min_split_tokens=256)
        po, pl = mod.absorbed_workspace(cfg, rows=b, device=dev)
        out = torch.empty(b, heads, 512, device=dev, dtype=torch.bfloat16)

        def ours():
            mod.absorbed(
                q,
                None,
                cache,
                table,
                lens,
                splits,
                out,
                po,
                pl,
                config=cfg,
                sm_scale=SCALE,
                kv_scale=scale,
                trusted_metadata=True,
            )

        try:
            ours()
            ms = do_bench(ours, warmup=25, rep=100)
        except Exception as e:  # noqa: BLE001
            print(f"sweep {heads} {kv} {(bh, bn, warps, stages)}: {type(e).__name__}: {e}")
            continue
        row = dict(
            part="sweep",
            heads=heads,
            batch=b,
            ctx=ctx,
            kv=kv,
            tile=[bh, bn, warps, stages],
            attngen_ms=ms,
            attngen_tflops=2 * b * heads * ctx * 1088 / ms / 1e9,
            attngen_tbs=b * ctx * 576 * cache.element_size() / ms / 1e9,
        )
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _prefill(torch, do_bench, mod):
    rows = []
    cfg = mod.CONFIGS["r512_rope64_h128_ps64_bf16_causal"]
    s, b, h = 4096, 4, 128
    t = s * b
    q = torch.randn(t, h, 192, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(t, h, 192, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(t, h, 128, device="cuda", dtype=torch.bfloat16)
    indptr = torch.arange(b + 1, device="cuda", dtype=torch.int32) * s
    out = torch.empty(t, h, 128, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(t, h, device="cuda", dtype=torch.float32)

    def ours():
        mod.ragged(
            q,
            k[..., :128],
            k[..., 128:],
            v,
            indptr,
            indptr,
            out,
            lse,
            max_q_len=s,
            causal=True,
            config=cfg,
            sm_scale=SCALE,
            trusted_metadata=True,
        )

    ours()
    ms = do_bench(ours, warmup=50, rep=200)
    flops = 2 * b * h * s * s * (192 + 128) / 2
    rows.append(
        dict(
            part="prefill", heads=h, batch=b, ctx=s, attngen_ms=ms, attngen_tflops=flops / ms / 1e9
        )
    )
    print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    main()
