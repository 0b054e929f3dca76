#!/usr/bin/env python3
"""GPU benchmark of attngen's generated Triton GDN kernels next to flash-linear-attention
(``fla-core==0.6.0``), same inputs, one run.

Both sides get the raw gate inputs (a, b) and fuse g = -exp(A_log) softplus(a + dt_bias),
beta = sigmoid(b) and the q/k L2 norm in their kernels (fla: ``use_gate_in_kernel``,
``use_beta_sigmoid_in_kernel``, ``use_qk_l2norm_in_kernel``); states are fp32 in SGLang's
``[N, HV, V, K]`` layout (fla: ``state_v_first=True``).

- chunk prefill: ragged batches without an initial state, final state written (attngen:
  into pool slots; fla: a new tensor); M tokens/s = tokens / time;
- recurrent decode: one token per request from an fp32 state; attngen updates pool slots in
  place (requests on shuffled slots, launched in slot order as GdnBackend's decode metadata
  does), fla reads a contiguous state and writes the final state;
  TB/s = (state read + state write) bytes / time; timed eagerly and, for the default
  tiles and the tile sweep, with both sides captured in CUDA graphs (how an engine runs
  decode); the default tiles also with the pool slots in order (1 .. B, fla's access
  pattern: ``graph_speedup_in_order``).

Outputs of the two are compared (max abs difference over the output RMS), and on the prefill
rows each side's output and final state against the float64 token-by-token recurrence
(request 0, value head 0: ``out_err_vs_f64``, ``state_err_vs_f64``, the same measure), so
that speed is quoted with what each side's precision costs. Run from the repo
root: ``python bench/gdn.py --out DIR`` (fla importable, ``FLA_FLASH_QLA=0``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib
import importlib.metadata
import json
import math
import os
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PREFILL_CASES = ((1, 32768, 16), (4, 8192, 16), (8, 4096, 32))  # (batch, length, heads), GVA 1
DECODE_CASES = ((64, 16, 32), (256, 16, 32))  # (batch, k heads, v heads), GVA 2
DIM = 128
# tile sweeps (config overrides) timed on one decode and two prefill cases, after the main
# table, to say which tiles the lowering should take
DECODE_SWEEP = (
    {"decode_tiles": 2},
    {"decode_tiles": 4},
    {"decode_tiles": 8},
    {"decode_block_v": 4},
    {"decode_block_v": 16},
    {"decode_block_v": 16, "decode_num_warps": 2},
    {"decode_block_v": 32, "decode_num_warps": 4},
    {"decode_num_warps": 2},
)
PREFILL_SWEEP = (  # the state kernel's tiles on two cases, the parallel kernels' on one
    {"state_block_v_max": 16},
    {"state_block_v": 32, "state_block_v_max": 32},
    {"state_block_v": 64, "state_block_v_max": 64},
    {"state_block_v_max": 16, "state_num_stages": 2},
    {"state_block_v_max": 16, "state_num_warps": 8},
    {"state_block_v": 32, "state_block_v_max": 32, "state_num_warps": 8},
    {"prepare_num_warps": 8},
    {"wu_num_warps": 4},
    {"output_block_v": 128, "output_num_warps": 8},
)
DECODE_SWEEP_BATCHES = (64, 256)
TABLES = ("prefill", "decode", "sweep")
WARMUP_MS, REP_MS = 25, 100
FLA_MS: dict[str, float] = {}
FLA_KERNELS: dict[str, object] = {}  # fla's per-kernel times per case, profiled once
# FlashInfer's GDN prefill (a second peer, CuTe DSL on sm90) when it imports: {"chunk": fn}
FLASHINFER: dict[str, object] = {}
# attngen's CuTe DSL prefill (generated/sm90/cute_dsl/gdn/gdn_gva1_extend), when it imports:
# its rows time it on the same inputs beside the Triton module
CUTE: dict[str, object] = {}
DEV = "cuda"
torch = None


T0 = datetime.datetime.now()


def log(msg: str) -> None:
    print(f"[{(datetime.datetime.now() - T0).total_seconds():6.1f}s] {msg}", flush=True)


def kernels_module(spec: str):
    sys.path.insert(0, str(ROOT))
    return importlib.import_module(f"generated.sm90.triton.gdn.{spec}.kernels")


def config_for(mod, group: int):
    return next(c for c in mod.CONFIGS.values() if c.v_heads_per_k_head == group)


def inputs(n: int, h: int, hv: int):
    bf16 = dict(dtype=torch.bfloat16, device=DEV)
    return dict(
        q=torch.randn(n, h, DIM, **bf16),
        k=torch.randn(n, h, DIM, **bf16),
        v=torch.randn(n, hv, DIM, **bf16),
        a=torch.randn(n, hv, **bf16),
        b=torch.randn(n, hv, **bf16),
        A_log=torch.empty(hv, dtype=torch.float32, device=DEV).uniform_(0.0, 2.7),
        dt_bias=torch.randn(hv, dtype=torch.float32, device=DEV) * 0.5,
    )


def bench(fn) -> float:
    import triton

    return triton.testing.do_bench(fn, warmup=WARMUP_MS, rep=REP_MS)


OUR_KERNELS = ("chunk", "recurrent", "conv", "accept")  # attngen's GDN kernel name prefixes


def kernel_times(fn, reps: int = 5, prefixes: tuple[str, ...] | None = OUR_KERNELS) -> dict:
    """Device time per kernel name (us per call, mean over ``reps`` calls), by the profiler:
    the kernels whose names start with one of ``prefixes`` (None: every kernel, as for fla,
    whose gate, norm and cumsum kernels count in its time)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    times: dict[str, float] = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
        if us and (prefixes is None or e.key.split("_")[0] in prefixes):
            times[e.key] = round(us / reps, 1)
    return times


