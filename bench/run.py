#!/usr/bin/env python3
"""GPU benchmark: attngen's generated MHA kernels side by side with peers, one run.

Decode (paged, one query per sequence): attngen ``decode`` vs FA4 ``flash_attn_varlen_func``
with ``page_table`` + ``seqused_k``; TB/s = bytes of K and V of every cached token / time.
Quantized decode: attngen ``decode`` over fp8 e4m3 and NVFP4 caches of the same K/V; the
ratios are the bf16 decode times (attngen's and FA4's, same run) over the quantized one.
Verify (speculative, draft chains): attngen ``verify`` vs FA4 with a page table and
bottom-right causal; TB/s as for decode.
Prefill (16k tokens per call): attngen ``extend`` with prefix 0 (Triton; and the CuTe DSL
kernels where a spec generates them: column ``cute``) vs FA4 ``flash_attn_func``, cuDNN and
FA2 through SDPA; TFLOP/s = 2*B*Hq*S*S*(Dqk+Dv) / time, halved when causal.
Extend (chunked prefill over a cached prefix): attngen ``extend`` of S new causal rows per
request over a P-token paged prefix (each generated backend) vs FA4 ``flash_attn_varlen_func``
with the same ``page_table`` and ``seqused_k`` (bottom-right causal); TFLOP/s =
2*B*Hq*(S*P + S*S/2)*(Dqk+Dv) / time.
API host cost: attngen's backend (``make_backend``) per decode layer call, eager vs its CUDA
graph replay, and the metadata calls per step (bench/api_cost.py).
Run from the repo root: ``python bench/run.py --out bench/results`` (see bench/README.md).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import inspect
import json
import math
import os
import subprocess
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench.device_tag import device_tag  # noqa: E402 (import-free: no torch)
from bench.preflight import missing_cuda  # noqa: E402
from bench.paired_timing import run_then_pair  # noqa: E402 (import-free: no torch)

HQ, HKV, D = 32, 8, 128  # q heads, kv heads, head dim (qk = v)
# (q heads, kv heads, qk dim, v dim) of the head-dim prefill rows (--only head_dims), each
# next to a spec that generates it: gqa_prefill (64), head_dim_256, mla_prefill (192/128)
HEAD_DIM_SHAPES = ((32, 8, 64, 64), (16, 8, 256, 256), (128, 128, 192, 128))
HEAD_DIM_SEQLENS = (1024, 4096)
DTYPE = "bfloat16"  # of q, out and the KV cache
SCALE = 1.0 / math.sqrt(D)
DECODE_CASES = ((64, 4096), (128, 8192))  # (batch, context)
PAGE_SIZES = (1, 64, 128)
PREFILL_TOKENS = 16384
PREFILL_SEQLENS = (1024, 4096, 8192, 16384)
EXTEND_CASES = ((16, 2048, 512), (8, 4096, 1024), (4, 8192, 2048))  # (batch, prefix, new)
PEERS = ("fa4", "cudnn", "fa2")
ATOL, RTOL = 4e-3, 2e-2  # mismatch when max|out - ref| > ATOL + RTOL * max|ref|
WARMUP_MS, REP_MS = 50, 200
# prefill, head-dim and extend rows: every kernel of a row timed in the same interleaved
# rounds, each sample the mean of PAIRED_CALLS back-to-back calls (bench/paired_timing.py)
PAIRED_ROUNDS, PAIRED_CALLS = 15, 5
DEV = "cuda"

torch = None  # imported in main(), so that --help needs nothing


def log(msg: str) -> None:
    print(msg, flush=True)


def rand(*shape):
    return torch.randn(*shape, dtype=getattr(torch, DTYPE), device=DEV)


def sync() -> None:
    """Wait for the device (a no-op when the bench runs on CPU tensors, as the tests do)."""
    if DEV == "cuda":
        torch.cuda.synchronize()


def short(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"


# -- attngen side ----


BACKENDS = ("triton", "cute_dsl")  # generated backends timed, each in its own result column
RESULT = {"triton": "attngen", "cute_dsl": "attngen_cute"}  # result key of each backend
# a row's ratio keys: "<prefix><peer>" for each attngen result key (bench/plot.py reads them)
RATIO_PREFIX = {"attngen": "", "attngen_cute": "cute_"}


def load_attngen() -> tuple[list, dict]:
    """Every generated sm90 MHA variant as ("<backend>/<spec>", module, config), and import
    errors by spec."""
    sys.path.insert(0, str(ROOT))
    variants, errors = [], {}
    for backend in BACKENDS:
        for path in sorted((ROOT / "generated" / "sm90" / backend / "mha").glob("*/kernels.py")):
            spec = f"{backend}/{path.parent.name}"
            try:
                mod = importlib.import_module(
                    f"generated.sm90.{backend}.mha.{path.parent.name}.kernels"
                )
            except Exception as e:  # a broken module must not stop the peers
                errors[spec] = short(e)
                continue
            for _uri, cfg in sorted(getattr(mod, "CONFIGS", {}).items()):
                variants.append((spec, mod, cfg))
    return variants, errors


def plain_mask(mod) -> bool:
    """Whether a generated module attends every key its phase allows: no sliding window, no
    softcap, no sinks (the peers run none of them). Every phase's variant must be plain: a
    windowed decode reads only the window's keys, so it looks fast and disagrees."""
    hooks = getattr(mod, "HOOKS", None)  # generated modules: MaskHooks
    return hooks is None or (
        hooks.window_left is None and not hooks.logit_softcap and not hooks.sinks
    )


def extend_mask_kwargs(mod, cfg, causal: bool) -> dict | None:
    """Extra kwargs that ask ``mod.extend`` for this mask (of a :func:`plain_mask` module);
    None when the variant lacks it."""
    hooks = getattr(mod, "HOOKS", None)  # generated modules: MaskHooks
    if hooks is not None:
        return {} if hooks.causal == causal and not hooks.tree else None
    for owner, name in ((cfg, "causal"), (mod, "CAUSAL")):
        if hasattr(owner, name):
            return {} if bool(getattr(owner, name)) == causal else None
    if "causal" in inspect.signature(mod.extend).parameters:
        return {"causal": causal}
    return {} if causal else None  # attngen's extend is causal unless it says otherwise


