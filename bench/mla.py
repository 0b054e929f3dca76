#!/usr/bin/env python3
"""GPU benchmark of attngen's MLA Triton kernels against FlashMLA, SGLang's Triton MLA decode
and FA4, in one process, every output checked.

Absorbed decode (one query per request, page 64, bf16 q): attngen ``absorbed`` (the generated
config, splits from PagedMlaBackend's heuristic) vs FlashMLA ``flash_mla_with_kvcache`` and
SGLang's ``decode_attention_fwd_grouped`` (bf16 only; it reads the same cache through per-token
indices) on the same latent cache, B64 ctx4096 and B128 ctx8192 at h_q 128 and 16, bf16, fp8
e4m3 and NVFP4 latent (NVFP4: attngen only; FlashMLA's fp8 path takes an fp8 q; attngen keeps q
bf16, so the fp8 rows compare speed only). TFLOP/s = 2 B H ctx (576 + 512) / time; TB/s =
latent bytes / time. ``--sweep``: decode tile variants (heads, rows, warps, stages, latent
column parts) and split counts per case, each output checked against an fp32 reference on
the first and last request. Prefill: ragged 192/128 causal with LSE, 4 x 4096 tokens, 128
heads, attngen ``ragged`` vs FA4 ``flash_attn_varlen_func(..., return_lse=True)``.

Run on the H200 from the repo root (FlashMLA packed by ../shared/gpu/pack-flashmla.sh DIR;
SGLang's file ``sglang/srt/layers/attention/triton_ops/decode_attention.py`` from the sglang
wheel, loaded with its one sglang import replaced; FA4 from /tmp/gpusite, see README.md):
``python3 bench/mla.py --flashmla DIR --sglang-decode FILE --sweep --out bench/results``.
``--precompile N`` first compiles every kernel the run needs in N processes (the Triton cache
is shared), so the timed process mostly loads binaries.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import datetime
import glob
import json
import os
import site
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.device_tag import device_tag  # noqa: E402
from bench.preflight import missing_cuda  # noqa: E402

CASES = ((64, 4096), (128, 8192))
HEADS = (128, 16)
PAGE = 64
SCALE = 192**-0.5
SUFFIX = {"bf16": "", "fp8": "_kvfp8_e4m3", "nvfp4": "_kvnvfp4"}

# Decode tiles (BLOCK_H, BLOCK_N, warps, stages, latent column parts[, keys-major[, value
# reload[, Gluon]]]) swept per
# (heads, kv), the ones that compiled spill-free on sm_90a (AOT, Triton 3.6);
# each is timed with the split counts of SPLITS ("auto": the backend's heuristic; 1: no
# partials, no combine).
SWEEP_TILES = {
    (128, "bf16"): (
        (64, 64, 8, 2, 1),
        (64, 64, 8, 2, 1, 0, 0, 1),
    ),
    (16, "fp8"): (
        (16, 64, 4, 2, 1, 0, 1),
        (16, 32, 4, 3, 1, 0, 1),
        (16, 64, 4, 3, 1, 0, 1),
        (16, 64, 4, 4, 1, 0, 1),
        (16, 32, 4, 4, 1, 0, 1),
        (16, 128, 4, 2, 1, 0, 1),
        (16, 64, 8, 3, 1, 0, 1),
        (16, 128, 8, 2, 1, 0, 1),
        (16, 16, 4, 3, 1, 0, 1),
        (16, 32, 2, 3, 1, 0, 1),
        (16, 64, 2, 2, 1, 0, 1),
        (16, 32, 4, 2, 2, 0, 1),
        (16, 64, 4, 2, 2, 0, 1),
        (16, 32, 4, 2, 1, 1, 1),
        (16, 64, 4, 2, 1, 1, 1),
        (16, 64, 4, 2, 1, 1, 0, 1),
        (16, 64, 4, 3, 1, 1, 0, 1),
    ),
    (16, "bf16"): (
        (16, 32, 4, 3, 1),
        (16, 32, 4, 2, 1),
        (16, 64, 4, 2, 1),
        (16, 64, 4, 3, 1),
        (16, 64, 8, 2, 1, 1, 0, 1),
    ),
    (32, "bf16"): (
        (32, 64, 8, 2, 1),
        (32, 64, 8, 2, 1, 1, 0, 1),
    ),
    (128, "fp8"): (
        (64, 64, 8, 2, 1, 0, 0, 1),
        (32, 32, 8, 2, 1),
        (64, 32, 8, 2, 2),
        (32, 32, 8, 2, 1, 0, 1),
        (64, 32, 8, 2, 2, 0, 1),
    ),
}
SPLITS = {128: ("auto", 1), 16: ("auto", 2, 4, 8, 16), 32: ("auto", 2, 4, 8)}


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

        return flash_mla, "sglang-kernel 0.4.5"
    except Exception as e:  # noqa: BLE001  (a missing peer is reported, not fatal)
        return None, f"{type(e).__name__}: {e}"


def load_sglang_decode(path: str | None):
    """SGLang's Triton decode module from its wheel file; its only sglang import (is_hip) is
    replaced by a constant, the rest runs unchanged."""
    if not path:
        return None, "no --sglang-decode"
    try:
        src = Path(path).read_text()
        src = src.replace("from sglang.srt.utils import is_hip", "def is_hip():\n    return False")
        mod = types.ModuleType("sglang_decode_attention")
        mod.__file__ = str(path)
        sys.modules[mod.__name__] = mod
        exec(compile(src, str(path), "exec"), mod.__dict__)
        return mod, "sglang 0.5.10.post1 decode_attention.py"
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"


def load_fa4():
    try:
        import importlib.metadata

        from flash_attn.cute import flash_attn_varlen_func

        return flash_attn_varlen_func, importlib.metadata.version("flash-attn-4")
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"


def modules():
    from generated.sm90.triton.mla.mla_deepseek_v3 import kernels as k16
    from generated.sm90.triton.mla.mla_deepseek_v3_fp8 import kernels as k8
    from generated.sm90.triton.mla.mla_deepseek_v3_nvfp4 import kernels as k4

    return {"bf16": k16, "fp8": k8, "nvfp4": k4}


def base_config(mods, heads, kv):
    return mods[kv].CONFIGS[f"r512_rope64_h{heads}_ps{PAGE}_bf16{SUFFIX[kv]}_causal"]


def tiled(cfg, tile):
    bh, bn, warps, stages, parts = tile[:5]
    return dataclasses.replace(
        cfg,
        decode_block_h=bh,
        decode_block_n=bn,
        decode_num_warps=warps,
        decode_num_stages=stages,
        decode_lora_parts=parts,
        decode_keys_major=tile[5] if len(tile) > 5 else 0,
        decode_value_reload=tile[6] if len(tile) > 6 else 0,
        decode_gluon=tile[7] if len(tile) > 7 else 0,
        decode_max_registers=tile[8] if len(tile) > 8 else 0,
    )


class Case:
    """One decode problem: q, a shuffled page table and the latent cache in one dtype."""

    def __init__(self, torch, heads, b, ctx, kv, seed=0):
        from attngen.runtime.nvfp4 import nvfp4_global_scale, quantize_nvfp4

        g = torch.Generator(device="cuda").manual_seed(seed)
        dev = "cuda"
        self.heads, self.b, self.ctx, self.kv = heads, b, ctx, kv
        pages = b * ctx // PAGE
        perm = torch.randperm(pages, device=dev, generator=g).to(torch.int32) + 1
        self.table = perm.view(b, ctx // PAGE).contiguous()
        self.lens = torch.full((b,), ctx, dtype=torch.int32, device=dev)
        self.q = torch.randn(b, heads, 576, device=dev, dtype=torch.bfloat16, generator=g)
        self.cache16 = torch.randn(
            pages + 1, PAGE, 1, 576, device=dev, dtype=torch.bfloat16, generator=g
        )
        self.block_scales = None
        if kv == "bf16":
            self.cache, self.scale = self.cache16, None
        elif kv == "fp8":
            self.cache = (self.cache16 * 4).to(torch.float8_e4m3fn)
            self.scale = torch.tensor([0.25], device=dev)
        else:
            self.scale = nvfp4_global_scale(self.cache16)
            self.cache, self.block_scales = quantize_nvfp4(self.cache16, self.scale)
        self.flops = 2 * b * heads * ctx * (576 + 512)
        row_bytes = self.cache.shape[-1] * self.cache.element_size()
        self.nbytes = b * ctx * (row_bytes + (36 if kv == "nvfp4" else 0))
        self._ref = None

    def latent_rows(self, i):
        """Dequantized fp32 latent rows of request i, in key order."""
        idx = self.table[i].long()
        if self.kv == "bf16":
            rows = self.cache16[idx].float()
        elif self.kv == "fp8":
            rows = self.cache[idx].float() * 0.25
        else:
            from attngen.runtime.nvfp4 import dequantize_nvfp4

            rows = dequantize_nvfp4(self.cache[idx], self.block_scales[idx], self.scale).float()
        return rows.reshape(-1, 576)[: self.ctx]

    def reference(self):
        """fp32 outputs of the first and last request: {i: [H, 512]}."""
        import torch

        if self._ref is None:
            self._ref = {}
            for i in (0, self.b - 1):
                k = self.latent_rows(i)
                s = self.q[i].float() @ k.T * SCALE
                self._ref[i] = torch.softmax(s, -1) @ k[:, :512]
        return self._ref

    def check(self, out):
        """Max |out - ref| over the checked requests, and whether it is within bounds (NaN
        anywhere fails)."""
        worst, ok = 0.0, not bool(out.isnan().any())
        for i, want in self.reference().items():
            err = (out[i].float() - want).abs().max().item()
            ok &= err <= 4e-3 + 2e-2 * want.abs().max().item()
            worst = max(worst, err)
        return worst, ok


def attngen_call(mod, cfg, case, splits):
    """A closure timing attngen's absorbed decode with ``splits`` (None: one split, no
    partials) into a fresh NaN-filled output, and that output."""
    import torch

    out = torch.full((case.b, case.heads, 512), float("nan"), device="cuda", dtype=torch.bfloat16)
    po, pl = (
        mod.absorbed_workspace(cfg, rows=case.b, device="cuda")
        if splits is not None
        else (
            None,
            None,
        )
    )

    def run():
        mod.absorbed(
            case.q,
            None,
            case.cache,
            case.table,
            case.lens,
            splits,
            out,
            po,
            pl,
            config=cfg,
            sm_scale=SCALE,
            kv_scale=case.scale,
            kv_block_scales=case.block_scales,
            trusted_metadata=True,
        )

    return run, out


def for_splits(cfg, choice):
    """``cfg`` able to run ``choice`` splits: a count past its max_splits raises it (a larger
    workspace); "auto" and 1 leave it as it is."""
    if isinstance(choice, int) and choice > cfg.max_splits:
        return dataclasses.replace(cfg, max_splits=choice)
    return cfg


def split_tensor(torch, cfg, case, choice):
    """The per-request split counts of ``choice`` ("auto": the backend's heuristic) and the
    count itself; (None, 1) for one split without partials."""
    import triton

    from attngen.families.mha.runtime import decode_num_splits
    from attngen.families.mla.runtime import MIN_SPLIT_TOKENS, split_cap

    if choice == 1:
        return None, 1
    if choice == "auto":
        programs = case.b * triton.cdiv(case.heads, cfg.decode_block_h) * cfg.decode_lora_parts
        cap = split_cap(
            programs_per_split=programs,
            num_sms=132,
            waves=cfg.decode_waves,
            max_splits=cfg.max_splits,
        )
        if cap == 1:  # as the backend: one split per request, no partials
            return None, 1
        min_tokens = max(MIN_SPLIT_TOKENS, cfg.decode_block_n)
        return decode_num_splits(case.lens, cap=cap, min_split_tokens=min_tokens), cap
    return torch.full((case.b,), choice, dtype=torch.int32, device="cuda"), choice


@dataclasses.dataclass(frozen=True)
class Timer:
    """How calls are timed (--timer): "graph" replays a decode call captured in a CUDA graph
    (as a serving engine runs decode; the host's launch cost is out), "events" times eager
    calls between CUDA events (a call shorter than its Python launch path measures the
    host). ``do_bench`` is triton.testing's eager timer."""

    mode: str
    do_bench: Callable


def time_it(fn, timer: Timer, quick=False, graph=True):
    """Milliseconds per call of ``fn`` under ``timer`` (peers alike). Prefill (graph=False)
    is always timed eagerly."""
    if graph and timer.mode == "graph":
        from bench.graph_timing import graph_ms

        return graph_ms(fn, rep=50 if quick else 100)
    fn()
    return timer.do_bench(fn, warmup=25 if quick else 50, rep=100 if quick else 200)


def flashmla_row(fm, case, ours_out, timer):
    import torch

    b, heads = case.b, case.heads
    q4 = case.q.view(b, 1, heads, 576)
    if case.kv == "fp8":
        meta, splits = fm.get_mla_metadata(case.lens, heads, 1, is_fp8_kvcache=True)
        one = torch.ones(1, device="cuda")
        q8 = q4.to(torch.float8_e4m3fn)

        def peer():
            return fm.flash_mla_with_kvcache(
                q8,
                case.cache,
                case.table,
                case.lens,
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
        meta, splits = fm.get_mla_metadata(case.lens, heads, 1)

        def peer():
            return fm.flash_mla_with_kvcache(
                q4,
                case.cache,
                case.table,
                case.lens,
                512,
                meta,
                splits,
                softmax_scale=SCALE,
                causal=False,
            )

    o, _ = peer()
    diff = (o.view(b, heads, 512).float() - ours_out.float()).abs().max().item()
    t = time_it(peer, timer)
    return dict(
        flashmla_ms=t,
        flashmla_tflops=case.flops / t / 1e9,
        flashmla_tbs=case.nbytes / t / 1e9,
        max_diff_vs_flashmla=diff,
    )


def sglang_row(sg, case, ours_out, timer, max_splits=8):
    """SGLang's Triton MLA decode (page 1 view of the same cache: per-token indices)."""
    import torch

    b, heads, ctx = case.b, case.heads, case.ctx
    k_buf = case.cache16.view(-1, 1, 576)
    v_buf = k_buf[..., :512]
    slots = case.table.long()[:, :, None] * PAGE + torch.arange(PAGE, device="cuda")
    kv_indices = slots.reshape(-1).to(torch.int32)
    kv_indptr = torch.arange(b + 1, device="cuda", dtype=torch.int32) * ctx
    logits = torch.empty(b, heads, max_splits, 512, device="cuda", dtype=torch.float32)
    lse = torch.empty(b, heads, max_splits, device="cuda", dtype=torch.float32)
    splits = torch.full((b,), max_splits, device="cuda", dtype=torch.int32)
    o = torch.empty(b, heads, 512, device="cuda", dtype=torch.bfloat16)

    def peer():
        sg.decode_attention_fwd_grouped(
            case.q,
            k_buf,
            v_buf,
            o,
            kv_indptr,
            kv_indices,
            logits,
            lse,
            splits,
            max_splits,
            SCALE,
            1.0,
        )

    peer()
    diff = (o.float() - ours_out.float()).abs().max().item()
    t = time_it(peer, timer)
    return dict(sglang_ms=t, sglang_tflops=case.flops / t / 1e9, max_diff_vs_sglang=diff)


def decode_rows(torch, timer, mods, fm, fm_info, sg, sg_info, rows, save):
    for heads in HEADS:
        for b, ctx in CASES:
            for kv in ("bf16", "fp8", "nvfp4"):
                case = Case(torch, heads, b, ctx, kv)
                mod, cfg = mods[kv], base_config(mods, heads, kv)
                splits, count = split_tensor(torch, cfg, case, "auto")
                row = dict(part="decode", heads=heads, batch=b, ctx=ctx, kv=kv, page=PAGE)
                row["tile"] = tile_of(cfg)
                row["splits"] = count
                try:
                    fn, out = attngen_call(mod, cfg, case, splits)
                    t = time_it(fn, timer)
                    err, ok = case.check(out)
                except Exception as e:  # noqa: BLE001  (reported in the row, not fatal)
                    row["attngen_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    rows.append(row)
                    save()
                    print(json.dumps(row), flush=True)
                    continue
                row.update(
                    attngen_ms=t,
                    attngen_tflops=case.flops / t / 1e9,
                    attngen_tbs=case.nbytes / t / 1e9,
                    max_err_vs_ref=err,
                    ref_ok=ok,
                )
                if kv == "nvfp4":
                    row["flashmla_error"] = "no NVFP4 path"
                elif fm is not None:
                    try:
                        row.update(flashmla_row(fm, case, out, timer))
                    except Exception as e:  # noqa: BLE001
                        row["flashmla_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                else:
                    row["flashmla_error"] = fm_info
                if kv == "bf16":
                    if sg is not None:
                        try:
                            row.update(sglang_row(sg, case, out, timer))
                        except Exception as e:  # noqa: BLE001
                            row["sglang_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    else:
                        row["sglang_error"] = sg_info
                rows.append(row)
                save()
                print(json.dumps(row), flush=True)
                del case
                torch.cuda.empty_cache()


def tile_of(cfg):
    return [
        cfg.decode_block_h,
        cfg.decode_block_n,
        cfg.decode_num_warps,
        cfg.decode_num_stages,
        cfg.decode_lora_parts,
        cfg.decode_keys_major,
        cfg.decode_value_reload,
        cfg.decode_gluon,
        cfg.decode_max_registers,
    ]


def sweep_rows(torch, timer, mods, fm, rows, save, only=None, groups=None, tiles_only=None):
    """Every SWEEP_TILES tile with every SPLITS choice on both cases (``only``: a set of
    (heads, kv, tile, splits) to restrict to; ``groups``: a set of (heads, kv)); FlashMLA
    timed once per case for the ratio (see ``for_splits`` for split counts past max_splits)."""
    for (heads, kv), tiles in SWEEP_TILES.items():
        if groups is not None and (heads, kv) not in groups:
            continue
        if f"r512_rope64_h{heads}_ps{PAGE}_bf16{SUFFIX[kv]}_causal" not in mods[kv].CONFIGS:
            print(f"sweep: no {kv} variant with {heads} heads generated; skipped", flush=True)
            continue
        for b, ctx in CASES:
            case = Case(torch, heads, b, ctx, kv)
            fm_ms = None
            for tile in tiles:
                if tiles_only is not None and tuple(tile) not in tiles_only:
                    continue
                tiled_cfg = tiled(base_config(mods, heads, kv), tile)
                for choice in SPLITS[heads]:
                    cfg = for_splits(tiled_cfg, choice)
                    if only is not None and (heads, kv, tuple(tile), str(choice)) not in only:
                        continue
                    splits, count = split_tensor(torch, cfg, case, choice)
                    row = dict(
                        part="sweep",
                        heads=heads,
                        batch=b,
                        ctx=ctx,
                        kv=kv,
                        tile=list(tile),
                        splits=str(choice),
                        split_count=count,
                    )
                    try:
                        fn, out = attngen_call(mods[kv], cfg, case, splits)
                        t = time_it(fn, timer, quick=True)
                        err, ok = case.check(out)
                        row.update(
                            attngen_ms=t,
                            attngen_tflops=case.flops / t / 1e9,
                            attngen_tbs=case.nbytes / t / 1e9,
                            max_err_vs_ref=err,
                            ref_ok=ok,
                        )
                        if fm is not None and fm_ms is None:
                            fm_ms = flashmla_row(fm, case, out, timer)["flashmla_ms"]
                        if fm_ms is not None:
                            row["flashmla_ms"] = fm_ms
                            row["ratio_vs_flashmla"] = fm_ms / t
                    except Exception as e:  # noqa: BLE001
                        row["attngen_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    rows.append(row)
                    save()
                    print(json.dumps(row), flush=True)
            del case
            torch.cuda.empty_cache()


def prefill_rows(torch, timer, mods, fa4, fa4_info, rows, save, tiles=(None,)):
    """The causal 192/128 prefill with LSE, once per ragged tile (None: the generated one;
    else (BLOCK_M, BLOCK_N, warps, stages)); FA4 timed once, next to the first. Returns
    FA4's time (None without FA4)."""
    base = mods["bf16"].CONFIGS["r512_rope64_h128_ps64_bf16_causal"]
    t4 = None
    for tile in tiles:
        cfg = base
        if tile is not None:
            bm, bn, w, st = tile
            cfg = dataclasses.replace(
                base, ragged_block_m=bm, ragged_block_n=bn, ragged_num_warps=w,
                ragged_num_stages=st,
            )  # fmt: skip
        t4 = prefill_row(torch, timer, mods["bf16"], cfg, fa4, fa4_info, rows, save, t4)
    return t4


def prefill_inputs(torch):
    """The prefill case's tensors (4 x 4096 tokens, 128 heads, qk 192, v 128): fresh random
    q/k/v (k's last 64 columns are the rope part, per head), the indptrs, NaN outputs."""
    s, b, h = 4096, 4, 128
    t = s * b
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(t, h, 192, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(t, h, 192, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(t, h, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    indptr = torch.arange(b + 1, device="cuda", dtype=torch.int32) * s
    out = torch.full((t, h, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((t, h), float("nan"), device="cuda", dtype=torch.float32)
    flops = 2 * b * h * s * s * (192 + 128) / 2
    return types.SimpleNamespace(s=s, b=b, h=h, t=t, q=q, k=k, v=v, indptr=indptr, out=out,
                                 lse=lse, flops=flops)  # fmt: skip


def prefill_errors(torch, inp, out, lse=None) -> dict:
    """Max errors of out (and lse) against the float reference on the last 64 queries of the
    last sequence (they see all s keys), and whether any NaN of the fill is left."""
    s, t = inp.s, inp.t
    lo = t - 64
    qs, ks, vs = inp.q[lo:t].float(), inp.k[t - s : t].float(), inp.v[t - s : t].float()
    sc = torch.einsum("qhd,khd->hqk", qs, ks) * SCALE
    pos_q = torch.arange(s - 64, s, device="cuda")[:, None]
    sc = sc.masked_fill(torch.arange(s, device="cuda")[None, :] > pos_q, float("-inf"))
    want = torch.einsum("hqk,khd->qhd", torch.softmax(sc, -1), vs)
    errs = dict(
        max_err_vs_ref=(out[lo:t].float() - want).abs().max().item(),
        nan_left=bool(out.isnan().any() or (lse is not None and lse.isnan().any())),
    )
    if lse is not None:
        errs["max_lse_err_vs_ref"] = (lse[lo:t] - torch.logsumexp(sc, -1).T).abs().max().item()
    return errs


def prefill_row(torch, timer, k16, cfg, fa4, fa4_info, rows, save, t4):
    inp = prefill_inputs(torch)
    q, k, v, indptr, out, lse = inp.q, inp.k, inp.v, inp.indptr, inp.out, inp.lse
    s, b, h, flops = inp.s, inp.b, inp.h, inp.flops

    def ours():
        k16.ragged(
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

    ms = time_it(ours, timer, graph=False)
    row = dict(
        part="prefill",
        heads=h,
        batch=b,
        ctx=s,
        tile=[cfg.ragged_block_m, cfg.ragged_block_n, cfg.ragged_num_warps, cfg.ragged_num_stages],
        attngen_ms=ms,
        attngen_tflops=flops / ms / 1e9,
    )
    row.update(prefill_errors(torch, inp, out, lse))
    if fa4 is not None:
        try:

            def peer():
                return fa4(
                    q,
                    k,
                    v,
                    cu_seqlens_q=indptr,
                    cu_seqlens_k=indptr,
                    max_seqlen_q=s,
                    max_seqlen_k=s,
                    softmax_scale=SCALE,
                    causal=True,
                    return_lse=True,
                )

            o4, l4 = peer()
            row["max_diff_vs_fa4"] = (o4.float() - out.float()).abs().max().item()
            l4 = l4 if l4.shape == lse.shape else l4.transpose(0, 1)
            row["max_lse_diff_vs_fa4"] = (l4.float() - lse).abs().max().item()
            t4 = t4 if t4 is not None else time_it(peer, timer, graph=False)
            row.update(fa4_ms=t4, fa4_tflops=flops / t4 / 1e9, ratio_vs_fa4=t4 / ms)
        except Exception as e:  # noqa: BLE001
            row["fa4_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    else:
        row["fa4_error"] = fa4_info
    rows.append(row)
    save()
    print(json.dumps(row), flush=True)
    return t4


def prefill_variant_rows(torch, timer, t4, rows, save):
    """The prefill case on kernels outside the library, each output checked, beside the
    library row's FA4 time t4: the TMA variants of bench/experimental/mla_prefill_tma.py,
    and the CuTe DSL MHA forward at qk 192 / v 128 (spec mha_mla_prefill, its cache-free
    prefill with the LSE: what PagedMlaBackend runs the new tokens on with prefill_kernels).
    Its per-head keys are given; joining k_nope and a shared k_rope into them, as the
    backend does then (per_head_keys), is timed apart."""
    from bench.experimental import mla_prefill_tma as tma

    inp = prefill_inputs(torch)
    q, k, v, indptr, s = inp.q, inp.k, inp.v, inp.indptr, inp.s
    base = dict(part="prefill_variant", heads=inp.h, batch=inp.b, ctx=s)

    def record(row, ms, out, lse=None):
        row.update(attngen_ms=ms, attngen_tflops=inp.flops / ms / 1e9)
        row.update(prefill_errors(torch, inp, out, lse))
        if t4:
            row.update(fa4_ms=t4, ratio_vs_fa4=t4 / ms)
        rows.append(row)
        save()
        print(json.dumps(row), flush=True)

    for variant in tma.VARIANTS:
        row = dict(base, kernel="tma", tile=list(variant))
        out = torch.full_like(inp.out, float("nan"))
        lse = torch.full_like(inp.lse, float("nan"))

        def run(variant=variant, out=out, lse=lse):
            tma.launch(q, k[..., :128], k[..., 128:], v, indptr, indptr, out, lse,
                       max_q_len=s, sm_scale=SCALE, variant=variant)  # fmt: skip

        try:
            record(row, time_it(run, timer, graph=False), out, lse)
        except Exception as e:  # noqa: BLE001
            row["attngen_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            rows.append(row)
    try:
        import importlib

        from attngen.families.mha.cute_dsl.config import MhaCuteTraits

        cute = importlib.import_module("generated.sm90.cute_dsl.mha.mha_mla_prefill.kernels")
    except Exception as e:  # noqa: BLE001
        rows.append(dict(base, kernel="cute_dsl", attngen_error=f"{type(e).__name__}: {e}"))
        return
    from attngen.families.mla.runtime import per_head_keys

    traits = MhaCuteTraits(cute.HOOKS, ("prefill",))
    k_nope, k_rope = k[..., :128].contiguous(), k[:, :1, 128:].contiguous()  # a shared rope
    concat_ms = time_it(lambda: per_head_keys(k_nope, k_rope, inp.h), timer, graph=False)
    for uri, cfg in sorted(cute.CONFIGS.items()):
        row = dict(base, kernel="cute_dsl", tile=[cfg.fwd_tile_m, cfg.fwd_tile_n,
                                                  cfg.fwd_num_stages], config=uri)  # fmt: skip
        out = torch.full_like(inp.out, float("nan"))
        lse = torch.full_like(inp.lse, float("nan"))

        def run(cfg=cfg, out=out, lse=lse):
            cute.library.prefill(q, k, v, indptr, out, max_seq_len=s, config=cfg,
                                 traits=traits, sm_scale=SCALE, lse=lse)  # fmt: skip

        try:
            record(row, time_it(run, timer, graph=False), out, lse)
            row["k_concat_ms"] = concat_ms
            save()
        except Exception as e:  # noqa: BLE001
            row["attngen_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            rows.append(row)


def precompile(share: int, shares: int, groups=None, decode_table=True) -> None:
    """Compile (by running once, on a B2 ctx4096 case with the same specializations) every
    kernel the sweep (its ``groups``, None: all) and the decode table use, share ``share``
    of ``shares``."""
    import torch

    mods = modules()
    jobs = []
    for (heads, kv), tiles in SWEEP_TILES.items():
        if groups is None or (heads, kv) in groups:
            jobs += [(heads, kv, tuple(t)) for t in tiles]
    if decode_table:
        for heads in HEADS:
            for kv in ("bf16", "fp8", "nvfp4"):
                jobs.append((heads, kv, None))
    cases = {}
    for n, (heads, kv, tile) in enumerate(jobs):
        if n % shares != share:
            continue
        case = cases.get((heads, kv)) or cases.setdefault(
            (heads, kv), Case(torch, heads, 2, 4096, kv)
        )
        cfg = base_config(mods, heads, kv)
        cfg = tiled(cfg, tile) if tile else cfg
        for choice in (1, 2, *(c for c in SPLITS[heads] if isinstance(c, int) and c > 2)):
            try:
                run_cfg = for_splits(cfg, choice)
                splits, _ = split_tensor(torch, run_cfg, case, choice)
                attngen_call(mods[kv], run_cfg, case, splits)[0]()
            except Exception as e:  # noqa: BLE001  (the timed run reports it)
                print(f"precompile {heads} {kv} {tile}: {type(e).__name__}: {str(e)[:200]}")
    torch.cuda.synchronize()


def main() -> int | None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flashmla")
    ap.add_argument("--sglang-decode")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--sweep", action="store_true", help="decode tile and split sweep")
    ap.add_argument("--best-of", help="a previous run's JSON: sweep only its 3 best per group")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: decode,prefill")
    ap.add_argument("--groups", help="sweep only these (heads:kv,...), e.g. 16:fp8,16:bf16")
    ap.add_argument("--tiles", help="sweep only these tiles (AxBx...,...), e.g. 16x64x8x2x1x1x0x1")
    ap.add_argument(
        "--prefill-tiles", help="ragged tiles to time (BMxBNxWARPSxSTAGES,...); default: generated"
    )
    ap.add_argument(
        "--prefill-variants",
        action="store_true",
        help="prefill also on bench/experimental/mla_prefill_tma.py and the CuTe DSL forward",
    )
    ap.add_argument("--precompile", type=int, default=0, help="compile first in N processes")
    ap.add_argument(
        "--timer", choices=("graph", "events"), default="graph", help="see time_it (default graph)"
    )
    ap.add_argument("--compile-share", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if (code := missing_cuda("bench/mla.py")) is not None:
        return code
    if args.compile_share:
        share, shares = map(int, args.compile_share.split("/"))
        precompile(share, shares, parse_groups(args.groups), "decode" not in args.skip)
        return
    if args.precompile:
        start = time.time()
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--compile-share", f"{i}/{args.precompile}"]
                + (["--groups", args.groups] if args.groups else [])
                + ["--skip", args.skip]
            )
            for i in range(args.precompile)
        ]
        for p in procs:
            p.wait()
        print(f"precompiled in {time.time() - start:.0f} s", flush=True)
    import torch
    import triton
    from triton.testing import do_bench

    timer = Timer(args.timer, do_bench)
    mods = modules()
    fm, fm_info = load_flashmla(args.flashmla)
    sg, sg_info = load_sglang_decode(args.sglang_decode)
    fa4, fa4_info = load_fa4()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%MZ")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"mla-{device_tag(torch.cuda.get_device_name())}-{stamp}.json"
    result = dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        triton=triton.__version__,
        commit=os.environ.get("ATTNGEN_COMMIT", ""),
        peers=dict(flashmla=fm_info, sglang_triton_decode=sg_info, fa4=fa4_info),
        shapes=dict(decode_cases=CASES, heads=HEADS, page=PAGE, prefill="4 x 4096, h128, 192/128"),
        timer=args.timer,
        rows=[],
    )

    def save():
        path.write_text(json.dumps(result, indent=1))

    skip, rows = set(args.skip.split(",")), result["rows"]
    if args.best_of and not Path(args.best_of).exists():
        print(f"no {args.best_of}: no sweep", flush=True)
    elif args.sweep or args.best_of:
        only = best_keys(args.best_of) if args.best_of else None
        tiles_only = None
        if args.tiles:
            tiles_only = {tuple(map(int, t.split("x"))) for t in args.tiles.split(",")}
        sweep_rows(torch, timer, mods, fm, rows, save, only, parse_groups(args.groups), tiles_only)
    if "decode" not in skip:
        decode_rows(torch, timer, mods, fm, fm_info, sg, sg_info, rows, save)
    if "prefill" not in skip:
        tiles = (None,)
        if args.prefill_tiles:
            tiles = [tuple(map(int, t.split("x"))) for t in args.prefill_tiles.split(",")]
        t4 = prefill_rows(torch, timer, mods, fa4, fa4_info, rows, save, tiles)
        if args.prefill_variants:
            prefill_variant_rows(torch, timer, t4, rows, save)
    save()
    print_table(result["rows"])
    print(f"wrote {path}")


def parse_groups(text):
    """``16:fp8,16:bf16`` -> {(16, "fp8"), (16, "bf16")}; None for all."""
    if not text:
        return None
    return {(int(h), kv) for h, kv in (g.split(":") for g in text.split(","))}


def best_keys(path, keep=3):
    rows = [r for r in json.loads(Path(path).read_text())["rows"] if r["part"] == "sweep"]
    groups = {}
    for r in rows:
        if "attngen_ms" in r and r.get("ref_ok"):
            groups.setdefault((r["heads"], r["kv"], r["batch"]), []).append(r)
    keys = set()
    for group in groups.values():
        for r in sorted(group, key=lambda r: r["attngen_ms"])[:keep]:
            keys.add((r["heads"], r["kv"], tuple(r["tile"]), r["splits"]))
    return keys


def print_table(rows):
    print(
        f"{'part':8}{'H':>5}{'B':>5}{'ctx':>6}{'kv':>6} {'tile':18}{'spl':>5}{'ours ms':>9}"
        f"{'TF/s':>6}{'TB/s':>6}{'FMLA ms':>9}{'x FMLA':>7}{'SGL ms':>8}{'x SGL':>7}{'ok':>4}"
    )
    best = {}
    for r in rows:
        if "attngen_error" in r:
            print(
                f"{r['part']} h{r['heads']} B{r['batch']} {r.get('kv')} {r.get('tile')} "
                f"{r.get('splits')}: {r['attngen_error'][:160]}"
            )
            continue
        if r["part"] == "prefill_variant":
            print(
                f"prefill {r['kernel']} {r.get('tile')}: {r['attngen_ms']:.3f} ms "
                f"{r['attngen_tflops']:.0f} TF/s; x FA4 {r.get('ratio_vs_fa4', float('nan')):.2f}; "
                f"err {r['max_err_vs_ref']:.4f} lse {r.get('max_lse_err_vs_ref', float('nan')):.4f}"
                f"{' NaN left' if r['nan_left'] else ''}"
            )
            continue
        if r["part"] == "prefill":
            print(
                f"prefill h{r['heads']} {r['batch']}x{r['ctx']}: {r['attngen_ms']:.3f} ms "
                f"{r['attngen_tflops']:.0f} TF/s; FA4 {r.get('fa4_ms', float('nan')):.3f} ms "
                f"{r.get('fa4_tflops', float('nan')):.0f} TF/s; ratio {r.get('ratio_vs_fa4', float('nan')):.2f}; "
                f"err {r['max_err_vs_ref']:.4f} lse {r['max_lse_err_vs_ref']:.4f} {r.get('fa4_error', '')}"
            )
            continue
        fm = r.get("flashmla_ms", float("nan"))
        sg = r.get("sglang_ms", float("nan"))
        print(
            f"{r['part'] + ('/' + r['kernel'] if 'kernel' in r else ''):8}{r['heads']:5}{r['batch']:5}{r['ctx']:6}{r['kv']:>6} "
            f"{str(r['tile']):18}{str(r['splits']):>5}{r['attngen_ms']:9.3f}"
            f"{r.get('attngen_tflops', float('nan')):6.0f}{r['attngen_tbs']:6.2f}"
            f"{fm:9.3f}{fm / r['attngen_ms']:7.2f}"
            f"{sg:8.3f}{sg / r['attngen_ms']:7.2f}{'y' if r['ref_ok'] else 'N':>4}"
        )
        if r["part"] == "sweep" and r["ref_ok"]:
            key = (r["heads"], r["kv"], r["batch"])
            if key not in best or r["attngen_ms"] < best[key]["attngen_ms"]:
                best[key] = r
    for (h, kv, b), r in sorted(best.items()):
        print(
            f"best h{h} {kv} B{b}: tile {r['tile']} splits {r['splits']} "
            f"{r['attngen_ms']:.3f} ms x{r.get('ratio_vs_flashmla', float('nan')):.2f} FlashMLA"
        )


if __name__ == "__main__":
    sys.exit(main())
