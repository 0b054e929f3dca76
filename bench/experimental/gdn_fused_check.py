"""GPU harness of ``gdn_fused_sm90.py``: numerics against the float64 recurrence and timing
against attngen's four-launch Triton prefill and the peers, same inputs.

``--check``: ragged requests (lengths 1 .. 1000, a chunk's edges among them), some from a
pool row's initial state, pool slots shuffled, one padding request (slot 0: its rows from a
zero state, no pool row read or written), GVA 1 and 2, keys random and correlated. Outputs
start as NaN: every row must be written. Each output and final state is
held to attngen's bounds (``attngen.families.gdn.testing``), the Triton extend's errors
printed beside it; with ``--segments`` S > 1 also long requests run as S segments
(``gdn_fused_cp``). ``--bench``: bench/gdn.py's prefill cases, prepare + fused (each
``--variants`` x ``--segments`` form) against the Triton extend, fla-core and
FlashInfer (each when it imports), same inputs. Writes ``gdn_fused.json`` under ``--out``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from attngen.families.gdn import reference, testing  # noqa: E402
from attngen.families.gdn.triton.host.options import prepare_options  # noqa: E402
from attngen.families.gdn.triton.kernels.chunk import chunk_prepare_kernel  # noqa: E402
from bench.experimental import gdn_fused_cp as cp  # noqa: E402
from bench.experimental import gdn_fused_gates as gates  # noqa: E402
from bench.experimental import gdn_prep_sm90 as prep  # noqa: E402
from bench.experimental import gdn_fused_sm90 as fused  # noqa: E402

DEV = "cuda"
F32 = dict(dtype=torch.float32, device=DEV)
SPECS = {1: "gdn_gva1", 2: "gdn_qwen3_next"}  # generated sm90 modules by GVA group
VARIANTS = fused.FORMS  # the kernel's forms by name
_COMPILED: dict[tuple, object] = {}


def module(group: int):
    """The generated sm90 Triton GDN module of ``group`` and its config (bench/gdn.py's)."""
    from bench import gdn

    mod = gdn.kernels_module(SPECS[group])
    return mod, gdn.config_for(mod, group)


def _rows(t):
    from cutlass.cute.runtime import from_dlpack

    return from_dlpack(t, assumed_align=16).mark_layout_dynamic(leading_dim=t.dim() - 1)


def _small(t):
    from cutlass.cute.runtime import from_dlpack

    return from_dlpack(t, assumed_align=4).mark_layout_dynamic(leading_dim=t.dim() - 1)


def prepare(x: dict, plan, qsl, cfg, scale: float):
    """The Triton prepare kernel: T ``[N, HV, C]`` and G, beta, qs, kn ``[HV, N]`` (fp32)."""
    q, k, v = x["q"], x["k"], x["v"]
    n, hv = q.shape[0], v.shape[1]
    f32 = dict(dtype=torch.float32, device=q.device)
    t_buf = torch.empty((n, hv, cfg.chunk_size), **f32)
    g_buf, beta_buf, qs_buf, kn_buf = (torch.empty((hv, n), **f32) for _ in range(4))
    chunks = [plan.chunk_seq, plan.chunk_start, qsl]
    args = [q, k, x["a"], x["b"], x["A_log"], x["dt_bias"], *chunks]
    args += [g_buf, beta_buf, qs_buf, kn_buf, t_buf, scale, q.stride(0), q.stride(1)]
    args += [k.stride(0), k.stride(1), x["a"].stride(0), x["b"].stride(0), hv, n]
    chunk_prepare_kernel[(plan.num_chunks, hv)](*args, **prepare_options(cfg))
    return t_buf, g_buf, beta_buf, qs_buf, kn_buf


def fused_args(x: dict, prepared, pool, slots, has_init, qsl, out, runs=None) -> tuple:
    """The fused kernel's arguments (CuTe tensors) on the current stream: one run a request
    (rows ``qsl[b] .. qsl[b + 1]``, outputs and values) unless ``runs`` gives (starts, ends,
    modes) int32 tensors of its own."""
    import cuda.bindings.driver as cuda

    t_buf, g_buf, beta_buf, qs_buf, kn_buf = prepared
    if runs is None:
        modes = torch.full_like(slots, fused.OUT | fused.VALUES)
        runs = (qsl[:-1], qsl[1:], modes)
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    return (
        _rows(x["q"]), _rows(x["k"]), _rows(x["v"]), _rows(t_buf), _small(g_buf),
        _small(beta_buf), _small(qs_buf), _small(kn_buf), _small(pool), _small(slots),
        _small(has_init), *(_small(r) for r in runs), _rows(out), stream,
    )  # fmt: skip


def compiled(
    group: int, cargs: tuple, skip: tuple[str, ...] = (), variant: str = "c1", modes: bool = False
):
    """The fused kernel for ``group`` (and a timing ablation's ``skip``; ``modes``: reading
    each run's mode bits, for gdn_fused_cp's launches), compiled once."""
    import cutlass.cute as cute

    key = (group, tuple(sorted(skip)), variant, modes)
    if key not in _COMPILED:
        t0 = time.time()
        kernel = fused.GdnFusedSm90(group, skip, **VARIANTS[variant], modes=modes)
        _COMPILED[key] = cute.compile(kernel, *cargs)
        print(f"compiled the fused kernel {key} in {time.time() - t0:.1f} s", flush=True)
    return _COMPILED[key]


def fused_runner(x: dict, prepared, out, group: int, variant: str = "c1"):
    """``gdn_fused_cp``'s runner on the GPU: one launch of the fused kernel over ``runs``
    from ``inits`` (a scratch pool, row i + 1 for run i), their final states returned."""
    cache: dict[tuple, tuple] = {}

    def run(runs, inits):
        if runs not in cache:
            i32 = dict(dtype=torch.int32, device=DEV)
            cache[runs] = (
                torch.arange(1, len(runs) + 1, **i32), torch.ones(len(runs), **i32),
                *(torch.tensor([getattr(r, f) for r in runs], **i32)
                  for f in ("start", "end", "mode")),
            )  # fmt: skip
        slots, has_init, *spans = cache[runs]
        scratch = torch.empty((len(runs) + 1, *inits.shape[1:]), **F32)
        scratch[1:] = inits
        cargs = fused_args(x, prepared, scratch, slots, has_init, None, out, runs=tuple(spans))
        compiled(group, cargs, (), variant, modes=True)(*cargs)
        return scratch[1:]

    return run


def prepared_for(variant: str, x: dict, plan, qsl, cfg, scale: float) -> tuple:
    """What the fused form ``variant`` reads beside q, k and v: (T, G, beta, qs, kn) from
    the Triton prepare kernel, from gdn_prep_sm90 (fp16 T, ``t16``), or the gates alone
    (``inverse``: T formed in the kernel; a placeholder T it does not read)."""
    if VARIANTS[variant].get("inverse"):
        no_t = torch.empty((1, x["v"].shape[1], cfg.chunk_size), **F32)
        return (no_t, *gates.gates(x, plan, qsl, cfg, scale))
    if VARIANTS[variant].get("t16"):
        return prep.prepare(x, plan, qsl, cfg, scale)
    return prepare(x, plan, qsl, cfg, scale)


def fused_extend(
    x: dict, pool, slots, has_init, qsl, out, plan, cfg, scale: float, variant: str = "c1",
    cp_host=None,
):  # fmt: skip
    """The prepare kernel (or, for ``inv``, the gates kernel), then the fused kernel: the
    same contract as the Triton extend (a padding request's rows from a zero state).
    With ``cp_host`` (a ``gdn_fused_cp.plan_segments`` plan, the slots and has_init as host
    lists: no sync), long requests run as segments side by side."""
    prepared = prepared_for(variant, x, plan, qsl, cfg, scale)
    group = cfg.v_heads_per_k_head
    if cp_host is not None:
        cp_plan, slots_host, has_init_host = cp_host
        runner = fused_runner(x, prepared, out, group, variant)
        cp.extend_cp(runner, cp_plan, pool, slots_host, has_init_host)
        return out
    cargs = fused_args(x, prepared, pool, slots, has_init, qsl, out)
    compiled(group, cargs, (), variant)(*cargs)
    return out


def make_inputs(lens, h, hv, correlated: bool, seed: int):
    g = torch.Generator(device="cpu").manual_seed(seed)
    n = sum(lens)

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    k = randn(n, h, fused.KD)
    if correlated:  # keys near a few shared directions: the triangular solve's hard case
        base = randn(4, fused.KD)
        k = base[torch.randint(0, 4, (n * h,), generator=g)].view(n, h, -1) + 0.3 * k
    bf = dict(dtype=torch.bfloat16, device=DEV)
    return dict(
        q=randn(n, h, fused.KD).to(**bf),
        k=k.to(**bf),
        v=randn(n, hv, fused.VD).to(**bf),
        a=randn(n, hv).to(**bf),
        b=randn(n, hv).to(**bf),
        A_log=testing.gate_A_log(hv, False, DEV),
        dt_bias=testing.gate_dt_bias(hv, False, DEV),
    )


def check_case(
    lens, group: int, correlated: bool, seed: int, variant: str = "c1", segments: int = 1
) -> dict:
    mod, cfg = module(group)
    hv, h = 4, 4 // group
    scale = fused.KD**-0.5
    bs = len(lens) + 1  # the last request is padding (slot 0)
    lens_all = list(lens) + [3]
    x = make_inputs(lens_all, h, hv, correlated, seed)
    n = sum(lens_all)
    i32 = dict(dtype=torch.int32, device=DEV)
    qsl = torch.tensor([0] + list(torch.tensor(lens_all).cumsum(0)), **i32)
    perm = torch.randperm(bs - 1, generator=torch.Generator().manual_seed(seed)) + 1
    slots = torch.cat([perm.to(torch.int32), torch.zeros(1, dtype=torch.int32)]).to(DEV)
    has_init = torch.tensor([i % 2 for i in range(bs)], **i32)
    pool0 = torch.randn(bs + 1, hv, fused.VD, fused.KD, device=DEV) * 0.5
    plan = mod.chunk_plan(lens_all, cfg.chunk_size, torch.device(DEV))
    results = {}
    for name in ("fused", "triton"):
        pool = pool0.clone()
        out = torch.full((n, hv, fused.VD), float("nan"), dtype=torch.bfloat16, device=DEV)
        if name == "fused":
            cp_host = None
            if segments > 1:
                host = (slots.tolist(), has_init.tolist())
                cp_host = (cp.plan_segments(qsl.tolist(), host[0], segments), *host)
            fused_extend(x, pool, slots, has_init, qsl, out, plan, cfg, scale, variant, cp_host)
        else:
            mod.extend(
                x["q"], x["k"], x["v"], x["a"], x["b"], A_log=x["A_log"],
                dt_bias=x["dt_bias"], ssm_states=pool, cache_indices=slots,
                has_initial_state=has_init, query_start_loc=qsl, out=out, plan=plan,
                config=cfg, scale=scale,
            )  # fmt: skip
        torch.cuda.synchronize()
        results[name] = (out, pool)
    row = {"lens": list(lens), "group": group, "correlated": correlated}
    row.update(variant=variant, segments=segments)
    worst = {"fused": [0.0, 0.0], "triton": [0.0, 0.0]}
    failures = []
    for b, length in enumerate(lens_all):  # the padding request's rows from a zero state
        s, e = int(qsl[b]), int(qsl[b + 1])
        g, beta = reference.gates(x["a"][s:e], x["b"][s:e], x["A_log"], x["dt_bias"])
        init = pool0[int(slots[b])] if has_init[b] and b < bs - 1 else None
        ref_out, ref_state, _ = reference.gdn_sequence(
            x["q"][s:e], x["k"][s:e], x["v"][s:e], g, beta, init, scale=scale,
            l2norm_qk=True, keep_steps=False,
        )  # fmt: skip
        ob = testing.output_bound(ref_out, torch.bfloat16, fused.KD)
        sb = testing.state_bound(ref_state, fused.KD)
        for name, (out, pool) in results.items():
            pairs = [(out[s:e], ref_out, ob), (pool[int(slots[b])], ref_state, sb)]
            for j, (got, want, tol) in enumerate(pairs[: 1 if b == bs - 1 else 2]):
                try:
                    ratio = testing.check_close(f"{name} request {b}", got, want, tol)
                except AssertionError as err:
                    failures.append(f"{name}: {err}")
                    ratio = float("inf")
                worst[name][j] = max(worst[name][j], ratio)
    for name, (out, pool) in results.items():
        if not torch.equal(pool[0], pool0[0]):
            failures.append(f"{name}: pool row 0 (padding) changed")
    row["fused_out_state_of_bound"] = worst["fused"]
    row["triton_out_state_of_bound"] = worst["triton"]
    row["fused_failures"] = [f for f in failures if f.startswith("fused")]
    row["triton_failures"] = [f for f in failures if f.startswith("triton")]
    row["ok"] = not row["fused_failures"]
    return row


def uniform_batch(bs: int, length: int, heads: int) -> dict:
    """bench/gdn.py's prefill inputs (GVA 1, ``bs`` requests of ``length`` rows, no initial
    state, slots 1 ..) with the pool, an output and the chunk plan: what the bench and the
    ablation time."""
    mod, cfg = module(1)
    i32 = dict(dtype=torch.int32, device=DEV)
    return dict(
        mod=mod, cfg=cfg, x=make_inputs([length] * bs, heads, heads, False, 7),
        qsl=torch.arange(bs + 1, **i32) * length, slots=torch.arange(1, bs + 1, **i32),
        no_init=torch.zeros(bs, **i32),
        pool=torch.zeros(bs + 1, heads, fused.VD, fused.KD, device=DEV),
        out=torch.empty(bs * length, heads, fused.VD, dtype=torch.bfloat16, device=DEV),
        plan=mod.chunk_plan([length] * bs, cfg.chunk_size, torch.device(DEV)),
    )  # fmt: skip


def bench_case(
    bs: int, length: int, heads: int, variants: tuple[str, ...] = ("c1",),
    segments: tuple[int, ...] = (1,),
) -> dict:  # fmt: skip
    """Prepare + fused (each form of ``variants`` x ``segments``; the first is the row's
    ``fused_ms``) against the Triton extend and fla, same inputs."""
    import triton

    from bench import gdn

    batch = uniform_batch(bs, length, heads)
    mod, cfg, x, qsl, slots, no_init, pool, out_f, plan = (
        batch[k] for k in ("mod", "cfg", "x", "qsl", "slots", "no_init", "pool", "out", "plan")
    )
    scale = fused.KD**-0.5
    out_t = torch.empty_like(out_f)

    host = (slots.tolist(), no_init.tolist())
    cp_plans = {s: (cp.plan_segments(qsl.tolist(), host[0], s), *host) for s in segments}

    def ours_fused(var: str = variants[0], segs: int = segments[0]):
        cp_host = cp_plans[segs] if segs > 1 else None
        fused_extend(x, pool, slots, no_init, qsl, out_f, plan, cfg, scale, var, cp_host)

    def ours_triton():
        mod.extend(
            x["q"], x["k"], x["v"], x["a"], x["b"], A_log=x["A_log"], dt_bias=x["dt_bias"],
            ssm_states=pool, cache_indices=slots, has_initial_state=no_init,
            query_start_loc=qsl, out=out_t, plan=plan, config=cfg, scale=scale,
        )  # fmt: skip

    ours_fused()
    ours_triton()
    torch.cuda.synchronize()
    gdn.torch = torch  # bench/gdn.py binds torch when its main runs
    diff = gdn.diff(out_f, out_t)
    forms = {}  # "variant x segments" -> ms
    for var in variants:
        for segs in segments:
            ours_fused(var, segs)
            forms[f"{var}x{segs}"] = triton.testing.do_bench(
                lambda: ours_fused(var, segs), warmup=25, rep=100
            )
    t_f = forms[f"{variants[0]}x{segments[0]}"]
    t_t = triton.testing.do_bench(ours_triton, warmup=25, rep=100)
    t_p = triton.testing.do_bench(lambda: prepare(x, plan, qsl, cfg, scale), warmup=25, rep=100)
    t_g = triton.testing.do_bench(lambda: gates.gates(x, plan, qsl, cfg, scale), warmup=25, rep=100)
    try:  # (its error recorded, not the other rows lost)
        t_p16 = triton.testing.do_bench(
            lambda: prep.prepare(x, plan, qsl, cfg, scale), warmup=25, rep=100
        )
    except Exception as err:
        t_p16 = f"failed: {err!r}"[:400]
    row = {
        "case": f"{bs}x{length} H{heads}", "fused_ms": t_f, "triton_ms": t_t,
        "speedup_vs_triton": t_t / t_f, "out_diff_vs_triton": diff, "prepare_ms": t_p,
        "gates_ms": t_g, "prep_sm90_ms": t_p16,
        "fused_ms_by_variant_x_segments": forms,
    }  # fmt: skip
    ours_fused()  # out_f and the pool as the first variant leaves them, for the diffs below
    torch.cuda.synchronize()
    row.update(peer_rows(x, out_f, pool, qsl, bs, length, heads, t_f, t_t))
    return row


def peer_rows(x, out_f, pool, qsl, bs: int, length: int, heads: int, t_f, t_t) -> dict:
    """fla-core (the issue's peer) and FlashInfer's CuTe DSL GDN prefill on the same inputs,
    each when it imports (FlashInfer as bench/gdn.py runs it: q and k normalised before its
    timed call)."""
    import traceback

    import triton

    from bench import gdn

    row: dict = {}
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError:
        chunk_gated_delta_rule = None
    if chunk_gated_delta_rule is not None:
        theirs = gdn.fla_prefill_call(chunk_gated_delta_rule, x, qsl.to(torch.int64))
        fla_out, _ = theirs()
        torch.cuda.synchronize()
        t_fla = triton.testing.do_bench(theirs, warmup=25, rep=100)
        row["out_diff_vs_fla"] = gdn.diff(fla_out[0], out_f)
        row.update(fla_ms=t_fla, speedup_vs_fla=t_fla / t_f, triton_speedup_vs_fla=t_fla / t_t)
    try:
        from flashinfer.gdn_prefill import chunk_gated_delta_rule as fi_chunk
    except ImportError:
        return row
    buffers = {"x": x, "out": out_f, "pool": pool, "qsl": qsl}
    try:
        row.update(gdn.flashinfer_prefill(fi_chunk, buffers, bs, length, heads))
        row["speedup_vs_flashinfer"] = row["flashinfer_ms"] / t_f
    except Exception:  # its row must not cost fla's
        row["flashinfer_error"] = traceback.format_exc()[-600:]
    return row


CHECKS = (
    ((1, 63, 64, 65, 200), 1, False),
    ((1000, 129, 7), 1, True),
    ((64, 300, 33), 2, False),
    ((513, 2, 190), 2, True),
)
CP_CHECKS = (  # long requests for the segmented runs (gdn_fused_cp), with short ones beside
    ((2000, 700, 64, 5), 1, False),
    ((1500, 300), 2, True),
)
BENCH = ((1, 32768, 16), (4, 8192, 16), (8, 4096, 32))


def _peers() -> dict:
    """Versions of the peers and of the CuTe DSL the kernel was built with."""
    import importlib.metadata as md

    found = {}
    for dist in ("fla-core", "flashinfer-python", "nvidia-cutlass-dsl", "triton", "torch"):
        try:
            found[dist] = md.version(dist)
        except md.PackageNotFoundError:
            found[dist] = None
    return found


def run(args) -> int:
    import faulthandler
    import os

    from bench.run import tree_commit

    commit = os.environ.get("ATTNGEN_COMMIT") or tree_commit()  # as bench/gdn.py records it
    report = {"device": torch.cuda.get_device_name(), "commit": commit, "peers": _peers()}
    report.update(checks=[], bench=[])
    out_dir = Path(args.out) if args.out else None

    def save():
        if out_dir:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "gdn_fused.json").write_text(json.dumps(report, indent=1))

    def watch(what: str):
        """Mark ``what`` as running (saved) and end the process, tracebacks printed, if it
        takes longer than --case-timeout: a kernel that hangs (a barrier or setmaxnreg
        waiting for ever) must not take the device call's whole limit."""
        report["running"] = what
        save()
        faulthandler.cancel_dump_traceback_later()
        if args.case_timeout > 0:
            faulthandler.dump_traceback_later(args.case_timeout, exit=True)

    ok = True
    if args.check:
        cases = [(c, 1) for c in (CHECKS[:1] if args.first else CHECKS)]
        cases += [(c, s) for s in args.segments if s > 1 for c in CP_CHECKS]
        for var in args.variants:
            for i, ((lens, group, corr), segs) in enumerate(cases):
                watch(f"check {var} {lens} group {group} segments {segs}")
                row = check_case(lens, group, corr, 100 + i, variant=var, segments=segs)
                report["checks"].append(row)
                ok &= row["ok"]
                print(json.dumps(row), flush=True)
                save()
    if args.bench:
        for bs, length, heads in BENCH:
            watch(f"bench {bs}x{length} H{heads}")
            row = bench_case(bs, length, heads, tuple(args.variants), tuple(args.segments))
            report["bench"].append(row)
            print(json.dumps(row), flush=True)
            save()
    faulthandler.cancel_dump_traceback_later()
    report.pop("running", None)
    save()
    return 0 if ok else 1