def find_variant(
    variants,
    phase: str,
    page_size: int | None,
    causal: bool = True,
    kv: str = DTYPE,
    spec_topk: int = 0,
    backend: str = "triton",
    heads: tuple = (HQ, HKV, D, D),
):
    """(spec, module, config, extra kwargs) of the variant for ``heads`` (q heads, kv heads,
    qk dim, v dim), or None."""
    for spec, mod, cfg in variants:
        if not spec.startswith(backend + "/"):
            continue
        key = (
            cfg.head_dim,
            cfg.v_head_dim,
            cfg.gqa_group,
            cfg.page_size,
            cfg.dtype,
            getattr(cfg, "kv_dtype", DTYPE),
            getattr(cfg, "spec_topk", 0),
        )
        want = (heads[2], heads[3], heads[0] // heads[1], page_size, DTYPE, kv, spec_topk)
        if page_size is None:  # the cache-free prefill: any page size
            key, want = key[:3] + key[4:], want[:3] + want[4:]
        if key != want or phase not in getattr(mod, "PHASES", (phase,)) or not plain_mask(mod):
            continue
        kwargs = extend_mask_kwargs(mod, cfg, causal) if phase in ("extend", "prefill") else {}
        if kwargs is not None:
            return spec, mod, cfg, kwargs
    return None


def decode_splits(mod, cfg, seq_lens, num_sms: int):
    """Per-request KV splits [B] int32 as the backend picks them (from the kernels module
    ``mod``), else the brief's formula."""
    try:
        from attngen.families.mha.runtime import PagedMhaBackend

        shim = SimpleNamespace(
            num_q_heads=HQ, num_kv_heads=HKV, config=cfg, num_sms=num_sms, kernels=mod
        )
        splits = PagedMhaBackend._num_splits(shim, seq_lens, seq_lens.shape[0])
        return splits.to(torch.int32), "attngen.families.mha.runtime.PagedMhaBackend._num_splits"
    except Exception as e:
        why = short(e)
    n = max(1, min(math.ceil(2 * num_sms / (seq_lens.shape[0] * HKV)), cfg.max_splits))
    return torch.full_like(seq_lens, n), f"clamp(ceil(2*num_sms/(B*Hkv)), 1, max_splits) ({why})"


# -- peers ----


def load_fa4():
    """(flash_attn_func, flash_attn_varlen_func) or None, and the version or why not."""
    try:
        from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

        return (flash_attn_func, flash_attn_varlen_func), importlib.metadata.version("flash-attn-4")
    except Exception as e:
        return None, f"unavailable: {short(e)}"


def sdpa_fn(backend: str, q4, k4, v4, causal: bool):
    """SDPA pinned to one backend on [B, S, H, D] inputs: (fn, how GQA was done)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    be = getattr(SDPBackend, backend)
    qt, kt, vt = (x.transpose(1, 2) for x in (q4, k4, v4))  # [B, H, S, D] views

    def call(k, v, gqa):
        with sdpa_kernel(be):
            return sdpa(qt, k, v, is_causal=causal, scale=SCALE, enable_gqa=gqa)

    try:
        call(kt, vt, True)
        return (lambda: call(kt, vt, True)), "enable_gqa=True"
    except RuntimeError as e:
        why = short(e)
    ke, ve = (x.repeat_interleave(qt.shape[1] // kt.shape[1], dim=1) for x in (kt, vt))
    call(ke, ve, False)  # raises when the backend cannot run this at all
    return (lambda: call(ke, ve, False)), f"kv heads expanded before the call ({why})"


# -- measuring and checking ----


def measure(fn, work: float, unit: str):
    """Call fn once (its output comes back for checks), then time it: (result, output)."""
    from triton.testing import do_bench

    try:
        out = fn()
        torch.cuda.synchronize()
        ms = float(do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, return_mode="median"))
        return {"ms": ms, unit: work / (ms * 1e-3) / 1e12}, out
    except Exception as e:
        traceback.print_exc()
        return {"error": short(e)}, None


def reference(q, k, v, q_pos, causal: bool):
    """fp32 attention of one sequence: q [n, Hq, D] at positions q_pos, k/v [L, Hkv, D]."""
    g = q.shape[1] // k.shape[1]
    kf, vf = (x.float().repeat_interleave(g, dim=1) for x in (k, v))
    s = torch.einsum("nhd,lhd->hnl", q.float(), kf) * SCALE
    if causal:
        keys = torch.arange(k.shape[0], device=k.device)
        s.masked_fill_(keys[None, None, :] > q_pos[None, :, None], float("-inf"))
    return torch.einsum("hnl,lhd->nhd", s.softmax(-1), vf)


def compare(out, ref) -> dict:
    diff = (out.float() - ref.float()).abs().max().item()  # NaN stays NaN and fails below
    tol = ATOL + RTOL * ref.float().abs().max().item()
    return {"max_abs_diff": diff, "tol": tol, "ok": bool(diff <= tol)}


def add_checks(res: dict, outs: dict, ref, rows) -> None:
    """Each output vs the fp32 reference rows; attngen vs every peer; flag mismatches."""
    for name, out in outs.items():
        res[name]["vs_ref"] = compare(out[rows], ref)
    for ours in (r for r in RESULT.values() if r in outs):
        for peer in (p for p in PEERS if p in outs):
            res[ours][f"vs_{peer}"] = compare(outs[ours], outs[peer])
        bad = [k for k, v in res[ours].items() if k.startswith("vs_") and not v["ok"]]
        res[ours]["mismatch"] = bad


def ratios(res: dict, unit: str) -> dict:
    """attngen (Triton) over each peer; "cute_<peer>": attngen's CuTe DSL kernels over it."""
    out = {}
    for ours, prefix in RATIO_PREFIX.items():
        a = res.get(ours, {}).get(unit)
        out |= {prefix + p: a / res[p][unit] for p in PEERS if a and res.get(p, {}).get(unit)}
    return out


def shuffled_page_table(batch: int, pages_per_seq: int, num_pages: int, seed: int):
    """Physical pages in a random order, as in a pool that has been in use for a while."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_pages, generator=g)[: batch * pages_per_seq]
    return perm.to(device=DEV, dtype=torch.int32).view(batch, pages_per_seq)


def token_slots(page_table, page_size: int, seq_len: int):
    """Flat pool index of every (request, position): [B, seq_len] int64."""
    pos = torch.arange(seq_len, device=page_table.device)
    return page_table[:, pos // page_size].long() * page_size + pos % page_size


# -- decode ----


def run_decode(batch, ctx, page_size, variants, fa4, num_sms, kv, q, keep_out=False) -> dict:
    k_flat, v_flat = kv
    row = {
        "case": f"B{batch} ctx{ctx}",
        "batch": batch,
        "ctx": ctx,
        "page_size": page_size,
        "hq": HQ,
        "hkv": HKV,
        "head_dim": D,
        "bytes": 2 * batch * ctx * HKV * D * 2,
    }
    k_cache, v_cache = (x.view(-1, page_size, HKV, D) for x in (k_flat, v_flat))
    page_table = shuffled_page_table(batch, ctx // page_size, k_cache.shape[0], seed=page_size)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEV)
    res, outs = {}, {}
    found = find_variant(variants, "decode", page_size)
    if found is None:
        res["attngen"] = {"status": "not generated"}
    else:
        spec, mod, cfg, _ = found
        num_splits, how = decode_splits(mod, cfg, seq_lens, num_sms)
        splits = int(num_splits.max())
        out = torch.full_like(q, float("nan"))
        part_o = torch.empty(batch, HQ, cfg.max_splits, D, dtype=torch.float32, device=DEV)
        part_lse = torch.empty(batch, HQ, cfg.max_splits, dtype=torch.float32, device=DEV)

        def attngen():
            mod.decode(
                q,
                k_cache,
                v_cache,
                page_table,
                seq_lens,
                num_splits,
                out,
                part_o,
                part_lse,
                config=cfg,
                sm_scale=SCALE,
            )
            return out

        res["attngen"], outs["attngen"] = measure(attngen, row["bytes"], "tbps")
        res["attngen"].update(spec=spec, uri=cfg.uri, num_splits=splits, splits_from=how)
    if fa4 is None:
        res["fa4"] = {"status": "unavailable"}
    else:

        def fa4_decode():
            return fa4[1](
                q.unsqueeze(1),
                k_cache,
                v_cache,
                page_table=page_table,
                seqused_k=seq_lens,
                softmax_scale=SCALE,
                causal=False,
            )[0]

        res["fa4"], o = measure(fa4_decode, row["bytes"], "tbps")
        if o is not None:
            outs["fa4"] = o.view(batch, HQ, D)
    outs = {k: v for k, v in outs.items() if v is not None}
    rows = [0, batch - 1]
    slots = token_slots(page_table[rows], page_size, ctx)
    ref = torch.cat(
        [
            reference(
                q[b : b + 1], k_flat[s], v_flat[s], torch.tensor([ctx - 1], device=DEV), False
            )
            for b, s in zip(rows, slots)
        ]
    )
    add_checks(res, outs, ref, rows)
    row.update(results=res, ratio=ratios(res, "tbps"))
    if keep_out and "attngen" in outs:  # for the quantized rows; popped before saving
        row["_out_bf16"] = outs["attngen"].float()
    return row


# -- quantized KV decode (fp8, NVFP4) and speculative verify ----

QUANT_PAGE = 64
QUANT_KINDS = (("fp8_e4m3", "float8_e4m3fn"), ("nvfp4", "nvfp4"))  # (label, config kv_dtype)
QUANT_RMS_BOUND = {"float8_e4m3fn": 0.10, "nvfp4": 0.25}  # see tests/gpu: fp8 / NVFP4 bounds


def quantized_cache(kv_name: str, k_flat, v_flat):
    """(k, v, kernel kwargs, bytes per token per kv head for K+V) of a paged cache."""
    from attngen.runtime.nvfp4 import quantize_nvfp4

    if kv_name == "nvfp4":
        kwargs, caches = {}, []
        for name, x in (("k", k_flat), ("v", v_flat)):
            scale = (x.abs().amax().float() / (6 * 448)).reshape(1)
            codes, bscales = quantize_nvfp4(x, scale)
            caches.append(codes.view(-1, QUANT_PAGE, HKV, D // 2))
            kwargs[f"{name}_scale"] = scale
            kwargs[f"{name}_block_scales"] = bscales.view(-1, QUANT_PAGE, HKV, D // 16)
        return caches[0], caches[1], kwargs, 2 * (D // 2 + D // 16)
    dtype = getattr(torch, kv_name)
    kwargs, caches = {}, []
    for name, x in (("k", k_flat), ("v", v_flat)):
        scale = (x.abs().amax().float() / torch.finfo(dtype).max).reshape(1)
        caches.append((x.float() / scale).to(dtype).view(-1, QUANT_PAGE, HKV, D))
        kwargs[f"{name}_scale"] = scale
    return caches[0], caches[1], kwargs, 2 * D


def run_quantized_decode(batch, ctx, variants, fa4, num_sms, kv, q) -> list[dict]:
    """attngen decode over fp8 / NVFP4 caches of the same K/V vs FA4 and attngen on bf16:
    the time ratio is what the smaller cache buys; outputs are held to the bf16 ones."""
    bf16 = run_decode(batch, ctx, QUANT_PAGE, variants, fa4, num_sms, kv, q, keep_out=True)
    base_ms = {n: r.get("ms") for n, r in bf16["results"].items()}
    page_table = shuffled_page_table(
        batch, ctx // QUANT_PAGE, kv[0].shape[0] // QUANT_PAGE, seed=QUANT_PAGE
    )
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEV)
    rows = []
    for kind, kv_name in QUANT_KINDS:
        row = {
            "case": f"B{batch} ctx{ctx} {kind}",
            "batch": batch,
            "ctx": ctx,
            "page_size": QUANT_PAGE,
            "kv_dtype": kv_name,
            "hq": HQ,
            "hkv": HKV,
            "head_dim": D,
        }
        found = find_variant(variants, "decode", QUANT_PAGE, kv=kv_name)
        if found is None:
            row.update(results={"attngen": {"status": "not generated"}}, ratio={})
            rows.append(row)
            continue
        spec, mod, cfg, _ = found
        k_cache, v_cache, scales, bytes_per = quantized_cache(kv_name, *kv)
        row["bytes"] = batch * ctx * HKV * bytes_per
        num_splits, _ = decode_splits(mod, cfg, seq_lens, num_sms)
        out = torch.full_like(q, float("nan"))
        part_o = torch.empty(batch, HQ, cfg.max_splits, D, dtype=torch.float32, device=DEV)
        part_lse = torch.empty(batch, HQ, cfg.max_splits, dtype=torch.float32, device=DEV)

        def attngen():
            mod.decode(
                q,
                k_cache,
                v_cache,
                page_table,
                seq_lens,
                num_splits,
                out,
                part_o,
                part_lse,
                config=cfg,
                sm_scale=SCALE,
                **scales,
            )
            return out

        res, o = measure(attngen, row["bytes"], "tbps")
        res.update(spec=spec, uri=cfg.uri)
        row["results"] = {"attngen": res}
        if o is not None and "_out_bf16" in bf16:
            ref = bf16["_out_bf16"]
            rel = ((o.float() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()
            bound = QUANT_RMS_BOUND[kv_name]
            res["vs_bf16"] = {"rel_rms": rel, "bound": bound, "ok": rel <= bound}
            res["mismatch"] = [] if rel <= bound else ["vs_bf16"]
        ms = res.get("ms")
        row["ratio"] = {
            f"time_{n}_bf16_over_this": base_ms[n] / ms
            for n in ("attngen", "fa4")
            if ms and base_ms.get(n)
        }
        rows.append(row)
    bf16.pop("_out_bf16", None)
    bf16["case"] += " bf16"
    return [bf16] + rows


def fa4_paged_fn(fa4, q4, k_cache, v_cache, page_table, seq_len: int):
    """FA4 varlen over a paged cache: q4 [B, S, Hq, D], every request ``seq_len`` keys long,
    causal bottom-right aligned (the S rows are the last S positions): timed fn."""
    seqused = torch.full((q4.shape[0],), seq_len, dtype=torch.int32, device=DEV)

    def fn():
        return fa4[1](
            q4,
            k_cache,
            v_cache,
            page_table=page_table,
            seqused_k=seqused,
            softmax_scale=SCALE,
            causal=True,
        )[0]

    return fn


def run_verify(batch, ctx, drafts, variants, fa4, kv) -> dict:
    """Chain verify (topk 1): `drafts` causal rows per request over a ctx-token prefix;
    attngen verify vs FA4 (batched q with a page table, causal = bottom-right aligned)."""
    k_flat, v_flat = kv
    total = ctx + drafts
    row = {
        "case": f"B{batch} ctx{ctx}+{drafts} chain",
        "batch": batch,
        "ctx": ctx,
        "drafts": drafts,
        "page_size": QUANT_PAGE,
        "hq": HQ,
        "hkv": HKV,
        "head_dim": D,
        "bytes": 2 * batch * total * HKV * D * 2,
    }
    pages = math.ceil(total / QUANT_PAGE)
    k_cache, v_cache = (x.view(-1, QUANT_PAGE, HKV, D) for x in (k_flat, v_flat))
    page_table = shuffled_page_table(batch, pages, k_cache.shape[0], seed=7)
    q = rand(batch * drafts, HQ, D)
    res, outs = {}, {}
    found = find_variant(variants, "verify", QUANT_PAGE, spec_topk=1)
    if found is None or found[2].num_draft_tokens != drafts:
        res["attngen"] = {"status": "not generated"}
    else:
        spec, mod, cfg, _ = found
        qo_indptr = (torch.arange(batch + 1, device=DEV) * drafts).to(torch.int32)
        prefix = torch.full((batch,), ctx, dtype=torch.int32, device=DEV)
        out = torch.full_like(q, float("nan"))

        def attngen():
            mod.verify(
                q, k_cache, v_cache, page_table, qo_indptr, prefix, out, config=cfg, sm_scale=SCALE
            )
            return out

        res["attngen"], outs["attngen"] = measure(attngen, row["bytes"], "tbps")
        res["attngen"].update(spec=spec, uri=cfg.uri)
    if fa4 is None:
        res["fa4"] = {"status": "unavailable"}
    else:
        fn = fa4_paged_fn(fa4, q.view(batch, drafts, HQ, D), k_cache, v_cache, page_table, total)
        res["fa4"], o = measure(fn, row["bytes"], "tbps")
        if o is not None:
            outs["fa4"] = o.reshape(batch * drafts, HQ, D)
    outs = {k: v for k, v in outs.items() if v is not None}
    seqs = [0, batch - 1]
    slots = token_slots(page_table[seqs], QUANT_PAGE, total)
    pos = torch.arange(ctx, total, device=DEV)
    ref = torch.cat(
        [
            reference(q[b * drafts : (b + 1) * drafts], k_flat[s], v_flat[s], pos, True)
            for b, s in zip(seqs, slots)
        ]
    )
    rows = torch.cat([torch.arange(b * drafts, (b + 1) * drafts) for b in seqs]).to(DEV)
    add_checks(res, outs, ref, rows)
    row.update(results=res, ratio=ratios(res, "tbps"))
    return row


# -- prefill ----


def attngen_extend(found, q, k, v, batch, seqlen, page_size):
    """attngen extend over pages filled with the new tokens' K/V (prefix 0): timed fn."""
    pages_per_seq = math.ceil(seqlen / page_size)
    num_pages = batch * pages_per_seq
    k_cache = torch.zeros(num_pages, page_size, *k.shape[1:], dtype=q.dtype, device=DEV)
    v_cache = torch.zeros(num_pages, page_size, *v.shape[1:], dtype=q.dtype, device=DEV)
    page_table = shuffled_page_table(batch, pages_per_seq, num_pages, seed=seqlen + page_size)
    slots = token_slots(page_table, page_size, seqlen).reshape(-1)
    k_cache.view(-1, *k.shape[1:])[slots] = k
    v_cache.view(-1, *v.shape[1:])[slots] = v
    prefix_lens = torch.zeros(batch, dtype=torch.int32, device=DEV)
    return extend_fn(found, q, k_cache, v_cache, page_table, prefix_lens, seqlen)


def attngen_prefill(found, q, k, v, batch, seqlen):
    """attngen's cache-free ``prefill`` over contiguous ragged q/k/v (FA4's inputs): timed fn."""
    _, mod, cfg, kwargs = found
    cu_seqlens = (torch.arange(batch + 1, device=DEV) * seqlen).to(torch.int32)
    out = q.new_full((q.shape[0], q.shape[1], v.shape[-1]), float("nan"))

    def fn():
        mod.prefill(q, k, v, cu_seqlens, out, max_seq_len=seqlen, config=cfg, sm_scale=SCALE,
                    **kwargs)  # fmt: skip
        return out

    return fn


def extend_fn(found, q, k_cache, v_cache, page_table, prefix_lens, new: int):
    """The timed call of attngen ``extend``: ``new`` rows per request after ``prefix_lens``
    cached tokens, into a fresh NaN-filled output (returned)."""
    _, mod, cfg, kwargs = found
    batch = prefix_lens.shape[0]
    qo_indptr = (torch.arange(batch + 1, device=DEV) * new).to(torch.int32)
    out = q.new_full((q.shape[0], q.shape[1], v_cache.shape[-1]), float("nan"))

    def fn():
        mod.extend(
            q,
            k_cache,
            v_cache,
            page_table,
            qo_indptr,
            prefix_lens,
            out,
            max_extend_len=new,
            config=cfg,
            sm_scale=SCALE,
            **kwargs,
        )
        return out

    return fn


def prefill_peers(fa4, q, k, v, batch, seqlen, causal) -> tuple[dict, dict, dict]:
    """FA4's, cuDNN's and FA2's calls for this shape: ({name: timed fn}, {name: fn turning
    its output into [T, Hq, Dv]}, {name: result of a peer that is unavailable})."""
    hq, dv = q.shape[1], v.shape[2]
    q4, k4, v4 = (x.view(batch, seqlen, *x.shape[1:]) for x in (q, k, v))
    fns, layout, res = {}, {}, {}
    if fa4 is None:
        res["fa4"] = {"status": "unavailable"}
    else:
        fns["fa4"] = lambda: fa4[0](q4, k4, v4, softmax_scale=SCALE, causal=causal)[0]
        layout["fa4"] = lambda o: o.reshape(-1, hq, dv)
    for name, backend in (("cudnn", "CUDNN_ATTENTION"), ("fa2", "FLASH_ATTENTION")):
        try:
            fns[name], gqa = sdpa_fn(backend, q4, k4, v4, causal)
        except Exception as e:
            res[name] = {"error": short(e)}
            continue
        res[name] = {"gqa": gqa}
        layout[name] = lambda o: o.transpose(1, 2).reshape(-1, hq, dv)
    return fns, layout, res


def run_prefill(seqlen, causal, page_sizes, variants, fa4, heads=(HQ, HKV, D, D)) -> list[dict]:
    """Prefill rows of one (seqlen, mask) case at heads (q heads, kv heads, qk dim, v dim),
    one per page size."""
    hq, hkv, d, dv = heads
    batch = PREFILL_TOKENS // seqlen
    flops = 2 * batch * hq * seqlen * seqlen * (d + dv) * (0.5 if causal else 1.0)
    tokens = batch * seqlen
    q, k, v = rand(tokens, hq, d), rand(tokens, hkv, d), rand(tokens, hkv, dv)
    peer_fns, peer_layout, peer_res = prefill_peers(fa4, q, k, v, batch, seqlen, causal)
    pos = torch.cat([torch.arange(32), torch.arange(seqlen - 32, seqlen)]).to(DEV)
    seqs = sorted({0, batch - 1})
    rows = torch.cat([b * seqlen + pos for b in seqs])
    ref = torch.cat(
        [
            reference(
                q[b * seqlen + pos],
                k[b * seqlen : (b + 1) * seqlen],
                v[b * seqlen : (b + 1) * seqlen],
                pos,
                causal,
            )
            for b in seqs
        ]
    )
    out_rows = []
    for page_size in page_sizes:
        row = {
            "case": f"S{seqlen} {'causal' if causal else 'non-causal'}",
            "seqlen": seqlen,
            "batch": batch,
            "causal": causal,
            "page_size": page_size,
            "hq": hq,
            "hkv": hkv,
            "head_dim": d,
            "v_head_dim": dv,
            "flops": flops,
        }
        # page 0: no cache, the cache-free prefill on FA4's contiguous inputs
        phase, page = ("prefill", None) if page_size == 0 else ("extend", page_size)
        res = {p: dict(r) for p, r in peer_res.items()}

        def find(backend):
            return page_size is not None and find_variant(
                variants, phase, page, causal, backend=backend, heads=heads
            )

        def make(found):
            if page_size == 0:
                return attngen_prefill(found, q, k, v, batch, seqlen)
            return attngen_extend(found, q, k, v, batch, seqlen, page_size)

        fns, found_of = attngen_calls(res, find, make)
        outs, paired = timed_row(res, peer_fns | fns, flops, peer_layout, found_of)
        add_checks(res, outs, ref, rows)
        row.update(results=res, **paired_ratios(paired))
        out_rows.append(row)
        torch.cuda.empty_cache()
    return out_rows


def attngen_calls(res: dict, find, make) -> tuple[dict, dict]:
    """Each generated backend's call for a row: ``({result key: fn}, {result key: its
    variant})``; ``find(backend)`` is the variant (falsy: "not generated", into ``res``),
    ``make(found)`` its call."""
    fns, found_of = {}, {}
    for backend, key in RESULT.items():
        found = find(backend)
        if not found:
            res[key] = {"status": "not generated"}
            continue
        found_of[key], fns[key] = found, make(found)
    return fns, found_of


def timed_row(res: dict, fns: dict, flops: float, layout: dict, found_of: dict):
    """Every kernel of a row in the same interleaved rounds (bench/paired_timing.py): their
    figures into ``res`` (with the spec and variant of attngen's, ``found_of``), and
    ``(outputs, rounds)``, each output through ``layout[name]`` when it has one."""
    timed, outs, paired = run_then_pair(fns, flops, "tflops", rounds=PAIRED_ROUNDS,
                                        calls=PAIRED_CALLS, sync=sync)  # fmt: skip
    for name, r in timed.items():
        res[name] = res.get(name, {}) | r
    for key, found in found_of.items():
        res[key].update(spec=found[0], uri=found[2].uri)
    return {n: layout.get(n, lambda o: o)(o) for n, o in outs.items() if o is not None}, paired


def paired_ratios(paired) -> dict:
    """``ratio`` (attngen's speed over each peer's: the median over rounds of the peer's time
    / attngen's in the same round; "cute_<peer>" for attngen's CuTe DSL kernels) and
    ``ratio_iqr`` (their interquartile ranges)."""
    ratio, iqr = {}, {}
    for ours, prefix in RATIO_PREFIX.items():
        for p in PEERS:
            if paired is not None and ours in paired.rounds and p in paired.rounds:
                med, q1, q3 = paired.ratio(p, ours)
                ratio[prefix + p], iqr[prefix + p] = med, [q1, q3]
    return {"ratio": ratio, "ratio_iqr": iqr}


def run_extend_prefix(batch, prefix, new, page_size, variants, fa4) -> dict:
    """Extend of ``new`` causal rows per request over a ``prefix``-token paged prefix: each
    generated backend's ``extend`` and FA4 varlen with a page table, on one cache whose pages
    are shuffled; checked against fp32 rows of the first and last request."""
    total = prefix + new
    flops = 2 * batch * HQ * (new * prefix + new * new / 2) * (2 * D)
    row = {
        "case": f"B{batch} P{prefix}+S{new}",
        "batch": batch,
        "prefix": prefix,
        "new": new,
        "page_size": page_size,
        "hq": HQ,
        "hkv": HKV,
        "head_dim": D,
        "flops": flops,
    }
    pages_per_seq = math.ceil(total / page_size)
    num_pages = batch * pages_per_seq
    k_flat, v_flat = rand(num_pages * page_size, HKV, D), rand(num_pages * page_size, HKV, D)
    k_cache, v_cache = (x.view(num_pages, page_size, HKV, D) for x in (k_flat, v_flat))
    page_table = shuffled_page_table(batch, pages_per_seq, num_pages, seed=prefix + page_size)
    q = rand(batch * new, HQ, D)
    prefix_lens = torch.full((batch,), prefix, dtype=torch.int32, device=DEV)
    res, layout = {}, {}
    fns, found_of = attngen_calls(
        res,
        lambda backend: find_variant(variants, "extend", page_size, True, backend=backend),
        lambda found: extend_fn(found, q, k_cache, v_cache, page_table, prefix_lens, new),
    )
    if fa4 is None:
        res["fa4"] = {"status": "unavailable"}
    else:
        q4 = q.view(batch, new, HQ, D)
        fns["fa4"] = fa4_paged_fn(fa4, q4, k_cache, v_cache, page_table, total)
        layout["fa4"] = lambda o: o.reshape(batch * new, HQ, D)
    outs, paired = timed_row(res, fns, flops, layout, found_of)
    seqs = sorted({0, batch - 1})
    slots = token_slots(page_table[seqs], page_size, total)
    picked = torch.cat([torch.arange(min(32, new)), torch.arange(max(0, new - 32), new)])
    picked = picked.unique().to(DEV)
    ref = torch.cat(
        [
            reference(q[b * new + picked], k_flat[s], v_flat[s], prefix + picked, True)
            for b, s in zip(seqs, slots)
        ]
    )
    add_checks(res, outs, ref, torch.cat([b * new + picked for b in seqs]))
    row.update(results=res, **paired_ratios(paired))
    return row


# -- report ----


def environment(args, fa4_version: str) -> dict:
    import triton

    attention = importlib.import_module("torch.nn.attention")
    flash_impl = getattr(attention, "current_flash_attention_impl", lambda: "FA2")
    try:
        dsl = importlib.metadata.version("nvidia-cutlass-dsl")
    except Exception as e:
        dsl = f"unavailable: {short(e)}"
    props = torch.cuda.get_device_properties(0)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat()
    return {
        "commit": commit_id(args),
        "date": now,
        "gpu": props.name,
        "num_sms": props.multi_processor_count,
        "capability": [props.major, props.minor],
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "triton": triton.__version__,
        "peers": {
            "flash-attn-4": fa4_version,
            "nvidia-cutlass-dsl": dsl,
            "sdpa_flash_impl": str(flash_impl()),
        },
        "timing": f"triton.testing.do_bench median, warmup {WARMUP_MS} ms, rep {REP_MS} ms; "
        f"prefill, head_dims and extend rows: paired rounds ({PAIRED_ROUNDS} rounds of "
        f"{PAIRED_CALLS} calls a kernel, ratios the per-round median, ratio_iqr their "
        "interquartile range)",
        "check": f"max|out-ref| <= {ATOL} + {RTOL}*max|ref| (ref: fp32 torch rows, or peer)",
    }


def commit_id(args) -> str:
    if args.commit or os.environ.get("ATTNGEN_COMMIT"):
        return args.commit or os.environ["ATTNGEN_COMMIT"]
    return tree_commit()


def tree_commit() -> str:
    """HEAD's short sha, with "-dirty" where tracked files differ from it (a copied tree
    whose .git is older than its files reads as dirty, not as that older commit: pass
    ATTNGEN_COMMIT there); "unknown" without git."""
    try:  # .git may be missing where the bench runs
        git = ["git", "-C", str(ROOT)]
        run = dict(capture_output=True, text=True, check=True)
        sha = subprocess.run([*git, "rev-parse", "--short", "HEAD"], **run).stdout.strip()
        changed = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], **run)
        return sha + ("-dirty" if changed.stdout.strip() else "")
    except Exception:
        return "unknown"


