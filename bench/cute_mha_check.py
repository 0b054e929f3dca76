"""One GPU run of the CuTe DSL MHA kernels: numerics against the oracle, first-call compile
times, and prefill timings next to FA4 on the same inputs. Prints a table; writes JSON.

``python3 bench/cute_mha_check.py [--out DIR] [--no-bench]`` on a CUDA machine with
nvidia-cutlass-dsl (and flash-attn-4 for the peer rows). ``--decode``: the split-KV decode
only (numerics with forced split counts, then paged decode hd128 32/8 next to FA4's paged
``flash_attn_varlen_func`` on the same cache, splits from the runtime's heuristic).

Numerics: every launcher is called on fresh random ragged batches (pages shuffled, outputs
poisoned with NaN), and compared with ``attngen.families.mha.reference``; the error is
reported as the worst row's RMS error relative to that row's RMS, and bounded by the
tolerance table (element-wise and per row).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attngen.families.mha.cute_dsl import library  # noqa: E402
from attngen.families.mha.cute_dsl.config import MhaCuteConfig, MhaCuteTraits  # noqa: E402
from attngen.families.mha.reference import (  # noqa: E402
    paged_decode_ref,
    paged_extend_ref,
    prefill_ref,
)
from attngen.families.mha.cute_dsl.tiles import (  # noqa: E402
    SM90_SHARED_BYTES,
    sm90_decode_shared_bytes,
    sm90_paged_tile_n,
)
from attngen.hooks import MaskHooks  # noqa: E402
from bench.graph_timing import graph_ms  # noqa: E402  (the benches' one CUDA-graph timing)
from attngen.testing.tolerance import KERNEL, assert_close, row_rms_error  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
HKV = 2


OVERLAP = 0  # fwd_intra_wg_overlap of every config (--overlap 1: the overlapped schedule)


def config(dtype: str, d: int, group: int, page: int, tile_n: int) -> MhaCuteConfig:
    return MhaCuteConfig(
        uri=f"d{d}_g{group}_ps{page}_{dtype}", head_dim=d, v_head_dim=d, gqa_group=group,
        page_size=page, dtype=dtype, kv_dtype=dtype, kv_scale="none", spec_topk=0,
        num_draft_tokens=0, arch="sm90", fwd_tile_m=128, fwd_tile_n=tile_n, fwd_num_stages=2,
        fwd_intra_wg_overlap=OVERLAP,
    )  # fmt: skip


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, bool]:
    """The worst row's rms(out - ref) / rms(ref), and whether out is within the tolerance
    table (element-wise and per row RMS, attngen.testing.tolerance)."""
    rel = float(row_rms_error(out, ref).max())
    try:
        assert_close(out, ref, KERNEL)
        return rel, True
    except AssertionError:
        return rel, False


def ragged(lens: list[int]) -> torch.Tensor:
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device="cuda")


def check_prefill(dtype: str, d: int, group: int, hooks: MaskHooks, lens: list[int]) -> dict:
    cfg = config(dtype, d, group, 128, 128)
    traits = MhaCuteTraits(hooks, ("prefill",))
    t, hq, dt = sum(lens), HKV * group, DTYPES[dtype]
    q = torch.randn(t, hq, d, dtype=dt, device="cuda")
    k = torch.randn(t, HKV, d, dtype=dt, device="cuda")
    v = torch.randn(t, HKV, d, dtype=dt, device="cuda")
    sinks = torch.randn(hq, device="cuda") if hooks.sinks else None
    cu = ragged(lens)
    out = torch.full((t, hq, d), float("nan"), dtype=dt, device="cuda")
    scale = d**-0.5
    library.prefill(q, k, v, cu, out, max_seq_len=max(lens), config=cfg, traits=traits,
                    sm_scale=scale, sinks=sinks)  # fmt: skip
    torch.cuda.synchronize()
    ref = prefill_ref(q.double(), k.double(), v.double(), cu, scale, mask=hooks, sinks=sinks)
    err, ok = rel_error(out, ref)
    return dict(nan=int(out.isnan().sum()), rel_err=err, ok=ok and not out.isnan().any())


def check_extend(dtype: str, d: int, group: int, page: int, hooks: MaskHooks,
                 prefixes: list[int], news: list[int]) -> dict:  # fmt: skip
    cfg = config(dtype, d, group, page, page)
    traits = MhaCuteTraits(hooks, ("extend",))
    dt, hq = DTYPES[dtype], HKV * group
    lengths = [p + n for p, n in zip(prefixes, news)]
    pages_per = [-(-n // page) for n in lengths]
    width = max(pages_per)
    num_pages = sum(pages_per) + 3
    perm = torch.randperm(num_pages, device="cuda").int()
    table = torch.zeros(len(lengths), width, dtype=torch.int32, device="cuda")
    used = 0
    for b, n in enumerate(pages_per):
        table[b, :n] = perm[used : used + n]
        used += n
    k_cache = torch.randn(num_pages, page, HKV, d, dtype=dt, device="cuda")
    v_cache = torch.randn(num_pages, page, HKV, d, dtype=dt, device="cuda")
    t = sum(news)
    q = torch.randn(t, hq, d, dtype=dt, device="cuda")
    sinks = torch.randn(hq, device="cuda") if hooks.sinks else None
    qo = ragged(news)
    prefix = torch.tensor(prefixes, dtype=torch.int32, device="cuda")
    out = torch.full((t, hq, d), float("nan"), dtype=dt, device="cuda")
    scale = d**-0.5
    library.extend(q, k_cache, v_cache, table, qo, prefix, out, max_extend_len=max(news),
                   config=cfg, traits=traits, sm_scale=scale, sinks=sinks)  # fmt: skip
    torch.cuda.synchronize()
    ref = paged_extend_ref(q.double(), k_cache.double(), v_cache.double(), table, qo, prefix,
                           scale, mask=hooks, sinks=sinks)  # fmt: skip
    err, ok = rel_error(out, ref)
    return dict(nan=int(out.isnan().sum()), rel_err=err, ok=ok and not out.isnan().any())


def decode_config(dtype: str, d: int, group: int, page: int, fp8: bool = False) -> MhaCuteConfig:
    tile_n = sm90_paged_tile_n(page, 128)  # the lowering's tile: whole pages, one TMA copy each
    cfg = dataclasses.replace(config(dtype, d, group, page, tile_n), max_splits=16)
    if fp8:  # an fp8 e4m3 cache with per-tensor scales
        cfg = dataclasses.replace(cfg, kv_dtype="float8_e4m3fn", kv_scale="per_tensor")
    return cfg


def to_fp8(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 cache, its per-tensor scale [1]): |x| / scale <= 448."""
    scale = (cache.abs().amax().float() / 448.0).reshape(1)
    return (cache.float() / scale).to(torch.float8_e4m3fn), scale


