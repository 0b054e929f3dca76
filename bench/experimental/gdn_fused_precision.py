"""Which operand precisions a fused GDN chunk kernel needs to meet attngen's bounds: a CPU
float64 emulation (2026-12-06), no GPU.

A fused prefill keeps each head's fp32 state for the whole sequence and, per chunk of C
tokens, runs every product on the tensor cores (bench/README, "What the fastest published
peer does"). In the chunk form used here (state H ``[K, V]``, log decays Γ = cumsum g,
γ = exp Γ, D[t, s] = exp(Γ_t - Γ_s) for s <= t):

    A = strict_lower(diag(β) (K K^T ∘ D)),   T = (I + A)^-1
    u = T diag(β) (V - diag(γ) K H0)                    (the chunk's "new values")
    O = diag(γ) Q H0 + (Q K^T ∘ D) u
    H = γ_C H0 + (K ∘ exp(Γ_C - Γ))^T u

Every product rounds its operands to the design's type per operand kind (``qk``: the
normalized q and k; ``state``: H0; ``tri``: T; ``diff``: V - γ K H0; ``u``; ``p``: Q K^T ∘ D;
``kdec``: K ∘ exp(Γ_C - Γ)) and its result to fp32, the accumulator; the state stays fp32.
Operand types: fp32, tf32 (10-bit mantissa), bf16, and ``split``: a bf16 high part plus a
bf16 low part (two MMAs, about 16 bits). Errors are measured against the float64
token-by-token recurrence (``attngen.families.gdn.reference``) as a fraction of attngen's
bounds (``attngen.families.gdn.testing``: prefill outputs in bf16, the final state), the
largest over the draws: <= 1 passes. ``exact`` (float64 throughout) checks the chunk form.

T itself comes from ``inverse``: ``exact`` (float64, rounded to fp32), or the blocked form a
kernel would compute (``blocked_inverse``: the 16 x 16 diagonal blocks by forward
substitution in fp32, the rest by four products whose operands round as named: ``tf32``, as
attngen's Triton prepare kernel; ``bf16``; ``split``). ``--inverse`` compares those under the
fused kernel's design.

``python bench/experimental/gdn_fused_precision.py [--tokens 2048] [--draws 4] [--inverse]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from attngen.families.gdn import reference, testing  # noqa: E402

F64 = torch.float64
KINDS = ("qk", "state", "tri", "diff", "u", "p", "kdec")


def tf32(x: torch.Tensor) -> torch.Tensor:
    """Round to nearest even at TF32's 10 mantissa bits (the fp32 value first)."""
    bits = x.float().view(torch.int32)
    bias = ((bits >> 13) & 1) + 0xFFF
    return ((bits + bias) & ~0x1FFF).view(torch.float32).double()


def bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).to(F64)


def fp16(x: torch.Tensor) -> torch.Tensor:
    """fp16 (10 mantissa bits; finite only below 65504: what overflows shows as inf)."""
    return x.to(torch.float16).to(F64)


def split(x: torch.Tensor) -> torch.Tensor:
    hi = bf16(x)
    return hi + bf16(x - hi)


ROUND = {
    "fp64": lambda x: x,
    "fp32": lambda x: x.float().double(),
    "tf32": tf32,
    "bf16": bf16,
    "fp16": fp16,
    "split": split,
}


def rounding(base: str, inverse: str = "exact", **kinds: str) -> dict[str, str]:
    """Every operand kind rounded to ``base``, the named kinds as given; T by ``inverse``."""
    return {**{k: kinds.get(k, base) for k in KINDS}, "inverse": inverse}