def cell(r: dict, unit: str) -> str:
    if unit in r:
        return f"{r[unit]:8.2f}"
    if "status" in r:
        return "     n/g" if r["status"] == "not generated" else "       -"
    return "     err"


def page_label(page_size: int | None) -> str:
    """A prefill row's page column: "none" for the cache-free prefill (page 0)."""
    return "none" if page_size == 0 else str(page_size or "-")


def table(report: dict) -> str:
    lines = ["decode TB/s           page  attngen      FA4  ag/FA4  splits  check"]
    for row in report["decode"]:
        r, a = row["results"], row["results"].get("attngen", {})
        chk = "MISMATCH" if a.get("mismatch") else "ok" if "mismatch" in a else "-"
        lines.append(
            f"{row['case']:<20} {row['page_size']:>5} {cell(a, 'tbps')} "
            f"{cell(r.get('fa4', {}), 'tbps')} {row['ratio'].get('fa4', 0):7.2f} "
            f"{a.get('num_splits', '-'):>7}  {chk}"
        )
    lines.append(
        "quantized decode           page  attngen TB/s  ms   bf16 attngen/this"
        "  bf16 FA4/this  rel_rms  check"
    )
    for row in report.get("quantized_decode", []):
        a = row["results"].get("attngen", {})
        chk = "MISMATCH" if a.get("mismatch") else "ok" if "mismatch" in a else "-"
        ratio = row.get("ratio", {})
        rel = a.get("vs_bf16", {}).get("rel_rms")
        lines.append(
            f"{row['case']:<26} {row['page_size']:>4} {cell(a, 'tbps')} "
            f"{a.get('ms', float('nan')):6.3f} "
            f"{ratio.get('time_attngen_bf16_over_this', 0):18.2f} "
            f"{ratio.get('time_fa4_bf16_over_this', 0):14.2f} "
            f"{rel if rel is not None else float('nan'):8.4f}  {chk}"
        )
    lines.append("verify TB/s                page  attngen      FA4  ag/FA4  check")
    for row in report.get("verify", []):
        r, a = row["results"], row["results"].get("attngen", {})
        chk = "MISMATCH" if a.get("mismatch") else "ok" if "mismatch" in a else "-"
        lines.append(
            f"{row['case']:<26} {row['page_size']:>4} {cell(a, 'tbps')} "
            f"{cell(r.get('fa4', {}), 'tbps')} {row['ratio'].get('fa4', 0):7.2f}  {chk}"
        )
    lines.append(
        "prefill TFLOP/s       page  attngen     cute      FA4    cuDNN      FA2  ag/FA4"
        " cute/FA4 ag/cuDNN  check"
    )
    for row in report["prefill"] + report.get("head_dims", []):
        r, a = row["results"], row["results"].get("attngen", {})
        c = r.get("attngen_cute", {})
        mismatch = a.get("mismatch") or c.get("mismatch")
        chk = "MISMATCH" if mismatch else "ok" if "mismatch" in a or "mismatch" in c else "-"
        peers = " ".join(cell(r.get(p, {"status": "-"}), "tflops") for p in PEERS)
        ratio = row["ratio"]
        lines.append(
            f"{row['case']:<20} {page_label(row['page_size']):>5} {cell(a, 'tflops')} "
            f"{cell(c, 'tflops')} {peers} {ratio.get('fa4', 0):7.2f} "
            f"{ratio.get('cute_fa4', 0):8.2f} {ratio.get('cudnn', 0):8.2f}  {chk}"
        )
    lines.append(
        "extend TFLOP/s             page  attngen     cute      FA4  ag/FA4 cute/FA4  check"
    )
    for row in report.get("extend", []):
        r, a = row["results"], row["results"].get("attngen", {})
        c = r.get("attngen_cute", {})
        mismatch = a.get("mismatch") or c.get("mismatch")
        chk = "MISMATCH" if mismatch else "ok" if "mismatch" in a or "mismatch" in c else "-"
        lines.append(
            f"{row['case']:<26} {row['page_size']:>4} {cell(a, 'tflops')} {cell(c, 'tflops')} "
            f"{cell(r.get('fa4', {}), 'tflops')} {row['ratio'].get('fa4', 0):7.2f} "
            f"{row['ratio'].get('cute_fa4', 0):8.2f}  {chk}"
        )
    lines += api_cost().table_lines(report.get("api", []))
    return "\n".join(lines)