def diff(x, y) -> float:
    x, y = x.float().flatten(), y.float().flatten()
    return float((x - y).abs().max() / y.pow(2).mean().sqrt())


def f64_oracle(x: dict, length: int) -> tuple:
    """The float64 token-by-token recurrence on request 0, value head 0 (the first
    ``length`` rows): its outputs ``[length, 1, V]`` and final state ``[V, K]``."""
    from attngen.families.gdn import reference

    one = {n: x[n][:length, :1] for n in ("q", "k", "v", "a", "b")}
    g, beta = reference.gates(one["a"], one["b"], x["A_log"][:1], x["dt_bias"][:1])
    ref_out, ref_state, _ = reference.gdn_sequence(
        one["q"], one["k"], one["v"], g, beta, None,
        scale=DIM**-0.5, l2norm_qk=True, keep_steps=False,
    )  # fmt: skip
    return ref_out, ref_state[0]


def oracle_errors(ref: tuple, length: int, sides: dict) -> dict:
    """Each side's errors against ``ref`` (``oracle``'s), as ``diff`` measures them: max
    |error| / RMS of the oracle. ``sides`` maps a name to its ``(out [T, HV, V], final state
    of request 0, value head 0 [V, K])``; only request 0, value head 0 is compared."""
    ref_out, ref_state = ref
    return {
        "out_err_vs_f64": {k: diff(out[:length, :1], ref_out) for k, (out, _) in sides.items()},
        "state_err_vs_f64": {k: diff(state, ref_state) for k, (_, state) in sides.items()},
    }


def prefill_runner(mod, bs: int, length: int, heads: int, tiles=None, x=None):
    """attngen's side of a prefill case: (run, buffers) for ``bs`` requests of ``length``
    tokens and ``heads`` value heads (GVA 1), no initial state, each final state into its
    pool slot; buffers holds the inputs ``x`` (fresh unless given), ``out``, ``pool`` and
    ``qsl``."""
    cfg = dataclasses.replace(config_for(mod, 1), **(tiles or {}))
    n = bs * length
    x = inputs(n, heads, heads) if x is None else x
    i32 = dict(dtype=torch.int32, device=DEV)
    qsl = torch.arange(bs + 1, **i32) * length
    pool = torch.zeros(bs + 1, heads, DIM, DIM, dtype=torch.float32, device=DEV)
    slots = torch.arange(1, bs + 1, **i32)
    no_init = torch.zeros(bs, **i32)
    out = torch.empty(n, heads, DIM, dtype=torch.bfloat16, device=DEV)
    plan = mod.chunk_plan([length] * bs, cfg.chunk_size, torch.device(DEV))
    gates = dict(A_log=x["A_log"], dt_bias=x["dt_bias"])

    def ours():
        mod.extend(
            x["q"],
            x["k"],
            x["v"],
            x["a"],
            x["b"],
            **gates,
            ssm_states=pool,
            cache_indices=slots,
            has_initial_state=no_init,
            query_start_loc=qsl,
            out=out,
            plan=plan,
            config=cfg,
            scale=DIM**-0.5,
        )

    return ours, dict(x=x, out=out, pool=pool, qsl=qsl, plan=plan)


