"""CPU emulation for the CuTe DSL fp8 decode (issue 10): can Q K^T run on fp8 MMAs over the
stored e4m3 keys, with bf16 q split into e4m3 parts under a per-row power-of-two scale?

Scores are formed three ways and the decode output compared with the float64 oracle on the
dequantized cache (row RMS error relative to the row's RMS, the tolerance table's measure):
today's path (q rounded to fp16, exact fp16 x e4m3 products, fp32 sums), and 2 or 3 e4m3
parts of q (exact e4m3 x e4m3 products). The fp8 MMA's narrower accumulation is modelled by
rounding each part's 128-term sum to ``ACC_BITS`` significant bits before the fp32 sum of the
parts (one promotion per part and key, k = 128). P goes to fp16 before P V, as today; the
output is left unrounded so the scores' share of the error shows. Run:
``python bench/experimental/fp8_qsplit_emulation.py``.
"""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
ACC_BITS = 13


def split_e4m3(q: torch.Tensor, n: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """``q`` [H, D] float64 as ``n`` e4m3 parts of ``q * s`` (s: per row, a power of two that
    puts the row's largest magnitude at most at 448) and s."""
    amax = q.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    s = torch.exp2(torch.floor(torch.log2(448.0 / amax)))
    rest, out = q * s, []
    for _ in range(n):
        part = rest.to(torch.float32).to(E4M3)
        out.append(part)
        rest = rest - part.double()
    return out, s


def round_bits(x: torch.Tensor, bits: int) -> torch.Tensor:
    mant, exp = torch.frexp(x)
    return torch.ldexp(torch.round(mant * 2**bits) / 2**bits, exp)


def worst_row_error(heads: int, keys: int, q_mul: float, parts: int, acc_bits: int | None,
                    reps: int = 8, dim: int = 128) -> float:  # fmt: skip
    worst = 0.0
    for _ in range(reps):
        q = (torch.randn(heads, dim, dtype=torch.float64) * q_mul).to(torch.bfloat16).double()
        k8 = (torch.randn(keys, dim, dtype=torch.float64) / 0.02).to(torch.float32).to(E4M3)
        v = (torch.randn(keys, dim, dtype=torch.float64) / 0.05).to(torch.float32).to(E4M3)
        k, v = k8.double() * 0.02, v.double() * 0.05
        scale = dim**-0.5
        ref = torch.softmax(q @ k.T * scale, dim=1) @ v
        if parts == 0:
            scores = q.to(torch.float16).double() @ k.T * scale
        else:
            pieces, s = split_e4m3(q, parts)
            acc = torch.zeros(heads, keys, dtype=torch.float64)
            for piece in pieces:
                prod = piece.double() @ k8.double().T
                acc = acc + (round_bits(prod, acc_bits) if acc_bits else prod)
            scores = acc * 0.02 / s * scale
        out = torch.softmax(scores, dim=1).to(torch.float16).double() @ v
        err = (out - ref).pow(2).mean(1).sqrt() / ref.pow(2).mean(1).sqrt()
        worst = max(worst, float(err.max()))
    return worst


def main() -> None:
    torch.manual_seed(0)
    print("q scale, keys | fp16 q | 2 parts | 3 parts | 2 parts, 13-bit sums | 3, 13-bit")
    for q_mul in (1, 4, 16):
        for keys in (300, 4096):
            row = [worst_row_error(8, keys, q_mul, n, None) for n in (0, 2, 3)]
            row += [worst_row_error(8, keys, q_mul, n, ACC_BITS) for n in (2, 3)]
            print(f"x{q_mul}, {keys} | " + " | ".join(f"{e:.2e}" for e in row))


if __name__ == "__main__":
    main()