def guarded(fn, *args, **stub) -> list[dict]:
    """Run one case; an exception outside the timed calls becomes a row, not a crash."""
    try:
        rows = fn(*args)
        return rows if isinstance(rows, list) else [rows]
    except Exception as e:
        traceback.print_exc()
        return [dict(stub, results={"attngen": {"error": short(e)}}, ratio={})]


def save(report: dict, path: Path) -> None:
    path.write_text(json.dumps(report, indent=1, default=str) + "\n")


def progress(kind: str, row: dict, unit: str) -> None:
    figures = {k: v.get(unit, v.get("status", v.get("error"))) for k, v in row["results"].items()}
    log(f"{kind} {row['case']} page {row['page_size']}: {json.dumps(figures)}")


def bench_decode(args, report: dict, variants, fa4, save_report) -> None:
    pages = [p for p in PAGE_SIZES if find_variant(variants, "decode", p)] or [64, 128]
    for batch, ctx in DECODE_CASES[:1] if args.quick else DECODE_CASES:
        kv, q = (rand(batch * ctx, HKV, D), rand(batch * ctx, HKV, D)), rand(batch, HQ, D)
        for page_size in pages[-1:] if args.quick else pages:
            case = dict(case=f"B{batch} ctx{ctx}", page_size=page_size)
            [row] = guarded(
                run_decode, batch, ctx, page_size, variants, fa4, report["num_sms"], kv, q, **case
            )
            report["decode"].append(row)
            save_report()
            progress("decode", row, "tbps")
        del kv, q
        torch.cuda.empty_cache()