def fla_fused(x: dict) -> dict:
    """fla's keywords shared by its prefill and decode calls here: the scale, the gates
    (``A_log``, ``dt_bias``), beta and the q/k L2 norm in the kernel, states in the pool's
    [V, K] layout, the final states returned."""
    return dict(
        scale=DIM**-0.5,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True,
        A_log=x["A_log"],
        dt_bias=x["dt_bias"],
        use_beta_sigmoid_in_kernel=True,
        state_v_first=True,
    )


def fla_prefill_call(fla_chunk, x: dict, cu):
    """fla's chunked prefill of the inputs ``x`` (q, k, v, a, b, A_log, dt_bias; ragged rows
    at ``cu``, int64) with its gates, q/k norms and beta in the kernel, no initial state, the
    final states returned ([V, K] layout): a closure to time."""

    def theirs():
        return fla_chunk(
            x["q"][None],
            x["k"][None],
            x["v"][None],
            x["a"][None],
            x["b"][None],
            initial_state=None,
            cu_seqlens=cu,
            **fla_fused(x),
        )

    return theirs


def fla_decode_call(fla_recurrent, x: dict, state):
    """fla's recurrent decode of the inputs ``x`` (one token a request) from the contiguous
    fp32 states ``state`` ([B, HV, V, K]), gates, q/k norms and beta in the kernel, the final
    states returned in a new tensor: a closure to time."""

    def theirs():
        return fla_recurrent(
            x["q"][:, None],
            x["k"][:, None],
            x["v"][:, None],
            g=x["a"][:, None],
            beta=x["b"][:, None],
            initial_state=state,
            **fla_fused(x),
        )

    return theirs


def prefill_case(
    mod, fla_chunk, bs: int, length: int, heads: int, tiles=None, oracle: bool = False
) -> dict:
    ours, buffers = prefill_runner(mod, bs, length, heads, tiles)
    x, out, pool, n = buffers["x"], buffers["out"], buffers["pool"], bs * length
    cu = buffers["qsl"].to(torch.int64)

    theirs = fla_prefill_call(fla_chunk, x, cu)
    ours()
    fla_out, fla_state = theirs()
    key = f"{bs}x{length} H{heads}"
    row = {"case": key, "tokens": n, "tiles": tiles or "default"}
    row["out_diff_vs_fla"] = diff(out, fla_out[0])
    row["state_diff_vs_fla"] = diff(pool[1:], fla_state)
    if oracle:  # the main rows (the sweep's tiles compute the same values)
        buffers["oracle"] = f64_oracle(x, length)
        sides = {"attngen": (out, pool[1, 0]), "fla": (fla_out[0], fla_state[0, 0])}
        row.update(oracle_errors(buffers["oracle"], length, sides))
    t_ours = bench(ours)
    if key not in FLA_MS:  # fla timed once per case (the sweep reuses it)
        FLA_MS[key] = bench(theirs)
    t_fla = FLA_MS[key]
    for name, fn, prefixes in (("kernels_us", ours, OUR_KERNELS), ("fla_kernels_us", theirs, None)):
        if name == "fla_kernels_us" and key in FLA_KERNELS:
            row[name] = FLA_KERNELS[key]
            continue
        try:
            row[name] = kernel_times(fn, prefixes=prefixes)
        except Exception as e:  # the profiler must not cost the timings
            row[name] = f"profiler failed: {e}"
    FLA_KERNELS.setdefault(key, row["fla_kernels_us"])
    row.update(attngen_ms=t_ours, fla_ms=t_fla, speedup=t_fla / t_ours)
    row.update(attngen_mtok_s=n / t_ours / 1e3, fla_mtok_s=n / t_fla / 1e3)
    if CUTE and tiles is None:  # attngen's CuTe DSL module on the same inputs
        try:
            row.update(cute_prefill(buffers, bs, length, heads, out, fla_out[0], t_ours, t_fla))
        except Exception:  # its rows must not cost the others
            row["cute_error"] = traceback.format_exc()[-600:]
    if FLASHINFER and tiles is None:  # the second peer, on the main rows
        try:
            row.update(flashinfer_prefill(FLASHINFER["chunk"], buffers, bs, length, heads))
            row["speedup_vs_flashinfer"] = row["flashinfer_ms"] / t_ours
        except Exception:  # its rows must not cost fla's
            row["flashinfer_error"] = traceback.format_exc()[-600:]
    return row


