#!/usr/bin/env python3
"""GPU benchmark of attngen's DSA Triton kernels against FlashMLA's sparse kernels, in one
process.

- Sparse decode (one query per request, top-2048 slots each, fp8 656-byte latent and bf16
  latent): attngen ``sparse_mla`` vs FlashMLA ``flash_mla_with_kvcache(indices=...,
  is_fp8_kvcache=True)`` on the same cache and the same slots, B64 / B128 at h_q 64 and
  128 (and attngen alone at 16). TFLOP/s = 2 B H 2048 (576 + 512) / time.
- Sparse prefill (4096 queries x 128 heads, top-2048 of 32k keys, bf16): attngen vs
  ``flash_mla_sparse_fwd``, same FLOP count with B = 4096 rows.
- Indexer (fp8 paged scores over the index pool) and top-k: TB/s of index cache read
  (132 bytes per key) against the 4.3 TB/s copy ceiling, B64 / B128 at 8k, 32k contexts.
- Tiles: alternative sparse tiles timed beside the generated ones (for the lowering), and
  the generated tiles at half and twice the launcher's split count (``choose_splits``).
Decode rows are timed by CUDA-graph replay (both sides; as an engine runs decode, so the
host's launch path is out), falling back to eager calls between CUDA events when a capture
fails (the row's ``timer`` says which); prefill and the indexer are timed eagerly. Outputs
of attngen and FlashMLA are compared (max abs difference relative to RMS).

Run on the H200 from the repo root: ``python3 bench/dsa.py --flashmla DIR --out DIR``.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import datetime
import glob
import importlib
import json
import os
import site
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.device_tag import device_tag  # noqa: E402
from bench.preflight import missing_cuda  # noqa: E402
from bench.graph_timing import graph_ms  # noqa: E402

PAGE, TOPK, SCALE = 64, 2048, 192**-0.5
PARTS = ("decode", "tiles", "sweep", "prefill", "indexer")  # --parts, in run order


def load_flashmla(path):
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
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"


def config(kv: str, heads: int):
    spec = "dsa_deepseek_v32_fp8" if kv == "fp8" else "dsa_deepseek_v32"
    mod = importlib.import_module(f"generated.sm90.triton.dsa.{spec}.kernels")
    return mod, next(c for c in mod.CONFIGS.values() if c.num_heads == heads)


def bench(fn):
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=100)


def bench_graph(fn) -> tuple[float, str]:
    """Milliseconds per call of ``fn`` replayed from a CUDA graph, or timed eagerly (and
    said so) when it cannot be captured."""
    try:
        return graph_ms(fn), "graph"
    except Exception as e:  # noqa: BLE001
        print(f"  (no CUDA graph: {type(e).__name__}: {str(e)[:120]}; timed eagerly)")
        return bench(fn), "events"


def sparse_case(fm, kv, heads, b, ctx, rows_log, tiles=None, split_factor=1.0):
    import torch

    from attngen.families.dsa.pool import latent_pool
    from attngen.runtime.batch import AttentionLayer

    mod, cfg = config(kv, heads)
    if tiles:
        cfg = dataclasses.replace(cfg, **tiles)
    pages = b * ctx // PAGE + 1
    pool = latent_pool(
        num_layers=1, num_pages=pages, page_size=PAGE, dtype=cfg_dtype(kv), device="cuda"
    )
    slots = torch.arange(pool.num_slots, device="cuda")
    layer = AttentionLayer(0, heads, 1, 576, 512, SCALE)
    pool.set_mla_kv_buffer(
        layer,
        slots,
        torch.randn(len(slots), 512, device="cuda").bfloat16(),
        torch.randn(len(slots), 64, device="cuda").bfloat16(),
    )
    cache = pool.kv_buffer[0]
    # each request owns ctx consecutive-page slots; 2048 random distinct picks among them
    base = torch.arange(b, device="cuda")[:, None] * ctx
    pick = torch.rand(b, ctx, device="cuda").argsort(dim=1)[:, :TOPK]
    idx = (base + pick).int().contiguous()
    q = torch.randn(b, heads, 576, device="cuda").bfloat16()
    out = torch.empty(b, heads, 512, device="cuda", dtype=torch.bfloat16)
    chosen = mod.choose_splits(cfg, b, 132)
    splits = max(1, min(cfg.max_splits, int(chosen * split_factor)))
    if split_factor != 1.0 and splits == chosen:  # the generated row already timed it
        return
    ws = mod.sparse_workspace(cfg, rows=b, device="cuda")

    def ours():
        mod.sparse_mla(
            q, None, cache, idx, out, config=cfg, sm_scale=SCALE, workspace=ws, splits=splits
        )

    t, timer = bench_graph(ours)
    flops = 2 * b * heads * TOPK * (576 + 512)
    row = dict(
        kind="sparse_decode",
        kv=kv,
        heads=heads,
        b=b,
        ctx=ctx,
        splits=splits,
        tiles=tiles or "generated",
        split_factor=split_factor,
        timer=timer,
        ms=t,
        tflops=flops / t / 1e9,
    )
    peer_row = not tiles and split_factor == 1.0
    if fm is not None and kv == "fp8" and heads in (64, 128) and peer_row:
        try:
            seqlens = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
            meta, nsplit = fm.get_mla_metadata(seqlens, heads, 1, heads, True, TOPK)
            table = torch.arange(pages - 1, device="cuda", dtype=torch.int32).view(b, -1)
            kc = cache.view(pages, PAGE, 1, 656)

            def peer():
                return fm.flash_mla_with_kvcache(
                    q.view(b, 1, heads, 576),
                    kc,
                    table,
                    seqlens,
                    512,
                    meta,
                    nsplit,
                    softmax_scale=SCALE,
                    causal=False,
                    is_fp8_kvcache=True,
                    indices=idx.view(b, 1, TOPK),
                )

            o_peer, _ = peer()
            ours()
            delta = o_peer.view(b, heads, 512).float() - out.float()
            diff, rms = delta.abs().max().item(), out.float().pow(2).mean().sqrt().item()
            row["rms_diff_over_rms"] = delta.pow(2).mean().sqrt().item() / rms
            tp, peer_timer = bench_graph(peer)
            row.update(
                peer_ms=tp,
                peer_tflops=flops / tp / 1e9,
                peer_timer=peer_timer,
                ratio=tp / t,
                max_diff_over_rms=diff / rms,
            )
        except Exception as e:  # noqa: BLE001
            row["peer_error"] = f"{type(e).__name__}: {e}"[:300]
    rows_log.append(row)
    print(json.dumps(row), flush=True)


def cfg_dtype(kv):
    import torch

    return torch.float8_e4m3fn if kv == "fp8" else torch.bfloat16


def prefill_case(fm, rows_log):
    import torch

    mod, cfg = config("bf16", 128)
    s_q, s_kv, heads = 4096, 32768, 128
    kv = torch.randn(s_kv, 576, device="cuda").bfloat16()
    cache = kv.view(s_kv // PAGE, PAGE, 1, 576)
    idx = torch.rand(s_q, s_kv, device="cuda").argsort(dim=1)[:, :TOPK].int().contiguous()
    q = torch.randn(s_q, heads, 576, device="cuda").bfloat16()
    out = torch.empty(s_q, heads, 512, device="cuda", dtype=torch.bfloat16)

    def ours():
        mod.sparse_mla(q, None, cache, idx, out, config=cfg, sm_scale=SCALE)

    t = bench(ours)
    flops = 2 * s_q * heads * TOPK * (576 + 512)
    row = dict(kind="sparse_prefill", heads=heads, s_q=s_q, s_kv=s_kv, ms=t, tflops=flops / t / 1e9)
    if fm is not None:
        try:

            def peer():
                return fm.flash_mla_sparse_fwd(
                    q, kv.view(s_kv, 1, 576), idx.view(s_q, 1, TOPK), SCALE, 512
                )

            o_peer = peer()[0]
            ours()
            delta = o_peer.float() - out.float()
            diff, rms = delta.abs().max().item(), out.float().pow(2).mean().sqrt().item()
            row["rms_diff_over_rms"] = delta.pow(2).mean().sqrt().item() / rms
            tp = bench(peer)
            row.update(
                peer_ms=tp, peer_tflops=flops / tp / 1e9, ratio=tp / t, max_diff_over_rms=diff / rms
            )
        except Exception as e:  # noqa: BLE001
            row["peer_error"] = f"{type(e).__name__}: {e}"[:300]
    rows_log.append(row)
    print(json.dumps(row), flush=True)


def indexer_case(b, ctx, rows_log):
    import torch

    from attngen.families.dsa.pool import IndexKeyPool

    mod, cfg = config("bf16", 128)
    pages = b * ctx // PAGE
    pool = IndexKeyPool(num_layers=1, num_pages=pages, page_size=PAGE, device="cuda")
    pool.buffer[0].view(-1)[: pages * PAGE * 128].view(torch.float8_e4m3fn).copy_(
        torch.randn(pages * PAGE * 128, device="cuda").to(torch.float8_e4m3fn)
    )
    table = torch.randperm(pages, device="cuda").int().view(b, -1)
    lens = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(b, 64, 128, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(b, 64, device="cuda")
    logits = torch.empty(b, ctx, device="cuda")
    pos = torch.empty(b, TOPK, dtype=torch.int32, device="cuda")
    slot = torch.empty_like(pos)

    def scores():
        mod.indexer_logits(q, w, pool.buffer[0], table, lens, logits, config=cfg)

    def select():
        mod.topk(logits, lens, pos, config=cfg, page_table=table, out_slot=slot)

    ts, tk = bench(scores), bench(select)
    read = b * ctx * 132
    row = dict(
        kind="indexer",
        b=b,
        ctx=ctx,
        scores_ms=ts,
        scores_tbps=read / ts / 1e9,
        topk_ms=tk,
        total_tbps=read / (ts + tk) / 1e9,
    )
    rows_log.append(row)
    print(json.dumps(row), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flashmla")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument(
        "--parts",
        default=",".join(PARTS),
        help="comma list of parts to run: decode (generated tiles, FlashMLA), tiles (the "
        "Triton kernel's tiles), sweep (other split counts), prefill, indexer",
    )
    args = ap.parse_args()
    if (code := missing_cuda("bench/dsa.py")) is not None:
        return code
    parts = set(args.parts.split(","))
    unknown = parts - set(PARTS)
    if unknown:
        ap.error(f"--parts: unknown part(s) {', '.join(sorted(unknown))}")
    fm, why = load_flashmla(args.flashmla)
    print("flashmla:", "loaded" if fm else why, flush=True)
    rows = []
    steps = []
    for kv in ("fp8", "bf16") if "decode" in parts else ():
        for heads in (128, 64, 16):
            for b in (64, 128):
                steps.append(
                    lambda kv=kv, heads=heads, b=b: sparse_case(fm, kv, heads, b, 8192, rows)
                )
    for kv in ("fp8", "bf16") if "tiles" in parts else ():
        for tiles in (  # the Triton kernel's tiles, next to the generated (Gluon) rows above
            {"sparse_gluon": 0, "sparse_block_h": 64, "sparse_block_n": 16},
            {"sparse_gluon": 0, "sparse_block_h": 64, "sparse_block_n": 32},
        ):
            steps.append(
                lambda kv=kv, tiles=tiles: sparse_case(None, kv, 128, 128, 8192, rows, tiles)
            )
    for kv in ("fp8", "bf16") if "sweep" in parts else ():  # other split counts
        for heads in (128, 64):
            for b in (64, 128):
                for factor in (0.5, 2.0):
                    steps.append(
                        lambda kv=kv, heads=heads, b=b, f=factor: sparse_case(
                            None, kv, heads, b, 8192, rows, split_factor=f
                        )
                    )
    if "prefill" in parts:
        steps.append(lambda: prefill_case(fm, rows))
    for b, ctx in ((64, 8192), (128, 32768)) if "indexer" in parts else ():
        steps.append(lambda b=b, ctx=ctx: indexer_case(b, ctx, rows))
    failed = False
    for step in steps:
        try:
            step()
        except Exception as e:  # noqa: BLE001
            print("step failed:", type(e).__name__, str(e)[:300], flush=True)
            if not failed:  # later failures may only repeat a sticky CUDA error
                traceback.print_exc()
            failed = True
    import torch
    import triton

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%MZ")
    result = dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=triton.__version__,
        commit=os.environ.get("ATTNGEN_COMMIT", ""),
        peers=dict(flashmla="sglang-kernel 0.4.5" if fm else why),
        shapes="sparse decode B64/B128 x 8192 tokens, top-2048, h_q 128/64/16; sparse "
        "prefill 4096 q x 32768 kv, h_q 128; indexer B64 x 8k, B128 x 32k",
        timing="decode: CUDA-graph replay (row 'timer'); prefill, indexer: eager, CUDA events",
        rows=rows,
    )
    tag = device_tag(torch.cuda.get_device_name())
    (out / f"dsa-{tag}-{stamp}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