def bench_quantized(args, report: dict, variants, fa4, save_report) -> None:
    for batch, ctx in DECODE_CASES[:1] if args.quick else DECODE_CASES:
        kv, q = (rand(batch * ctx, HKV, D), rand(batch * ctx, HKV, D)), rand(batch, HQ, D)
        case = dict(case=f"B{batch} ctx{ctx} quantized", page_size=QUANT_PAGE)
        for row in guarded(
            run_quantized_decode, batch, ctx, variants, fa4, report["num_sms"], kv, q, **case
        ):
            report["quantized_decode"].append(row)
            save_report()
            progress("quantized decode", row, "tbps")
        del kv, q
        torch.cuda.empty_cache()


def bench_verify(args, report: dict, variants, fa4, save_report) -> None:
    found = find_variant(variants, "verify", QUANT_PAGE, spec_topk=1)
    drafts = found[2].num_draft_tokens if found else 4
    for batch, ctx in DECODE_CASES[:1] if args.quick else DECODE_CASES:
        pages = batch * math.ceil((ctx + drafts) / QUANT_PAGE)
        kv = (rand(pages * QUANT_PAGE, HKV, D), rand(pages * QUANT_PAGE, HKV, D))
        case = dict(case=f"B{batch} ctx{ctx}+{drafts} chain", page_size=QUANT_PAGE)
        [row] = guarded(run_verify, batch, ctx, drafts, variants, fa4, kv, **case)
        report["verify"].append(row)
        save_report()
        progress("verify", row, "tbps")
        del kv
        torch.cuda.empty_cache()