SPLIT = "split"
DESIGNS = {
    "exact": rounding("fp64"),
    "tf32 everywhere": rounding("tf32"),
    "bf16 everywhere": rounding("bf16"),
    "bf16, split state": rounding("bf16", state=SPLIT),
    "bf16, split state and u": rounding("bf16", state=SPLIT, u=SPLIT),
    "bf16, split state, u, diff": rounding("bf16", state=SPLIT, u=SPLIT, diff=SPLIT),
    "bf16, split state, u, diff, T": rounding("bf16", state=SPLIT, u=SPLIT, diff=SPLIT, tri=SPLIT),
    "bf16, split T": rounding("bf16", tri=SPLIT),
    "bf16, split T and u": rounding("bf16", tri=SPLIT, u=SPLIT),
    "bf16, split T, u, kdec": rounding("bf16", tri=SPLIT, u=SPLIT, kdec=SPLIT),
    "split all but q, k": rounding(SPLIT, qk="bf16"),
    "tf32, bf16 state": rounding("tf32", state="bf16"),
    # one MMA a product with fp16 operands where bf16 needed a split (an MMA takes one type
    # for both operands: T, d, u, P and the update's keys fp16; q, k and the state bf16)
    "fp16 everywhere": rounding("fp16"),
    "fp16 T, d, u, P, kdec; bf16 q, k, state": rounding("fp16", qk="bf16", state="bf16"),
}
# the fused kernel's operands (bf16; T, u and the update's u split, the update's keys exact:
# about "bf16, split T, u, kdec"), with T from each inverse
KERNEL = dict(tri=SPLIT, u=SPLIT, kdec=SPLIT)
INVERSE_DESIGNS = {
    f"kernel, T {inv}": rounding("bf16", inverse=inv, **KERNEL)
    for inv in ("exact", "tf32", "split", "bf16")
}


def blocked_inverse(a: torch.Tensor, prod: str, sub: int = 16) -> torch.Tensor:
    """T = (I + A)^-1 of a strictly lower A as a kernel computes it: D = I + A's diagonal
    sub x sub blocks inverted by forward substitution in fp32; N = D^-1 (A - blocks), which
    is block-strictly-lower (N^4 = 0 for four blocks), then T = (I - N)(I + N^2) D^-1 in
    four products whose operands round as ``prod`` and whose results are fp32."""
    n = a.shape[0]
    a32 = a.float()
    blocks = torch.zeros_like(a32)
    dinv = torch.zeros_like(a32)
    for b0 in range(0, n, sub):
        blk = a32[b0 : b0 + sub, b0 : b0 + sub]
        inv = torch.eye(blk.shape[0], dtype=torch.float32)
        for j in range(1, blk.shape[0]):  # row j from the final rows above it, in fp32
            inv[j] = inv[j] - blk[j, :j] @ inv[:j]
        blocks[b0 : b0 + sub, b0 : b0 + sub] = blk
        dinv[b0 : b0 + sub, b0 : b0 + sub] = inv
    eye = torch.eye(n, dtype=torch.float32)

    def mm(x, y):
        return (ROUND[prod](x) @ ROUND[prod](y)).float()

    nmat = mm(dinv, a32 - blocks)
    series = mm(eye - nmat, eye + mm(nmat, nmat))
    return mm(series, dinv).double()