def cute_prefill(buffers, bs, length, heads, out_triton, out_fla, t_triton, t_fla) -> dict:
    """The CuTe DSL module's prefill on the Triton side's inputs: its time and ratios, its
    output against the Triton module's and fla's, and (on the main rows) its float64
    errors beside theirs."""
    run, mine = prefill_runner(CUTE["mod"], bs, length, heads, x=buffers["x"])
    run()
    n = bs * length
    row = {"cute_out_diff_vs_triton": diff(mine["out"], out_triton)}
    row["cute_out_diff_vs_fla"] = diff(mine["out"], out_fla)
    if "oracle" in buffers:
        errs = oracle_errors(buffers["oracle"], length, {"cute": (mine["out"], mine["pool"][1, 0])})
        row.update({f"cute_{k}": v["cute"] for k, v in errs.items()})
    t = bench(run)
    row.update(cute_ms=t, cute_mtok_s=n / t / 1e3, cute_speedup=t_fla / t)
    row["cute_speedup_vs_triton"] = t_triton / t
    taken = [s for s in getattr(mine["plan"], "schedules", {}).values() if s is not None]
    if taken:  # context parallelism ran: its segments, and the plain launch's time beside
        row["cute_segments"] = list(taken[0].schedule.counts)
        plain, _ = prefill_runner(
            CUTE["mod"], bs, length, heads, {"segments_max": 1}, x=buffers["x"]
        )
        row["cute_plain_ms"] = bench(plain)
    return row


def flashinfer_prefill(fi_chunk, buffers: dict, bs: int, length: int, heads: int) -> dict:
    """FlashInfer's chunked GDN prefill on the same inputs (``[T, H, D]`` rows, varlen
    ``cu_seqlens``, fp32 states ``[N, HV, V, K]`` like the pool's). Its API takes the gates
    as values (alpha = exp(g) and beta, fp32 ``[T, HV]``), and 0.6.14 accepts
    ``use_qk_l2norm_in_kernel`` but never reads it (raw keys make its states blow up to NaN),
    so q and k are normalised here (as the oracle does, rounded to bf16) too. Both happen
    before the timed call: its time leaves out the gates and the norms, which attngen's and
    fla's include."""
    from attngen.families.gdn import reference

    x, out, pool, n = buffers["x"], buffers["out"], buffers["pool"], bs * length
    g, beta = reference.gates(x["a"], x["b"], x["A_log"], x["dt_bias"])
    alpha, beta = torch.exp(g).float().contiguous(), beta.float().contiguous()
    q, k = (reference.l2norm(t).to(t.dtype).contiguous() for t in (x["q"], x["k"]))
    fi_out = torch.empty(n, heads, DIM, dtype=torch.bfloat16, device=DEV)
    fi_state = torch.empty(bs, heads, DIM, DIM, dtype=torch.float32, device=DEV)
    cu = buffers["qsl"].to(torch.int64)  # converted once, outside the timed call

    def theirs():
        return fi_chunk(
            q,
            k,
            x["v"],
            alpha,
            beta,
            scale=DIM**-0.5,
            initial_state=None,
            output_final_state=True,
            cu_seqlens=cu,
            use_qk_l2norm_in_kernel=False,  # normalised above
            output=fi_out,
            output_state=fi_state,
        )

    theirs()
    torch.cuda.synchronize()
    row = {
        "out_diff_vs_flashinfer": diff(out, fi_out),
        "state_diff_vs_flashinfer": diff(pool[1:], fi_state),
    }
    if not all(math.isfinite(v) for v in row.values()):  # no time for a wrong answer
        raise ValueError(f"FlashInfer's output or state is not finite: {row}")
    if "oracle" in buffers:
        errs = oracle_errors(buffers["oracle"], length, {"fi": (fi_out, fi_state[0, 0])})
        row["flashinfer_out_err_vs_f64"] = errs["out_err_vs_f64"]["fi"]
        row["flashinfer_state_err_vs_f64"] = errs["state_err_vs_f64"]["fi"]
    t = bench(theirs)
    row.update(flashinfer_ms=t, flashinfer_mtok_s=n / t / 1e3)
    return row