def bench_prefill(args, report: dict, variants, fa4, save_report) -> None:
    """Prefill rows: attngen's cache-free prefill (page 0) and its extend over pages that
    hold the new tokens, per generated page size, against FA4, cuDNN and FA2."""
    pages = [
        p
        for p in PAGE_SIZES
        if any(
            find_variant(variants, "extend", p, c, backend=b)
            for b in BACKENDS
            for c in (True, False)
        )
    ]
    if any(find_variant(variants, "prefill", None, c, backend=b) for b in BACKENDS for c in (0, 1)):
        pages.insert(0, 0)
    pages = pages or [None]
    for seqlen in PREFILL_SEQLENS[:1] if args.quick else PREFILL_SEQLENS:
        for causal in (True, False):
            case = dict(case=f"S{seqlen} {'causal' if causal else 'non-causal'}", page_size=None)
            for row in guarded(run_prefill, seqlen, causal, pages, variants, fa4, **case):
                report["prefill"].append(row)
                save_report()
                progress("prefill", row, "tflops")


def bench_head_dims(args, report: dict, variants, fa4, save_report) -> None:
    """Causal prefill at the other head dims (HEAD_DIM_SHAPES), on the page sizes the
    generated specs have for each, against the same peers."""
    for heads in HEAD_DIM_SHAPES:
        pages = extend_pages(variants, PAGE_SIZES + (16,), heads) or [None]
        for seqlen in HEAD_DIM_SEQLENS[:1] if args.quick else HEAD_DIM_SEQLENS:
            name = f"S{seqlen} causal h{heads[0]}/{heads[1]} d{heads[2]}/{heads[3]}"
            case = dict(case=name, page_size=None)
            for row in guarded(run_prefill, seqlen, True, pages, variants, fa4, heads, **case):
                row["case"] = name
                report["head_dims"].append(row)
                save_report()
                progress("head_dims", row, "tflops")
            torch.cuda.empty_cache()


