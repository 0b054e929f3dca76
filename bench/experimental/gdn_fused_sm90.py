"""The GDN chunk kernel (``attngen.families.gdn.cute_dsl.kernels.chunk_sm90``, which the
generated CuTe DSL GDN backends launch) from the bench: its forms by name, the float64
mirror of its arithmetic (``chunk_reference``) and the command line of its GPU harness
(``--check`` against the float64 recurrence, ``--bench`` against the Triton extend, fla and
FlashInfer, ``--compile`` for sm_90a without a GPU). The kernel was written here first
(2026-12-06; its history: bench/README.md, "GDN").
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from attngen.families.gdn.cute_dsl.kernels.chunk_sm90 import (  # noqa: E402
    C,
    CONSUMER_REGS,
    FORMS,
    KD,
    OUT,
    POOL_REGS,
    PRODUCER_REGS,
    VALUES,
    VD,
    GdnFusedSm90,
    fake_args,
)

__all__ = [
    "C", "CONSUMER_REGS", "FORMS", "KD", "OUT", "POOL_REGS", "PRODUCER_REGS", "VALUES", "VD",
    "GdnFusedSm90", "chunk_reference", "compile_cpu", "fake_args",
]  # fmt: skip


def chunk_reference(q, k, v, g, beta, state, *, scale: float, eps: float = 1e-6):
    """The kernel's arithmetic for one value head in float64 torch (no roundings): the
    prepare kernel's T and row vectors, then per chunk the transposed products above, with
    the kernel's masks (rows past the request repeat its last). ``q, k [T, K]`` raw, ``v [T,
    V]``, ``g, beta [T]``, ``state [V, K]`` (S^T). Returns (out [T, V], final S^T)."""
    import torch

    f64 = torch.float64
    q, k, v, g, beta = (x.to(f64) for x in (q, k, v, g, beta))
    st = state.to(f64).clone()
    n_tok = q.shape[0]
    out = torch.empty(n_tok, v.shape[1], dtype=f64)
    qs = scale / torch.sqrt((q * q).sum(-1) + eps)
    kn = 1.0 / torch.sqrt((k * k).sum(-1) + eps)
    rows = torch.arange(C)
    lower = rows[:, None] > rows[None, :]
    on_or_below = rows[:, None] >= rows[None, :]
    for t0 in range(0, n_tok, C):
        n = min(C, n_tok - t0)
        valid = rows < n
        idx = t0 + rows.clamp(max=n - 1)
        qc, kc, vc = q[idx], k[idx], v[idx]
        gc = torch.cumsum(g[t0 : t0 + n], 0)[rows.clamp(max=n - 1)]
        qsv, knv, bv = (torch.where(valid, x[idx], 0.0) for x in (qs, kn, beta))
        decay = torch.exp(gc[:, None] - gc[None, :])
        # the prepare kernel: M and T = (I + M)^-1
        kk = (kc * knv[:, None]) @ (kc * knv[:, None]).T
        m = torch.where(lower, bv[:, None] * decay * kk, 0.0)
        t = torch.linalg.inv(torch.eye(C, dtype=f64) + m)
        t = t[rows.clamp(max=n - 1)]  # the kernel's T rows past the request: its last
        # this kernel
        p = torch.where(on_or_below, (qc @ kc.T) * qsv[:, None] * knv[None, :] * decay, 0.0)
        t = torch.where(on_or_below, t, 0.0)
        gamma = torch.exp(gc)
        d = (vc.T - (st @ kc.T) * (gamma * knv)[None, :]) * bv[None, :]  # beta: 0 past n
        o = torch.where(valid[None, :], (st @ qc.T) * (gamma * qsv)[None, :], 0.0)
        u = d @ t.T
        o = o + u @ p.T
        out[t0 : t0 + n] = o[:, :n].T
        to_end = torch.where(valid, knv * torch.exp(gc[n - 1] - gc), 0.0)
        st = torch.exp(gc[n - 1]) * st + (u * to_end[None, :]) @ kc
    return out, st


def compile_cpu(group: int = 1, arch: str = "sm_90a", **kw):
    import cutlass.cute as cute
    from cutlass import Float16, Float32

    kernel = GdnFusedSm90(group, **kw)
    args = fake_args(group, Float16 if kernel.t16 else Float32)
    return cute.compile(kernel, *args, options=f"--gpu-arch {arch}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compile", action="store_true", help="CPU: build for sm_90a only")
    parser.add_argument("--check", action="store_true", help="GPU: against float64")
    parser.add_argument("--bench", action="store_true", help="GPU: time against attngen")
    parser.add_argument("--first", action="store_true", help="only the first check (sanitizers)")
    parser.add_argument(
        "--variants", nargs="+", default=["c1"], choices=tuple(FORMS),
        help="the kernel's forms (FORMS)",
    )  # fmt: skip
    parser.add_argument(
        "--segments", type=int, nargs="+", default=[1],
        help="segments a long request runs as (gdn_fused_cp; 1: none)",
    )  # fmt: skip
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--case-timeout", type=float, default=150.0,
        help="seconds a check or bench case may take before the process ends (0: no limit)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.compile:
        os.environ.setdefault("CUTE_DSL_COMPILER_OPT", "remarks{ptx}")
        compile_cpu()
        print("compiled for sm_90a")
        return 0
    from bench.experimental import gdn_fused_check

    return gdn_fused_check.run(args)


if __name__ == "__main__":
    sys.exit(main())