def chunked(qn, kn, v, g, beta, design: dict[str, str], chunk: int):
    """The fused kernel's arithmetic for one head: (out [T, V], final state [V, K])."""
    exact = all(design[k] == "fp64" for k in KINDS)
    op = {k: ROUND[design[k]] for k in KINDS}
    acc = (lambda x: x) if exact else ROUND["fp32"]

    def mm(a, b, ka, kb):
        return acc(op[ka](a) @ op[kb](b))

    n, kdim = kn.shape
    h = torch.zeros(kdim, v.shape[1], dtype=F64)
    out = torch.empty(n, v.shape[1], dtype=F64)
    for s in range(0, n, chunk):
        e = min(s + chunk, n)
        q, k, vv, gg, bb = qn[s:e], kn[s:e], v[s:e], g[s:e], beta[s:e]
        cum = torch.cumsum(gg, 0)
        diff = cum[:, None] - cum[None, :]
        lower = torch.tril(torch.ones(e - s, e - s, dtype=torch.bool))
        dmask = torch.where(lower, torch.exp(diff.clamp(max=0.0)), torch.zeros_like(diff))
        a = torch.tril(bb[:, None] * mm(k, k.T, "qk", "qk") * dmask, -1)
        if design["inverse"] == "exact":
            t = acc(torch.linalg.inv(torch.eye(e - s, dtype=F64) + acc(a)))
        else:
            t = blocked_inverse(acc(a), design["inverse"])
        gamma = torch.exp(cum)
        d = acc(vv - gamma[:, None] * mm(k, h, "qk", "state"))
        u = acc(op["tri"](t * bb[None, :]) @ op["diff"](d))  # T diag(β) folded
        p = acc(mm(q, k.T, "qk", "qk") * dmask)
        out[s:e] = acc(gamma[:, None] * mm(q, h, "qk", "state") + mm(p, u, "p", "u"))
        kdec = k * torch.exp(cum[-1] - cum)[:, None]
        h = acc(torch.exp(cum[-1]) * h + mm(kdec.T, u, "kdec", "u"))
    return out, h.T


# the fused kernel's forms with its own placements (``kernel_form``): each operand's type
FORMS = {
    "fp32 operands but the state's bf16 (checks the form)": dict(
        t="fp32", d="fp32", u="fp32", p="fp32"
    ),
    "c1 (bf16; T, u and the update's u split)": dict(t=SPLIT, d="bf16", u=SPLIT, p="bf16"),
    "c1h / c1p (fp16 T, d, u, P, update)": dict(t="fp16", d="fp16", u="fp16", p="fp16"),
}


def kernel_form(q, k, v, g, beta, form: dict[str, str], scale: float, chunk: int = 64):
    """The fused kernel's arithmetic for one head with its roundings where it makes them
    (gdn_fused_sm90's docstring): q, k, v as stored (bf16), norms and gates fp32, the
    state fp32 and a bf16 operand of S^T K^T and S^T Q^T, T = (I + M)^-1 in fp32 then
    rounded to ``form["t"]``, d^T diag(β) to ``d``, u^T to ``u`` (O's P u) and u^T diag(kn
    exp(G_C - G)) to ``u`` (the update, against the exact keys), P to ``p``; every
    product's result fp32. Returns (out [T, V], final S^T [V, K])."""
    r = {name: ROUND[kind] for name, kind in form.items()}
    f32 = ROUND["fp32"]
    q, k, v = (x.to(F64) for x in (q, k, v))  # the stored bf16 values, exactly
    qs = f32(scale / torch.sqrt((q * q).sum(-1) + 1e-6))
    kn = f32(1.0 / torch.sqrt((k * k).sum(-1) + 1e-6))
    g, beta = f32(g.to(F64)), f32(beta.to(F64))
    n_tok, kdim = k.shape
    st = torch.zeros(v.shape[1], kdim, dtype=F64)
    out = torch.empty(n_tok, v.shape[1], dtype=F64)
    for t0 in range(0, n_tok, chunk):
        e = min(t0 + chunk, n_tok)
        qc, kc, vc = q[t0:e], k[t0:e], v[t0:e]
        gc = f32(torch.cumsum(g[t0:e], 0))
        lower = torch.tril(torch.ones(e - t0, e - t0, dtype=torch.bool), -1)
        on_or_below = torch.tril(torch.ones(e - t0, e - t0, dtype=torch.bool))
        decay = torch.exp((gc[:, None] - gc[None, :]).clamp(max=0.0))
        kk = f32(kc @ kc.T)
        m = f32(
            torch.where(
                lower, (beta[t0:e] * kn[t0:e])[:, None] * decay * kk * kn[t0:e][None, :], 0.0
            )
        )
        t = r["t"](f32(torch.linalg.inv(torch.eye(e - t0, dtype=F64) + m)))
        p = r["p"](
            f32(
                torch.where(
                    on_or_below, f32(qc @ kc.T) * qs[t0:e, None] * kn[t0:e][None, :] * decay, 0.0
                )
            )
        )
        gamma = torch.exp(gc)
        s_op = bf16(st)
        d = r["d"](
            f32((vc.T - f32(s_op @ kc.T) * (gamma * kn[t0:e])[None, :]) * beta[t0:e][None, :])
        )
        o = f32(s_op @ qc.T) * (gamma * qs[t0:e])[None, :]
        u = f32(d @ t.T)
        o = f32(o + f32(r["u"](u) @ p.T))
        out[t0:e] = o.T
        to_end = kn[t0:e] * torch.exp(gc[-1] - gc)
        st = f32(torch.exp(gc[-1]) * st + f32(r["u"](f32(u * to_end[None, :])) @ kc))
    return out, st