def extend_pages(variants, pages, heads=(HQ, HKV, D, D)) -> list:
    """The page sizes of ``pages`` that some generated backend has a causal extend of
    ``heads`` for."""
    return [
        p
        for p in pages
        if any(find_variant(variants, "extend", p, True, backend=b, heads=heads) for b in BACKENDS)
    ]


def bench_extend(args, report: dict, variants, fa4, save_report) -> None:
    """Extend over a cached prefix (EXTEND_CASES) on every page size a causal extend variant
    is generated for, each backend and FA4 on the same cache."""
    pages = extend_pages(variants, PAGE_SIZES)
    for batch, prefix, new in EXTEND_CASES[:1] if args.quick else EXTEND_CASES:
        for page_size in pages[-1:] if args.quick else pages:
            case = dict(case=f"B{batch} P{prefix}+S{new}", page_size=page_size)
            [row] = guarded(run_extend_prefix, batch, prefix, new, page_size, variants, fa4, **case)
            report["extend"].append(row)
            save_report()
            progress("extend", row, "tflops")
            torch.cuda.empty_cache()


def api_cost():
    """bench/api_cost.py, imported when first needed (it imports torch)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module("api_cost")


def bench_api(args, report: dict, save_report) -> None:
    mod = api_cost()
    for batch in mod.QUICK_BATCHES if args.quick else mod.BATCHES:
        case = dict(case=f"B{batch} ctx{mod.CTX}", batch=batch, page_size=mod.PAGE)
        [row] = guarded(mod.run_case, batch, **case)
        report["api"].append(row)
        save_report()
        log(mod.summary(row))
        torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="bench/results", help="folder for the JSON and table")
    ap.add_argument("--commit", default=None, help="commit id (else $ATTNGEN_COMMIT, else git)")
    ap.add_argument(
        "--quick", action="store_true", help="smoke run: B64 ctx4096, S=1024, api B8 only"
    )
    ap.add_argument(
        "--only",
        choices=("decode", "quantized", "verify", "prefill", "head_dims", "extend", "api"),
        action="append",
        help="run only this part (repeatable); default: every part",
    )
    args = ap.parse_args()
    if (code := missing_cuda("bench")) is not None:
        return code
    global torch
    import torch

    torch.manual_seed(0)
    variants, errors = load_attngen()
    fa4, fa4_version = load_fa4()
    report = environment(args, fa4_version)
    uris = sorted({c.uri for _, _, c in variants})
    report.update(
        attngen={"variants": uris, "import_errors": errors},
        decode=[],
        prefill=[],
        quantized_decode=[],
        verify=[],
        head_dims=[],
        extend=[],
        api=[],
    )
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%MZ")
    path = Path(args.out) / f"{device_tag(report['gpu'])}-{stamp}-{report['commit']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    log(
        f"bench: {report['gpu']}, torch {report['torch']}, triton {report['triton']}, "
        f"FA4 {fa4_version}; {len(variants)} attngen variants {errors or ''}; writing {path}"
    )
    save_report = lambda: save(report, path)  # noqa: E731  (after every case: a crash keeps rows)
    for name, fn in (
        ("decode", bench_decode),
        ("quantized", bench_quantized),
        ("verify", bench_verify),
        ("prefill", bench_prefill),
        ("head_dims", bench_head_dims),
        ("extend", bench_extend),
    ):
        if not args.only or name in args.only:
            fn(args, report, variants, fa4, save_report)
    if not args.only or "api" in args.only:
        bench_api(args, report, save_report)
    every = report["decode"] + report["quantized_decode"] + report["verify"] + report["prefill"]
    every += report["head_dims"] + report["extend"]
    every += report["api"]
    bad = [
        f"{r['case']} page {r['page_size']} {key}"
        for r in every
        for key in RESULT.values()
        if key in r["results"]
        and (r["results"][key].get("mismatch") or "error" in r["results"][key])
    ]
    report["attngen_failures"] = bad
    save_report()
    text = table(report)
    path.with_suffix(".txt").write_text(text + "\n")
    log(text)
    log(f"bench: wrote {path}" + (f"; attngen mismatches or errors: {bad}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