def decode_case(mod, fla_recurrent, bs: int, h: int, hv: int, tiles=None) -> dict:
    cfg = dataclasses.replace(config_for(mod, hv // h), **(tiles or {}))
    x = inputs(bs, h, hv)
    i32 = dict(dtype=torch.int32, device=DEV)
    state = torch.randn(bs, hv, DIM, DIM, dtype=torch.float32, device=DEV) * 0.05
    from attngen.families.gdn.runtime import slot_order

    held = (torch.randperm(bs, device=DEV) + 1).to(torch.int32)  # request b's slot, shuffled
    pool = torch.zeros(bs + 1, hv, DIM, DIM, dtype=torch.float32, device=DEV)
    pool[held.long()] = state
    # launched as GdnBackend's decode metadata does: programs in slot order, rows permuted
    slots, qsl = torch.empty(bs, **i32), torch.empty(bs + 1, **i32)
    slot_order(held, slots, qsl)
    out = torch.empty(bs, hv, DIM, dtype=torch.bfloat16, device=DEV)
    gates = dict(A_log=x["A_log"], dt_bias=x["dt_bias"])
    start = pool.clone()

    def ours():
        mod.decode(
            x["q"],
            x["k"],
            x["v"],
            x["a"],
            x["b"],
            **gates,
            ssm_states=pool,
            cache_indices=slots,
            query_start_loc=qsl,
            out=out,
            config=cfg,
            scale=DIM**-0.5,
        )

    theirs = fla_decode_call(fla_recurrent, x, state)
    ours()
    fla_out, fla_state = theirs()
    row = {"case": f"B{bs} H{h}/{hv}", "tiles": tiles or "default"}
    row["out_diff_vs_fla"] = diff(out, fla_out[:, 0])
    row["state_diff_vs_fla"] = diff(pool[held.long()], fla_state)
    pool.copy_(start)
    nbytes = 2 * bs * hv * DIM * DIM * 4
    t_ours = bench(ours)
    if row["case"] not in FLA_MS:  # fla timed once per case (the sweep reuses it)
        FLA_MS[row["case"]] = bench(theirs)
    t_fla = FLA_MS[row["case"]]
    row.update(attngen_us=t_ours * 1e3, fla_us=t_fla * 1e3, speedup=t_fla / t_ours)
    row.update(attngen_tb_s=nbytes / t_ours / 1e9, fla_tb_s=nbytes / t_fla / 1e9)
    try:  # both in CUDA graphs too: at B64 the eager call's host time shows
        from bench.graph_timing import graph_ms

        t_ours, t_fla = graph_ms(ours), graph_ms(theirs)
        row.update(attngen_graph_us=t_ours * 1e3, fla_graph_us=t_fla * 1e3)
        row.update(graph_speedup=t_fla / t_ours, attngen_graph_tb_s=nbytes / t_ours / 1e9)
        row.update(fla_graph_tb_s=nbytes / t_fla / 1e9)
        if tiles is None:  # the requests on slots 1 .. B in order: fla's access pattern
            slots.copy_(torch.arange(1, bs + 1, **i32))
            qsl.copy_(torch.arange(bs + 1, **i32))
            t_in_order = graph_ms(ours)
            row.update(attngen_graph_in_order_us=t_in_order * 1e3)
            row.update(graph_speedup_in_order=t_fla / t_in_order)
    except Exception as e:  # a failed capture must not cost the eager row
        row["graph_error"] = f"{type(e).__name__}: {e}"[:300]
    return row


def main() -> int:
    global torch
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results")
    parser.add_argument(
        "--only",
        action="append",
        choices=TABLES,
        help="run only these tables (repeatable; default: all of them)",
    )
    args = parser.parse_args()
    only = set(args.only or TABLES)
    sys.path.insert(0, str(ROOT))
    from bench.preflight import missing_cuda, missing_peer

    if (code := missing_cuda("bench/gdn.py")) is not None:
        return code
    import torch as _torch

    torch = _torch
    torch.manual_seed(0)
    os.environ.setdefault("FLA_FLASH_QLA", "0")
    try:
        from fla.ops.gated_delta_rule import (
            chunk_gated_delta_rule,
            fused_recurrent_gated_delta_rule,
        )
    except ImportError as e:
        how = "put fla-core 0.6.0 and einops on PYTHONPATH (bench/README.md, GDN)"
        return missing_peer("bench/gdn.py", "fla-core", e, how)

    try:  # optional: flashinfer-python (and its CuTe DSL kernels' nvidia-cutlass-dsl)
        from flashinfer.gdn_prefill import chunk_gated_delta_rule as flashinfer_chunk

        version = importlib.metadata.version("flashinfer-python")
        FLASHINFER.update(chunk=flashinfer_chunk, version=version)  # both or neither
    except Exception as e:  # noqa: BLE001 -- fla's rows run either way
        log(f"FlashInfer GDN prefill not importable ({type(e).__name__}: {e}); fla only")

    import triton

    from bench.device_tag import device_tag
    from bench.run import tree_commit

    try:  # optional: the CuTe DSL prefill (nvidia-cutlass-dsl importable)
        mod = importlib.import_module("generated.sm90.cute_dsl.gdn.gdn_gva1_extend.kernels")
        version = importlib.metadata.version("nvidia-cutlass-dsl")
        CUTE.update(mod=mod, version=version)  # both or neither: the rows read both
    except Exception as e:  # noqa: BLE001 -- the Triton rows run either way
        log(f"attngen's CuTe DSL GDN prefill not importable ({type(e).__name__}: {e})")

    commit = os.environ.get("ATTNGEN_COMMIT") or tree_commit()
    rows = {"prefill": [], "decode": [], "sweep": []}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%MZ")
    path = out / f"{device_tag(torch.cuda.get_device_name())}-{stamp}-gdn-{commit}.json"
    log(f"bench/gdn.py: writing {path} (and its plot beside it)")

    def record(table: str, what: str, fn) -> None:
        """One row into ``rows[table]`` (a failure is a row too), then the JSON so far."""
        try:
            rows[table].append(fn())
        except Exception:  # one failure must not hide the rest
            rows[table].append({"case": what, "error": traceback.format_exc()[-800:]})
        log(json.dumps(rows[table][-1]))
        head = {
            "device": torch.cuda.get_device_name(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
            "commit": commit,
            "torch": torch.__version__,
            "triton": triton.__version__,
            "peer": "fla-core 0.6.0",
            "peer2": f"flashinfer-python {FLASHINFER['version']}" if FLASHINFER else "none",
            "cute_dsl": f"nvidia-cutlass-dsl {CUTE['version']}" if CUTE else "none",
        }
        path.write_text(json.dumps({**head, **rows}, indent=1) + "\n")

    prefill_mod, decode_mod = kernels_module("gdn_gva1"), kernels_module("gdn_qwen3_next")
    for bs, length, heads in PREFILL_CASES if "prefill" in only else ():
        record(
            "prefill",
            f"{bs}x{length} H{heads}",
            lambda: prefill_case(
                prefill_mod, chunk_gated_delta_rule, bs, length, heads, oracle=True
            ),
        )
    for bs, h, hv in DECODE_CASES if "decode" in only else ():
        record(
            "decode",
            f"B{bs}",
            lambda: decode_case(decode_mod, fused_recurrent_gated_delta_rule, bs, h, hv),
        )
    for tiles in PREFILL_SWEEP if "sweep" in only else ():
        for bs, length, heads in (PREFILL_CASES[2], PREFILL_CASES[0]):
            if "state_" not in str(tiles) and bs == 1:
                continue  # tiles of the parallel kernels: the many-request case says enough
            record(
                "sweep",
                f"{bs}x{length} H{heads} {tiles}",
                lambda: prefill_case(prefill_mod, chunk_gated_delta_rule, bs, length, heads, tiles),
            )
    for tiles in DECODE_SWEEP if "sweep" in only else ():
        for bs in DECODE_SWEEP_BATCHES:
            record(
                "sweep",
                f"B{bs} {tiles}",
                lambda: decode_case(
                    decode_mod, fused_recurrent_gated_delta_rule, bs, 16, 32, tiles
                ),
            )
    log("case | attngen | fla | speedup | diff vs fla | out / state error vs float64: attngen, fla")
    for r in rows["prefill"]:
        if "error" not in r:
            errs = [r.get(k, {}) for k in ("out_err_vs_f64", "state_err_vs_f64")]
            f64 = " / ".join(f"{e.get('attngen', 0):.1e}, {e.get('fla', 0):.1e}" for e in errs)
            log(
                f"{r['case']} | {r['attngen_mtok_s']:.1f} Mtok/s | {r['fla_mtok_s']:.1f} | {r['speedup']:.2f}x | {r['out_diff_vs_fla']:.2e} | {f64} | {r.get('kernels_us')}"
            )
            if "cute_mtok_s" in r:
                log(
                    f"  cute_dsl {r['cute_mtok_s']:.1f} Mtok/s: {r['cute_speedup']:.2f}x fla, "
                    f"{r['cute_speedup_vs_triton']:.2f}x triton, out / state error vs float64 "
                    f"{r.get('cute_out_err_vs_f64', 0):.1e} / {r.get('cute_state_err_vs_f64', 0):.1e}"
                    + (
                        f"; segments {r['cute_segments']}, plain launch {r['cute_plain_ms']:.3f} ms"
                        if "cute_plain_ms" in r
                        else ""
                    )
                )
            if "flashinfer_mtok_s" in r:
                log(
                    f"  flashinfer {r['flashinfer_mtok_s']:.1f} Mtok/s: attngen "
                    f"{r['speedup_vs_flashinfer']:.2f}x, diff {r['out_diff_vs_flashinfer']:.2e}"
                    + (
                        f", out / state error vs float64 {r['flashinfer_out_err_vs_f64']:.1e}"
                        f" / {r['flashinfer_state_err_vs_f64']:.1e}"
                        if "flashinfer_out_err_vs_f64" in r
                        else ""
                    )
                )
            elif "flashinfer_error" in r:
                log(f"  flashinfer failed: {r['flashinfer_error'].splitlines()[-1]}")
    for r in rows["sweep"]:
        if "error" not in r:
            graphs = f" | graphs {r['graph_speedup']:.2f}x" if "graph_speedup" in r else ""
            log(
                f"sweep {r['case']} {r['tiles']} | {r['speedup']:.2f}x{graphs} | {r.get('kernels_us', '')}"
            )
    for r in rows["decode"]:
        if "error" not in r:
            log(
                f"{r['case']} | {r['attngen_tb_s']:.2f} TB/s | {r['fla_tb_s']:.2f} | {r['speedup']:.2f}x | {r['out_diff_vs_fla']:.2e}"
                f" | graphs: {r.get('attngen_graph_tb_s', 0):.2f} TB/s | {r.get('fla_graph_tb_s', 0):.2f} | {r.get('graph_speedup', 0):.2f}x {r.get('graph_error', '')}"
                f" | slots in order: {r.get('graph_speedup_in_order', 0):.2f}x"
            )
    try:  # the ratios as a figure beside the JSON (bench/plot.py; matplotlib may be absent)
        from bench import plot

        plot.main([str(path)])
    except Exception as e:  # the JSON is the result; a missing plot must not fail the run
        log(f"no plot: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