def paged_cache(lens: list[int], page: int, d: int, hkv: int, dt: torch.dtype):
    """Shuffled pages of random K/V for ``lens``: (k_cache, v_cache, page_table)."""
    pages_per = [max(1, -(-n // page)) for n in lens]
    num_pages = sum(pages_per) + 1
    perm = (torch.randperm(num_pages - 1, device="cuda") + 1).int()
    table = torch.zeros(len(lens), max(pages_per), dtype=torch.int32, device="cuda")
    used = 0
    for b, n in enumerate(pages_per):
        table[b, :n] = perm[used : used + n]
        used += n
    k = torch.randn(num_pages, page, hkv, d, dtype=dt, device="cuda")
    return k, torch.randn_like(k), table


def check_decode(dtype: str, d: int, group: int, page: int, hooks: MaskHooks,
                 lens: list[int], fp8: bool = False) -> dict:  # fmt: skip
    """Split-KV decode with random split counts (1 .. max_splits) against the oracle (on the
    dequantized cache when it is fp8)."""
    cfg = decode_config(dtype, d, group, page, fp8)
    traits = MhaCuteTraits(hooks, ("decode",))
    dt, hq, b = DTYPES[dtype], HKV * group, len(lens)
    k_cache, v_cache, table = paged_cache(lens, page, d, HKV, dt)
    scales: dict = {}
    if fp8:
        (k_cache, ks), (v_cache, vs) = to_fp8(k_cache), to_fp8(v_cache)
        scales = dict(k_scale=ks, v_scale=vs)
    q = torch.randn(b, hq, d, dtype=dt, device="cuda")
    sinks = torch.randn(hq, device="cuda") if hooks.sinks else None
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    splits = torch.randint(1, cfg.max_splits + 1, (b,), dtype=torch.int32, device="cuda")
    out = torch.full((b, hq, d), float("nan"), dtype=dt, device="cuda")
    po = torch.full((b, hq, cfg.max_splits, d), float("nan"), device="cuda")
    pl = torch.full((b, hq, cfg.max_splits), float("nan"), device="cuda")
    scale = d**-0.5
    library.decode(q, k_cache, v_cache, table, seq_lens, splits, out, po, pl, config=cfg,
                   traits=traits, sm_scale=scale, sinks=sinks, **scales)  # fmt: skip
    torch.cuda.synchronize()
    if fp8:
        k_cache = k_cache.double() * scales["k_scale"].double()
        v_cache = v_cache.double() * scales["v_scale"].double()
    ref = paged_decode_ref(q, k_cache, v_cache, table, seq_lens, scale, mask=hooks, sinks=sinks)
    err, ok = rel_error(out, ref)
    return dict(nan=int(out.isnan().sum()), rel_err=err, ok=ok and not out.isnan().any())


def decode_cases() -> list[tuple[str, object]]:
    lens = [1, 100, 129, 1000, 4097, 0, 8192]
    cases = []
    for d, group, page in ((128, 4, 64), (128, 4, 128), (128, 8, 16), (64, 16, 1), (128, 1, 128)):
        cases.append((f"decode bf16 d{d} g{group} ps{page} causal",
                      lambda d=d, g=group, p=page: check_decode("bfloat16", d, g, p, CAUSAL, lens)))  # fmt: skip
    for d, group, page in ((128, 4, 64), (128, 8, 16), (64, 4, 128)):
        cases.append((f"decode bf16 fp8-KV d{d} g{group} ps{page} causal",
                      lambda d=d, g=group, p=page: check_decode("bfloat16", d, g, p, CAUSAL, lens,
                                                                fp8=True)))  # fmt: skip
    cases.append(("decode fp16 d128 g4 ps64 window 500 sinks",
                  lambda: check_decode("float16", 128, 4, 64,
                                       MaskHooks(causal=True, window_left=500, sinks=True), lens)))  # fmt: skip
    return cases


def bench_decode(batch: int, ctx: int, page: int, d: int = 128, hq: int = 32, hkv: int = 8,
                 stages: tuple[int, ...] = (2, 3)) -> dict:  # fmt: skip
    """attngen's CuTe DSL decode (K/V ring depths ``stages``; the first is the generated
    default) vs FA4's paged varlen forward, same cache and queries."""
    from triton.testing import do_bench

    from attngen.families.mha.cute_dsl.host.compile import decode_shape
    from attngen.families.mha.cute_dsl.kernels.decode_sm90 import resident_ctas
    from attngen.families.mha.runtime import MIN_SPLIT_TOKENS, decode_num_splits, decode_split_cap

    dt = torch.bfloat16
    cfg = decode_config("bfloat16", d, hq // hkv, page)
    traits = MhaCuteTraits(CAUSAL, ("decode",))
    k_cache, v_cache, table = paged_cache([ctx] * batch, page, d, hkv, dt)
    q = torch.randn(batch, hq, d, dtype=dt, device="cuda")
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def runtime_splits(c: MhaCuteConfig) -> torch.Tensor:
        """The runtime's split counts for ``c`` (its rule reads the decode's resident CTAs)."""
        resident = resident_ctas(decode_shape(c, traits))
        cap = decode_split_cap(programs_per_split=batch * hkv, num_sms=sms,
                               max_splits=c.max_splits, resident_ctas=resident)  # fmt: skip
        return decode_num_splits(seq_lens, cap=cap,
                                 min_split_tokens=max(MIN_SPLIT_TOKENS, c.decode_block_n))  # fmt: skip

    splits = runtime_splits(cfg)
    out = torch.empty_like(q)
    po = torch.empty(batch, hq, cfg.max_splits, d, device="cuda")
    pl = torch.empty(batch, hq, cfg.max_splits, device="cuda")
    scale = d**-0.5

    def ours() -> None:
        library.decode(q, k_cache, v_cache, table, seq_lens, splits, out, po, pl, config=cfg,
                       traits=traits, sm_scale=scale)  # fmt: skip

    nbytes = 2 * batch * ctx * hkv * d * 2
    row = dict(case=f"decode hd{d} {hq}/{hkv} B{batch} ctx{ctx} page{page}",
               splits=int(splits.max()))  # fmt: skip
    ours()
    ms = do_bench(ours, warmup=25, rep=100, return_mode="median")
    row["attngen_tbps"] = round(nbytes / ms / 1e9, 2)
    # the same launch captured in a CUDA graph (as an engine runs decode): no host cost
    ms_graph = graph_ms(ours)
    row["attngen_graph_tbps"] = round(nbytes / ms_graph / 1e9, 2)
    default = cfg
    for n in stages[1:]:  # other ring depths (the tuning key decode_num_stages) that fit
        cfg = dataclasses.replace(default, decode_num_stages=n)
        if decode_shared_bytes(cfg) > SM90_SHARED_BYTES:
            continue
        ours()  # compile outside the capture
        row[f"attngen_graph_tbps_stages{n}"] = round(nbytes / graph_ms(ours) / 1e9, 2)
    cfg = default
    # the same shape over an fp8 e4m3 cache (pages of 16+ tokens): sequences per second
    # relative to the bf16 cache (the target: 1.7x)
    k8, ks = to_fp8(k_cache)
    v8, vs = to_fp8(v_cache)
    cfg8 = decode_config("bfloat16", d, hq // hkv, page, fp8=True)
    splits8 = runtime_splits(cfg8)
    row["fp8_splits"] = int(splits8.max())

    def ours_fp8() -> None:
        library.decode(q, k8, v8, table, seq_lens, splits8, out, po, pl, config=cfg8,
                       traits=traits, sm_scale=scale, k_scale=ks, v_scale=vs)  # fmt: skip

    try:  # both sides in CUDA graphs: eager launches of the fp8 kernel are host-bound
        ours_fp8()
        ms8 = graph_ms(ours_fp8)
        row["fp8_speedup_vs_bf16"] = round(ms_graph / ms8, 3)
        row["fp8_stages"] = cfg8.decode_num_stages
        default8 = cfg8
        for n in FP8_STAGES:  # other ring depths over the fp8 cache, where shared memory holds them
            cfg8 = dataclasses.replace(default8, decode_num_stages=n)
            if n == default8.decode_num_stages or decode_shared_bytes(cfg8) > SM90_SHARED_BYTES:
                continue
            ours_fp8()  # compile outside the capture
            row[f"fp8_speedup_stages{n}"] = round(ms_graph / graph_ms(ours_fp8), 3)
        if page == 64:  # the page as the key tile (as lowered until 2026-12-03), same splits
            cfg8 = dataclasses.replace(default8, fwd_tile_n=64)
            ours_fp8()
            row["fp8_speedup_tile64"] = round(ms_graph / graph_ms(ours_fp8), 3)
            cfg = dataclasses.replace(default, fwd_tile_n=64)
            ours()
            row["attngen_graph_tbps_tile64"] = round(nbytes / graph_ms(ours) / 1e9, 2)
            cfg = default
        cfg8 = default8
    except Exception as exc:  # noqa: BLE001
        row["fp8_error"] = f"{type(exc).__name__}: {exc}"[:300]
    try:
        from flash_attn.cute import flash_attn_varlen_func

        def fa4():
            return flash_attn_varlen_func(q.unsqueeze(1), k_cache, v_cache, page_table=table,
                                          seqused_k=seq_lens, softmax_scale=scale,
                                          causal=False)[0]  # fmt: skip

        ref = fa4().view(batch, hq, d).float()
        ours()
        row["max_abs_vs_fa4"] = float((out.float() - ref).abs().max())
        ms_fa4 = do_bench(fa4, warmup=25, rep=100, return_mode="median")
        row["fa4_tbps"] = round(nbytes / ms_fa4 / 1e9, 2)
        row["ratio"] = round(ms_fa4 / ms, 3)  # eager, both
        ms_fa4_graph = graph_ms(fa4)
        row["fa4_graph_tbps"] = round(nbytes / ms_fa4_graph / 1e9, 2)
        row["ratio_graph"] = round(ms_fa4_graph / ms_graph, 3)  # both in CUDA graphs
    except Exception as exc:  # noqa: BLE001
        row["fa4_error"] = f"{type(exc).__name__}: {exc}"[:300]
    print(json.dumps(row), flush=True)
    return row


FP8_STAGES = (2, 3, 4)


def decode_shared_bytes(cfg: MhaCuteConfig) -> int:
    """The decode kernel's shared memory for ``cfg`` (the plan check's formula)."""
    kv_bytes = 1 if cfg.kv_dtype.startswith("float8") else 2
    return sm90_decode_shared_bytes(cfg.head_dim, cfg.v_head_dim, cfg.decode_block_n,
                                    cfg.decode_num_stages, kv_bytes=kv_bytes)  # fmt: skip


DECODE_BENCH = [(8, 8192, 64), (8, 8192, 128), (64, 4096, 64), (64, 4096, 128),
                (32, 16384, 128), (128, 2048, 64)]  # fmt: skip


CAUSAL, NONE = MaskHooks(causal=True), MaskHooks(causal=False)
LENS = [1, 77, 300, 128, 1000, 513]


def numerics_cases() -> list[tuple[str, object]]:
    cases = []
    for d in (64, 128):
        for name, hooks in (("causal", CAUSAL), ("none", NONE)):
            for group in (1, 4):
                cases.append((f"prefill bf16 d{d} g{group} {name}",
                              lambda d=d, h=hooks, g=group: check_prefill("bfloat16", d, g, h, LENS)))  # fmt: skip
    cases.append(("prefill fp16 d128 g4 causal",
                  lambda: check_prefill("float16", 128, 4, CAUSAL, LENS)))  # fmt: skip
    for name, hooks in (
        ("window 100", MaskHooks(causal=True, window_left=100)),
        ("softcap 30", MaskHooks(causal=True, logit_softcap=30.0)),
        ("sinks", MaskHooks(causal=True, sinks=True)),
    ):
        cases.append((f"prefill bf16 d128 g4 {name}",
                      lambda h=hooks: check_prefill("bfloat16", 128, 4, h, LENS)))  # fmt: skip
    prefixes, news = [0, 500, 1000, 37, 4096], [129, 1, 300, 64, 700]
    for d in (64, 128):
        for page in (64, 128):
            cases.append((f"extend bf16 d{d} ps{page} g4 causal",
                          lambda d=d, p=page: check_extend("bfloat16", d, 4, p, CAUSAL, prefixes, news)))  # fmt: skip
    cases.append(("extend bf16 d128 ps128 g1 none",
                  lambda: check_extend("bfloat16", 128, 1, 128, NONE, prefixes, news)))  # fmt: skip
    cases.append(("extend fp16 d128 ps64 g8 window 256",
                  lambda: check_extend("float16", 128, 8, 64, MaskHooks(causal=True, window_left=256),
                                       prefixes, news)))  # fmt: skip
    return cases


def run_numerics(cases: list[tuple[str, object]]) -> list[dict]:
    rows = []
    for name, fn in cases:
        torch.manual_seed(len(rows))
        t0 = time.perf_counter()
        try:
            res = fn()
        except Exception as exc:  # noqa: BLE001 -- every case is reported
            res = dict(ok=False, error=f"{type(exc).__name__}: {exc}"[:600])
            traceback.print_exc()
        res.update(case=name, seconds=round(time.perf_counter() - t0, 2))
        print(json.dumps(res), flush=True)
        rows.append(res)
    return rows


FIRST_CALL = """
import sys, time, torch
sys.path.insert(0, {root!r})
t0 = time.perf_counter()
from attngen.families.mha.cute_dsl import library
from attngen.families.mha.cute_dsl.config import MhaCuteConfig, MhaCuteTraits
from attngen.hooks import MaskHooks
t1 = time.perf_counter()
cfg = MhaCuteConfig(uri="x", head_dim=128, v_head_dim=128, gqa_group=4, page_size=128,
    dtype="bfloat16", kv_dtype="bfloat16", kv_scale="none", spec_topk=0, num_draft_tokens=0,
    arch="sm90", fwd_tile_m=128, fwd_tile_n=128, fwd_num_stages=2)
q = torch.randn(256, 8, 128, dtype=torch.bfloat16, device="cuda")
k = torch.randn(256, 2, 128, dtype=torch.bfloat16, device="cuda"); out = torch.empty_like(q)
cu = torch.tensor([0, 256], dtype=torch.int32, device="cuda")
t2 = time.perf_counter()
library.prefill(q, k, k, cu, out, max_seq_len=256, config=cfg,
    traits=MhaCuteTraits(MaskHooks(causal=True), ("prefill",)), sm_scale=0.1)
torch.cuda.synchronize(); t3 = time.perf_counter()
library.prefill(q, k, k, cu, out, max_seq_len=256, config=cfg,
    traits=MhaCuteTraits(MaskHooks(causal=True), ("prefill",)), sm_scale=0.1)
torch.cuda.synchronize(); t4 = time.perf_counter()
print("FIRST_CALL", round(t1 - t0, 3), round(t3 - t2, 3), round(t4 - t3, 4))
"""


def first_call_times(cache_dir: Path) -> list[str]:
    """A fresh process's import time, first call (compile or disk-cache load) and second
    call, twice with one CUTE_DSL_CACHE_DIR: cold, then warm."""
    env = dict(os.environ, CUTE_DSL_CACHE_DIR=str(cache_dir))
    code = FIRST_CALL.format(root=str(Path(__file__).resolve().parents[1]))
    lines = []
    for label in ("cold", "warm"):
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=240)  # fmt: skip
        found = [ln for ln in proc.stdout.splitlines() if ln.startswith("FIRST_CALL")]
        lines.append(f"{label}: {found[0] if found else proc.stderr[-800:]}")
        print(lines[-1], flush=True)
    return lines


def bench_prefill(causal: bool, seq: int, d: int = 128, hq: int = 32, hkv: int = 8) -> dict:
    from triton.testing import do_bench

    total = 16384
    batch = total // seq
    dt = torch.bfloat16
    q = torch.randn(total, hq, d, dtype=dt, device="cuda")
    k = torch.randn(total, hkv, d, dtype=dt, device="cuda")
    v = torch.randn(total, hkv, d, dtype=dt, device="cuda")
    cu = ragged([seq] * batch)
    out = torch.empty_like(q)
    cfg = config("bfloat16", d, hq // hkv, 128, 128)
    traits = MhaCuteTraits(MaskHooks(causal=causal), ("prefill",))
    scale = d**-0.5

    def ours() -> None:
        library.prefill(q, k, v, cu, out, max_seq_len=seq, config=cfg, traits=traits,
                        sm_scale=scale)  # fmt: skip

    flops = 2 * batch * hq * seq * seq * (d + d) * (0.5 if causal else 1.0)
    row = dict(case=f"prefill hd{d} {hq}/{hkv} S={seq} {'causal' if causal else 'non-causal'}")
    ms = do_bench(ours, warmup=25, rep=100, return_mode="median")
    row["attngen_tflops"] = round(flops / ms / 1e9, 1)
    try:
        from flash_attn.cute import flash_attn_varlen_func

        def fa4() -> None:
            flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=seq,
                                   max_seqlen_k=seq, softmax_scale=scale, causal=causal)  # fmt: skip

        ms_fa4 = do_bench(fa4, warmup=25, rep=100, return_mode="median")
        row["fa4_tflops"] = round(flops / ms_fa4 / 1e9, 1)
        row["ratio"] = round(ms_fa4 / ms, 3)  # eager, both
    except Exception as exc:  # noqa: BLE001
        row["fa4_error"] = f"{type(exc).__name__}: {exc}"[:300]
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
    parser.add_argument("--no-bench", action="store_true")
    parser.add_argument(
        "--overlap",
        type=int,
        choices=(0, 1),
        default=0,
        help="fwd_intra_wg_overlap of every kernel (1: not yet GPU-verified)",
    )
    parser.add_argument("--decode", action="store_true", help="split-KV decode only")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    global OVERLAP
    OVERLAP = args.overlap
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    if args.decode:
        return decode_main(args)
    result: dict = {"numerics": run_numerics(numerics_cases())}
    result["first_call"] = first_call_times(args.out / "cute_cache_probe")
    if not args.no_bench:
        result["bench"] = [
            bench_prefill(causal, seq) for causal in (True, False) for seq in (1024, 4096, 16384)
        ]
    result["overlap"] = OVERLAP
    (args.out / f"cute_mha_check_overlap{OVERLAP}.json").write_text(json.dumps(result, indent=1))
    print("\n== numerics")
    for r in result["numerics"]:
        status = "ok " if r.get("ok") else "FAIL"
        detail = (
            r.get("error") or f"row rms err {r.get('rel_err', math.nan):.2e} nan {r.get('nan')}"
        )
        print(f"{status} {r['case']:<42} {detail} ({r['seconds']} s)")
    for line in result["first_call"]:
        print(line)
    for r in result.get("bench", []):
        print(r)
    return 0 if all(r.get("ok") for r in result["numerics"]) else 1


def decode_main(args: argparse.Namespace) -> int:
    result: dict = {"numerics": run_numerics(decode_cases())}
    if not args.no_bench:
        result["bench"] = []
        for case in DECODE_BENCH:
            try:
                result["bench"].append(bench_decode(*case, stages=(2, 3, 4)))
            except Exception as exc:  # noqa: BLE001 -- every case is reported
                traceback.print_exc()
                result["bench"].append(dict(case=str(case), error=f"{exc}"[:300]))
    (args.out / "cute_mha_decode_check.json").write_text(json.dumps(result, indent=1))
    print("\n== decode numerics")
    for r in result["numerics"]:
        status = "ok " if r.get("ok") else "FAIL"
        detail = (
            r.get("error") or f"row rms err {r.get('rel_err', math.nan):.2e} nan {r.get('nan')}"
        )
        print(f"{status} {r['case']:<46} {detail} ({r['seconds']} s)")
    print("== decode vs FA4 (TB/s of K+V read; ratio = FA4 time / attngen time)")
    for r in result.get("bench", []):
        print(r)
    return 0 if all(r.get("ok") for r in result["numerics"]) else 1


if __name__ == "__main__":
    sys.exit(main())