def draw(tokens: int, slow: bool, correlated: bool, seed: int):
    torch.manual_seed(seed)
    kdim = vdim = 128
    q = torch.randn(tokens, 1, kdim).to(torch.bfloat16)
    k = torch.randn(tokens, 1, kdim)
    if correlated:  # keys near a few shared directions: the triangular solve's hard case
        base = torch.randn(4, kdim)
        k = base[torch.randint(0, 4, (tokens,))][:, None] + 0.3 * k
    k = k.to(torch.bfloat16)
    v = torch.randn(tokens, 1, vdim).to(torch.bfloat16)
    a = torch.randn(tokens, 1).to(torch.bfloat16)
    b = torch.randn(tokens, 1).to(torch.bfloat16)
    g, beta = reference.gates(
        a, b, testing.gate_A_log(1, slow, "cpu"), testing.gate_dt_bias(1, slow, "cpu")
    )
    return q, k, v, g, beta


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--draws", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--inverse", action="store_true", help="compare T's computations")
    parser.add_argument("--forms", action="store_true", help="the kernel's forms (kernel_form)")
    args = parser.parse_args()
    designs = INVERSE_DESIGNS if args.inverse else FORMS if args.forms else DESIGNS
    kdim = 128
    scale = kdim**-0.5
    worst: dict[str, list[float]] = {name: [0.0, 0.0] for name in designs}
    for i in range(args.draws):
        for slow in (False, True):
            for correlated in (False, True):
                q, k, v, g, beta = draw(args.tokens, slow, correlated, 1000 * i + 7)
                ref_out, ref_state, _ = reference.gdn_sequence(
                    q, k, v, g, beta, None, scale=scale, l2norm_qk=True, keep_steps=False
                )
                qn, kn = reference.prepare_qk(q, k, 1, scale=scale, l2norm_qk=True)
                ob = testing.output_bound(ref_out[:, 0], torch.bfloat16, kdim)
                sb = testing.state_bound(ref_state[0], kdim)
                for name, design in designs.items():
                    if args.forms:
                        out, state = kernel_form(
                            q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], design, scale,
                            args.chunk,
                        )  # fmt: skip
                    else:
                        out, state = chunked(
                            qn[:, 0], kn[:, 0], v[:, 0].to(F64), g[:, 0], beta[:, 0], design,
                            args.chunk,
                        )  # fmt: skip
                    out_b = bf16(out)  # the kernel writes bf16 outputs
                    for j, (got, want, tol) in enumerate(
                        ((out_b, ref_out[:, 0], ob), (state, ref_state[0], sb))
                    ):
                        allowed = tol.rel * want.abs() + tol.abs_
                        ratio = float(((got - want).abs() / allowed).max())
                        worst[name][j] = max(worst[name][j], ratio)
        print(f"draw {i + 1}/{args.draws} done", file=sys.stderr, flush=True)
    print(f"worst error / attngen's bound over {args.draws * 4} draws of {args.tokens} tokens")
    print("| design | output (bf16) | final state |")
    print("|---|---|---|")
    for name, (o, s) in worst.items():
        print(f"| {name} | {o:.2f} | {s:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
